"""Did the input keep up: the record's ``input`` field and the report's input-wait column (no TensorFlow), then real
runs where the input is made slow or the host pauses between steps (the test aids tests/aids/slow_input_aid.py and
tests/aids/pause_aid.py).

What the real runs check is what docs/measurement.md says the two methods measure: the custom loop times the fetch
of the batch and nothing else (a host pause between steps is not in it), Keras fit's "input + between steps"
includes the time between two steps, and a pipeline slower than the step shows as highly input-bound.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from common.report.render import format_csv, format_section
from common.report.summary import input_text, summarize
from tests.conftest import backend_cmd, base_env, only_result, pause_vars, run, slow_input_vars
from tests.test_report import make_run

SLOW = 0.05  # s each batch waits in the input pipeline (slow_input_vars)
PAUSE = 0.03  # s the host sleeps after each step (pause_vars; test_backends' clock test: the same)


def _input(method: str | None, fraction: float, kept_up: bool | None, bound: str | None = None) -> dict:
    return {"method": method, "wait_fraction": fraction, "kept_up": kept_up, "input_bound": bound,
            "threshold": 0.05, "wait_seconds_per_rank": [fraction]}


def test_report_shows_the_input_wait_per_row():
    ps_input = {"method": None, "kept_up": None, "reason": "the workers fetch their own batches"}
    runs = [make_run("native", 1, 100.0, input=_input("fetch", 0.004, True, "no"), run_id="a"),
            make_run("native", 1, 110.0, input=_input("fetch", 0.006, True, "no"), run_id="b"),
            make_run("native", 2, 150.0, input=_input("fetch", 0.23, False, "highly"), run_id="c"),
            make_run("native", 2, 160.0, input=_input("fetch", 0.03, True, "no"), run_id="d"),
            make_run("horovod", 1, 120.0, input=_input("gap", 0.48, None), run_id="e"),
            make_run("horovod", 2, 200.0, input=_input("gap", 0.02, True), run_id="f"),
            make_run("native", 4, 90.0, input=ps_input, asynchronous=True,
                     backend_info={"strategy": "parameter_server"}, run_id="g"),
            make_run("native", 4, 300.0, run_id="h")]  # an older file: no input field
    [s] = summarize(runs)
    rows = {(r.identity.label, r.identity.world_size): r for r in s.rows}
    text = {k: input_text(r) for k, r in rows.items()}
    assert text[("native", 1)] == "0.5% kept up"  # median of 0.4% and 0.6%
    # a row is kept up only if every repeat was: one highly input-bound repeat decides (median share 13%)
    assert text[("native", 2)] == "13.0% highly input-bound"
    assert text[("horovod", 1)] == "48.0% input + between steps"  # an upper bound: never called input-bound
    assert text[("horovod", 2)] == "2.0% input + between steps: kept up"
    assert text[("native (parameter_server, asynchronous)", 4)] == text[("native", 4)] == "n/a"
    assert any("input wait not measured (the workers fetch their own batches)" in n for n in s.notes)
    assert any(n.startswith("input wait:") and "input + between steps" in n and "below 5% kept up" in n
               for n in s.notes)
    md = format_section(s)
    assert "| input wait |" in md and "| 13.0% highly input-bound |" in md
    csv_rows = {(r["backend"], r["world_size"]): r for r in csv.DictReader(io.StringIO(format_csv([s])))}
    assert csv_rows[("native", "2")]["input_verdict"] == "highly input-bound"
    assert float(csv_rows[("native", "2")]["input_wait_fraction"]) == pytest.approx(0.13)
    assert csv_rows[("horovod", "1")]["input_method"] == "gap" and csv_rows[("native", "4")]["input_method"] == ""


# -- real runs (one process each, CPU) ---------------------------------------------------------------------
def _run(tmp_path: Path, kind: str, *extra: str, env: dict[str, str] | None = None) -> dict:
    run(backend_cmd(kind, tmp_path, *extra, workers=1), env={**base_env(), **(env or {})})
    return _one_rank(only_result(tmp_path))


def _one_rank(rec: dict) -> dict:
    assert rec["input"]["wait_seconds_per_rank"] and len(rec["input"]["wait_seconds_per_rank"]) == 1
    return rec


def _per_step(rec: dict) -> float:
    return rec["input"]["wait_seconds_per_rank"][0] / rec["step_time"]["timed_steps"]


@pytest.mark.parametrize("kind", ["native", "horovod"])
def test_slow_input_is_highly_input_bound(tmp_path, kind):
    rec = _run(tmp_path, kind, "--set", "mode=ctl", env=slow_input_vars(SLOW))
    inp = rec["input"]
    assert inp["method"] == "fetch" and inp["measures"] == "time waiting for the next batch"
    assert inp["kept_up"] is False and inp["input_bound"] == "highly" and inp["wait_fraction"] > 0.5
    # every timed step waited about SLOW for its batch, and never longer than the step itself
    assert 0.8 * SLOW <= _per_step(rec) <= rec["step_time"]["mean"]


@pytest.mark.timing  # asserts on wall-clock figures: run alone (tests/conftest.py)
def test_a_compute_bound_step_kept_up(tmp_path):
    """The same pipeline feeding a step of tens of milliseconds (a wide MLP): fetching a batch is then well under
    5% of the time. (The smoke job's own sub-millisecond steps spend 10-20% fetching here: see docs/measurement.md.)"""
    rec = _run(tmp_path, "native", "--set", "mode=ctl", "--set", "mlp_hidden=[4096, 4096]")
    assert rec["step_time"]["mean"] > 0.02, "the step is meant to be long compared with a fetch"
    assert rec["input"]["kept_up"] is True and rec["input"]["input_bound"] == "no"
    assert 0 <= rec["input"]["wait_fraction"] < 0.05


@pytest.mark.timing  # asserts on wall-clock figures: run alone (tests/conftest.py)
def test_fetch_excludes_and_gap_includes_time_between_steps(runner):
    """A host pause after every step: not in the custom loop's fetch time, all in fit's "input + between steps"."""
    # the session's runs (tests/test_backends.py::test_clock_counts_time_between_steps times the same ones)
    ctl = _one_rank(runner("native", "--set", "mode=ctl", workers=1, env=pause_vars(PAUSE)))
    fit = _one_rank(runner("native", "--set", "mode=fit", workers=1, env=pause_vars(PAUSE)))
    assert _per_step(ctl) < PAUSE / 3, ctl["input"]
    assert fit["input"]["method"] == "gap" and fit["input"]["measures"] == "input + between steps"
    assert PAUSE <= _per_step(fit) <= fit["step_time"]["mean"], fit["input"]
    assert fit["input"]["kept_up"] is None and fit["input"]["input_bound"] is None  # undecided, not input-bound
