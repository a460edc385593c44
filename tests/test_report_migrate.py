"""common.report.migrate: "can this job leave Horovod for native MWMS?", one table per job in report.md,
report.html and migration.csv, from fake records (tests.test_report's helpers) and hand-written check.json files.
No TensorFlow."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from common.cluster import machine
from common.report.build import ReportOptions, build_report
from common.report.migrate import CHECK_FILE, check_summary
from common.report.render import md_table
from common.workload.job import Job
from tests.test_report import JOB_A, put
from tests.test_report_verdict import cell

HEADING = "## Can this job leave horovod for native MultiWorkerMirroredStrategy?"
NATIVE_STACK = {"python": "3.11.9", "tensorflow": "2.21.0", "tf_keras": "2.21.0"}
HOROVOD_STACK = {**NATIVE_STACK, "horovod": "0.28.1", "horovod_patch": "bebb506487fc"}


def memory(mib: int) -> dict[str, Any]:
    return machine.combine([{"host": "n0", "cpu": {"model": "C"}, "gpu": dict(machine.NO_GPU),
                             "memory": {"peak_rss_bytes": mib * 2**20, "peak_gpu_bytes": None}}])


def results(d: Path, backends: tuple[str, ...] = ("native", "horovod")) -> Path:
    """Six runs a cell at 1 and 2 replicas on one CPU node: horovod 32% faster at 2, both slower than at 1."""
    speeds = {("native", 1): 200.0, ("native", 2): 102.0, ("horovod", 1): 200.0, ("horovod", 2): 134.6}
    for (b, ws), ips in speeds.items():
        if b in backends:
            for rec in cell(b, ws, ips, versions=HOROVOD_STACK if b == "horovod" else NATIVE_STACK,
                            machine=memory(800 if b == "native" else 810)):
                put(d, rec)
    return d


def check(d: Path, job: dict[str, Any], status: int = 0, line: str = "all 12 pairs agree to 1e-05") -> None:
    """The check.json common.check would write (migrate.check_summary) for ``job``."""
    h = Job(**{k: tuple(v) if isinstance(v, list) else v for k, v in job.items()}).job_hash
    d.mkdir(parents=True, exist_ok=True)
    (d / CHECK_FILE).write_text(json.dumps(check_summary(job, h, status, line, 1e-5, "2026-11-27T10:00:00+00:00")))


def section(md: str) -> str:
    return md[md.index(HEADING):md.index("## Method")]


def test_the_section_answers_in_md_html_and_csv_alike(tmp_path: Path) -> None:
    d = results(tmp_path / "r")
    build_report(d, options=ReportOptions(plots=False))
    md = (d / "report" / "report.md").read_text()
    assert md.index("## Verdict") < md.index(HEADING) < md.index("## Method")
    part = section(md)
    assert "| same math |  |  | not checked: no common.check result for this job in the results directories" in part
    assert "| images/s, 2 replicas (1x2) | 102.0 [" in part and "95% CI | horovod is 32% faster than native [" in part
    assert "| peak memory per rank, 1 replica (1x1) | 800 MiB host RSS | 810 MiB host RSS |  |" in part
    assert ("| needs installed | TensorFlow 2.21.0 (with tf-keras 2.21.0): MultiWorkerMirroredStrategy is part of "
            "TensorFlow, nothing else | the same, plus Horovod 0.28.1 compiled against TensorFlow 2.21.0 (its sdist "
            "patched: bebb506487fc) and its launcher (horovodrun, or MPI) |  |") in part
    assert ("| these runs cannot tell |  |  | GPUs and NCCL (every run here on CPU); more than 1 node or 2 replicas "
            "(the largest measured); other machines, networks, models or batch sizes than these runs' |") in part
    assert "time to target" not in part  # the job sets no target
    with (d / "report" / "migration.csv").open() as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["job_hash", "job_name", "question", "native (MultiWorkerMirroredStrategy)", "horovod",
                       "horovod vs native"]
    assert {r[0] for r in rows[1:]} == {JOB_A.job_hash} and {r[1] for r in rows[1:]} == {"small"}
    assert md_table(rows[0][2:], [r[2:] for r in rows[1:]]) in part  # the same cells as report.md's table
    html = (d / "report" / "report.html").read_text()
    assert "<h2>Can this job leave horovod for native MultiWorkerMirroredStrategy?</h2>" in html
    assert "<td>needs installed</td><td>TensorFlow 2.21.0 (with tf-keras 2.21.0)" in html


def test_a_check_result_says_same_math_when_it_is_of_this_job(tmp_path: Path) -> None:
    """check.json of this job (its hash), of the job with other steps and mode (the same step), of another job (a
    hashed key that changes the math: not this job's check), and a failed one."""
    d = results(tmp_path / "r")
    job = JOB_A.to_dict()

    def same_math() -> str:
        build_report(d, options=ReportOptions(plots=False), warn=warnings.append)
        part = section((d / "report" / "report.md").read_text())
        return next(x for x in part.splitlines() if x.startswith("| same math |"))

    warnings: list[str] = []
    check(d / "check", job)
    assert same_math() == ("| same math |  |  | yes: all 12 pairs agree to 1e-05 (common.check of this job, "
                           "2026-11-27T10:00:00+00:00) |")
    assert warnings == []  # check.json is not a training run
    check(d / "check", {**job, "steps": 20, "mode": "ctl", "name": "renamed"})
    assert "yes: all 12 pairs agree to 1e-05 (common.check of this job with other mode, steps," in same_math()
    check(d / "check", {**job, "learning_rate": 0.5})
    assert "| same math |  |  | not checked:" in same_math()
    check(d / "check", job, 1, "DIFFERS: native vs horovod, fit, 2 workers: loss differs, step 3: 0.5 vs 0.6")
    assert "| NO: DIFFERS: native vs horovod, fit, 2 workers: loss differs, step 3" in same_math()
    (d / "check" / CHECK_FILE).write_text(json.dumps({"kind": "check", "job": job, "line": "x"}))  # no status
    assert "| same math |  |  | not checked:" in same_math()
    assert warnings[-1].endswith("check.json: a check result needs job, job_hash, status and line")


def test_one_backend_alone_has_no_section_and_no_csv(tmp_path: Path) -> None:
    d = results(tmp_path / "r", ("native",))
    paths = build_report(d, options=ReportOptions(plots=False)).paths
    assert HEADING not in (d / "report" / "report.md").read_text()
    assert "migration.csv" not in [p.name for p in paths]


def test_time_to_target_and_gpu_runs(tmp_path: Path) -> None:
    """A job with a target shows each side's time to target; runs on GPUs do not claim GPUs as unmeasured."""
    job = replace(JOB_A, target_metric="loss", target_value=0.6)
    d = tmp_path / "r"
    for b, ttt in (("native", 30.0), ("horovod", 25.0)):
        for rec in cell(b, 2, 100.0, job=job, time_to_target_s=ttt, devices=["/physical_device:GPU:0"] * 2):
            put(d, rec)
    build_report(d, options=ReportOptions(plots=False))
    part = section((d / "report" / "report.md").read_text())
    assert "| time to target, 2 replicas (1x2) | 30.0 s (6/6 reached) | 25.0 s (6/6 reached) |  |" in part
    assert "GPUs and NCCL" not in part and "more than 1 node or 2 replicas" in part
