"""The two training loops, Keras ``fit`` and a custom ``tf.function`` loop, and what runs around every step.

Same math on both backends (the loss-scaling rules of the tf.distribute tutorial):
- each replica's objective is sum(per-example loss) / GLOBAL batch + regularisation / replicas, and the
  backends SUM gradients across replicas (MWMS ``apply_gradients``; Horovod ``op=Sum``), which equals the
  gradient of the global-batch mean loss plus the regularisation counted once;
- in ``fit`` Keras applies the same rule itself under a strategy; under Horovod each rank's Keras loss is its
  local mean and ``DistributedOptimizer`` averages, which is the same quantity;
- the LR warm-up is Horovod's ``LearningRateWarmupCallback`` rule, re-implemented for the native backend and
  the custom loop (``warmup_multiplier``), momentum correction off on both sides.
Per-step losses are recorded locally (no extra collective inside the timed loop) and averaged across ranks
once at the end: every replica has the same batch size, so the mean of replica means is the global mean.
"""

from __future__ import annotations

import math
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from backends.base import Backend
from common import reliability as rel
from common.job import Job
from common.runconfig import RunOptions


def warmup_multiplier(epoch: float, steps_per_epoch: int, replicas: int, warmup_epochs: int) -> float:
    """Horovod's warm-up multiplier (horovod/_keras/callbacks.py) at fractional ``epoch`` = e + batch/spe.

    Goes from ~1/replicas at the first batch to exactly 1 at the last batch of epoch ``warmup_epochs - 1``.
    """
    epoch += 1.0 / steps_per_epoch
    return 1.0 / replicas * (epoch * (replicas - 1) / warmup_epochs + 1)


def lr_at_step(step: int, lr: float, steps_per_epoch: int, replicas: int, warmup_epochs: int) -> float | None:
    """LR to set before 0-based global ``step``; None after warm-up (the LR then stays where warm-up left it)."""
    epoch, batch = divmod(step, steps_per_epoch)
    if warmup_epochs <= 0 or epoch >= warmup_epochs:
        return None
    return lr * warmup_multiplier(epoch + batch / steps_per_epoch, steps_per_epoch, replicas, warmup_epochs)


@dataclass(frozen=True)
class Plan:
    """The run's derived sizes: what the chief prints at start and both loops follow."""

    global_batch: int
    learning_rate: float  # scaled for the replica count (job.lr_scaling)
    steps_per_epoch: int
    total_steps: int
    replicas: int


@dataclass
class StepHooks:
    """What happens around every training step in both modes: timing, loss record, watchdog, preemption."""

    backend: Backend
    opts: RunOptions
    start_step: int  # global steps already done (a resumed run)
    total: int  # global steps the job runs
    preemption: rel.Preemption
    watchdog: rel.Watchdog | None
    begins: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    first_step_done: float | None = None
    stopped_at: int | None = None

    @property
    def global_step(self) -> int:
        """0-based index of the step about to run (or running)."""
        return self.start_step + len(self.losses)

    def begin(self) -> None:
        self.begins.append(time.perf_counter())

    def end(self, loss: float) -> bool:
        """Record a finished step; True when training must stop now (done or preempted)."""
        self.ends.append(time.perf_counter())
        self.losses.append(loss)
        done = self.global_step  # steps completed
        if self.first_step_done is None:
            self.first_step_done = time.time()
            if self.opts.verbose and self.backend.is_chief:
                print(f"[twinbench] first step done {self.first_step_done - self.opts.t_process_start:.1f} s after "
                      "process start", flush=True)
        if self.watchdog is not None:
            self.watchdog.progress(f"step {done}")
        if self.opts.signal_at_step == done and self.backend.is_chief:
            os.kill(os.getpid(), signal.SIGTERM)
        if done >= self.total:
            return True
        if done % self.opts.preempt_check_steps == 0:
            # Every rank asks at the same steps, so all stop after the same step even if only some got the
            # signal. Outside the step's timed interval (begin/end above).
            if self.backend.any_flag(self.preemption.signalled is not None):
                self.stopped_at = done
                return True
        return False

    def step_times(self) -> list[float]:
        return [e - b for b, e in zip(self.begins, self.ends)]


# -- Keras fit ----------------------------------------------------------------------------------------------
def _fit_callback_classes() -> Any:
    import tensorflow as tf

    class StepRecorder(tf.keras.callbacks.Callback):
        """Feeds Keras' batches to the shared ``StepHooks`` (timing, loss, watchdog, preemption agreement)."""

        def __init__(self, hooks: StepHooks) -> None:
            super().__init__()
            self.hooks = hooks

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self.hooks.begin()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            # float() waits for the step: the timing below covers the whole step.
            if self.hooks.end(float(logs["step_loss"])):
                self.model.stop_training = True  # `steps` may end mid-epoch; preemption ends it anywhere

    class WarmupLR(tf.keras.callbacks.Callback):
        """Horovod's LearningRateWarmupCallback rule, by global step (momentum correction off)."""

        def __init__(self, hooks: StepHooks, lr: float, steps_per_epoch: int, replicas: int, warmup: int) -> None:
            super().__init__()
            self.hooks, self.args = hooks, (lr, steps_per_epoch, replicas, warmup)

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            lr, spe, replicas, warm = self.args
            new = lr_at_step(self.hooks.global_step, lr, spe, replicas, warm)
            if new is not None:
                tf.keras.backend.set_value(self.model.optimizer.lr, new)

    return StepRecorder, WarmupLR


def twin_model_class() -> Any:
    import tensorflow as tf

    class TwinModel(tf.keras.Model):
        """Keras' own train step, plus ``step_loss``: this replica's mean loss of this step (not a running mean)."""

        local_replicas = 1
        xla_forward = None  # a holder (not tracked by Keras) whose .fn is the jit-compiled forward pass, or None

        def train_step(self, data: Any) -> dict[str, Any]:
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self.xla_forward.fn(x) if self.xla_forward is not None else self(x, training=True)
                loss = self.compute_loss(x, y, y_pred, None)
            self.optimizer.minimize(loss, self.trainable_variables, tape=tape)
            logs = self.compute_metrics(x, y, y_pred, None)
            # Under a strategy Keras divided this replica's loss by the replica count; undo it for the record.
            step_loss = loss * tf.cast(tf.distribute.get_strategy().num_replicas_in_sync, loss.dtype)
            if self.local_replicas > 1:
                # Keras returns only the first local replica's value; average them (in-process) first.
                step_loss = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.MEAN, step_loss)
            logs["step_loss"] = step_loss
            return logs

    return TwinModel


def run_fit(job: Job, backend: Backend, model: Any, dataset: Any, hooks: StepHooks, plan: Plan,
            verbose: bool) -> None:
    StepRecorder, WarmupLR = _fit_callback_classes()
    callbacks = backend.fit_callbacks()
    if job.warmup_epochs:
        # The backend's own warm-up callback counts Keras epochs from 0: only valid for a run that starts at step 0.
        own = backend.fit_warmup(job.warmup_epochs, plan.steps_per_epoch, plan.learning_rate) \
            if hooks.start_step == 0 else None
        callbacks.append(own if own is not None else
                         WarmupLR(hooks, plan.learning_rate, plan.steps_per_epoch, plan.replicas, job.warmup_epochs))
    callbacks.append(StepRecorder(hooks))
    model.fit(dataset, epochs=math.ceil((plan.total_steps - hooks.start_step) / plan.steps_per_epoch),
              steps_per_epoch=plan.steps_per_epoch, callbacks=callbacks, verbose=2 if verbose else 0)


# -- custom loop --------------------------------------------------------------------------------------------
def _ctl_step_fn(job: Job, backend: Backend, model: Any, optimizer: Any, plan: Plan) -> Any:
    """One replica's step: forward, loss scaled by the global batch, gradients through the backend's tape."""
    import tensorflow as tf

    loss_obj = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=tf.keras.losses.Reduction.NONE)
    mixed = job.mixed_precision
    gb, replicas = plan.global_batch, plan.replicas

    def forward(x: Any, y: Any) -> Any:
        per_example = loss_obj(y, model(x, training=True))
        # Divide by the GLOBAL batch: the backends then SUM gradients across replicas.
        loss = tf.nn.compute_average_loss(per_example, global_batch_size=gb)
        if model.losses:
            # Regularisation counted once in total, not once per replica (tf.nn.scale_regularization_loss
            # only knows tf.distribute's replica count, not Horovod's, so divide explicitly).
            loss += tf.add_n(model.losses) / replicas
        return loss

    if job.xla:  # compile the collective-free part only: Horovod's allreduce is not an XLA op
        forward = tf.function(forward, jit_compile=True)

    def step_fn(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = forward(x, y)
            target = optimizer.get_scaled_loss(loss) if mixed else loss
        grads = backend.wrap_tape(tape).gradient(target, model.trainable_variables)
        if mixed:
            grads = optimizer.get_unscaled_gradients(grads)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss * replicas  # this replica's own mean loss (+ regularisation)

    return step_fn


def run_ctl(job: Job, backend: Backend, model: Any, optimizer: Any, dataset: Any, hooks: StepHooks, plan: Plan,
            verbose: bool) -> None:
    import tensorflow as tf

    step_fn = _ctl_step_fn(job, backend, model, optimizer, plan)
    iterator = iter(dataset)

    @tf.function
    def train_step() -> Any:
        # The iterator is captured, not passed: a (distributed) iterator argument costs a structure check per call.
        return backend.run(step_fn, next(iterator))

    lr_var = optimizer.lr
    first = True
    spe = plan.steps_per_epoch
    while hooks.global_step < hooks.total:
        step = hooks.global_step
        new_lr = lr_at_step(step, plan.learning_rate, spe, plan.replicas, job.warmup_epochs)
        if new_lr is not None:
            tf.keras.backend.set_value(lr_var, new_lr)
        hooks.begin()
        local = train_step()
        loss = sum(float(v) for v in local) / len(local)  # reading the value waits for the step
        stop = hooks.end(loss)
        if first:
            backend.after_first_step(model, optimizer)
            first = False
        if verbose and (step % max(1, spe // 4) == 0 or hooks.global_step == hooks.total):
            print(f"step {step + 1}/{hooks.total} rank-0 loss {loss:.5f}", flush=True)
        if stop:
            break
