"""scripts/demo.sh finishes what it can (tests/fake_demo_run.py's runs, no TensorFlow): a diagnostic the job
cannot have is skipped with its one-line reason and the demo still ends with the report and the verdict (exit 0); a
benchmark run that fails is named, the report of the runs that finished is still written, and the demo exits 1."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO
from tests.test_demo_until import fake_demo

REFUSAL = "--diagnose breakdown cannot split this job's step: a reason in one line"


def test_a_refused_diagnostic_is_skipped_and_the_demo_ends_with_the_verdict(tmp_path: Path) -> None:
    proc, out = fake_demo(tmp_path, REPEATS="1", FAKE_DEMO_REFUSE=REFUSAL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    skipped = [ln for ln in proc.stdout.splitlines() if ln.startswith("[demo] skipped")]
    assert skipped == [f"[demo] skipped breakdown-{b}-{n}: {REFUSAL}" for n in (1, 2) for b in ("native", "horovod")]
    assert (out / "report" / "report.md").is_file() and (out / "report" / "report.html").is_file()
    last = proc.stdout.rstrip().splitlines()[-2:]  # the verdict lines end the output, one per layout
    assert [re.match(r"  \d+ nodes? x \d+ ranks?: ", ln) is not None for ln in last] == [True, True], last


def test_a_failed_run_is_named_and_the_report_of_the_others_still_written(tmp_path: Path) -> None:
    proc, out = fake_demo(tmp_path, REPEATS="2", FAKE_DEMO_FAIL="native 2")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("FAILED (exit 1)") == 2  # both repeats of the cell, each with its log's tail
    assert "[demo] 2 run(s) FAILED (native-2-r1 native-2-r2): the report below holds the runs that finished" \
        in proc.stdout
    md = (out / "report" / "report.md").read_text()
    assert "| horovod | 2 |" in md and "| native | 2 |" not in md  # the runs that finished, and only those
    # two rounds give each cell its range, labelled (the proof tests/test_demo.py's real demo made at REPEATS=2)
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith(("| native | 1 |", "| horovod |"))]
    assert len(rows) == 3 and all("| 2 |" in r and "min-max (n=2)" in r for r in rows), rows
    assert len((out / "order.txt").read_text().splitlines()) == 2 * 3  # every other cell still ran, twice


def test_a_job_mistake_is_one_line_before_any_run(tmp_path: Path) -> None:
    """A data directory that does not exist (or a misspelt argument) stops the demo before its first run, in one
    line naming the key, with nothing written: not the same error in each of its runs."""
    job = tmp_path / "job.toml"
    job.write_text((REPO / "examples" / "stream_job.toml").read_text().replace(
        'pythonpath = ["."]', f'pythonpath = ["{REPO / "examples"}"]').replace(
        "/tmp/twinbench-stream", str(tmp_path / "nowhere")))
    proc, out = fake_demo(tmp_path, JOB=str(job))
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        f"demo: JOB={job}: dataset_args.data_dir = '{tmp_path / 'nowhere'}': '{tmp_path / 'nowhere'}' does not exist "
        "here"]
    assert not out.exists()
