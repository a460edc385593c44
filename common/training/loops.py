"""The two training loops, Keras ``fit`` and a custom ``tf.function`` loop, and what runs around every step.

Both take the job's objective and LR schedule from ``common.training.objective`` (the loss-scaling rules that make both
backends compute the same math). Per-step losses are recorded locally (no extra collective inside the timed loop)
and averaged across ranks once at the end: every replica has the same batch size, so the mean of replica means is
the global mean.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from common.core.contract import Backend, Warmup
from common.training import inputwait, keras3, outputs
from common.training import reliability as rel
from common.training.context import RunContext
from common.training.objective import fit_objective, lr_schedule, mean_over_ranks
from common.training.runconfig import PREEMPT_CHECK_SECONDS, PREEMPT_CHECK_STEPS
from common.training.step import ReplicaStep, make_step
from common.workload.job import Job


@dataclass
class StepHooks:
    """What happens between the training steps in both modes: host syncs, clock marks, watchdog, preemption.

    The loops hand steps to the runtime without waiting for them; the host waits for the device only at a *sync*
    (reading the block of losses the device accumulated since the last one, ``LossRing``). Each sync records a
    clock mark (steps done in this run, ``perf_counter``), so wall time between marks includes everything: the
    steps, input waits, the harness' own work between steps and this agreement. Syncs happen after the first
    step (time to first step), at the end of the untimed warm-up, at every multiple of ``sync_every`` steps and
    at the last step; the preemption agreement rides on one of these (or on syncs ``--preempt-check-steps`` adds).

    The agreement is a collective (1-4 ms on this CPU, more than a millisecond step). By default it runs at a sync
    that happens anyway, about once every PREEMPT_CHECK_SECONDS: each agreement also sums the ranks' recent step
    times, from which every rank derives the same next interval in steps.

    Validation (``evaluator``, common.training.evaluate) is not training: a sync is forced where one is due, the
    evaluation runs right after that sync's mark, and its duration is added to ``excluded``, which every later mark
    subtracts (``now``): the marks are a training clock, evaluation removed exactly, and each window's wall time
    everything else. ``evaluations`` get their ``wall_time`` on the real clock (since ``start_clock``).

    The run's fixed facts (backend, options, schedule, sizes) are read from ``ctx``; the fields are this run's own
    and what changes while it runs.
    """

    ctx: RunContext
    start_step: int  # global steps already done (a resumed run)
    preemption: rel.Preemption
    watchdog: rel.Watchdog | None
    dispatched: int = 0  # steps of this run handed to the runtime so far
    marks: list[tuple[int, float]] = field(default_factory=list)  # (steps done in this run, perf_counter)
    losses: list[float] = field(default_factory=list)  # this rank's loss of every step of this run
    first_step_done: float | None = None
    stopped_at: int | None = None
    input_clock: Any = None  # common.training.inputwait: the loop's input-wait clock (read once, after the loop)
    _last_check: int = 0  # steps done at the last agreement
    _last_check_time: float = 0.0
    _check_every: int = 0  # steps between agreements (0 until the clock starts)
    trace: Any = None  # common.training.observe.Trace under --profile-steps
    progress: Any = None  # common.training.observe.Progress on a verbose chief
    evaluator: Any = None  # common.training.evaluate.Evaluator when the job has validation data
    evaluations: list[dict[str, Any]] = field(default_factory=list)  # this run's, in order (evaluate.Evaluator.run)
    excluded: float = 0.0  # seconds of evaluation so far: subtracted from every later clock mark
    t0: float = 0.0  # perf_counter at start_clock: evaluations' wall_time counts from here, evaluations included
    energy: Any = None  # common.cluster.energy.EnergyMeter on a GPU with an energy counter: read at the timed marks
    least_warm: int = 0  # untimed first steps a probe needs at least (the breakdown: 1, for its first gap)

    def __post_init__(self) -> None:
        from common.training import observe

        opts, plan = self.ctx.opts, self.ctx.plan
        if self.ctx.verbose and opts.progress_seconds > 0:
            self.progress = observe.Progress(opts.progress_seconds, plan.global_batch, plan.total_steps,
                                             self.start_step)
        if opts.profile_steps is not None and opts.results_dir:
            # a collective (the run id): every rank builds its hooks at the same point, before the first step
            self.trace = observe.Trace.create(self.ctx.backend, opts.results_dir, self.ctx.label, opts.profile_steps,
                                              self.start_step)

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
    def check_every(self) -> int:
        """Steps between two preemption agreements (identical on every rank)."""
        return self._check_every

    def _next_check_every(self, seconds_per_step: float) -> int:
        """About PREEMPT_CHECK_SECONDS of steps, in whole sync intervals (so the agreement rides on a sync)."""
        every = self.ctx.job.sync_interval
        if self.ctx.opts.preempt_check_steps:
            return self.ctx.opts.preempt_check_steps
        if not seconds_per_step > 0:
            return max(every, PREEMPT_CHECK_STEPS)
        syncs = math.ceil(PREEMPT_CHECK_SECONDS / seconds_per_step / every)
        return max(syncs, 1) * every

    @property
    def synced(self) -> int:
        """Steps of this run whose losses the host has read."""
        return self.marks[-1][0] if self.marks else 0

    def start_clock(self) -> None:
        """Right before the first step is handed over: the mark the first window (and time to first step) starts."""
        if self.trace is not None:
            self.trace.update(0)  # --profile-steps 1:B: the trace covers the first step too
        self.t0 = time.perf_counter()
        self.marks.append((0, self.now()))
        if self.energy is not None:
            self.energy.at_mark(0, self.warm, self.run_steps)
        self._last_check_time = self.marks[0][1]
        # until the first agreement measures the step time: every PREEMPT_CHECK_STEPS steps, at syncs
        self._check_every = self.ctx.opts.preempt_check_steps or max(self.ctx.job.sync_interval,
                                                                      PREEMPT_CHECK_STEPS)

    def now(self) -> float:
        """The training clock: perf_counter without the evaluations so far."""
        return time.perf_counter() - self.excluded

    def step_ended(self, dispatched: int) -> bool:
        """After each execution is handed over, in both modes: ``dispatched`` steps of this run so far; True when
        the host must sync now (``sync_due``). Anything done here is between two steps, inside the timed window."""
        self.dispatched = dispatched
        return self.sync_due()

    def sync_due(self) -> bool:
        """Must the host wait for the device now (after ``dispatched`` steps)? Same answer on every rank."""
        d, last, every, opts = self.dispatched, self.synced, self.ctx.job.sync_interval, self.ctx.opts

        def crossed(step: int) -> bool:
            return last < step <= d

        # an explicit --preempt-check-steps may ask for agreements between the regular syncs
        asked = opts.preempt_check_steps and d - self._last_check >= opts.preempt_check_steps
        return bool(last == 0 or d >= self.run_steps or d % every == 0 or crossed(self.warm) or asked
                    or (self.trace is not None and self.trace.due(last, d))
                    or (self.evaluator is not None and self.evaluator.due(self.global_step)))

    def sync(self, losses: list[float]) -> bool:
        """Record a block just read (the read waited for its steps); True when training must stop now."""
        if self.trace is not None:
            self.trace.update(self.dispatched)  # before the mark: starting or writing a trace is never timed
        self.marks.append((self.dispatched, self.now()))
        if self.energy is not None:  # after the mark: a read at the warm-up's end is inside the window, once
            self.energy.at_mark(self.dispatched, self.warm, self.run_steps)
        self.losses.extend(losses)
        if len(self.losses) != self.dispatched:
            raise RuntimeError(f"loss block out of step: {len(self.losses)} losses for {self.dispatched} steps")
        done = self.global_step
        if self.first_step_done is None:
            self.first_step_done = time.time()
            if self.ctx.verbose:
                since = self.first_step_done - self.ctx.opts.t_process_start
                print(f"[twinbench] first step done {since:.1f} s after process start", flush=True)
        if self.watchdog is not None:
            self.watchdog.progress(f"step {done}")
        if self.progress is not None:
            line = self.progress.at_sync(self.dispatched, self.marks[-1][1], self.losses[-1] if losses else None)
            if line:
                print(line, flush=True)
        if self.evaluator is not None and self.evaluator.due(done):
            self.evaluate()
        if self.dispatched >= self.run_steps:
            return True
        if self.dispatched - self._last_check >= self.check_every:
            return self._agree()
        return False

    def evaluate(self) -> None:
        """Evaluate now (right after a sync's mark) and take its duration off the training clock."""
        ping = (lambda: self.watchdog.progress("evaluation")) if self.watchdog is not None else None
        start = time.perf_counter()
        result = self.evaluator.run(self.global_step, ping)
        end = time.perf_counter()
        self.excluded += end - start
        self.evaluations.append({**result, "seconds": end - start, "wall_time": end - self.t0})
        restart = getattr(self.input_clock, "restart_gap", None)
        if restart is not None:
            restart()  # fit's input gap: the evaluation ran between two steps, and is no input wait

    def _agree(self) -> bool:
        """The preemption agreement: True (and ``stopped_at`` set) when any rank got SIGTERM/SIGUSR1."""
        now = self.marks[-1][1]
        per_step = (now - self._last_check_time) / max(self.dispatched - self._last_check, 1)
        # Every rank agrees at the same steps, so all stop after the same step even if only some got the signal.
        # After this rank's mark: its cost is in the next window's wall time like any other work of the harness.
        backend = self.ctx.backend
        flags, seconds = backend.allsum([1.0 if self.preemption.signalled is not None else 0.0, per_step])
        self._last_check, self._last_check_time = self.dispatched, now
        self._check_every = self._next_check_every(seconds / backend.num_workers)  # same sum on every rank
        if flags > 0:
            self.stopped_at = self.global_step
            return True
        return False

    def clock_marks(self) -> list[list[float]]:
        """The marks as [steps done in this run, seconds since the first mark] (JSON, comparable across ranks)."""
        t0 = self.marks[0][1] if self.marks else 0.0
        return [[d, t - t0] for d, t in self.marks]


class LossRing:
    """What each step wrote on the device (its loss, one per local replica; a probe's timestamps too), in a ring of
    ``size`` rows; the host reads the block of rows since its last sync at the next one.

    ``size`` >= the steps between two syncs (``sync_every``), so no row is overwritten before it is read. The one
    ring of every loop: ``read`` gives each step's loss as the mean over its row (``mean_over_ranks``, in float64);
    ``rows`` gives the rows as written (``common.diagnostics.breakdown``).
    """

    def __init__(self, size: int, columns: int, dtype: Any = None) -> None:
        import tensorflow as tf

        self.size = size
        # Not a model attribute (Keras would track and checkpoint it): held by the loops only.
        self.values = tf.Variable(tf.zeros([size, columns], dtype or tf.float32), trainable=False,
                                  name="twinbench_step_losses")

    def write(self, step: Any, row: Any) -> Any:
        """In the step function: store this step's row (a list of scalars: one loss per local replica; or a vector)
        at ``step % size``."""
        import tensorflow as tf

        dtype = self.values.dtype
        row = tf.stack([tf.cast(v, dtype) for v in row]) if isinstance(row, list | tuple) else tf.cast(row, dtype)
        slot = tf.cast(step % self.size, tf.int32)
        return self.values.scatter_nd_update([[slot]], [row])

    def rows(self, first: int, stop: int) -> list[list[float]]:
        """The rows of run steps [first, stop) as written; waits for those steps."""
        block = self.values.numpy()  # the one host <-> device sync of this block
        return [[float(v) for v in block[i % self.size]] for i in range(first, stop)]

    def read(self, first: int, stop: int) -> list[float]:
        """Losses of run steps [first, stop), each the mean over local replicas; waits for those steps."""
        return [mean_over_ranks(row) for row in self.rows(first, stop)]


class StepProbe(Protocol):
    """A diagnostic around the custom loop's one step (``common.diagnostics.breakdown``): what its step function
    writes per step instead of the losses alone, how the host reads the losses back, and what it measured."""

    columns: int  # values the step writes per step (its ring's row)
    dtype: Any  # of those values (tf.float64 for timestamps)
    least_warm: int  # untimed first steps it needs at least

    def device_step(self, fetch: Callable[[], Any], one: ReplicaStep, backend: Any) -> Any:
        """In the step's tf.function: fetch the batch, run the step on the backend, return the ring's row."""

    def losses(self, rows: list[list[float]]) -> list[float]:
        """Each step's loss from the rows just read (and keep what else they hold)."""


# -- Keras fit ----------------------------------------------------------------------------------------------
@dataclass
class FitParts:
    """What fit's step needs besides the Keras model, made with it (``fit_model``) and given to its constructor: not
    attributes Keras would track. The loss ring and the input clock are the run's, given by ``run_fit``."""

    reduce_fn: Callable[[list[Any]], list[Any]]  # the backend's reduce_gradients: fit reduces as the custom loop does
    replicas: int  # the plan's: the objective's share of the global batch
    local_replicas: int  # tf.distribute replicas in this process
    optimizer_reduces: bool  # the backend's Capabilities.optimizer_reduces
    xla: bool  # the forward pass jit-compiled (the collective-free part, as in the custom loop)
    structure_loss: Any = None  # one per-example loss over a multi-output model's structures (outputs.structure_loss)
    ring: LossRing | None = None
    clock: Any = None  # common.training.inputwait.InputClock
    forward: Any = None  # the jit-compiled forward pass, made at the first trace

    def step(self, model: Any) -> ReplicaStep:
        """The one step (``common.training.step``) with fit's objective (``objective.fit_objective``), in the
        replica context of ``train_step``."""
        import tensorflow as tf

        in_sync = tf.distribute.get_strategy().num_replicas_in_sync
        # Keras divides the loss by the replicas tf.distribute knows; the objective divides by the rest (Horovod's).
        outside = 1 if self.optimizer_reduces else self.replicas // in_sync
        if self.xla and self.forward is None:
            # Not compile(jit_compile=True): that compiles the whole step, collectives included, which XLA cannot do
            # on CPU (MWMS) and Horovod only with its optional XLA ops.
            self.forward = tf.function(lambda x: model(x, training=True), jit_compile=True)
        forward = self.forward or (lambda x: model(x, training=True))
        mixed = isinstance(model.optimizer, tf.keras.mixed_precision.LossScaleOptimizer)
        return ReplicaStep(fit_objective(model, forward, outside, self.structure_loss), model.trainable_variables,
                           model.optimizer, self.reduce_fn, outside * in_sync, mixed=mixed,
                           optimizer_reduces=self.optimizer_reduces)


def fit_model(job: Job, backend: Backend, inner: Any, optimizer: Any) -> Any:
    """The model ``fit`` trains: the job's model as a ``TwinModel`` with its ``FitParts``, compiled."""
    multi = outputs.is_multi(inner)
    parts = FitParts(backend.reduce_gradients, backend.num_replicas, backend.info.replicas_per_worker,
                     backend.capabilities().optimizer_reduces, bool(job.xla), outputs.structure_loss(job, inner))
    model = twin_model_class()(inputs=inner.inputs, outputs=inner.output if multi else inner.outputs,
                               name=inner.name, parts=parts)
    # tf_keras' default ("auto" = "sum" under MWMS) all-reduces every returned log across workers each step, on top
    # of the metrics' own sync, and so shows N x the loss. "first" keeps the synced metric values as they are and
    # adds no collective that Horovod runs do not have.
    model.distribute_reduction_method = "first"
    model.compile(optimizer=optimizer, **outputs.compile_loss(job, model), steps_per_execution=job.steps_per_execution)
    return model


def _fit_callback_classes() -> Any:
    import tensorflow as tf

    class StepRecorder(tf.keras.callbacks.Callback):
        """Feeds Keras' executions to the shared ``StepHooks``: a sync (loss block, clock mark) when one is due."""

        def __init__(self, hooks: StepHooks, ring: LossRing) -> None:
            super().__init__()
            self.hooks, self.ring = hooks, ring
            self.epoch_start = 0
            # Keras then passes the logs on as tensors: converting them would wait for every step.
            self._supports_tf_logs = True

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.epoch_start = self.hooks.dispatched

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            hooks = self.hooks
            done = self.epoch_start + batch + 1  # batch: index of the execution's last step
            if hooks.step_ended(done) and hooks.sync(self.ring.read(hooks.synced, done)):
                self.model.stop_training = True  # `steps` may end mid-epoch; preemption ends it anywhere

    class WarmupLR(tf.keras.callbacks.Callback):
        """Horovod's LearningRateWarmupCallback rule, then the job's lr_schedule, by global step (momentum
        correction off): ``schedule`` is ``objective.lr_schedule``'s."""

        def __init__(self, hooks: StepHooks, schedule: Any) -> None:
            super().__init__()
            self.hooks, self.schedule = hooks, schedule
            self._supports_tf_logs = True

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            new = self.schedule(self.hooks.global_step)
            if new is not None:
                tf.keras.backend.set_value(self.model.optimizer.lr, new)

    return StepRecorder, WarmupLR


def twin_model_class() -> Any:
    import tensorflow as tf

    class TwinModel(tf.keras.Model):
        """Keras' model whose ``train_step`` is the one step (``common.training.step``: this replica's gradients of
        the compiled loss, the backend's one reduction, apply without reducing again), plus ``step_loss``: this
        replica's mean loss of this step (not a running mean), written into the ``LossRing`` (the host reads it at
        the next sync) and returned in the logs."""

        def __init__(self, *args: Any, parts: FitParts, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.parts = parts  # a plain object: Keras neither tracks nor checkpoints it

        def train_step(self, data: Any) -> dict[str, Any]:
            parts = self.parts
            clock = parts.clock
            if clock is not None:  # Keras fetched ``data`` before this call: the time since the last step ended
                self._on_first_replica(lambda: clock.batch_ready(data, self._train_counter))
            x, y = data
            trained = parts.step(self).train(x, y)
            logs = self.compute_metrics(x, y, trained.outputs, None)
            step_loss = trained.loss
            if parts.local_replicas > 1:
                # Keras returns only the first local replica's value; average them (in-process) first.
                step_loss = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.MEAN, step_loss)
            logs["step_loss"] = step_loss
            if parts.ring is not None:
                # Keras' own step counter of this fit call (0 at the first step): the run step this loss belongs to
                self._on_first_replica(lambda: parts.ring.write(self._train_counter, [step_loss]))
            if clock is not None:
                self._on_first_replica(lambda: clock.step_done([t for t in (trained.update, step_loss)
                                                                if t is not None]))
            return logs

        def _on_first_replica(self, fn: Any) -> Any:
            # every local replica would measure (nearly) the same time, and holds the same averaged loss: the first
            # one records it
            if self.parts.local_replicas == 1:
                return fn()
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            return tf.cond(tf.equal(replica % self.parts.local_replicas, 0), lambda: tf.group(fn()), tf.no_op)

    return TwinModel


def run_fit(ctx: RunContext, model: Any, optimizer: Any, dataset: Any, hooks: StepHooks) -> None:
    """Keras ``fit`` for the run's steps (``optimizer`` is the compiled model's: fit reads it from the model)."""
    job, backend, plan = ctx.job, ctx.backend, ctx.plan
    StepRecorder, WarmupLR = _fit_callback_classes()
    # The backend's own warm-up callback counts Keras epochs from 0: only offered for a run that starts at step 0,
    # and only with a constant schedule after it (twinbench's callback then sets the warm-up and the schedule).
    scheduled = job.lr_schedule != "constant"
    offer = Warmup(job.warmup_epochs, plan.steps_per_epoch, plan.learning_rate) \
        if job.warmup_epochs and hooks.start_step == 0 and not scheduled else None
    callbacks, warmup_handled = backend.fit_callbacks(offer)
    if (job.warmup_epochs or scheduled) and not warmup_handled:
        callbacks.append(WarmupLR(hooks, lr_schedule(job, plan.learning_rate, plan.steps_per_epoch, plan.total_steps,
                                                     plan.replicas)))
    model.parts.ring = ring = LossRing(job.sync_interval, 1)
    hooks.input_clock = model.parts.clock = inputwait.InputClock("gap", hooks.warm)
    callbacks.append(StepRecorder(hooks, ring))
    hooks.start_clock()
    model.fit(dataset, epochs=math.ceil(hooks.run_steps / plan.steps_per_epoch),
              steps_per_epoch=plan.steps_per_epoch, callbacks=callbacks, verbose=2 if ctx.verbose else 0)


# -- custom loop --------------------------------------------------------------------------------------------
def run_ctl(ctx: RunContext, model: Any, optimizer: Any, dataset: Any, hooks: StepHooks,
            probe: StepProbe | None = None) -> None:
    """The custom loop: one tf.function step per global step, the host reading the device only at syncs. A
    ``probe`` (``--diagnose breakdown``) writes its own row per step around the same step."""
    import tensorflow as tf

    job, backend, plan = ctx.job, ctx.backend, ctx.plan
    one = make_step(ctx, model, optimizer)  # forward, loss, local gradients, the backend's SUM, apply
    iterator = iter(dataset)
    counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="twinbench_run_step")
    if probe is None:
        ring = LossRing(job.sync_interval, backend.info.replicas_per_worker)
        hooks.input_clock = clock = inputwait.InputClock("fetch", hooks.warm)

        def row() -> Any:  # timed on the device: how long the batch took
            return backend.run_step(one.run, clock.fetch(lambda: next(iterator), counter))

        def losses(first: int, stop: int) -> list[float]:
            return ring.read(first, stop)
    else:
        ring = LossRing(job.sync_interval, probe.columns, probe.dtype)
        hooks.input_clock = inputwait.NotMeasured(PROBE_INPUT)

        def row() -> Any:
            return probe.device_step(lambda: next(iterator), one, backend)

        def losses(first: int, stop: int) -> list[float]:
            return probe.losses(ring.rows(first, stop))

    @tf.function
    def train_step() -> Any:
        # The iterator is captured, not passed: a (distributed) iterator argument costs a structure check per call.
        written = ring.write(counter, row())
        with tf.control_dependencies([written]):
            return counter.assign_add(1)

    set_lr = keras3.learning_rate_setter(job, optimizer)
    schedule = lr_schedule(job, plan.learning_rate, plan.steps_per_epoch, plan.total_steps, plan.replicas)
    hooks.start_clock()
    while hooks.global_step < plan.total_steps:
        new_lr = schedule(hooks.global_step)
        if new_lr is not None:
            set_lr(new_lr)
        train_step()  # not waited for: the host reads the device only at a sync
        if hooks.dispatched == 0:
            backend.after_first_step(model, optimizer)
        if not hooks.step_ended(hooks.dispatched + 1):
            continue
        if hooks.sync(losses(hooks.synced, hooks.dispatched)):  # progress lines: StepHooks.sync
            break


# Why a probed run's record has no input wait of the loop's: the probe times the input phase itself.
PROBE_INPUT = "a diagnostic probe times the input phase itself (its own record)"
