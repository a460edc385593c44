"""Validation during training, one implementation for Keras ``fit`` and the custom loop (never Keras'
``validation_data``, whose behaviour differs per strategy and per backend).

When the job's dataset has a validation split (``common.workload.data.validation_arrays``), the run evaluates it
at the end of every ``eval_every_epochs``-th epoch (global step a multiple of ``eval_every_epochs`` x steps per
epoch) and always once after its last step, partial last epoch or not, so every run with validation data records
the validation numbers of its final weights (``due``). An evaluation computes:

- ``loss``: the mean over the validation examples of the job's per-example loss
  (``common.training.objective.per_example_loss``), summed in float64 on the host. The data loss only: the
  regularisation term the training step losses include is not in it (comparable across ``weight_decay`` values);
- each of the job's ``metrics``, by Keras name, computed per example and averaged like the loss (``metric_fn``).
  "accuracy" / "acc" follow Keras ``compile``'s rule on the shapes: one output per example = binary accuracy,
  labels of lower rank than the outputs (integer class labels, the builtin models' logits) = sparse categorical
  accuracy (arg max of the logits = the label; arg max of logits = arg max of probabilities), else categorical
  accuracy. Any other name is the ``tf.keras.metrics`` function of that name (e.g. "sparse_top_k_categorical_accuracy"
  with Keras' k = 5, "mae"), labels reshaped to the outputs' rank as compile does for a metric of one value per
  label; a stateful metric class (AUC, Precision...) has no per-example value and is refused (exit 2).

Design, for exact agreement across backends and world sizes: EVERY rank evaluates the WHOLE validation set, in
fixed batches of ``EVAL_BATCH`` examples (independent of the world size and of the per-replica batch), in file order,
with the same weights (identical on every rank after a synchronous step), and reduces on the host in float64 in a
fixed order. No collective takes part in the numbers, so native and Horovod, 1 worker and N workers, compute the
same forward passes on the same batches: they agree as closely as the weights do. (Sharding the set and summing
through ``backend.allsum`` would be N times cheaper, but ties each example's batch to the world size, and with it
the float32 rounding of its forward pass.) Two collectives frame it, on every rank at the same step:
``backend.sync_model_state`` first (Horovod ranks hold their own BatchNorm statistics until averaged; MWMS reads the
mean), and a barrier last, so all ranks leave the evaluation together and the next timed window starts equal.

The evaluation is not training: ``common.training.hostsync.StepHooks`` takes it right after a host sync (the device
has finished the steps before it) and shifts every later clock mark back by its duration, so the throughput, the
step times and the progress lines measure training alone; each evaluation's ``wall_time`` (seconds since the first
training step started) includes every evaluation before it: time to target is wall time.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from common.core.errors import UsageError
from common.training.objective import Objective
from common.workload.job import Job

EVAL_BATCH = 256  # examples per forward pass: fixed, so no world size or per-replica batch changes the rounding
ACCURACY = ("accuracy", "acc")  # Keras compile picks the accuracy from the shapes
SPARSE = ("sparse_categorical_accuracy", "sparse_top_k_categorical_accuracy", "sparse_categorical_crossentropy")


# -- the schedule and the target (no TensorFlow) ------------------------------------------------------------------
def due(step: int, steps_per_epoch: int, every_epochs: int, total_steps: int) -> bool:
    """Is an evaluation due after global step ``step`` (steps done, 1-based)? At the end of every ``every_epochs``-th
    epoch, and after the last step."""
    if step <= 0:
        return False
    return step == total_steps or step % (steps_per_epoch * every_epochs) == 0


def reached(value: float, metric: str, target: float) -> bool:
    """The target rule: the loss reaches its target at or below it, a metric at or above it."""
    if not math.isfinite(value):
        return False
    return value <= target if metric == "loss" else value >= target


def time_to_target(evaluations: Sequence[Mapping[str, Any]], metric: str, target: float) -> float | None:
    """The ``wall_time`` of the first evaluation where ``metric`` reaches ``target``; None without a target or
    when no evaluation reached it."""
    if not metric:
        return None
    for e in evaluations:
        value = e.get(metric)
        if isinstance(value, int | float) and reached(float(value), metric, target):
            return float(e["wall_time"])
    return None


def summary_line(evaluations: Sequence[Mapping[str, Any]], job: Job, ttt: float | None,
                 metrics: Sequence[str] | None = None) -> str | None:
    """One line on the last evaluation (and the target), or None when the run evaluated nothing. ``metrics``: the
    run's recipe's (a compiled model's), else the job's."""
    if not evaluations:
        return None
    last = evaluations[-1]
    names = ("loss", *(job.metrics if metrics is None else metrics))
    values = ", ".join(f"{k} {float(last[k]):.4f}" for k in names if k in last)
    line = f"[twinbench] validation after step {last['step']} (epoch {float(last['epoch']):.2f}): {values}"
    if job.target_metric:
        op = "<=" if job.target_metric == "loss" else ">="
        got = f"reached at {ttt:.2f} s" if ttt is not None else "not reached"
        line += f"; target {job.target_metric} {op} {job.target_value:g} {got}"
    return line


# -- the evaluation (TensorFlow) ----------------------------------------------------------------------------------
def metric_fn(name: str) -> Callable[[Any, Any], Any]:
    """``(labels, outputs) -> one value per example`` for a job metric name (the rule in the module docstring);
    UsageError naming it when Keras has no per-example function of that name."""
    import tensorflow as tf

    m = tf.keras.metrics
    if name in ACCURACY:
        def accuracy(y: Any, out: Any) -> Any:  # tf_keras compile_utils.MetricsContainer._get_metric_object's rule
            if out.shape[-1] == 1:
                return m.binary_accuracy(y if y.shape.rank == out.shape.rank else tf.expand_dims(y, -1), out)
            if y.shape.rank < out.shape.rank or y.shape[-1] == 1:
                return m.sparse_categorical_accuracy(y, out)
            return m.categorical_accuracy(y, out)
        return accuracy
    try:
        fn = m.get(name)
    except (ValueError, TypeError):
        fn = None
    if isinstance(fn, m.Metric):  # a mean of a per-example function (MeanMetricWrapper): that function
        inner, kwargs = getattr(fn, "_fn", None), dict(getattr(fn, "_fn_kwargs", None) or {})
        fn = functools.partial(inner, **kwargs) if callable(inner) else None
    if fn is None or isinstance(fn, type) or not callable(fn):
        raise UsageError(f"metrics: {name!r} is not a tf.keras.metrics function with one value per example (such as "
                         "\"accuracy\", \"sparse_top_k_categorical_accuracy\", \"mae\")")
    if name in SPARSE:
        return fn

    def per_label(y: Any, out: Any) -> Any:  # labels of the outputs' rank, as compile reshapes them
        return fn(tf.expand_dims(y, -1) if y.shape.rank == out.shape.rank - 1 else y, out)
    return per_label


def _batch_fn(job: Objective, model: Any) -> Any:
    """A tf.function: (x, y) -> per-example loss and one per-example vector per metric (float32)."""
    import tensorflow as tf

    from common.training.objective import per_example_loss

    loss_obj = per_example_loss(job)
    fns = [metric_fn(name) for name in job.metrics]

    def per_example_values(v: Any, n: Any) -> Any:  # [n] float32: a [n, ...] result averaged over its other axes
        v = tf.cast(v, tf.float32)
        return tf.reduce_mean(tf.reshape(v, [n, -1]), axis=1)

    @tf.function(reduce_retracing=True)
    def per_example(x: Any, y: Any) -> list[Any]:
        out = tf.nest.map_structure(lambda t: tf.cast(t, tf.float32), model(x, training=False))  # or a structure
        n = tf.shape(tf.nest.flatten(out)[0])[0]
        return [per_example_values(f(y, out), n) for f in (loss_obj, *fns)]

    return per_example


def evaluate_arrays(job: Objective, model: Any, x: np.ndarray, y: np.ndarray, batch: int = EVAL_BATCH,
                    ping: Callable[[], None] | None = None, fn: Any = None) -> dict[str, float]:
    """``{"loss": ..., metric: ...}``: means over every example of (x, y), in batches of ``batch`` in order,
    summed in float64 on the host (the same numbers on every rank that holds the same weights). ``fn``: a
    ``_batch_fn`` made earlier (one trace per run); ``ping``: called after every batch (the watchdog)."""
    if len(x) != len(y) or len(y) == 0:
        raise ValueError(f"validation split: {len(x)} inputs and {len(y)} labels (need as many, at least one)")
    fn = fn or _batch_fn(job, model)
    names = ("loss", *job.metrics)
    sums = [0.0] * len(names)
    for lo in range(0, len(y), batch):
        parts = fn(x[lo:lo + batch], y[lo:lo + batch])
        for i, p in enumerate(parts):
            sums[i] += float(np.sum(p.numpy(), dtype=np.float64))
        if ping is not None:
            ping()
    return {name: s / len(y) for name, s in zip(names, sums)}


class Evaluator:
    """One run's evaluations (every rank makes one, and evaluates at the same steps)."""

    def __init__(self, job: Job, model: Any, backend: Any, arrays: tuple[np.ndarray, np.ndarray],
                 steps_per_epoch: int, total_steps: int, spec: Objective | None = None) -> None:
        self.job, self.model, self.backend = job, model, backend
        self.spec: Objective = spec or job  # the loss and metrics: the run's recipe's (a compiled model's)
        x = np.asarray(arrays[0])
        self.x = x.astype(np.float32) if x.dtype == np.float64 else x  # the model's inputs are float32
        self.y = np.asarray(arrays[1])
        self.steps_per_epoch, self.total_steps = steps_per_epoch, total_steps
        self._fn: Any = None
        self._last = -1  # the global step last evaluated (never twice at one step)

    def due(self, step: int) -> bool:
        return step != self._last and due(step, self.steps_per_epoch, self.job.eval_every_epochs, self.total_steps)

    def values(self, ping: Callable[[], None] | None) -> dict[str, float]:
        """The numbers of one evaluation (``run``'s): the arrays' (an input function's: ``streamed``)."""
        return evaluate_arrays(self.spec, self.model, self.x, self.y, ping=ping, fn=self._fn)

    def run(self, step: int, ping: Callable[[], None] | None = None) -> dict[str, Any]:
        """Evaluate after global step ``step``: the record's entry without its times (``StepHooks`` adds them).
        Collectives: every rank calls it at the same step."""
        self._last = step
        self.backend.sync_model_state(self.model)  # BatchNorm statistics as MWMS reads them: the mean over ranks
        if self._fn is None:
            self._fn = _batch_fn(self.spec, self.model)
        values = self.values(ping)
        self.backend.barrier()  # every rank leaves together: the next timed window starts equal on all of them
        return {"epoch": step / self.steps_per_epoch, "step": step, **values}


def no_evaluation_line(job: Job, metrics: Sequence[str] | None = None) -> str | None:
    """Why the job's ``metrics`` (``metrics``: the recipe's), or ``target_metric``, will never be computed, as one
    line, or None."""
    asked = [*(job.metrics if metrics is None else metrics)] or ([job.target_metric] if job.target_metric else [])
    if not asked:
        return None
    return (f"[twinbench] warning: metrics = {asked} but dataset = {job.dataset!r} gives no validation data: no "
            "evaluation will run; return {\"train\": ..., \"validation\": (x, y)} from a dataset function (a "
            "\"validation\" dataset from an input function)")


def say_no_evaluation(job: Job, backend: Any, metrics: Sequence[str] | None = None) -> None:
    """The chief says once, before training, that the job's metrics will not be computed (stderr: under --quiet too)."""
    line = no_evaluation_line(job, metrics)
    if line and backend.is_chief:
        print(line, file=sys.stderr, flush=True)


def make_evaluator(job: Job, model: Any, backend: Any, steps_per_epoch: int, total_steps: int,
                   spec: Objective | None = None) -> Evaluator | None:
    """The run's evaluator, or None when the job's dataset has no validation split. ``spec``: the run's recipe (the
    loss and metrics evaluated), else the job's keys."""
    from common.workload import data as data_mod

    spec = spec or job
    arrays = data_mod.validation_arrays(job)
    if arrays is None:
        say_no_evaluation(job, backend, spec.metrics)
        return None
    for name in spec.metrics:
        metric_fn(name)  # UsageError (exit 2) before the first step for a name without per-example values
    return Evaluator(job, model, backend, arrays, steps_per_epoch, total_steps, spec)
