"""Between the steps of every loop (Keras fit, the custom loop, the breakdown's probe, parameter-server training): when
the host syncs with the device, and what it does there, one named part each.

The loops hand steps to the runtime without waiting for them; the host waits for the device only at a *sync* (reading
the block of losses the device accumulated since the last one: ``common.training.loops.LossRing``). ``StepHooks`` is the
one statement of when: after the first step (time to first step), at the end of the untimed warm-up, at every multiple
of ``sync_every`` steps and at the last step, plus where a part asks for one (a validation due, a trace to start or
write, an explicit ``--preempt-check-steps``). At each sync, in this order:

- ``TrainingClock``: a clock mark (steps done in this run, the training clock), so wall time between marks includes
  everything: the steps, input waits, the harness' own work between steps and the agreement below;
- the trace (``common.training.observe.Trace``) before the mark, the energy meter after it;
- the watchdog's progress and the chief's progress line;
- ``Validation``: the evaluation, when due, right after the mark; its duration is taken off the training clock;
- ``Agreement``: the preemption agreement, a collective, about once every PREEMPT_CHECK_SECONDS.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from common.training import reliability as rel
from common.training.context import RunContext
from common.training.runconfig import PREEMPT_CHECK_SECONDS, PREEMPT_CHECK_STEPS


@dataclass
class TrainingClock:
    """``perf_counter`` without the evaluations so far, and the marks taken on it at syncs: the marks are a training
    clock (evaluation removed exactly), each window's wall time everything else."""

    marks: list[tuple[int, float]] = field(default_factory=list)  # (steps done in this run, training clock)
    excluded: float = 0.0  # seconds of evaluation so far: subtracted from every later mark
    t0: float = 0.0  # perf_counter at the start: evaluations' wall_time counts from here, evaluations included

    def start(self) -> float:
        """The first mark, right before the first step is handed over; returns it."""
        self.t0 = time.perf_counter()
        self.marks.append((0, self.now()))
        return self.marks[0][1]

    def now(self) -> float:
        return time.perf_counter() - self.excluded

    def mark(self, dispatched: int) -> float:
        """A mark after ``dispatched`` steps of this run; returns it."""
        self.marks.append((dispatched, self.now()))
        return self.marks[-1][1]

    def exclude(self, seconds: float) -> None:
        """``seconds`` of work that is not training (an evaluation), off every later mark."""
        self.excluded += seconds

    @property
    def synced(self) -> int:
        """Steps of this run up to the last mark."""
        return self.marks[-1][0] if self.marks else 0

    def relative(self) -> list[list[float]]:
        """The marks as [steps done in this run, seconds since the first mark] (JSON, comparable across ranks)."""
        t0 = self.marks[0][1] if self.marks else 0.0
        return [[d, t - t0] for d, t in self.marks]


@dataclass
class Agreement:
    """The preemption agreement: a collective (1-4 ms on this CPU, more than a millisecond step) in which every rank
    learns whether any got SIGTERM/SIGUSR1, so that all stop after the same step.

    By default it rides on a sync that happens anyway, about once every PREEMPT_CHECK_SECONDS: each agreement also
    sums the ranks' recent step times, from which every rank derives the same next interval in steps (until the first
    one, every PREEMPT_CHECK_STEPS steps). ``asked``: --preempt-check-steps, agreements every N steps, syncs added.
    """

    backend: Any  # the set-up backend: its allsum
    preemption: rel.Preemption
    sync_every: int  # the job's sync interval: agreements come in whole sync intervals
    asked: int = 0  # --preempt-check-steps (0: about once a second)
    last: int = 0  # steps done at the last agreement
    last_time: float = 0.0
    every: int = 0  # steps between agreements (0 until the clock starts)

    def start(self, t: float) -> None:
        self.last_time = t
        self.every = self.asked or max(self.sync_every, PREEMPT_CHECK_STEPS)

    def wants_sync(self, dispatched: int) -> bool:
        """An agreement asked for between the regular syncs (``asked`` only)."""
        return bool(self.asked) and dispatched - self.last >= self.asked

    def due(self, dispatched: int) -> bool:
        return dispatched - self.last >= self.every

    def agree(self, dispatched: int, now: float) -> bool:
        """True when any rank got a signal. After this rank's mark ``now``: its cost is in the next window's wall time
        like any other work of the harness."""
        per_step = (now - self.last_time) / max(dispatched - self.last, 1)
        flags, seconds = self.backend.allsum([1.0 if self.preemption.signalled is not None else 0.0, per_step])
        self.last, self.last_time = dispatched, now
        self.every = self._next_every(seconds / self.backend.num_workers)  # the same sum on every rank
        return flags > 0

    def _next_every(self, seconds_per_step: float) -> int:
        """About PREEMPT_CHECK_SECONDS of steps, in whole sync intervals (so the agreement rides on a sync)."""
        if self.asked:
            return self.asked
        if not seconds_per_step > 0:
            return max(self.sync_every, PREEMPT_CHECK_STEPS)
        syncs = math.ceil(PREEMPT_CHECK_SECONDS / seconds_per_step / self.sync_every)
        return max(syncs, 1) * self.sync_every


@dataclass
class Validation:
    """Validation (``common.training.evaluate``) is not training: a sync is forced where one is due, the evaluation
    runs right after that sync's mark and its duration is taken off the training clock; ``evaluations`` get their
    ``wall_time`` on the real clock (since the clock's start)."""

    evaluator: Any  # common.training.evaluate.Evaluator (or the input function's)
    evaluations: list[dict[str, Any]] = field(default_factory=list)  # this run's, in order

    def due(self, global_step: int) -> bool:
        return self.evaluator.due(global_step)

    def run(self, global_step: int, clock: TrainingClock, watchdog: rel.Watchdog | None, input_clock: Any) -> None:
        ping = (lambda: watchdog.progress("evaluation")) if watchdog is not None else None
        start = time.perf_counter()
        result = self.evaluator.run(global_step, ping)
        end = time.perf_counter()
        clock.exclude(end - start)
        self.evaluations.append({**result, "seconds": end - start, "wall_time": end - clock.t0})
        restart = getattr(input_clock, "restart_gap", None)
        if restart is not None:
            restart()  # fit's input gap: the evaluation ran between two steps, and is no input wait


@dataclass
class StepHooks:
    """What happens between the training steps in every loop: when the host syncs (``sync_due``), and the parts that
    act at a sync (module docstring). The run's fixed facts (backend, options, schedule, sizes) are read from ``ctx``;
    the fields are this run's own and what changes while it runs."""

    ctx: RunContext
    start_step: int  # global steps already done (a resumed run)
    preemption: rel.Preemption
    watchdog: rel.Watchdog | None
    least_warm: int = 0  # untimed first steps a probe needs at least (the breakdown: 1, for its first gap)
    dispatched: int = 0  # steps of this run handed to the runtime so far
    losses: list[float] = field(default_factory=list)  # this rank's loss of every step of this run
    first_step_done: float | None = None
    stopped_at: int | None = None
    input_clock: Any = None  # common.training.inputwait: the loop's input-wait clock (read once, after the loop)
    trace: Any = None  # common.training.observe.Trace under --profile-steps
    progress: Any = None  # common.training.observe.Progress on a verbose chief
    energy: Any = None  # common.cluster.energy.EnergyMeter on a GPU with an energy counter: read at the timed marks
    clock: TrainingClock = field(default_factory=TrainingClock)
    validation: Validation | None = None  # when the job has validation data (the shared loops only)
    agreement: Agreement = field(init=False)

    def __post_init__(self) -> None:
        from common.training import observe

        opts, plan = self.ctx.opts, self.ctx.plan
        self.agreement = Agreement(self.ctx.backend, self.preemption, self.ctx.job.sync_interval,
                                   opts.preempt_check_steps)
        if self.ctx.verbose and opts.progress_seconds > 0:
            self.progress = observe.Progress(opts.progress_seconds, plan.global_batch, plan.total_steps,
                                             self.start_step)
        if opts.profile_steps is not None and opts.results_dir:
            # a collective (the run id): every rank builds its hooks at the same point, before the first step
            self.trace = observe.Trace.create(self.ctx.backend, opts.results_dir, self.ctx.label, opts.profile_steps,
                                              self.start_step)

    # -- what the loops and the record read ------------------------------------------------------------------
    @property
    def global_step(self) -> int:
        """0-based index of the next step to hand to the runtime."""
        return self.start_step + self.dispatched

    @property
    def run_steps(self) -> int:
        return self.ctx.plan.total_steps - self.start_step

    @property
    def warm(self) -> int:
        """Untimed first steps of this run: at least one step is always timed. Profiled steps are never timed: the
        timed window starts after the last of them."""
        traced = self.trace.end if self.trace is not None else 0
        return min(max(self.ctx.job.warmup_interval, traced, self.least_warm), max(self.run_steps - 1, 0))

    @property
    def synced(self) -> int:
        """Steps of this run whose losses the host has read."""
        return self.clock.synced

    @property
    def marks(self) -> list[tuple[int, float]]:
        return self.clock.marks

    @property
    def evaluations(self) -> list[dict[str, Any]]:
        return self.validation.evaluations if self.validation is not None else []

    @property
    def evaluator(self) -> Any:
        return self.validation.evaluator if self.validation is not None else None

    @evaluator.setter
    def evaluator(self, evaluator: Any) -> None:
        self.validation = Validation(evaluator) if evaluator is not None else None

    @property
    def check_every(self) -> int:
        """Steps between two preemption agreements (identical on every rank)."""
        return self.agreement.every

    def clock_marks(self) -> list[list[float]]:
        return self.clock.relative()

    # -- the loops call these ------------------------------------------------------------------------------------
    def start_clock(self) -> None:
        """Right before the first step is handed over: the mark the first window (and time to first step) starts."""
        if self.trace is not None:
            self.trace.update(0)  # --profile-steps 1:B: the trace covers the first step too
        t = self.clock.start()
        if self.energy is not None:
            self.energy.at_mark(0, self.warm, self.run_steps)
        self.agreement.start(t)

    def step_ended(self, dispatched: int) -> bool:
        """After each execution is handed over, in every loop: ``dispatched`` steps of this run so far; True when the
        host must sync now (``sync_due``). Anything done here is between two steps, inside the timed window."""
        self.dispatched = dispatched
        return self.sync_due()

    def sync_due(self) -> bool:
        """Must the host wait for the device now (after ``dispatched`` steps)? Same answer on every rank."""
        d, last, every = self.dispatched, self.synced, self.ctx.job.sync_interval

        def crossed(step: int) -> bool:
            return last < step <= d

        return bool(last == 0 or d >= self.run_steps or d % every == 0 or crossed(self.warm)
                    or self.agreement.wants_sync(d)
                    or (self.trace is not None and self.trace.due(last, d))
                    or (self.validation is not None and self.validation.due(self.global_step)))

    def sync(self, losses: list[float]) -> bool:
        """Record a block just read (the read waited for its steps); True when training must stop now."""
        if self.trace is not None:
            self.trace.update(self.dispatched)  # before the mark: starting or writing a trace is never timed
        now = self.clock.mark(self.dispatched)
        if self.energy is not None:  # after the mark: a read at the warm-up's end is inside the window, once
            self.energy.at_mark(self.dispatched, self.warm, self.run_steps)
        self.losses.extend(losses)
        if len(self.losses) != self.dispatched:
            raise RuntimeError(f"loss block out of step: {len(self.losses)} losses for {self.dispatched} steps")
        self._report(losses)
        if self.validation is not None and self.validation.due(self.global_step):
            self.validation.run(self.global_step, self.clock, self.watchdog, self.input_clock)
        if self.dispatched >= self.run_steps:
            return True
        if self.agreement.due(self.dispatched) and self.agreement.agree(self.dispatched, now):
            self.stopped_at = self.global_step
            return True
        return False

    def _report(self, losses: list[float]) -> None:
        """The first step's line, the watchdog's progress and the chief's progress line."""
        if self.first_step_done is None:
            self.first_step_done = time.time()
            if self.ctx.verbose:
                since = self.first_step_done - self.ctx.opts.t_process_start
                print(f"[twinbench] first step done {since:.1f} s after process start", flush=True)
        if self.watchdog is not None:
            self.watchdog.progress(f"step {self.global_step}")
        if self.progress is not None:
            line = self.progress.at_sync(self.dispatched, self.marks[-1][1], self.losses[-1] if losses else None)
            if line:
                print(line, flush=True)
