"""One allocation for a sweep's rounds (common.sweep.allocation, ``submit --one-allocation``): one sbatch job whose
generated script runs every run as a job step in the sweep's interleaved order, each size on the first nodes of the
allocation for both backends; a failed step is recorded and the next one starts; ``status`` counts the runs,
``resume`` submits only the failed one, ``extend`` one more job, and the script run again (as after a requeue)
skips the runs that have their results. Slurm is faked (tests/test_sweep_queue.py's commands, plus ``srun`` and
``scontrol show hostnames``); the generated script itself runs under bash. No TensorFlow."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from common.cluster import machine
from common.sweep import allocation, plan
from tests.conftest import REPO, SMOKE
from tests.test_sweep_queue import _main, _manifest, fake_slurm

SWEEP = ("--sizes", "1,2", "--nodes", "1,2", "--gres-per-node", "2", "--cpus-per-task", "1", "--repeats", "3",
         "--order-seed", "5", "--skip-data-check")
FAIL = "horovod-1x2-r2"  # the run whose step fails


def _fake_steps(tmp_path: Path, fail: str = FAIL) -> Path:
    """``srun`` writing its node list and results directory to calls.txt, then a results JSON (exit 3, nothing
    written, for ``fail``); ``scontrol show hostnames`` answering node1, node2 (else the queue test's scontrol)."""
    bin_dir = tmp_path / "bin"
    (bin_dir / "srun").write_text(f"""#!/usr/bin/env bash
nl=""; out=""; prev=""
for a in "$@"; do
  case $a in --nodelist=*) nl=${{a#--nodelist=}} ;; esac; [ "$prev" = --results ] && out=$a; prev=$a
done
echo "$nl $(basename "$out") $*" >> {tmp_path}/calls.txt
[ "$(basename "$out")" = {fail} ] && exit 3
mkdir -p "$out" && echo '{{}}' > "$out/run.json"
""")
    queue_scontrol = (bin_dir / "scontrol").read_text().split("\n", 1)[1]
    (bin_dir / "scontrol").write_text(f"""#!/usr/bin/env bash
if [ "$1 $2" = "show hostnames" ]; then printf 'node1\\nnode2\\n'; exit 0; fi
{queue_scontrol}""")
    for name in ("srun", "scontrol"):
        (bin_dir / name).chmod(0o755)
    return tmp_path / "calls.txt"


def _run_script(path: Path, job_id: str = "101") -> subprocess.CompletedProcess:
    env = {**os.environ, "SLURM_JOB_ID": job_id, "SLURM_JOB_NODELIST": "node[1-2]", "TWINBENCH_REPO": str(REPO)}
    return subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=60)


def _calls(calls: Path) -> list[tuple[str, str]]:
    return [tuple(line.split()[:2]) for line in calls.read_text().splitlines()]


def test_one_job_runs_every_cell_in_the_sweeps_order_on_the_same_nodes_and_goes_on_after_a_failure(
        tmp_path, monkeypatch, capsys):
    root = fake_slurm(tmp_path, monkeypatch, queue_state="RUNNING")
    calls = _fake_steps(tmp_path)
    assert _main("submit", "--job", SMOKE, "--results", str(root), *SWEEP, "--one-allocation") == 0
    m = _manifest(root)
    assert (tmp_path / "count").read_text().strip() == "101"  # one sbatch for 3 rounds x 6 cells
    assert len(m["runs"]) == len(m["planned"]) == 18 and {r["job_id"] for r in m["runs"]} == {"101"}
    assert [r["step"] for r in m["runs"]] == list(range(1, 19))
    sbatch = m["runs"][0]["sbatch"]
    assert "--nodes=2" in sbatch and "--ntasks-per-node=2" in sbatch and "--gres=gpu:2" in sbatch
    assert "--time=0-09:00:00" in sbatch  # 18 runs x the scripts' 30 minutes
    capsys.readouterr()
    assert _main("status", str(root)) == 3  # the job runs: every run waits its turn
    assert "18 run(s): 18 pending" in capsys.readouterr().out

    proc = _run_script(root / m["runs"][0]["allocation"])
    assert proc.returncode == 0, proc.stderr
    done = _calls(calls)
    assert [name for _, name in done] == [r["name"] for r in m["planned"]]  # the sweep's interleaved order
    nodes = {name: nl for nl, name in done}
    for r in m["planned"]:
        assert nodes[r["name"]] == ("node1" if r["nodes"] == 1 else "node1,node2")
    for cell in {r["cell"].split("-", 1)[1] for r in m["planned"]}:  # both backends of a layout: the same nodes
        assert len({nodes[r["name"]] for r in m["planned"] if r["cell"].endswith(cell)}) == 1
    line = next(x for x in calls.read_text().splitlines() if " horovod-" in x)
    assert "--mpi=pmix" in line and "--ntasks=" in line and "--port-base" not in line
    assert "--port-base" in next(x for x in calls.read_text().splitlines() if " native-" in x)
    assert (root / "logs" / f"{FAIL}.step").read_text().startswith("exit=3 job=101 nodelist=node1 ")
    assert "18 run(s), 1 failed" in proc.stdout

    fake_slurm(tmp_path, monkeypatch, queue_state="", sacct_state="COMPLETED")
    _fake_steps(tmp_path)
    capsys.readouterr()
    assert _main("status", str(root), "--json") == 1
    out = json.loads(capsys.readouterr().out)
    assert sum(r["state"] == "finished" for r in out["runs"]) == 17
    failed = [r for r in out["runs"] if r["state"] == "failed"]
    assert len(failed) == 1 and failed[0]["detail"].startswith("step exit 3 on node1, no results")
    assert out["cells"]["horovod-1x2"] == {"done": 2, "failed": 1, "pending": 0, "unsubmitted": 0, "of": 3}

    # the job requeued: its script again runs only what has no results
    calls.unlink()
    assert _run_script(root / m["runs"][0]["allocation"]).returncode == 0
    assert [name for _, name in _calls(calls)] == [FAIL]

    # resume: the failed run alone, in a new job
    assert _main("resume", str(root)) == 0
    m = _manifest(root)
    again = [r for r in m["runs"] if r["job_id"] == "102"]
    assert [r["name"] for r in again] == [FAIL] and again[0]["previous_jobs"] == ["101"]
    assert len(m["runs"]) == 18 and (root / again[0]["allocation"]).is_file()


def test_extend_and_rounds_per_job_submit_whole_rounds_per_job(tmp_path, monkeypatch, capsys):
    root = fake_slurm(tmp_path, monkeypatch)
    assert _main("submit", "--job", SMOKE, "--results", str(root), *SWEEP, "--one-allocation",
                 "--rounds-per-job", "2") == 0
    m = _manifest(root)
    jobs = {j: sorted({r["round"] for r in m["runs"] if r["job_id"] == j}) for j in {r["job_id"] for r in m["runs"]}}
    assert jobs == {"101": [1, 2], "102": [3]}
    assert _main("extend", str(root), "--rounds", "1") == 0
    m = _manifest(root)
    assert len(m["runs"]) == len(m["planned"]) == 24
    assert {r["job_id"] for r in m["runs"] if r["round"] == 4} == {"103"}
    assert sorted(p.name for p in (root / "jobs").iterdir()) == ["alloc-r1-r2-1.sbatch", "alloc-r3-1.sbatch",
                                                               "alloc-r4-1.sbatch"]


@pytest.mark.parametrize("args, says", [
    (["--rounds-per-job", "2"], "--rounds-per-job needs --one-allocation"),
    (["--one-allocation", "--rounds-per-job", "0"], "--rounds-per-job must be >= 1"),
    (["--one-allocation", "--hvd-launch", "horovodrun"], "--hvd-launch horovodrun is not supported"),
    (["--one-allocation", "--time", "soon"], "--time 'soon' is not a Slurm time"),
])
def test_bad_one_allocation_options_are_one_line_and_exit_2(tmp_path, monkeypatch, capsys, args, says):
    root = fake_slurm(tmp_path, monkeypatch)
    assert _main("submit", "--job", SMOKE, "--results", str(root), *SWEEP, *args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]
    assert not root.exists() and not (tmp_path / "count").exists()


def test_the_dry_run_shows_the_job_and_writes_nothing(tmp_path, monkeypatch, capsys):
    root = fake_slurm(tmp_path, monkeypatch)
    assert _main("submit", "--job", SMOKE, "--results", str(root), *SWEEP, "--one-allocation", "--dry-run") == 0
    out = capsys.readouterr().out
    assert "# alloc-r1-r3-1.sbatch: 18 run(s)" in out and "sbatch --parsable" in out
    assert not root.exists() and not (tmp_path / "count").exists()


def test_slurm_times_and_the_records_step_facts():
    assert [allocation.minutes(t) for t in ("30", "1:30", "01:00:00", "1-0", "1-2:30", "0-0:0:59")] == \
        [30, 2, 60, 1440, 1590, 1]
    with pytest.raises(ValueError):
        allocation.minutes("1h")
    env = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "3", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_STEP_NODELIST": "node1"}
    assert machine.step_facts(env) == {"slurm_job": "7", "slurm_step": "3", "nodelist": "node1"}
    assert machine.step_facts({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]"})["nodelist"] == "n[1-2]"
    assert machine.step_facts({}) == {"slurm_job": None, "slurm_step": None, "nodelist": None}
    assert plan.MANIFEST == "sweep-manifest.json"
