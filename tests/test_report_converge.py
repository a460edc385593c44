"""Issue 23's convergence rule (common.report.converge) and ``python -m common.report DIR --until WIDTH``.

Fast (no TensorFlow): synthetic records written into tmp_path (tests/test_report.py's make_run and put).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from common.report import converge
from common.report.cli import main
from common.report.load import load_runs
from common.report.stats import Interval
from common.report.summary import summarize
from tests.conftest import PY, REPO
from tests.test_report import JOB_B, make_run, put

TIGHT = [100.0, 101.0, 99.0, 100.5, 99.5, 100.2]  # 95% CI [99, 101] around 100.1: 1.1% wide
SPREAD = [100.0, 120.0, 80.0, 110.0, 90.0, 100.0]  # 95% CI [80, 120] around 100: 20% wide


def cells(tmp_path: Path, **series: list[float]) -> Path:
    """A results directory with one cell per keyword: ``native_2=[...]`` is native at 2 replicas."""
    d = tmp_path / "r"
    for key, values in series.items():
        backend, ws = key.rsplit("_", 1)
        for i, v in enumerate(values):
            put(d, make_run(backend, int(ws), v, run_id=f"{key}-{i}"))
    return d


def checks_of(d: Path, width: float = 0.05) -> dict[str, converge.CellCheck]:
    return {c.cell: c for c in converge.check(summarize(load_runs(d)), width)}


def test_six_tight_runs_converge_six_spread_do_not_and_five_tight_never(tmp_path: Path) -> None:
    got = checks_of(cells(tmp_path, native_1=TIGHT, native_2=SPREAD, horovod_1=TIGHT[:5]))
    tight, spread, five = got["native 1 replica (1x1)"], got["native 2 replicas (2x1)"], got["horovod 1 replica (1x1)"]
    assert tight.converged and tight.interval.kind == "95% CI" and tight.width == pytest.approx(1.1 / 100.1)
    assert not spread.converged and spread.width == pytest.approx(0.20) and spread.why() == "20.0% wide"
    # five runs within 1% of each other: their min-max is narrow, but it is no confidence interval
    assert five.interval.kind == "min-max" and five.width < 0.05
    assert not five.converged and five.why() == "5 of 6 runs"
    assert not converge.converged(list(got.values()))


def test_the_width_is_the_wider_side_and_the_bound_is_inclusive() -> None:
    iv = Interval(95.0, 101.0, "95% CI", 6, 0.97)
    assert converge.relative_half_width(100.0, iv) == pytest.approx(0.05)  # the low side, not (101 - 95) / 2
    row = summarize([make_run("native", 1, v, run_id=f"x{i}")
                            for i, v in enumerate([95.0, 99.0, 100.0, 100.0, 100.0, 101.0])])[0].rows[0]
    assert converge.check_row(row, 0.05).converged  # half-width 5.0% <= 5%: within
    assert not converge.check_row(row, 0.049).converged


def test_a_single_run_has_no_interval_and_several_jobs_name_their_cells(tmp_path: Path) -> None:
    runs = [make_run("native", 1, v, run_id=f"a{i}") for i, v in enumerate(TIGHT)]
    runs.append(make_run("native", 1, 100.0, job=JOB_B, run_id="b"))
    got = converge.check(summarize(runs), 0.05)
    assert [(c.cell, c.converged) for c in got] == [("bigger: native 1 replica (1x1)", False),
                                                    ("small: native 1 replica (1x1)", True)]
    assert got[0].interval is None and got[0].width is None and got[0].why() == "1 of 6 runs"
    assert converge.verdict(got, 0.05) == "not yet within 5%: bigger: native 1 replica (1x1) 1 of 6 runs"


@pytest.mark.parametrize("text,value", [("5%", 0.05), ("2.5%", 0.025), ("0.05", 0.05), (" 10% ", 0.1), (".1", 0.1)])
def test_widths_accepted(text: str, value: float) -> None:
    assert converge.parse_width(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["5", "0%", "0", "abc", "100%", "-5%", "5 %", "", "1"])
def test_widths_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--until"):
        converge.parse_width(text)


def test_cli_exit_status_table_and_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = cells(tmp_path, native_1=TIGHT, horovod_1=TIGHT)
    assert main([str(d), "--until", "5%"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "every cell within 5% of its median (2 cells)"
    assert all(ln.endswith("converged") for ln in out[1:3]) and "[99.0, 101.0] 95% CI" in out[1]
    assert not (d / "report").exists(), "--until writes nothing"
    put(d, make_run("native", 2, 100.0, run_id="n2-0"))
    put(d, make_run("native", 2, 90.0, run_id="n2-1"))
    assert main([str(d), "--until", "0.05"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "not yet within 5%: native 2 replicas (2x1) 2 of 6 runs"
    [n2] = [ln for ln in out if ln.startswith("native 2 replicas")]
    assert n2.endswith("not yet (2 of 6 runs)") and "min-max (n=2)" in n2
    assert main([str(d), "--until", "50%"]) == 1, "fewer than 6 runs never converge, however wide the bound"


@pytest.mark.parametrize("width", ["5", "0%", "abc"])
def test_cli_refuses_a_bad_width_in_one_line(tmp_path: Path, width: str) -> None:
    d = cells(tmp_path, native_1=TIGHT)
    proc = subprocess.run([PY, "-m", "common.report", str(d), "--until", width], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "--until" in proc.stderr
    assert not (d / "report").exists()


def test_cli_with_no_results_is_bad_input(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty"), "--until", "5%"]) == 2
