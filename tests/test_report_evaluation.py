"""common.report's validation section: time to target beside throughput, final validation numbers, and results
files from before validation (no TensorFlow: records written by hand, as in tests/test_report.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from common.report.build import ReportOptions, build_report
from common.report.load import load_runs
from common.workload.job import Job
from tests.test_report import JOB_A, csv_rows, make_run, put

JOB_T = Job(name="targeted", per_replica_batch_size=16, steps=12, metrics=("accuracy",), target_metric="accuracy",
            target_value=0.8)


def _evals(acc: float, wall: float) -> list[dict[str, Any]]:
    return [{"epoch": 1.0, "step": 4, "loss": 1.5, "accuracy": 0.5, "seconds": 0.2, "wall_time": wall / 2},
            {"epoch": 3.0, "step": 12, "loss": 0.4, "accuracy": acc, "seconds": 0.2, "wall_time": wall}]


def test_time_to_target_beside_throughput_and_final_validation(tmp_path: Path) -> None:
    d = tmp_path / "results"
    for i, (acc, wall, ttt) in enumerate([(0.9, 10.0, 10.0), (0.85, 12.0, 12.0), (0.7, 20.0, None)]):
        put(d, make_run("native", 1, 100.0 + i, job=JOB_T, evaluations=_evals(acc, wall), time_to_target_s=ttt))
    put(d, make_run("horovod", 1, 120.0, job=JOB_T, evaluations=_evals(0.95, 8.0), time_to_target_s=8.0))
    put(d, make_run("native", 1, 100.0, run_id="plain"))  # another job, from before validation: no fields at all
    out = tmp_path / "out"
    build_report(d, out, ReportOptions(plots=False))
    md = (out / "report.md").read_text()
    section = md.split("Job `targeted`")[1].split("### Notes")[0]
    assert "### Time to target and validation" in section
    rows = {c[0]: c for line in section.splitlines()
            if (c := [x.strip() for x in line.strip().strip("|").split("|")])[0] in ("native", "horovod")
            and len(c) == 10}
    # native: median of the repeats that reached it (10, 12) -> 11; 2 of 3 reached; final accuracy median 0.85
    assert rows["native"] == ["native", "1", "1x1", "1", "3", "101.0", "11.00", "2/3", "0.4000", "0.8500"]
    assert rows["horovod"] == ["horovod", "1", "1x1", "1", "1", "120.0", "8.00", "1/1", "0.4000", "0.9500"]
    assert "target: accuracy >= 0.8" in section
    csv_r = csv_rows(out / "report.csv")
    n = csv_r[(JOB_T.job_hash, "native", 1)]
    assert float(n["time_to_target_s"]) == 11.0 and n["target_reached_repeats"] == "2/3"
    assert n["final_validation"] == "loss=0.4;accuracy=0.85"
    # the job without evaluation: no section, empty columns, its scaling table as before
    plain = md.split("Job `small`")[1]
    assert "Time to target" not in plain.split("### Notes")[0]
    p = csv_r[(JOB_A.job_hash, "native", 1)]
    assert p["time_to_target_s"] == "" and p["target_reached_repeats"] == "" and p["final_validation"] == ""


def test_old_results_files_load_without_validation_fields(tmp_path: Path) -> None:
    d = tmp_path / "results"
    put(d, make_run("native", 1, 100.0))
    runs = load_runs(d)
    assert runs[0].record.evaluations == [] and runs[0].record.time_to_target_s is None
