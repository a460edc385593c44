"""Between the steps of every loop (Keras fit, the custom loop, the breakdown's probe, parameter-server training): when
the host syncs with the device, and what it does there, one named part each.

The loops hand steps to the runtime without waiting for them; the host waits for the device only at a *sync* (reading
the block of losses the device accumulated since the last one: ``common.training.loops.LossRing``). ``StepHooks`` is the
one statement of when: after the first step (time to first step), at the end of the untimed warm-up, at every multiple
of ``sync_every`` steps and at the last step, plus where a part asks for one (a validation due, a trace to start or
write, an explicit ``--preempt-check-steps``). What acts there are *parts* (``Part``: start, wants a sync, at a sync,
what it measured), each given to ``StepHooks`` once, at its construction (``common.training.train.make_hooks``), and
called in the order given:

- ``TrainingClock``: a clock mark (steps done in this run, the training clock), so wall time between marks includes
  everything: the steps, input waits, the harness' own work between steps and the agreement below (StepHooks' own);
- the parts acting before the mark (the trace, ``common.training.observe.Trace``), then those after it: the energy
  meter (``common.cluster.energy``), ``FirstStep`` (the time to first step), ``Liveness`` (the watchdog's progress),
  the chief's progress line (``observe.Progress``), ``Validation`` (the evaluation, when due; its duration is taken
  off the training clock), the input clock (``common.training.inputwait``, read after the loop);
- ``Agreement``: the preemption agreement, a collective, about once every PREEMPT_CHECK_SECONDS (StepHooks' own).

A figure sampled at syncs is one more part: its class (``start``/``at_sync`` read it, ``measured`` returns it), its
line in ``make_hooks``; nothing else here changes (docs/architecture.md, "Adding a measured figure to the report").
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

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



# -- the parts: one protocol, given to StepHooks once ------------------------------------------------------------
@dataclass(frozen=True)
class At:
    """Where this run stands, as a part sees it at the clock's start or at a sync."""

    done: int  # steps of this run handed over (at a sync: all of them read back)
    start_step: int  # global steps done before this run (a resumed run)
    warm: int  # untimed first steps of this run (``StepHooks.warm``)
    run_steps: int  # steps this run trains
    clock: TrainingClock  # its last mark is this sync's (taken before the parts after the mark act)
    loss: float | None = None  # at a sync: this rank's loss of the last step read (None: none read)

    @property
    def global_step(self) -> int:
        return self.start_step + self.done


class Part(Protocol):
    """What acts at the host's syncs, given to ``StepHooks`` once, at its construction. ``StepHooks`` calls every
    part the same way, in the order given; the driver merges each part's ``measured()`` into the rank's
    measurements (``common.training.train.gather``, one allgather for all)."""

    before_mark: bool  # acts before the sync's clock mark: its work is in the window that ends there (a trace)
    untimed: int  # first steps of this run it needs untimed (a trace: up to its last step); 0: none

    def start(self, at: At) -> None:
        """As the clock starts, right before the first step is handed over (``at.done`` 0)."""

    def wants_sync(self, last: int, done: int, global_step: int) -> bool:
        """After each step (``done`` steps of this run; the previous sync at ``last``): must the host sync now for
        this part? Called between two steps, inside the timed window: cheap, and the same answer on every rank."""

    def at_sync(self, at: At) -> None:
        """At every sync (a collective here must be called by every part of every rank at the same sync)."""

    def measured(self) -> dict[str, Any]:
        """After the loop: this rank's measurements (keys of the rank's measurement dict), {} when none."""


class Quiet:
    """A part's defaults: acts after the mark, needs no untimed steps, asks for no sync, measures nothing."""

    before_mark = False
    untimed = 0

    def start(self, at: At) -> None:
        pass

    def wants_sync(self, last: int, done: int, global_step: int) -> bool:
        return False

    def at_sync(self, at: At) -> None:
        pass

    def measured(self) -> dict[str, Any]:
        return {}


class FirstStep(Quiet):
    """The time to first step (this process's start to the first sync, which waits for the first step), and the
    chief's line saying it."""

    def __init__(self, t_process_start: float, verbose: bool) -> None:
        self.t_process_start, self.verbose = t_process_start, verbose
        self.done: float | None = None  # time.time() at the first sync

    def at_sync(self, at: At) -> None:
        if self.done is None:
            self.done = time.time()
            if self.verbose:
                print(f"[twinbench] first step done {self.done - self.t_process_start:.1f} s after process start",
                      flush=True)

    def measured(self) -> dict[str, Any]:
        return {"time_to_first_step": (self.done or time.time()) - self.t_process_start}


class Liveness(Quiet):
    """The watchdog hears of every sync: a rank that stops reaching them is stalled (``reliability.Watchdog``)."""

    def __init__(self, watchdog: rel.Watchdog) -> None:
        self.watchdog = watchdog

    def at_sync(self, at: At) -> None:
        self.watchdog.progress(f"step {at.global_step}")


class Validation(Quiet):
    """Validation (``common.training.evaluate``) is not training: a sync is forced where one is due, the evaluation
    runs right after that sync's mark and its duration is taken off the training clock; ``evaluations`` get their
    ``wall_time`` on the real clock (since the clock's start). ``resumed``: called after each evaluation (Keras fit's
    input clock restarts its gap: the evaluation ran between two steps, and is no input wait). ``keep``: this rank
    sends its evaluations to the gathering (the chief: every rank's are the same values)."""

    def __init__(self, evaluator: Any, watchdog: rel.Watchdog | None = None, resumed: Any = None,
                 keep: bool = True) -> None:
        self.evaluator, self.watchdog, self.resumed, self.keep = evaluator, watchdog, resumed, keep
        self.evaluations: list[dict[str, Any]] = []  # this run's, in order

    def wants_sync(self, last: int, done: int, global_step: int) -> bool:
        return self.evaluator.due(global_step)

    def at_sync(self, at: At) -> None:
        step = at.global_step
        if not self.evaluator.due(step):
            return
        watchdog = self.watchdog
        ping = (lambda: watchdog.progress("evaluation")) if watchdog is not None else None
        start = time.perf_counter()
        result = self.evaluator.run(step, ping)  # collectives: every rank evaluates at the same sync
        end = time.perf_counter()
        at.clock.exclude(end - start)
        self.evaluations.append({**result, "seconds": end - start, "wall_time": end - at.clock.t0})
        if self.resumed is not None:
            self.resumed()

    def measured(self) -> dict[str, Any]:
        return {"evaluations": self.evaluations if self.keep else []}


P = TypeVar("P")


@dataclass
class StepHooks:
    """What happens between the training steps in every loop: when the host syncs (``sync_due``), and the parts
    acting at a sync (``Part``; module docstring), given here once. The run's fixed facts (backend, options,
    schedule, sizes) are read from ``ctx``; the fields are this run's own and what changes while it runs."""

    ctx: RunContext
    start_step: int  # global steps already done (a resumed run)
    preemption: rel.Preemption
    # in the order they act (those ``before_mark`` first at each sync); a None (a part not asked for) is dropped
    parts: Sequence[Part | None] = ()
    dispatched: int = 0  # steps of this run handed to the runtime so far
    losses: list[float] = field(default_factory=list)  # this rank's loss of every step of this run
    stopped_at: int | None = None
    clock: TrainingClock = field(default_factory=TrainingClock)
    agreement: Agreement = field(init=False)

    def __post_init__(self) -> None:
        self.parts = tuple(p for p in self.parts if p is not None)
        self.agreement = Agreement(self.ctx.backend, self.preemption, self.ctx.job.sync_interval,
                                   self.ctx.opts.preempt_check_steps)
        # fixed for the run: every part's untimed steps are known at construction
        untimed = max([self.ctx.job.warmup_interval, *(p.untimed for p in self.parts)])
        self._warm = min(untimed, max(self.run_steps - 1, 0))

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
        timed window starts after the last of them (the trace's ``untimed``)."""
        return self._warm

    @property
    def synced(self) -> int:
        """Steps of this run whose losses the host has read."""
        return self.clock.synced

    @property
    def marks(self) -> list[tuple[int, float]]:
        return self.clock.marks

    @property
    def check_every(self) -> int:
        """Steps between two preemption agreements (identical on every rank)."""
        return self.agreement.every

    def clock_marks(self) -> list[list[float]]:
        return self.clock.relative()

    def find(self, kind: type[P]) -> P | None:
        """The part of class ``kind`` given at construction, None without one (the loops' input clock, the trace
        the record names)."""
        return next((p for p in self.parts if isinstance(p, kind)), None)

    def measured(self) -> dict[str, Any]:
        """Every part's measurements of this rank, after the loop (``common.training.train.gather`` merges them)."""
        out: dict[str, Any] = {}
        for p in self.parts:
            out.update(p.measured())
        return out

    def _at(self, loss: float | None = None) -> At:
        return At(self.dispatched, self.start_step, self.warm, self.run_steps, self.clock, loss)

    # -- the loops call these ------------------------------------------------------------------------------------
    def start_clock(self) -> None:
        """Right before the first step is handed over: the mark the first window (and time to first step) starts.
        Parts before the mark act before it (--profile-steps 1:B: the trace covers the first step too), the others
        right after it (the energy counter's first read)."""
        at = self._at()
        for p in self.parts:
            if p.before_mark:
                p.start(at)
        t = self.clock.start()
        for p in self.parts:
            if not p.before_mark:
                p.start(at)
        self.agreement.start(t)

    def step_ended(self, dispatched: int) -> bool:
        """After each execution is handed over, in every loop: ``dispatched`` steps of this run so far; True when the
        host must sync now (``sync_due``). Anything done here is between two steps, inside the timed window."""
        self.dispatched = dispatched
        return self.sync_due()

    def sync_due(self) -> bool:
        """Must the host wait for the device now (after ``dispatched`` steps)? Same answer on every rank."""
        d, last, every = self.dispatched, self.synced, self.ctx.job.sync_interval
        if last == 0 or d >= self.run_steps or d % every == 0 or last < self.warm <= d \
                or self.agreement.wants_sync(d):
            return True
        step = self.global_step
        for p in self.parts:  # a trace to start or write, a validation due
            if p.wants_sync(last, d, step):
                return True
        return False

    def sync(self, losses: list[float]) -> bool:
        """Record a block just read (the read waited for its steps); True when training must stop now.

        The order matters: parts before the mark (starting or writing a trace, which ends with a collective) act
        in the window the mark closes, never a timed one; then the mark; then the others in the order given (the
        energy counter right after the mark, so a read at the warm-up's end is inside the window once; the first
        step's line, the watchdog, the progress line; an evaluation, collectives, taken off the clock); the
        preemption agreement, a collective every rank joins at the same syncs, last, after this rank's mark."""
        self.losses.extend(losses)
        if len(self.losses) != self.dispatched:
            raise RuntimeError(f"loss block out of step: {len(self.losses)} losses for {self.dispatched} steps")
        at = self._at(losses[-1] if losses else None)
        for p in self.parts:
            if p.before_mark:
                p.at_sync(at)
        now = self.clock.mark(self.dispatched)
        for p in self.parts:
            if not p.before_mark:
                p.at_sync(at)
        if self.dispatched >= self.run_steps:
            return True
        if self.agreement.due(self.dispatched) and self.agreement.agree(self.dispatched, now):
            self.stopped_at = self.global_step
            return True
        return False
