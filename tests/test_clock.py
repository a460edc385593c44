"""The step clock and host-sync schedule of ``common.training.hostsync.StepHooks``, driven by a fake clock (no
TensorFlow)."""

from __future__ import annotations

import pytest

from common.training import hostsync
from common.training.context import Plan, RunContext
from common.training.reliability import Preemption
from common.training.runconfig import RunOptions
from common.workload.job import Job
from tests.aids import signal_aid


class FakeBackend:
    """One of ``num_workers`` identical ranks: allsum multiplies (every rank contributes the same values)."""

    is_chief = True

    def __init__(self, num_workers: int = 2) -> None:
        self.num_workers = num_workers
        self.agreements: list[int] = []
        self.hooks: hostsync.StepHooks | None = None

    def allsum(self, values: list[float]) -> list[float]:
        assert self.hooks is not None
        self.agreements.append(self.hooks.dispatched)
        return [v * self.num_workers for v in values]


def run_context(backend: object, opts: RunOptions, steps: int, sync_every: int, warm: int,
                images_per_step: int = 0) -> RunContext:
    """What ``StepHooks`` reads of a run: host syncs every ``sync_every`` steps, ``warm`` untimed steps, ``steps``
    steps of ``images_per_step`` images (one replica)."""
    job = Job(sync_every_steps=sync_every, timing_warmup_steps=warm)
    return RunContext(job, backend, opts, Plan(images_per_step, steps, steps, 1))  # type: ignore[arg-type]


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def drive(monkeypatch: pytest.MonkeyPatch, steps: int, step_s: float, *, sync_every: int = 25, warm: int = 2,
          check: int = 0, pause_after: dict[int, float] | None = None, start: int = 0, signal_at: int = 0,
          preemption: Preemption | None = None) -> tuple[hostsync.StepHooks, FakeBackend]:
    """Run fake steps of ``step_s`` each (the device time elapses before the sync that reads them) until the
    job's ``steps`` are done or the hooks stop training; ``start``: global steps done before (a resumed run)."""
    clock = FakeClock()
    monkeypatch.setattr(hostsync.time, "perf_counter", clock)
    backend = FakeBackend()
    opts = RunOptions(t_process_start=0.0, command=(), verbose=False, preempt_check_steps=check)
    hooks_class = hostsync.StepHooks
    if signal_at:  # the test aid the started processes load (tests/aids), on a subclass: StepHooks stays as is
        hooks_class = type("SignallingHooks", (hostsync.StepHooks,), {})
        signal_aid.patch(hooks_class, signal_at)
    hooks = hooks_class(run_context(backend, opts, steps, sync_every, warm), start, preemption or Preemption())
    backend.hooks = hooks
    hooks.start_clock()
    while hooks.global_step < steps:
        clock.now += step_s
        hooks.dispatched += 1
        clock.now += (pause_after or {}).get(hooks.dispatched, 0.0)  # host work between steps
        if hooks.sync_due() and hooks.sync([1.0] * (hooks.dispatched - hooks.synced)):
            break
    return hooks, backend


def test_syncs_after_first_step_warmup_every_k_and_at_the_end(monkeypatch):
    hooks, _ = drive(monkeypatch, 100, 0.001)
    assert [d for d, _ in hooks.marks] == [0, 1, 2, 25, 50, 75, 100]
    assert len(hooks.losses) == 100


def test_per_step_syncs_with_k_1(monkeypatch):
    hooks, _ = drive(monkeypatch, 5, 0.01, sync_every=1, warm=1)
    assert [d for d, _ in hooks.marks] == [0, 1, 2, 3, 4, 5]


def test_wall_clock_includes_host_work_between_steps(monkeypatch):
    from common.core import results as res

    hooks, _ = drive(monkeypatch, 50, 0.001, pause_after={30: 0.5})
    stats = res.throughput_stats([hooks.clock_marks()], 10, hooks.warm, 25)
    assert stats["timed_wall_time"] == pytest.approx(48 * 0.001 + 0.5)
    assert stats["images_per_sec"] == pytest.approx(10 * 48 / (48 * 0.001 + 0.5))


def test_agreement_rides_on_syncs_about_once_a_second(monkeypatch):
    # 1 ms steps: first agreement after PREEMPT_CHECK_STEPS (at the sync at step 25), then every ~1 s = 1000 steps
    _, backend = drive(monkeypatch, 3000, 0.001)
    assert backend.agreements[:3] == [25, 1025, 2025]
    # 100 ms steps: every 10 steps would be 1 s, but agreements only ride on syncs: every 25 steps
    _, slow = drive(monkeypatch, 100, 0.1)
    assert slow.agreements == [25, 50, 75]


def test_explicit_check_interval_adds_syncs(monkeypatch):
    hooks, backend = drive(monkeypatch, 12, 0.001, check=2)
    assert backend.agreements == [2, 4, 6, 8, 10]
    assert [d for d, _ in hooks.marks] == [0, 1, 2, 4, 6, 8, 10, 12]


def test_a_signal_stops_training_at_the_next_agreement(monkeypatch):
    preemption = Preemption()
    preemption.signalled = "SIGTERM"  # as the handler records it (on one rank: allsum carries it to all)
    hooks, backend = drive(monkeypatch, 10, 0.001, check=3, preemption=preemption)
    assert hooks.dispatched == 3 and hooks.stopped_at == 3 and backend.agreements == [3]


def test_signal_aid_fires_once_and_not_again_after_a_resume(monkeypatch):
    """The signal aid at step S (tests/aids/signal_aid.py): SIGTERM in the run whose sync covers step S; the
    resumed run (same command) starts past S and must not signal itself again (a Slurm requeue would loop)."""
    sent: list[int] = []
    monkeypatch.setattr(signal_aid.os, "kill", lambda pid, sig: sent.append(sig))
    drive(monkeypatch, 12, 0.001, check=2, signal_at=3)
    assert len(sent) == 1
    drive(monkeypatch, 12, 0.001, check=2, signal_at=3, start=4)
    assert len(sent) == 1


def test_outside_clock_pairs_each_run_with_itself():
    """bench.clock's arithmetic: a run that reports its true steady throughput reads 1.0 whatever its own speed,
    up to the S1 runs' share of the difference (S1 / (S2 - S1) of their own drift); a clock that skipped a tenth of
    the time between steps reads 1.1."""
    from bench.clock import paired_ratios

    gb, s1, s2, fixed = 32, 200, 2200, 3.0  # fixed: start-up, first step, gathering (s)

    def dt(steps: int, step_s: float) -> float:
        return fixed + steps * step_s

    s1_dts = [dt(s1, 0.002), dt(s1, 0.002)]
    same = [(gb / 0.002, dt(s2, 0.002))]
    assert paired_ratios(gb, s1, s2, s1_dts, same) == pytest.approx([1.0], rel=1e-9)
    steps = (0.0015, 0.0025)  # S2 runs 25% faster / slower than the S1 runs
    got = paired_ratios(gb, s1, s2, s1_dts, [(gb / step, dt(s2, step)) for step in steps])
    # the S1 steps are taken at the S1 runs' pace: off by S1 / (S2 - S1) x (0.002 / step - 1), 3.3% / 2% here
    assert got == pytest.approx([1 - s1 / (s2 - s1) * (0.002 / step - 1) for step in steps], rel=1e-9)
    assert all(abs(r - 1) < 0.035 for r in got)
    skipping = [(gb / (0.9 * 0.002), dt(s2, 0.002))]  # reports 10% more than the stopwatch saw
    assert paired_ratios(gb, s1, s2, s1_dts, skipping) == pytest.approx([1 / 0.9], rel=1e-9)


def test_headline_is_printed_before_the_tensorboard_logs_are_written(tmp_path, monkeypatch, capsys):
    """bench.clock stops its outside clock at the headline: writing the logs (about 0.3 ms per step, one eager
    summary op each) comes after it, else the outside clock would charge it to the steps."""
    from pathlib import Path

    from common.training import observe, train
    from common.training.runconfig import RunOptions
    from tests.test_results import full_record

    def finish(rec, results_dir, trace):
        print("LOGS WRITTEN")
        return rec

    monkeypatch.setattr(observe, "finish", finish)
    opts = RunOptions(t_process_start=0.0, command=("python",), results_dir=str(tmp_path), verbose=True)
    resume = train.Resume(0, {}, Path(tmp_path / "ckpt"), Path(tmp_path / "ckpt"))
    train.publish(full_record(), opts, resume)
    out = capsys.readouterr().out
    assert out.index(" images/s over ") < out.index("LOGS WRITTEN") < out.index("[twinbench] results:"), out
