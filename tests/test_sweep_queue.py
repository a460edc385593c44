"""Sweeps that survive the queue (common.sweep.nodes, common.sweep.resume): each cell's request checked against the
partition's nodes before anything is submitted, a submission stopped part way completed in place, runs never
submitted counted by ``status``, a cancelled run resumed in place from its checkpoint and its orphaned checkpoint
named. Slurm is faked: ``sbatch``, ``squeue``, ``sacct``, ``scontrol`` and ``sinfo`` executables first on PATH,
answering with outputs recorded from Slurm 22.05 (tests/slurm). No TensorFlow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.sweep import cli, nodes, plan
from common.sweep import resume as sweep_resume
from tests.conftest import REPO, SMOKE, base_env

# `scontrol show node -o` of tests/slurm/start_cluster.sh's node (TWINBENCH_SLURM_CPUS=4, TWINBENCH_SLURM_GPUS=2),
# recorded, its host name replaced; then a second node like it, as on the emulated 2-node cluster
NODE_LINE = ("NodeName={name} Arch=x86_64 CoresPerSocket=4  CPUAlloc=0 CPUEfctv=4 CPUTot=4 CPULoad=2.26 "
             "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:2 NodeAddr=127.0.0.1 NodeHostName={name} "
             "Version=22.05.8 OS=Linux 6.18.44-fc-v595 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=4000 AllocMem=0 "
             "FreeMem=18676 Sockets=1 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A "
             "MCS_label=N/A Partitions=debug  BootTime=2026-11-26T18:48:48 SlurmdStartTime=2026-11-26T18:59:37 "
             "LastBusyTime=2026-11-26T18:59:37 CfgTRES=cpu=4,mem=4000M,billing=4 AllocTRES= CapWatts=n/a "
             "CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s")
TWO_NODES = "\n".join(NODE_LINE.format(name=n) for n in ("node1", "node2")) + "\n"
SINFO = "debug*\n"  # `sinfo -h -o %P`, recorded: the default partition marked with *


def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, node_text: str | None = TWO_NODES,
               refuse_from: int = 0, queue_state: str = "PENDING", sacct_state: str = "") -> Path:
    """Fake Slurm client commands first on PATH. sbatch answers job ids 101, 102, ... (refusing the
    ``refuse_from``-th submission and every later one, as on a node configuration that is not available);
    squeue reports every asked job as ``queue_state`` ("" = forgotten); sacct as ``sacct_state``; scontrol
    show node prints ``node_text`` (None: fails)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (tmp_path / "nodes.txt").write_text(node_text or "")
    scripts = {
        "sbatch": f"""n=$(cat {tmp_path}/count 2>/dev/null || echo 100); n=$((n + 1))
if [ {refuse_from} -gt 0 ] && [ $((n - 100)) -ge {refuse_from} ]; then
  echo "sbatch: error: Batch job submission failed: Requested node configuration is not available" >&2; exit 1
fi
echo $n > {tmp_path}/count; echo "$n;cluster"
""",
        "squeue": f"""ids=""; while [ $# -gt 0 ]; do [ "$1" = -j ] && ids=$2; shift; done
[ -n "{queue_state}" ] && for j in ${{ids//,/ }}; do echo "$j|{queue_state}|Priority"; done; exit 0
""",
        "sacct": f"""ids=""; while [ $# -gt 0 ]; do [ "$1" = -j ] && ids=$2; shift; done
[ -n "{sacct_state}" ] && for j in ${{ids//,/ }}; do echo "$j|{sacct_state}|0:15"; done; exit 0
""",
        "scontrol": f"""[ "$1 $2" = "show node" ] || exit 1
[ {int(node_text is None)} = 1 ] && {{ echo "scontrol: error: no config" >&2; exit 1; }}
cat {tmp_path}/nodes.txt
""",
        "sinfo": f"printf '{SINFO}'\n",
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text("#!/usr/bin/env bash\n" + body)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{base_env()['PATH']}")
    return tmp_path / "sw"


def _main(*argv: str) -> int:
    try:
        return cli.main(list(argv))
    except SystemExit as e:
        return int(e.code)


def _manifest(root: Path) -> dict:
    return json.loads((root / plan.MANIFEST).read_text())


# -- the nodes ----------------------------------------------------------------------------------------------------
def test_the_recorded_node_lines_and_gres_forms_parse():
    assert nodes.parse_nodes(TWO_NODES) == [nodes.Node("node1", 4, 2, ("debug",)), nodes.Node("node2", 4, 2,
                                                                                             ("debug",))]
    assert nodes.default_partition(SINFO) == "debug" and nodes.default_partition("a\nb\n") is None
    assert [nodes.gpu_count(g) for g in ("gpu:2", "gpu:a100:4(S:0-1)", "gpu:tesla:2,mps:100", "(null)",
                                         "gpu:a100:2(S:0),gpu:v100:1(S:1)", "")] == [2, 4, 2, 0, 3, 0]


def test_a_request_is_the_command_over_the_scripts_defaults():
    script = REPO / "jobs" / "slurm" / "native.sbatch"  # #SBATCH --cpus-per-task=4 --gres=gpu:1 ...
    assert nodes.request(["--nodes=1", "--ntasks-per-node=2", "--gres=gpu:2"], script) == nodes.Request(1, 2, 4, 2, ())
    assert nodes.request(["--nodes=2", "--ntasks-per-node=1", "-c2", "-pgpu,big"], script) == \
        nodes.Request(2, 1, 2, 1, ("gpu", "big"))
    req = nodes.request(["--nodes=1", "--ntasks-per-node=2", "--gres=gpu:2"], script)
    two = nodes.parse_nodes(TWO_NODES)
    assert "asks for 1 node(s) x 2 task(s) x 4 CPU(s) per task (8 CPUs, gpu:2 per node), partition 'debug' has 0 " \
           "such node(s) (2 x (4 CPUs, gpu:2))" in nodes.misfit(req, two, "debug")
    assert nodes.misfit(nodes.Request(2, 2, 2, 2, ()), two, "debug") is None
    assert nodes.misfit(nodes.Request(3, 1, 1, 0, ()), two, "debug").endswith("has 2 such node(s) (2 x (4 CPUs, "
                                                                             "gpu:2))")
    assert "partition 'gpu' has no nodes" in nodes.misfit(nodes.Request(1, 1, 1, 0, ("gpu",)), two, "debug")


@pytest.mark.parametrize("args, cell", [
    (["--sizes", "1,2", "--nodes", "1,2", "--gres-per-node", "2"], "native-1x2"),  # 2 x 4 CPUs (the default)
    (["--sizes", "1,2,4", "--gres-per-node", "4", "--cpus-per-task", "1"], "native-n1"),  # gpu:1 fits; n4: gpu:4
])
def test_submit_refuses_a_cell_the_nodes_cannot_hold_before_anything_is_submitted(tmp_path, monkeypatch, capsys,
                                                                                  args, cell):
    root = fake_slurm(tmp_path, monkeypatch)
    for dry in ([], ["--dry-run"]):
        assert _main("submit", "--job", SMOKE, "--results", str(root), *args, *dry) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("common.sweep: error: cell ") and "nothing submitted" in err[0]
        assert not root.exists() and not (tmp_path / "count").exists()
    if cell == "native-1x2":
        assert "cell native-1x2 asks for 1 node(s) x 2 task(s) x 4 CPU(s)" in err[0]
        assert _main("submit", "--job", SMOKE, "--results", str(root), *args, "--cpus-per-task", "2") == 0
    else:
        assert "cell native-n4 asks for 1 node(s) x 4 task(s) x 1 CPU(s) per task (4 CPUs, gpu:4 per node)" in err[0]


def test_without_an_answer_from_slurm_the_dry_run_says_it_did_not_check(tmp_path, monkeypatch, capsys):
    root = fake_slurm(tmp_path, monkeypatch, node_text=None)
    assert _main("submit", "--job", SMOKE, "--sizes", "1,2", "--results", str(root), "--dry-run") == 0
    assert "the cells' requests are not checked against the nodes" in capsys.readouterr().out


# -- a submission stopped part way, completed in place -------------------------------------------------------------
def test_a_half_submitted_sweep_is_counted_and_completed_in_place(tmp_path, monkeypatch, capsys):
    root = fake_slurm(tmp_path, monkeypatch, refuse_from=3)
    args = ["submit", "--job", SMOKE, "--sizes", "1,2", "--gres-per-node", "2", "--cpus-per-task", "1",
            "--results", str(root), "--repeats", "2", "--serial"]
    assert _main(*args) == 1
    err = capsys.readouterr().err
    assert "2 job(s) submitted" in err and f"python -m common.sweep resume {root}" in err
    m = _manifest(root)
    assert len(m["runs"]) == 2 and len(m["planned"]) == 8
    assert _main("status", str(root)) == 1  # pending and never submitted: not 0, and not "still running" either
    out = capsys.readouterr().out
    assert "6 run(s) planned but never submitted" in out and "never submitted 2" in out
    assert "8 run(s): 2 pending, 6 unsubmitted" in out
    assert _main("submit", *args[1:]) == 2 and f"python -m common.sweep resume {root}" in capsys.readouterr().err
    fake_slurm(tmp_path, monkeypatch)  # the queue takes jobs again
    assert _main("resume", str(root), "--dry-run") == 0
    assert capsys.readouterr().out.count("never submitted") == 6 and _manifest(root)["runs"] == m["runs"]
    assert _main("resume", str(root)) == 0
    m = _manifest(root)
    assert [r["name"] for r in m["runs"]] == [r["name"] for r in m["planned"]]  # each once, in the planned order
    assert [r["job_id"] for r in m["runs"]] == [str(101 + i) for i in range(8)]
    assert "--dependency=afterany:102" in m["runs"][2]["sbatch"]  # serial: after the last one submitted
    assert m["runs"][2]["log"] == f"logs/{m['runs'][2]['name']}-103.out"
    assert _main("status", str(root)) == 3  # all pending now
    assert _main("resume", str(root)) == 0 and "nothing to resume" in capsys.readouterr().out
    assert len(_manifest(root)["runs"]) == 8


def test_status_counts_cells_never_submitted_in_a_manifest_without_planned(tmp_path, monkeypatch, capsys):
    """A manifest written before ``planned``: its ``order`` says what was planned (sizes 1,2,4: 6 cells, 4 run)."""
    root = fake_slurm(tmp_path, monkeypatch, queue_state="")
    runs, header = plan.plan(cli.parser().parse_args(["submit", "--job", SMOKE, "--sizes", "1,2,4", "--results",
                                                      str(root)]))
    root.mkdir()
    done = [{**r, "job_id": str(101 + i)} for i, r in enumerate(runs[:4])]
    (root / plan.MANIFEST).write_text(json.dumps({**header, "runs": done}))
    for r in done:
        (root / r["results_dir"]).mkdir()
        (root / r["results_dir"] / "run.json").write_text("{}")
    assert _main("status", str(root), "--json") == 1
    report = json.loads(capsys.readouterr().out)
    assert report["unsubmitted"] == 2 and report["cells"]["native-n4"]["unsubmitted"] == 1
    assert [r["name"] for r in sweep_resume.never_submitted(_manifest(root))] == ["native-n4", "horovod-n4"]


# -- a cancelled run, resumed in place from its checkpoint ------------------------------------------------------------
def test_a_cancelled_run_is_named_with_its_checkpoint_and_resumed_in_place(tmp_path, monkeypatch, capsys):
    root = fake_slurm(tmp_path, monkeypatch)
    assert _main("submit", "--job", SMOKE, "--sizes", "1", "--gres-per-node", "2", "--cpus-per-task", "1",
                 "--results", str(root)) == 0
    native, horovod = _manifest(root)["runs"]
    (root / native["results_dir"]).mkdir()
    (root / native["results_dir"] / "run.json").write_text("{}")
    ckpt = root / horovod["results_dir"] / "checkpoints" / "horovod-n1-abc"
    ckpt.mkdir(parents=True)
    (ckpt / "meta.json").write_text(json.dumps({"step": 120}))
    fake_slurm(tmp_path, monkeypatch, queue_state="", sacct_state="CANCELLED by 0")
    capsys.readouterr()
    assert _main("status", str(root)) == 1
    out = capsys.readouterr().out
    assert f"orphaned checkpoint: {ckpt} (step 120; job 102 CANCELLED)" in out
    assert f"resume them in place: python -m common.sweep resume {root}" in out
    assert _main("resume", str(root), "--dry-run") == 0
    assert f"horovod-n1: job 102 failed, resumes from {ckpt} (step 120)" in capsys.readouterr().out
    assert _main("resume", str(root)) == 0
    runs = _manifest(root)["runs"]
    assert [r["job_id"] for r in runs] == ["101", "103"] and runs[1]["previous_jobs"] == ["102"]
    assert runs[1]["results_dir"] == horovod["results_dir"] and runs[1]["log"] == "logs/horovod-n1-103.out"
    assert f"--output={root}/logs/horovod-n1-%j.out" in runs[1]["sbatch"]  # not the cancelled job's log
    fake_slurm(tmp_path, monkeypatch, queue_state="RUNNING")
    assert _main("status", str(root)) == 3 and "orphaned" not in capsys.readouterr().out
