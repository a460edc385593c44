"""``StepHooks`` built from named parts (``common.training.hostsync.Part``): what every part is called with and in
which order at a sync, the structure rule that keeps parts from being assigned after construction, and a figure
sampled at syncs added end to end the way docs/architecture.md ("Adding a measured figure to the report", second
kind) says: one part, one record field, one column. No TensorFlow: fake clock, fake backend, fake counter.
"""

from __future__ import annotations

import ast
import csv
import dataclasses
import sys
import types
from dataclasses import dataclass
from typing import Any

import pytest

from common.cluster import energy, machine
from common.core import results
from common.core.contract import Capabilities, Collective
from common.core.results import RunRecord, write_record
from common.report import document, load
from common.report.build import ReportOptions, build_report
from common.report.document import Column, number
from common.report.stats import num
from common.report.summary import from_runs
from common.training import compiled, hostsync, train
from common.training.context import Plan, RunContext
from common.training.reliability import Preemption
from common.training.runconfig import RunOptions
from common.workload.job import Job
from tests.conftest import REPO
from tests.test_clock import FakeClock
from tests.test_report_new_figure import html_tables, md_tables, scaling

sys.path.insert(0, str(REPO / "scripts"))
import check_structure  # noqa: E402

STEPS, SYNC_EVERY, WARM = 10, 3, 2


class Recorder(hostsync.Quiet):
    """A part writing what it is called with into a shared log, with the number of clock marks taken so far."""

    def __init__(self, name: str, log: list[Any], before_mark: bool = False, wants_at: int = 0) -> None:
        self.name, self.log, self.before_mark, self.wants_at = name, log, before_mark, wants_at
        self.clock: hostsync.TrainingClock | None = None

    def start(self, at: hostsync.At) -> None:
        self.clock = at.clock
        self.log.append((self.name, "start", at.done, len(at.clock.marks)))

    def wants_sync(self, last: int, done: int, global_step: int) -> bool:
        return done == self.wants_at

    def at_sync(self, at: hostsync.At) -> None:
        self.log.append((self.name, "sync", at.done, len(at.clock.marks)))

    def measured(self) -> dict[str, Any]:
        return {self.name: len(self.log)}


def fake_backend(log: list[Any] | None = None) -> Any:
    """One chief rank: allgather and allsum as one process does them (the agreement's allsum logged)."""

    def allsum(values: list[float]) -> list[float]:
        if log is not None:
            log.append(("agreement", "allsum"))
        return values

    return types.SimpleNamespace(
        name="native", num_workers=1, rank=0, is_chief=True, allgather=lambda x: [x], allsum=allsum,
        info=types.SimpleNamespace(local_rank=0, local_size=1, cpus=(0,), cpu_bind="none", device="cpu"),
        describe=lambda: {}, capabilities=lambda: Capabilities(Collective("auto", "n/a", "one process")),
        train_loop=lambda: (lambda *a: None))  # a loop of its own: no input clock, no evaluator (no TensorFlow)


def context(backend: Any, check: int = 0) -> RunContext:
    job = Job(name="m", per_replica_batch_size=4, steps=STEPS, sync_every_steps=SYNC_EVERY, timing_warmup_steps=WARM)
    opts = RunOptions(t_process_start=0.0, command=("python",), verbose=False, preempt_check_steps=check)
    ctx = RunContext(job, backend, opts, Plan(4, STEPS, STEPS, 1))  # type: ignore[arg-type]
    return dataclasses.replace(ctx, recipe=compiled.recipe(job, None, 1))


def drive(monkeypatch: pytest.MonkeyPatch, hooks: hostsync.StepHooks, clock: FakeClock, step_s: float = 1.0) -> None:
    """The loops' calls (start_clock, step_ended after each step, sync when due), each step ``step_s`` s."""
    monkeypatch.setattr(hostsync.time, "perf_counter", clock)
    hooks.start_clock()
    while hooks.global_step < STEPS:
        clock.now += step_s
        if hooks.step_ended(hooks.dispatched + 1) and hooks.sync([1.0] * (hooks.dispatched - hooks.synced)):
            break


def test_parts_act_in_order_around_the_mark_and_before_the_agreement(monkeypatch):
    """At the start and at every sync: the parts before the mark, the mark, the others in the order given; the
    preemption agreement (a collective) after all of them. A part's own sync request adds a sync."""
    log: list[Any] = []
    backend = fake_backend(log)
    parts = (Recorder("after1", log), Recorder("before", log, before_mark=True), Recorder("after2", log, wants_at=5))
    hooks = hostsync.StepHooks(context(backend, check=4), 0, Preemption(), parts)
    drive(monkeypatch, hooks, FakeClock())
    assert [d for d, _ in hooks.marks] == [0, 1, 2, 3, 4, 5, 6, 8, 9, 10]  # 5: after2 asked; 4, 8: the agreement
    assert log[:3] == [("before", "start", 0, 0), ("after1", "start", 0, 1), ("after2", "start", 0, 1)]
    at_4 = [e for e in log if e[2:3] == (4,) or e[0] == "agreement"]
    assert at_4[:4] == [("before", "sync", 4, 4), ("after1", "sync", 4, 5), ("after2", "sync", 4, 5),
                        ("agreement", "allsum")]
    assert sum(e[0] == "agreement" for e in log) == 2  # at 4 and 8, never at the last step
    assert hooks.measured() == {"after1": len(log), "before": len(log), "after2": len(log)}


def test_parts_untimed_steps_set_the_warm_up():
    """The warm-up is the largest of the job's and every part's untimed steps (a trace's last step, the
    breakdown's first gap), at least one step timed."""
    ctx = context(fake_backend())
    assert hostsync.StepHooks(ctx, 0, Preemption()).warm == WARM
    part = hostsync.Quiet()
    part.untimed = 7
    assert hostsync.StepHooks(ctx, 0, Preemption(), (None, part)).warm == 7
    part.untimed = 50
    assert hostsync.StepHooks(ctx, 0, Preemption(), (part,)).warm == STEPS - 1


# -- the structure rule -------------------------------------------------------------------------------------------
OLD = {  # the assignments the code had before its hooks were built from parts (one of each module)
    "common/training/train.py": "hooks.energy = energy.rank_meter()\n",
    "common/training/loops.py": "hooks.input_clock = model.parts.clock = inputwait.InputClock('gap', hooks.warm)\n",
    "backends/native_ps.py": "def f(self):\n    self.hooks.input_clock, x = 1, 2\n    setattr(hooks, 'trace', 3)\n",
}


def test_structure_rule_flags_a_part_assigned_after_construction():
    flagged = {where: check_structure.hooks_assigned_outside_home(ast.parse(code), where) for where, code in
               OLD.items()}
    assert [len(v) for v in flagged.values()] == [1, 1, 2], flagged
    assert "hooks.input_clock" in flagged["common/training/loops.py"][0]
    # its home, the tests' fake loops and a read are not assignments of a part
    assert check_structure.hooks_assigned_outside_home(ast.parse(OLD["common/training/train.py"]),
                                                       check_structure.HOOKS_HOME) == []
    assert check_structure.hooks_assigned_outside_home(ast.parse("hooks.dispatched += 1"), "tests/t.py") == []
    assert check_structure.hooks_assigned_outside_home(ast.parse("x = hooks.warm"), "common/x.py") == []
    # today's tree has none: tests/test_structure.py runs every rule on it


# -- a figure sampled at syncs, end to end: one part, one record field, one column ---------------------------------
class TimedCounter(hostsync.Quiet):
    """The recipe's example of the second kind: a counter (here this process's CPU seconds, faked) read right after
    the marks at the warm-up's end and at the last step, as the energy meter reads its counter."""

    def __init__(self, read: Any) -> None:
        self.read, self.first, self.last = read, None, None

    def at_sync(self, at: hostsync.At) -> None:
        if at.done == at.warm:
            self.first = self.read()
        if at.done >= at.run_steps:
            self.last = self.read()

    def measured(self) -> dict[str, Any]:
        done = self.first is not None and self.last is not None
        return {"timed_cpu": self.last - self.first if done else None}


@dataclass(frozen=True, kw_only=True)
class WithTimedCpu(RunRecord):
    timed_cpu_s: float | None = None  # the busiest rank's CPU seconds over the timed steps


HEADER = "timed CPU (s)"
COLUMN = Column(HEADER, "timed_cpu_s", from_runs(lambda run: num(run.timed_cpu_s)), number(".2f"))


def test_a_part_measured_figure_reaches_the_record_and_the_report(monkeypatch, tmp_path):
    clock = FakeClock()
    counter = TimedCounter(lambda: 0.25 * clock.now)  # a quarter CPU second per second of the fake clock
    monkeypatch.setattr(energy, "rank_meter", lambda: None)  # no GPU counter (and no TensorFlow to ask)
    monkeypatch.setattr(machine, "rank_machine", lambda iface: {  # this rank's machine, without TensorFlow
        "host": "n0", "cpu": {"model": "C"}, "gpu": dict(machine.NO_GPU),
        "memory": {"peak_rss_bytes": 2**29, "peak_gpu_bytes": None}})
    # the recipe's one line in make_hooks' parts: here around it, no product file edited
    monkeypatch.setattr(train, "StepHooks", lambda ctx, start, preemption, parts: hostsync.StepHooks(
        ctx, start, preemption, (*parts, counter)))
    backend = fake_backend()
    ctx = context(backend)
    hooks = train.make_hooks(ctx, None, 0, Preemption(), None, None)  # type: ignore[arg-type]
    assert [type(p).__name__ for p in hooks.parts] == ["FirstStep", "NotMeasured", "TimedCounter"]
    drive(monkeypatch, hooks, clock)
    built = train.Built(types.SimpleNamespace(weights=[], trainable_weights=[], trainable_variables=[]), None, None,
                        ctx.trained_by)
    resume = train.Resume(0, {}, tmp_path, tmp_path)
    gathered = train.gather(ctx, built, hooks, resume, "d")
    mine = gathered.everyone[0]
    assert mine["timed_cpu"] == pytest.approx(0.25 * (STEPS - WARM))  # 8 timed steps of 1 s
    assert mine["input"]["reason"] and mine["time_to_first_step"] > 0  # the other parts' measurements
    rec = train.make_record(ctx, built, resume, gathered)
    # the recipe's record field and its line in make_record (the busiest rank's)
    rec = WithTimedCpu(**rec.to_dict(), timed_cpu_s=max(r["timed_cpu"] for r in gathered.everyone))
    d = tmp_path / "results"
    write_record(d, rec)
    monkeypatch.setattr(results, "_FIELD_NAMES", results._FIELD_NAMES | {"timed_cpu_s"})
    monkeypatch.setattr(load, "RunRecord", WithTimedCpu)
    monkeypatch.setattr(document, "COLUMNS", (*document.COLUMNS, COLUMN))  # the recipe's one Column
    build_report(d, tmp_path / "report", ReportOptions(plots=False), warn=lambda m: None)
    with (tmp_path / "report" / "report.csv").open() as f:
        (row,) = list(csv.DictReader(f))
    assert float(row["timed_cpu_s"]) == pytest.approx(2.0)
    md, page = ((tmp_path / "report" / name).read_text() for name in ("report.md", "report.html"))
    assert scaling(md_tables(md))[("native", 1)][HEADER] == scaling(html_tables(page))[("native", 1)][HEADER] == "2.00"
