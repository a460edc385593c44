"""Repeated, interleaved sweeps (common.sweep --repeats): the order of the jobs, the manifest's record of it, and
the per-cell status count. Pure Python, no Slurm, no TensorFlow."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import pytest

from common.sweep import cli, plan, slurm
from common.sweep import layout as sweep_layout
from common.sweep import order as sweep_order
from tests.conftest import PY, REPO, SMOKE, base_env

CELLS = ["native-n1", "horovod-n1", "native-n2", "horovod-n2"]


@pytest.mark.parametrize("cells", [CELLS, CELLS[:2], CELLS + ["x-n4", "y-n4", "z-n8"]])
@pytest.mark.parametrize("seed", [0, 1, 7, 12345])
def test_each_round_is_a_permutation_and_consecutive_jobs_change_cell(cells, seed):
    order = sweep_order.interleave(cells, 6, seed)
    assert len(order) == 6 * len(cells)
    for rnd in range(6):
        this = [c for c, r in order if r == rnd]
        assert sorted(this) == sorted(cells), "a round is a permutation of the cells"
        assert order[rnd * len(cells):(rnd + 1) * len(cells)] == [(c, rnd) for c in this], "rounds in order"
    for (a, _), (b, _) in zip(order, order[1:]):
        assert a != b, f"two consecutive jobs of cell {a} (seed {seed})"


def test_the_order_is_reproducible_with_the_seed_and_changes_between_rounds():
    assert sweep_order.interleave(CELLS, 5, 3) == sweep_order.interleave(CELLS, 5, 3)
    assert sweep_order.interleave(CELLS, 5, 3) != sweep_order.interleave(CELLS, 5, 4)
    rounds = {tuple(c for c, r in sweep_order.interleave(CELLS, 8, 3) if r == k) for k in range(8)}
    assert len(rounds) > 1, "every round in the same order: not interleaved"


def test_one_cell_and_bad_repeats():
    assert sweep_order.interleave(["a"], 3, 0) == [("a", 0), ("a", 1), ("a", 2)]
    with pytest.raises(ValueError, match="--repeats"):
        sweep_order.interleave(CELLS, 0, 0)


def _submit_args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    return cli.parser().parse_args(["submit", "--job", SMOKE, "--sizes", "1,2", "--results",
                                      str(tmp_path / "sw"), *extra])


def test_plan_records_cell_round_and_order(tmp_path):
    runs, header = plan.plan(_submit_args(tmp_path, "--repeats", "3", "--order-seed", "5"))
    assert len(runs) == 12 and header["repeats"] == 3 and header["order_seed"] == 5
    assert [(r["cell"], r["round"]) for r in runs] == [(o["cell"], o["round"]) for o in header["order"]]
    assert [(r["cell"], r["round"] - 1) for r in runs] == sweep_order.interleave(
        ["native-n1", "horovod-n1", "native-n2", "horovod-n2"], 3, 5)
    assert [r["order"] for r in runs] == list(range(12))
    assert len({r["results_dir"] for r in runs}) == 12, "each run its own results directory"
    assert all(r["results_dir"] == f"{r['cell']}-r{r['round']}" for r in runs)
    # one repeat without a seed: the sweep as before (size-major, registry order, directories without -r)
    runs1, _ = plan.plan(_submit_args(tmp_path))
    assert [r["results_dir"] for r in runs1] == ["native-n1", "horovod-n1", "native-n2", "horovod-n2"]


def test_dry_run_prints_the_interleaved_serial_plan_and_the_launch_environment(tmp_path):
    out = tmp_path / "sw"
    proc = subprocess.run([PY, "-m", "common.sweep", "submit", "--job", SMOKE, "--sizes", "1,2", "--results",
                           str(out), "--repeats", "2", "--serial", "--dry-run", "--srun-mpi", "pmi2", "--hint", "",
                           "--module-purge"], cwd=REPO, env=base_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    jobs = [ln for ln in proc.stdout.splitlines() if " sbatch " in ln]
    assert len(jobs) == 8 and not out.exists()
    assert "--dependency" not in jobs[0] and all("--dependency=afterany:<job " in j for j in jobs[1:])
    assert all("TWINBENCH_SRUN_MPI=pmi2" in j and "TWINBENCH_HINT=''" in j and "TWINBENCH_MODULE_PURGE=1" in j
               for j in jobs)
    cells = [ln.split("cell ")[1].split(",")[0] for ln in proc.stdout.splitlines() if ln.startswith("# job")]
    assert [(c, i // 4) for i, c in enumerate(cells)] == sweep_order.interleave(
        ["native-n1", "horovod-n1", "native-n2", "horovod-n2"], 2, 0)


def test_status_counts_per_cell(tmp_path, capsys):
    runs, header = plan.plan(_submit_args(tmp_path, "--repeats", "2"))
    root = tmp_path / "sw"
    root.mkdir()
    manifest = {**header, "runs": [{**r, "job_id": str(100 + i)} for i, r in enumerate(runs)]}
    (root / plan.MANIFEST).write_text(json.dumps(manifest))
    for r in runs:  # native-n1 done twice, horovod-n2 once; the rest: no result (Slurm cannot be asked: failed)
        if r["cell"] == "native-n1" or (r["cell"] == "horovod-n2" and r["round"] == 1):
            (root / r["results_dir"]).mkdir()
            (root / r["results_dir"] / "run.json").write_text("{}")
    cli.main(["status", str(root), "--json"])
    cells = json.loads(capsys.readouterr().out)["cells"]
    assert cells["native-n1"] == {"done": 2, "failed": 0, "pending": 0, "unsubmitted": 0, "of": 2}
    assert cells["horovod-n2"]["done"] == 1 and cells["horovod-n2"]["of"] == 2
    cli.main(["status", str(root)])
    assert "native-n1   done 2/2, failed 0, pending 0" in capsys.readouterr().out


def test_status_until_checks_convergence_of_the_finished_runs(tmp_path, capsys):
    from tests.test_report import make_run, put

    runs, header = plan.plan(_submit_args(tmp_path, "--repeats", "6"))
    root = tmp_path / "sw"
    root.mkdir()
    (root / plan.MANIFEST).write_text(json.dumps({**header, "runs": [{**r, "job_id": str(100 + i)}
                                                                       for i, r in enumerate(runs)]}))
    spread = [80.0, 120.0, 90.0, 110.0, 100.0, 100.0]
    for r in runs:  # every cell within 1% of 100 images/s, but native at 2 replicas spread over 80-120
        ips = spread[r["round"] - 1] if r["cell"] == "native-n2" else 100.0 + r["round"] % 3 * 0.5
        put(root / r["results_dir"], make_run(r["backend"], r["size"], ips, run_id=r["name"]))
    assert cli.main(["status", str(root), "--until", "5%"]) == sweep_order.EXIT_NOT_CONVERGED
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "not yet within 5%: native 2 replicas (2x1) 20.0% wide"
    assert cli.main(["status", str(root), "--until", "0.25", "--json"]) == 0
    until = json.loads(capsys.readouterr().out)["until"]
    assert until["converged"] and len(until["cells"]) == 4 and until["width"] == 0.25
    (root / "native-n2-r6" / "native-n2-r6.json").unlink()  # a finished run lost: status' own exit wins
    assert cli.main(["status", str(root), "--until", "25%"]) == slurm.EXIT_FAILED
    assert capsys.readouterr().out.splitlines()[-1] == "not yet within 25%: native 2 replicas (2x1) 5 of 6 runs"
    with pytest.raises(SystemExit) as e:
        cli.main(["status", str(root), "--until", "5"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and "--until" in err


def fake_sbatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An ``sbatch`` first on PATH that accepts every job and answers job ids 101, 102, ... (``--parsable``)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f"""#!/usr/bin/env bash
n=$(cat {tmp_path}/count 2>/dev/null || echo 100); n=$((n + 1)); echo $n > {tmp_path}/count; echo "$n;cluster"
""")
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{base_env()['PATH']}")


def test_extend_submits_more_rounds_continuing_the_order_up_to_the_cap(tmp_path, capsys, monkeypatch):
    fake_sbatch(tmp_path, monkeypatch)
    root = tmp_path / "sw"
    assert cli.main(["submit", "--job", SMOKE, "--sizes", "1,2", "--results", str(root), "--repeats", "2",
                       "--order-seed", "5", "--max-repeats", "4", "--serial"]) == 0
    assert json.loads((root / plan.MANIFEST).read_text())["max_repeats"] == 4
    assert cli.main(["extend", str(root), "--rounds", "2"]) == 0
    assert "8 job(s) submitted (4 round(s) in all)" in capsys.readouterr().out
    m = json.loads((root / plan.MANIFEST).read_text())
    assert [(r["cell"], r["round"] - 1) for r in m["runs"]] == sweep_order.interleave(CELLS, 4, 5), \
        "the rounds a --repeats 4 submission would have made"
    assert [(o["cell"], o["round"]) for o in m["order"]] == [(r["cell"], r["round"]) for r in m["runs"]]
    assert m["repeats"] == 4 and [r["order"] for r in m["runs"]] == list(range(16))
    assert [r["job_id"] for r in m["runs"]] == [str(101 + i) for i in range(16)]
    assert len({r["results_dir"] for r in m["runs"]}) == 16 and m["runs"][8]["results_dir"].endswith("-r3")
    assert "--dependency=afterany:108" in m["runs"][8]["sbatch"], "serial: the new rounds wait for the last job"
    assert m["runs"][8]["log"] == f"logs/{m['runs'][8]['name']}-109.out"
    with pytest.raises(SystemExit) as e:
        cli.main(["extend", str(root)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and "its cap is 4" in err
    assert len(json.loads((root / plan.MANIFEST).read_text())["runs"]) == 16


def test_max_repeats_below_repeats_is_refused(tmp_path):
    with pytest.raises(sweep_layout.SweepError, match="--max-repeats"):
        plan.plan(_submit_args(tmp_path, "--repeats", "3", "--max-repeats", "2"))
    assert plan.plan(_submit_args(tmp_path, "--repeats", "3"))[1]["max_repeats"] == 12
