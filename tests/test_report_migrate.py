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
from common.report import migrate
from common.report.build import ReportOptions, build_report
from common.report.migrate import CHECK_FILE, NO, NOT_COMPARED, SAME_MATH, SCALES, YES, Answer, check_summary
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


def check(d: Path, job: dict[str, Any], status: int = 0, line: str = "all 12 pairs agree to 1e-05",
          answers: dict[str, Answer] | None = None, when: str = "2026-11-27T10:00:00+00:00") -> str:
    """The check.json common.check would write (migrate.check_summary) for ``job``: schema 1 (status and line)
    without ``answers``; returns the job's hash."""
    h = Job(**{k: tuple(v) if isinstance(v, list) else v for k, v in job.items()}).job_hash
    d.mkdir(parents=True, exist_ok=True)
    (d / CHECK_FILE).write_text(json.dumps(check_summary(job, h, status, line, 1e-5, when, answers)))
    return h


def answers(d: Path) -> dict[str, str]:
    """The report's leave-Horovod answers, by question (the table's last column)."""
    build_report(d, options=ReportOptions(plots=False), warn=lambda w: None)
    part = section((d / "report" / "report.md").read_text())
    cells = [ln.split(" | ") for ln in part.splitlines() if ln.startswith("| ")]
    return {c[0].lstrip("| "): c[-1].rstrip(" |") for c in cells}


SCALING_ROW = "scales exactly: 1 worker x 2b = 2 workers x b"
DROPOUT_ANSWERS = {
    SAME_MATH: Answer(YES, "2 pairs agree to 1e-05, bit for bit (native = horovod in ctl at 1 and 2 workers)"),
    SCALES: Answer(NO, "native ctl: 1 worker x 2b vs 2 workers x b: loss differs, step 1: 2.68 vs 2.79 (the same "
                       "numbers on horovod: the job's own math, not a backend's)",
                   ("per-replica random draws: droppkg/model.py's build uses Dropout",), True),
    migrate.MODES: Answer(NOT_COMPARED, "one mode checked (ctl: --modes)")}


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
    assert "<td>needs installed</td><td class=\"prose\">TensorFlow 2.21.0 (with tf-keras 2.21.0)" in html


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
    assert "|  |  | NO: native vs horovod, fit, 2 workers: loss differs, step 3: 0.5 vs 0.6 (common.check of this" \
        in same_math()
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


def test_a_dropout_job_can_leave_horovod_and_its_scaling_row_says_why_it_differs(tmp_path: Path) -> None:
    """The issue's false NO: native = Horovod bit for bit, 1 worker x 2b vs 2 workers x b differs (Dropout). Same
    math yes, the scaling row explains, read from a check.json of either shape (common.check's answers, or an older
    file whose one line named the scaling pair: the backend pairs before it agreed)."""
    d = results(tmp_path / "r")
    line = ("SCALES INEXACTLY (exit 6): the backends agree (same math), but native ctl: 1 worker x 2b vs 2 workers x "
            "b: loss differs, step 1: 2.68 vs 2.79 (tolerance 1e-05)")
    check(d / "check", JOB_A.to_dict(), 6, line, DROPOUT_ANSWERS)
    got = answers(d)
    assert got["same math"] == ("yes: 2 pairs agree to 1e-05, bit for bit (native = horovod in ctl at 1 and 2 "
                                "workers) (common.check of this job, 2026-11-27T10:00:00+00:00)")
    assert got[SCALING_ROW] == ("no: native ctl: 1 worker x 2b vs 2 workers x b: loss differs, step 1: 2.68 vs 2.79 "
                                "(the same numbers on horovod: the job's own math, not a backend's); likely cause: "
                                "per-replica random draws: droppkg/model.py's build uses Dropout")
    assert got["fit = custom loop"] == "not compared: one mode checked (ctl: --modes)"
    old = "DIFFERS: native ctl: 1 worker x 2b vs 2 workers x b: loss differs, step 1: 2.68 vs 2.79 (tolerance 1e-05)"
    check(d / "check", JOB_A.to_dict(), 1, old)  # schema 1: what common.check wrote before it told them apart
    got = answers(d)
    assert got["same math"].startswith("yes: the native vs Horovod pairs agreed (an older check: it stopped at the "
                                       "first pair that differs, native ctl)")
    assert got[SCALING_ROW] == "no: " + old.removeprefix("DIFFERS: ")  # its cause not recorded then
    assert got["fit = custom loop"].startswith("not known: an older check.json gives one verdict for every pair")
    check(d / "check", JOB_A.to_dict(), 1, "DIFFERS: native vs horovod, ctl, 2 workers: loss differs, step 2: 1 vs 2")
    got = answers(d)
    assert got["same math"].startswith("NO: native vs horovod, ctl, 2 workers: loss differs, step 2: 1 vs 2")
    assert got[SCALING_ROW].startswith("not known: ")


def test_checks_of_other_code_of_the_job_name_are_named_never_silently_not_checked(tmp_path: Path) -> None:
    """A check of the same job name whose user code changed since (another code_digest: another hash) is named with
    the command that checks this code; with several hashes, each is named and the newest of this job's used."""
    d = results(tmp_path / "r")
    job = JOB_A.to_dict()
    other = check(d / "old-code", {**job, "code_digest": "0123456789abcdef"}, when="2026-11-28T10:00:00+00:00")
    got = answers(d)
    assert got["same math"] == (f"not checked: a check of other code (hash {other}, 2026-11-28T10:00:00+00:00, "
                                f"{d / 'old-code' / CHECK_FILE}) was found, not of this job: rerun `python -m "
                                "common.check --job JOB.toml`")
    assert got[SCALING_ROW] == got["fit = custom loop"] == "not checked"
    third = check(d / "other-lr", {**job, "learning_rate": 0.5}, when="2026-11-29T10:00:00+00:00")
    check(d / "mine", job, answers=DROPOUT_ANSWERS, when="2026-11-26T10:00:00+00:00")  # the oldest: still used
    got = answers(d)
    assert got["same math"].startswith("yes: 2 pairs agree to 1e-05, bit for bit (native = horovod in ctl at 1 and 2 "
                                       "workers) (common.check of this job, 2026-11-26T10:00:00+00:00); also found: ")
    assert f"a check of other code (hash {other}, 2026-11-28" in got["same math"]
    assert f"a check of this job name with other learning_rate (hash {third}, 2026-11-29" in got["same math"]
    assert got[SCALING_ROW].startswith("no: native ctl: 1 worker x 2b vs 2 workers x b")


def test_the_rerun_command_is_the_runs_job_file_and_its_math_overrides() -> None:
    from types import SimpleNamespace

    def summary(*commands: list[str]) -> Any:
        return SimpleNamespace(records=[SimpleNamespace(command=c) for c in commands])

    run = ["python", "-m", "backends.native", "--nproc", "2", "--job", "my job.toml", "--set", "steps=200",
           "--set=learning_rate=0.1", "--results", "r"]
    assert migrate.rerun(summary(None, run)) == \
        "python -m common.check --job 'my job.toml' --set learning_rate=0.1"  # steps: the check's own
    assert migrate.rerun(summary(["python", "-m", "backends.native"])) == "python -m common.check --job JOB.toml"


def test_constructs_not_carried_over_from_horovod_are_listed() -> None:
    """The records' ``job.not_carried`` (written by the port of a Horovod script), read by name whatever its shape:
    each construct once, in the leave-Horovod table."""
    from types import SimpleNamespace

    def summary(*values: Any) -> Any:
        return SimpleNamespace(records=[SimpleNamespace(job={"not_carried": v}) for v in values])

    assert migrate.not_carried(summary(None, [])) is None
    assert migrate.not_carried(summary(["ModelCheckpoint", {"name": "Compression.fp16", "why": "no MWMS "
                                                            "counterpart"}], ["ModelCheckpoint"],
                                       {"backward_passes_per_step": "accumulation"}, "x", 3)) == \
        "ModelCheckpoint; Compression.fp16: no MWMS counterpart; backward_passes_per_step: accumulation"
