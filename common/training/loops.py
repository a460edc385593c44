"""The two training loops, Keras ``fit`` and a custom ``tf.function`` loop (with a probe: ``--diagnose breakdown``).

Both run the one step (``common.training.step``: the tape, the loss scaling, the backend's one reduction) with the
job's objective and LR schedule from ``common.training.objective`` (the loss-scaling rules that make both backends
compute the same math), and hand the host's side to ``common.training.hostsync.StepHooks`` (when the host syncs, and
what it does there). Per-step losses are written on the device into the one ``LossRing``, read at syncs (no extra
collective inside the timed loop) and averaged across ranks once at the end: every replica has the same batch size,
so the mean of replica means is the global mean.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from common.core.contract import Backend, Warmup
from common.training import inputwait, keras3
from common.training.context import RunContext
from common.training.hostsync import StepHooks
from common.training.objective import (
    Objective,
    compile_loss,
    fit_objective,
    is_multi,
    lr_schedule,
    mean_over_ranks,
    structure_loss,
)
from common.training.step import ReplicaStep, make_step
from common.workload.job import Job


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
    writes per step instead of the losses alone, and how the host reads the losses back (its untimed steps and what
    it measured: a part of the hooks, ``common.training.hostsync.Part``)."""

    columns: int  # values the step writes per step (its ring's row)
    dtype: Any  # of those values (tf.float64 for timestamps)

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
    structure_loss: Any = None  # one per-example loss over a multi-output model's structures (objective.structure_loss)
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


def fit_model(job: Job, recipe: Objective, backend: Backend, inner: Any, optimizer: Any) -> Any:
    """The model ``fit`` trains: the job's model as a ``TwinModel`` with its ``FitParts``, compiled with the
    recipe's loss."""
    multi = is_multi(inner)
    parts = FitParts(backend.reduce_gradients, backend.num_replicas, backend.info.replicas_per_worker,
                     backend.capabilities().optimizer_reduces, bool(job.xla), structure_loss(recipe, inner))
    model = twin_model_class()(inputs=inner.inputs, outputs=inner.output if multi else inner.outputs,
                               name=inner.name, parts=parts)
    # tf_keras' default ("auto" = "sum" under MWMS) all-reduces every returned log across workers each step, on top
    # of the metrics' own sync, and so shows N x the loss. "first" keeps the synced metric values as they are and
    # adds no collective that Horovod runs do not have.
    model.distribute_reduction_method = "first"
    model.compile(optimizer=optimizer, **compile_loss(recipe, model),
                  steps_per_execution=job.steps_per_execution)
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
    job, backend, plan, recipe = ctx.job, ctx.backend, ctx.plan, ctx.trained_by
    StepRecorder, WarmupLR = _fit_callback_classes()
    # The backend's own warm-up callback counts Keras epochs from 0 and ramps from LR / its own replicas: only
    # offered for a run that starts at step 0, warms up for its own replicas (not --lr-replicas), and has a constant
    # schedule after it (otherwise twinbench's callback sets the warm-up and the schedule).
    scheduled = recipe.lr_schedule != "constant"
    offer = Warmup(recipe.warmup_epochs, plan.steps_per_epoch, recipe.learning_rate) \
        if recipe.warmup_epochs and hooks.start_step == 0 and not scheduled \
        and recipe.lr_replicas == plan.replicas else None
    callbacks, warmup_handled = backend.fit_callbacks(offer)
    if (recipe.warmup_epochs or scheduled) and not warmup_handled:
        callbacks.append(WarmupLR(hooks, lr_schedule(recipe, recipe.learning_rate, plan.steps_per_epoch,
                                                     plan.total_steps, recipe.lr_replicas)))
    model.parts.ring = ring = LossRing(job.sync_interval, 1)
    model.parts.clock = input_clock(hooks, "gap")
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
        clock = input_clock(hooks, "fetch")

        def row() -> Any:  # timed on the device: how long the batch took
            return backend.run_step(one.run, clock.fetch(lambda: next(iterator), counter))

        def losses(first: int, stop: int) -> list[float]:
            return ring.read(first, stop)
    else:
        ring = LossRing(job.sync_interval, probe.columns, probe.dtype)

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
    recipe = ctx.trained_by
    schedule = lr_schedule(recipe, recipe.learning_rate, plan.steps_per_epoch, plan.total_steps, recipe.lr_replicas)
    hooks.start_clock()
    while hooks.global_step < plan.total_steps:
        new_lr = schedule(hooks.global_step)
        if new_lr is not None:
            set_lr(new_lr)
        train_step()  # not waited for: the host reads the device only at a sync
        if not hooks.step_ended(hooks.dispatched + 1):
            continue
        if hooks.sync(losses(hooks.synced, hooks.dispatched)):  # progress lines: StepHooks.sync
            break


# Why a probed run's record has no input wait of the loop's: the probe times the input phase itself.
PROBE_INPUT = "a diagnostic probe times the input phase itself (its own record)"
INPUT_METHOD = {"fit": "gap", "ctl": "fetch"}  # the input wait each loop measures (common.training.inputwait)


def input_clock(hooks: StepHooks, method: str) -> inputwait.InputClock:
    """The loop's input clock, a part its hooks were built with (``common.training.train.make_hooks``)."""
    clock = hooks.find(inputwait.InputClock)
    if clock is None or clock.method != method:
        raise RuntimeError(f"this loop measures the input wait by {method!r}: its hooks hold {clock!r}")
    return clock
