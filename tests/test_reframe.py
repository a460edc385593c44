"""The ReFrame check (jobs/reframe/twinbench_check.py) against the test Slurm cluster, as a centre runs it:
``reframe -C jobs/reframe/settings.py -c jobs/reframe/twinbench_check.py -r``, both backends at 1 and 2 tasks. All
four pass their sanity (exit 0, summary lines, the job file's hash printed and recorded) and report the performance
variables; the four ran the same job. The `cluster` fixture is tests/conftest.py's (one cluster per session)."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from common.workload.job import load_job
from tests.conftest import BIN, REPO, SMOKE, run

CHECK = REPO / "jobs" / "reframe" / "twinbench_check.py"
SETTINGS = REPO / "jobs" / "reframe" / "settings.py"
PERF_VARS = ("total_img_s", "total_img_s_lo95", "total_img_s_hi95",
             "img_s_per_gpu", "img_s_per_gpu_lo95", "img_s_per_gpu_hi95")


def _reframe() -> str:
    exe = BIN / "reframe"
    if not exe.exists():
        pytest.skip("reframe-hpc is not installed (make setup)")
    return str(exe)


def test_check_lists_four_tests_without_a_cluster(tmp_path):
    proc = run([_reframe(), "-C", str(SETTINGS), "-c", str(CHECK), "--prefix", str(tmp_path), "-l"])
    found = re.findall(r"^- TwinbenchCheck %backend=(\w+) %tasks=(\d)", proc.stdout, re.M)
    assert sorted(found) == [("horovod", "1"), ("horovod", "2"), ("native", "1"), ("native", "2")], proc.stdout


@pytest.mark.distributed
def test_reframe_runs_both_backends_at_one_and_two_tasks(cluster, tmp_path):
    exe = _reframe()
    if shutil.which("squeue", path=cluster.env()["PATH"]) is None:
        pytest.skip("no squeue")
    report = tmp_path / "report.json"
    proc = run([exe, "-C", str(SETTINGS), "-c", str(CHECK), "--prefix", str(tmp_path / "rfm"),
                "--report-file", str(report), "-S", "cpus_per_task=2", "-r", "--performance-report"],
               env=cluster.env(), timeout=400, check=False)
    assert proc.returncode == 0, f"reframe exited {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    data = json.loads(report.read_text())
    cases = [c for r in data["runs"] for c in r["testcases"]]
    assert len(cases) == 4 and all(c["result"] == "pass" for c in cases), [(c["name"], c["result"]) for c in cases]
    assert data["session_info"]["num_failures"] == 0
    assert sorted((c["backend"], c["tasks"]) for c in cases) == [("horovod", 1), ("horovod", 2), ("native", 1),
                                                                ("native", 2)]
    for c in cases:  # perfvalues: "system:partition:var" -> [value, reference, lower, upper, unit, result]
        values = {key.rsplit(":", 1)[1]: v[0] for key, v in c["perfvalues"].items()}
        assert set(values) == set(PERF_VARS), c["name"]
        assert 0 < values["total_img_s_lo95"] <= values["total_img_s"] <= values["total_img_s_hi95"], values
        assert values["img_s_per_gpu"] == pytest.approx(values["total_img_s"] / c["tasks"], rel=0.01, abs=0.1), values
    for var in PERF_VARS:  # the performance report and the perflog name every variable
        assert var in proc.stdout, var
    perflog = (tmp_path / "rfm" / "perflogs" / "twinbench-local" / "debug" / "TwinbenchCheck.log").read_text()
    assert all(f"{var}_value" in perflog.splitlines()[0] for var in PERF_VARS)
    assert len(perflog.splitlines()) == 5 and all(ln.startswith("pass|") for ln in perflog.splitlines()[1:])
    # the same job everywhere: the job file's hash, as each test's output printed it
    outs = sorted((tmp_path / "rfm" / "output").rglob("rfm_job.out"))
    hashes = {re.search(r"^\[reframe\] recorded job_hash (\w+)", o.read_text(), re.M).group(1) for o in outs}
    assert len(outs) == 4 and hashes == {load_job(SMOKE).job_hash}, (outs, hashes)
