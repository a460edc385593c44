"""scripts/demo.sh runs the parity check of its own job after the benchmark and breakdown runs and before the report,
into $OUT/check (where the report reads the verdict, never the check's runs), and the report's "leave Horovod" table
answers every row from it; a check that wrote no verdict is named as a failure, and an earlier demo's check is moved
aside, never taken for this one's. Fake runs and a fake check (tests/fake_demo_run.py): no TensorFlow."""

from __future__ import annotations

from pathlib import Path

from tests.test_demo_until import fake_demo

HEADING = "## Can this job leave horovod for native MultiWorkerMirroredStrategy?"


def rows(out: Path) -> dict[str, str]:
    """The leave-Horovod table's answer column, by question."""
    md = (out / "report" / "report.md").read_text()
    part = md[md.index(HEADING):]
    cells = [ln.split(" | ") for ln in part.splitlines() if ln.startswith("| ")]
    return {c[0].lstrip("| "): c[-1].rstrip(" |") for c in cells}


def test_the_demo_checks_its_job_and_the_report_answers_every_row(tmp_path: Path) -> None:
    proc, out = fake_demo(tmp_path, REPEATS="1", FAKE_DEMO_CHECK="scales")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (cmd,) = (tmp_path / "check_commands.txt").read_text().splitlines()
    assert cmd == (f"--job jobs/demo.toml --set steps=200 --set timing_warmup_steps=10 --steps 6 --modes ctl "
                   f"--timeout 600 --results {out}/check")
    lines = proc.stdout.splitlines()
    at = {name: next(i for i, ln in enumerate(lines) if ln.startswith(name))
          for name in ("breakdown-horovod-2", "check ", "plots and the full report")}
    assert at["breakdown-horovod-2"] < at["check "] < at["plots and the full report"]  # after the timed runs
    assert lines[at["check "]].startswith("check") and "exit 6" in lines[at["check "]]
    said = [ln for ln in lines if ln.startswith("[demo] check:")]
    assert [s.split(":")[1].strip() for s in said] == ["same math", "scales exactly", "fit = custom loop"]
    answers = rows(out)
    assert answers["same math"].startswith("yes: 2 pairs agree to 1e-05, bit for bit (native = horovod in ctl at 1 "
                                           "and 2 workers) (common.check of this job, ")
    assert answers["scales exactly: 1 worker x 2b = 2 workers x b"] == (
        "no: native ctl: 1 worker x 2b vs 2 workers x b: loss differs, step 1: 2.5 vs 2.6; likely cause: "
        "per-replica random draws: Dropout")
    assert answers["fit = custom loop"] == "not compared: one mode checked (ctl: --modes)"
    assert sorted(p.name for p in (out / "check").iterdir()) == ["check.json"]


def test_a_failed_check_is_named_and_an_earlier_check_is_not_taken_for_it(tmp_path: Path) -> None:
    proc, out = fake_demo(tmp_path, REPEATS="1")
    assert proc.returncode == 0 and rows(out)["same math"].startswith("yes: "), proc.stdout[-3000:]
    again, out = fake_demo(tmp_path, REPEATS="1", FAKE_DEMO_CHECK="fail")
    assert again.returncode == 1, again.stdout[-3000:] + again.stderr[-3000:]
    assert "[demo] 1 run(s) FAILED (check): the report below holds the runs that finished" in again.stdout
    assert "RuntimeError: a rank died" in again.stdout  # the log's tail
    (earlier,) = (out / "previous").glob("check-*/check.json")  # the first demo's, moved aside
    assert not (out / "check" / "check.json").exists()
    answers = rows(out)
    assert answers["same math"].startswith("not checked: no common.check result for this job")
    assert answers["scales exactly: 1 worker x 2b = 2 workers x b"] == "not checked"
