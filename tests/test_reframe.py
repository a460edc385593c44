"""The ReFrame check (jobs/reframe/twinbench_check.py) as a centre runs it, on the test clusters:

- the single-node Slurm (the `cluster` fixture of tests/conftest.py): 1 node x 1 task (``-S num_tasks_per_node=1``),
  both backends and a parity test; all three pass, the runs report their performance variables, the parity test the
  two throughputs and their ratio, and the final losses agree. That the default session is 1 x 1 and 1 x 2 is the
  listing's (test_check_lists_two_layouts_by_default_and_one_when_set); several tasks per layout run on the emulated
  cluster below, and several tasks on one node are the sbatch scripts' (tests/test_slurm.py), which the check's job
  script sources as they do. Then again at 1 x 1 against a baseline
  directory (``-S baseline=``) made from the first session's results JSONs with Horovod's throughput inflated
  a thousandfold: native's reference is its median there and passes, Horovod's throughput and the ratio fail;
- the emulated 2-node cluster (tests/cluster/cluster.sh), ReFrame on its login node: 2 nodes x 1 task.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
from pathlib import Path
from typing import Any

import pytest

from common.core import registry
from common.workload.job import load_job
from jobs.reframe import baseline
from tests.conftest import BIN, REPO, SMOKE, run

CHECK = REPO / "jobs" / "reframe" / "twinbench_check.py"
SETTINGS = REPO / "jobs" / "reframe" / "settings.py"
PERF_VARS = ("total_img_s", "total_img_s_lo95", "total_img_s_hi95",
             "img_s_per_gpu", "img_s_per_gpu_lo95", "img_s_per_gpu_hi95")
BACKENDS = list(registry.names())
PARITY_VARS = {f"{b}_img_s" for b in BACKENDS} | {f"{b}_{BACKENDS[0]}_ratio" for b in BACKENDS[1:]}
RFM_TIMEOUT = 600
LOCAL_LAYOUTS = [(1, 1)]  # (nodes, tasks per node) of the local session: the baseline test's layout
DEFLATE = 1000.0  # native's baseline throughput is made this much smaller: the horovod/native ratio must then fail


def _reframe() -> str:
    exe = BIN / "reframe"
    if not exe.exists():
        pytest.fail("reframe-hpc is not installed (requirements.txt; make setup)")
    return str(exe)


def _listed(*options: str, prefix: Path) -> list[tuple[str, ...]]:
    proc = run([_reframe(), "-C", str(SETTINGS), "-c", str(CHECK), "--prefix", str(prefix), *options, "-l"])
    return re.findall(r"^\s*[-^] ?(Twinbench\w+) %default_tasks=(\d)(?: %backend=(\w+))?", proc.stdout, re.M)


def test_check_lists_two_layouts_by_default_and_one_when_set(tmp_path):
    found = _listed(prefix=tmp_path)
    assert sorted(set(found)) == sorted({("TwinbenchParity", t, "") for t in "12"}
                                        | {("TwinbenchCheck", t, b) for t in "12" for b in BACKENDS}), found
    found = _listed("-S", "num_nodes=2", "-S", "num_tasks_per_node=4", prefix=tmp_path)
    assert sorted(set(found)) == sorted({("TwinbenchParity", "1", "")}
                                        | {("TwinbenchCheck", "1", b) for b in BACKENDS}), found


def test_the_check_holds_no_reference_figures():
    src = CHECK.read_text()
    assert "REFERENCES" not in src and "-S baseline=DIR" in src


# -- what a session's report says ------------------------------------------------------------------------------
def _session(report: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    data = json.loads(report.read_text())
    return data, [c for r in data["runs"] for c in r["testcases"]]


def _perf(case: dict[str, Any]) -> dict[str, list[Any]]:
    """``system:partition:var`` -> [value, reference, lower, upper, unit, result], by variable name."""
    return {key.rsplit(":", 1)[1]: v for key, v in (case.get("perfvalues") or {}).items()}


def _records(outdir: Path) -> list[dict[str, Any]]:
    return baseline.read_records(outdir.rglob("*.json"))


def _check_session(cases: list[dict[str, Any]], outdir: Path, layouts: list[tuple[int, int]]) -> None:
    """Every test passed; each layout has a run per backend and a parity test; measured values are sane."""
    assert all(c["result"] == "pass" for c in cases), [(c["display_name"], c["result"], c.get("fail_reason"))
                                                       for c in cases]
    runs = [c for c in cases if c["name"].startswith("TwinbenchCheck")]
    parity = [c for c in cases if c["name"].startswith("TwinbenchParity")]
    assert sorted((c["num_nodes"], c["num_tasks_per_node"], c["backend"]) for c in runs) == sorted(
        (n, t, b) for n, t in layouts for b in BACKENDS)
    assert sorted((c["num_nodes"], c["num_tasks_per_node"]) for c in parity) == sorted(layouts)
    for c in runs:
        values = {k: v[0] for k, v in _perf(c).items()}
        assert set(values) == set(PERF_VARS), c["display_name"]
        assert 0 < values["total_img_s_lo95"] <= values["total_img_s"] <= values["total_img_s_hi95"], values
        ranks = c["num_nodes"] * c["num_tasks_per_node"]
        assert values["img_s_per_gpu"] == pytest.approx(values["total_img_s"] / ranks, rel=0.01, abs=0.1), values
    records = _records(outdir)
    assert len(records) == len(runs) and {r["job_hash"] for r in records} == {load_job(SMOKE).job_hash}
    for c in parity:
        lay = (c["num_nodes"], c["num_tasks_per_node"])
        mine = {r["backend"]: r for r in records if baseline.layout(r) == lay}
        assert set(mine) == set(BACKENDS), (lay, [r["_path"] for r in records])
        values = {k: v[0] for k, v in _perf(c).items()}
        assert set(values) == PARITY_VARS and all(v > 0 for v in values.values()), values
        for b in BACKENDS:
            assert values[f"{b}_img_s"] == pytest.approx(mine[b]["images_per_sec"])
        first = BACKENDS[0]
        for b in BACKENDS[1:]:
            assert values[f"{b}_{first}_ratio"] == pytest.approx(values[f"{b}_img_s"] / values[f"{first}_img_s"])
            # what the parity test's sanity checked, checked again from the kept results JSONs
            a, z = baseline.final_loss(mine[first]), baseline.final_loss(mine[b])
            assert baseline.relative_difference(a, z) <= 1e-5, (lay, a, z)


@pytest.fixture(scope="module")
def local_session(cluster, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The session on the single-node Slurm at 1 x 1: its prefix and reframe's process."""
    exe = _reframe()
    if shutil.which("squeue", path=cluster.env()["PATH"]) is None:
        pytest.fail("no squeue next to slurmctld")
    prefix = tmp_path_factory.mktemp("rfm-local")
    proc = run([exe, "-C", str(SETTINGS), "-c", str(CHECK), "--prefix", str(prefix / "rfm"),
                "--report-file", str(prefix / "report.json"), "-S", "cpus_per_task=2", "-S", "num_tasks_per_node=1",
                "-S", "repeats=1", "-r", "--performance-report"],
               env=cluster.env(), timeout=RFM_TIMEOUT, check=False)
    return prefix, proc


@pytest.mark.distributed
def test_reframe_runs_both_backends_and_their_parity_at_one_task(local_session):
    prefix, proc = local_session
    assert proc.returncode == 0, f"reframe exited {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    data, cases = _session(prefix / "report.json")
    assert data["session_info"]["num_failures"] == 0 and len(cases) == 3 * len(LOCAL_LAYOUTS)
    _check_session(cases, prefix / "rfm" / "output", LOCAL_LAYOUTS)
    for var in (*PERF_VARS, *PARITY_VARS):  # the performance report names every variable
        assert var in proc.stdout, var
    perflog = (prefix / "rfm" / "perflogs" / "twinbench-local" / "debug" / "TwinbenchCheck.log").read_text()
    lines = perflog.splitlines()
    assert all(f"{var}_value" in lines[0] for var in PERF_VARS)
    assert len(lines) == 1 + len(BACKENDS) * len(LOCAL_LAYOUTS) and all(ln.startswith("pass|") for ln in lines[1:])
    # the same job everywhere: the job file's hash, as each run's output printed it
    outs = sorted(o for o in (prefix / "rfm" / "output").rglob("rfm_job.out") if "TwinbenchCheck" in str(o))
    hashes = {re.search(r"^\[reframe\] recorded job_hash (\w+)", o.read_text(), re.M).group(1) for o in outs}
    assert len(outs) == len(BACKENDS) * len(LOCAL_LAYOUTS) and hashes == {load_job(SMOKE).job_hash}, outs




@pytest.mark.distributed
def test_references_come_from_the_baseline_directory(cluster, local_session, tmp_path):
    """At 1 x 1 against a baseline of the first session's results JSONs, native's throughput divided by 1000 there:
    each run's reference is its backend's median in the baseline, and both pass (native is far above its deflated
    figure; Horovod within 90 % of its own); the ratio's reference is the ratio of the medians, 1000x the measured
    one, and fails: reframe exits non-zero, the parity test failing in its performance stage only. Each test runs its
    backend twice (``-S repeats=2``) with job overrides given as ReFrame splits them (``-S sets=...``,
    ``-S backend_args=--set,...``): the figures are the medians of the two runs."""
    prefix, first = local_session
    assert first.returncode == 0, first.stdout[-3000:]
    base = tmp_path / "baseline"
    for i, rec in enumerate(_records(prefix / "rfm" / "output")):
        rec.pop("_path")
        if rec["backend"] == BACKENDS[0]:
            rec["images_per_sec"] /= DEFLATE
        (base / f"r{i}").mkdir(parents=True)
        (base / f"r{i}" / "result.json").write_text(json.dumps(rec))
    found = baseline.baseline_records(base)
    proc = run([_reframe(), "-C", str(SETTINGS), "-c", str(CHECK), "--prefix", str(tmp_path / "rfm"),
                "--report-file", str(tmp_path / "report.json"), "-S", "cpus_per_task=2", "-S", "num_tasks_per_node=1",
                "-S", f"baseline={base}", "-S", "reference_tolerance=0.9", "-S", "repeats=2",
                "-S", "sets=name=rfm-smoke,steps=12", "-S", "backend_args=--set,sync_every_steps=25", "-r"],
               env=cluster.env(), timeout=RFM_TIMEOUT, check=False)
    assert proc.returncode != 0, proc.stdout[-3000:]
    _, cases = _session(tmp_path / "report.json")
    # two runs per test, each with the overrides (name is not hashed, the others are the job's own values); read in
    # the stage directories: ReFrame moves a test's files to its output only once its dependents passed
    mine = _records(tmp_path / "rfm" / "stage")
    assert sorted(r["backend"] for r in mine) == sorted(BACKENDS * 2), [r["_path"] for r in mine]
    assert {r["job"]["name"] for r in mine} == {"rfm-smoke"} and {r["job_hash"] for r in mine} == {load_job(
        SMOKE).job_hash}
    for out in (tmp_path / "rfm" / "stage").rglob("rfm_job.out"):
        if "TwinbenchCheck" in str(out):
            assert out.read_text().count("[reframe] twinbench exit status 0") == 2, out
    by = {c.get("backend") or "parity": c for c in cases}
    assert set(by) == {*BACKENDS, "parity"}, [c["display_name"] for c in cases]
    job_hash = load_job(SMOKE).job_hash
    medians = {b: baseline.median_throughput(found, job_hash, b, (1, 1)) for b in BACKENDS}
    assert all(medians.values()), medians
    for b in BACKENDS:
        ref = _perf(by[b])["total_img_s"]
        assert ref[1:4] == [pytest.approx(medians[b]), -0.9, None] and ref[5] == "pass", (b, ref)
        assert by[b]["result"] == "pass", by[b].get("fail_reason")
    native, *others = BACKENDS
    parity = _perf(by["parity"])
    for b in BACKENDS:  # the parity test's figure: the median of the backend's two runs
        assert parity[f"{b}_img_s"][0] == pytest.approx(statistics.median(
            r["images_per_sec"] for r in mine if r["backend"] == b), rel=1e-3)
    for b in others:
        ratio = parity[f"{b}_{native}_ratio"]
        assert ratio[1:4] == [pytest.approx(medians[b] / medians[native]), -0.9, 0.9] and ratio[5] == "fail", ratio
        assert parity[f"{b}_img_s"][5] == "pass"
    assert by["parity"]["result"] == "fail" and by["parity"]["fail_phase"] == "performance", by["parity"]


# -- the emulated 2-node cluster -----------------------------------------------------------------------------
# the session's emulated cluster (`emu`, tests/cluster/emulated.py), shared with the other cluster tests
@pytest.mark.distributed
def test_reframe_on_the_emulated_cluster_two_nodes_one_task_each(emu, tmp_path):
    """ReFrame on the login node submits to the emulated Slurm; each run spans node1 and node2."""
    prefix = tmp_path / "rfm"
    proc = emu.run("login", _reframe(), "-C", str(SETTINGS), "--system", "twinbench-emulated:debug", "-c", str(CHECK),
                   "--prefix", str(prefix), "--report-file", str(tmp_path / "report.json"), "-S", "num_nodes=2",
                   "-S", "num_tasks_per_node=1", "-S", "cpus_per_task=1", "-S", "repeats=1", "-r",
                   "--performance-report",
                   timeout=RFM_TIMEOUT, check=False)
    assert proc.returncode == 0, f"reframe exited {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    data, cases = _session(tmp_path / "report.json")
    assert data["session_info"]["num_failures"] == 0 and len(cases) == 1 + len(BACKENDS)
    _check_session(cases, prefix / "output", [(2, 1)])
    for rec in _records(prefix / "output"):
        assert rec["hosts"] == ["node1", "node2"], rec["hosts"]
    assert (prefix / "perflogs" / "twinbench-emulated" / "debug" / "TwinbenchParity.log").is_file()
