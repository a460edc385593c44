"""The objective both backends minimise, in one place: the loss, its scaling to the global batch, the
regularisation, and the learning-rate schedule with warm-up.

The rules are the tf.distribute tutorial's, so that MWMS and Horovod compute the same math:
- each replica's objective is sum(per-example loss) / GLOBAL batch + regularisation / replicas, and the backends
  SUM gradients across replicas (``Backend.reduce_gradients`` in ``common.training.step``), which equals the gradient
  of the global-batch mean loss plus the regularisation counted once (``replica_objective``);
- in Keras ``fit`` the loss is the compiled ``fit_loss`` (``compile_loss``: its ``compile`` arguments, and
  ``structure_loss`` for a user loss over a multi-output model's structures, applied by ``fit_objective``): under a
  strategy Keras applies the same rule itself; under Horovod each rank's Keras loss is its local mean, divided by
  the ranks before the same SUM, the same quantity (``fit_objective``); both go through the one step
  (``common.training.step``);
- the LR warm-up is Horovod's ``LearningRateWarmupCallback`` rule (``warmup_multiplier``), re-implemented for the
  native backend and the custom loop, momentum correction off on both sides; after it the job's ``lr_schedule``
  (``lr_schedule``: constant, cosine, or the user's LearningRateSchedule), set from the host before every step in
  every loop, so both backends and both Keras families step through the same values.
Every loop (fit, custom loop, the breakdown diagnostic, parameter-server training) takes its loss from here.

The job's ``loss``: the default, sparse categorical cross-entropy from logits (what every builtin model outputs); a
``tf.keras.losses`` name, built as ``compile(loss=NAME)`` builds it (Keras' defaults, e.g. ``from_logits=False``);
or ``"package.module:function"``, a per-example loss ``fn(y_true, y_pred) -> [batch]`` called as it is (with the
labels and outputs in their structures for a model with several outputs). Or ``loss_per_output``: the weighted sum
of the outputs' per-example losses (``per_output_values``; common/training/outputs.py says how fit matches it).

What these functions read of the loss and the schedule is an ``Objective``: the run's ``Recipe``
(common/training/context.py: the job's keys, or what a compiled model brought in their place), or a ``Job`` itself
where no model is involved (its keys are the recipe then).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from common.core.errors import one_line
from common.workload import usercode
from common.workload.job import DEFAULT_LOSS, loss_weights_of


class Objective(Protocol):
    """The keys the loss, the metrics and the LR schedule are built from (a ``Recipe``, or a ``Job``)."""

    loss: str
    loss_per_output: Mapping[str, str]
    loss_weights: Mapping[str, float]
    metrics: Sequence[str]
    warmup_epochs: int
    lr_schedule: str
    lr_schedule_args: Mapping[str, Any]
    keras: int


def per_example_loss(job: Objective) -> Any:
    """The job's loss, one value per example (no reduction)."""
    import tensorflow as tf

    if job.loss_per_output:  # a model with a dict of outputs: common/training/outputs.py
        return _weighted_sum(job)
    if job.loss == DEFAULT_LOSS:  # the model outputs logits
        return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                             reduction=tf.keras.losses.Reduction.NONE)
    return loss_from("loss", job.loss, tf.keras.losses.Reduction.NONE)


def fit_loss(job: Objective) -> Any:
    """The same loss for ``Model.compile``, with Keras' own reduction (Keras scales it for the strategy)."""
    import tensorflow as tf

    if job.loss_per_output:  # a dict for compile(loss=dict, loss_weights=dict)
        return _per_output(job, tf.keras.losses.Reduction.AUTO)
    if job.loss == DEFAULT_LOSS:
        return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return loss_from("loss", job.loss, tf.keras.losses.Reduction.AUTO)


def is_multi(model: Any) -> bool:
    """Does ``model`` return a structure of outputs (a dict, a list) rather than one tensor?"""
    import tensorflow as tf

    return tf.nest.is_nested(model.output)


def compile_loss(job: Objective, model: Any) -> dict[str, Any]:
    """``Model.compile``'s loss arguments for ``fit``: ``loss_per_output`` as a dict with every output's weight; None
    for a user loss over the structures of a multi-output model (``structure_loss`` has it); else the job's single
    loss (``fit_loss``)."""
    if job.loss_per_output:
        return {"loss": fit_loss(job), "loss_weights": loss_weights_of(job)}
    if is_multi(model):
        return {"loss": None}
    return {"loss": fit_loss(job)}


def structure_loss(job: Objective, model: Any) -> Any:
    """The per-example loss ``fit``'s objective (``fit_objective``) applies to a multi-output model's structures
    (what ``compile_loss`` leaves out), or None."""
    return per_example_loss(job) if is_multi(model) and not job.loss_per_output else None


def loss_from(key: str, value: str, reduction: Any) -> Any:
    """A tf.keras.losses name as compile(loss=NAME) builds it, or the user's per-example function, with
    ``reduction``; UserCodeError (exit 2) naming job key ``key`` if it cannot be had."""
    import sys

    import tensorflow as tf

    if usercode.is_ref(value):
        fn = usercode.function(key, value)

        class UserLoss(tf.keras.losses.Loss):
            def call(self, y_true: Any, y_pred: Any) -> Any:
                return fn(y_true, y_pred)  # as the user wrote it: no reshaping of the labels, structures as they are

        return UserLoss(reduction=reduction, name=value.split(":")[1])
    try:
        found = tf.keras.losses.get(value)
    except (ValueError, TypeError) as e:
        raise usercode.UserCodeError(f"{key} = {value!r} is not a tf.keras.losses name (such as \"mse\", "
                                     f"\"binary_crossentropy\") nor \"package.module:function\": "
                                     f"{str(e).split('. ')[0]}") from None
    if isinstance(found, tf.keras.losses.Loss):  # a class name: the same class with this reduction
        return type(found).from_config({**found.get_config(), "reduction": reduction})
    # a function name: wrapped as compile() wraps it (labels reshaped to the output's rank)
    wrapper = sys.modules[tf.keras.losses.Loss.__module__].LossFunctionWrapper
    return wrapper(found, reduction=reduction, name=value)


def compiled_loss(ref: str, loss: Any) -> str | None:
    """The job ``loss`` value that builds the loss a model function compiled (``loss_from``; common/training/
    compiled.py), or None for no loss; UserCodeError naming ``model = ref`` when no job value builds it exactly."""
    import tensorflow as tf

    if loss is None:
        return None
    losses = tf.keras.losses
    shown = loss if isinstance(loss, str) else f"{type(loss).__name__}({_loss_text(loss)})" \
        if isinstance(loss, losses.Loss) else getattr(loss, "__name__", type(loss).__name__)
    if isinstance(loss, str):
        try:
            found = losses.get(loss)
        except (ValueError, TypeError):
            found = None
        if found is not None:
            # by its class name when it is one: job loss "sparse_categorical_crossentropy" means from logits
            return type(found).__name__ if isinstance(found, losses.Loss) else _by_name(loss)
    elif isinstance(loss, losses.Loss) and getattr(losses, type(loss).__name__, None) is type(loss):
        mine = _loss_settings(loss)
        if type(loss) is losses.SparseCategoricalCrossentropy and mine == {
                **_loss_settings(losses.SparseCategoricalCrossentropy()), "from_logits": True}:
            return DEFAULT_LOSS
        if mine == _loss_settings(type(loss)()):
            return type(loss).__name__
    elif callable(loss) and getattr(losses, getattr(loss, "__name__", ""), None) is loss:
        return _by_name(loss.__name__)
    raise usercode.UserCodeError(f"model = {ref!r} was compiled with loss {shown}, which twinbench cannot carry over "
                                 "exactly: compile without a loss and set loss in the job (a tf.keras.losses name, "
                                 "or \"package.module:function\" returning one value per example)")


def _by_name(name: str) -> str:
    """The job loss value of a tf.keras.losses function name: the job's default name means from logits, Keras'
    function of that name takes probabilities, as the class does by default."""
    return "SparseCategoricalCrossentropy" if name == DEFAULT_LOSS else name


def _loss_settings(loss: Any) -> dict[str, Any]:
    """A loss' configuration that changes its values (its name does not; the reduction twinbench sets itself unless
    the user chose a sum)."""
    config = dict(loss.get_config())
    config.pop("name", None)
    if config.get("reduction") in ("auto", "sum_over_batch_size"):
        config.pop("reduction")
    return config


def _loss_text(loss: Any) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in _loss_settings(loss).items())


def _per_output(job: Objective, reduction: Any) -> dict[str, Any]:
    """``loss_per_output``'s losses by output name, each built as the job's ``loss`` is (``loss_from``)."""
    return {name: loss_from(f"loss_per_output[{name!r}]", value, reduction)
            for name, value in sorted(job.loss_per_output.items())}


def _match(y: Any, out: Any) -> Any:
    """Labels as ``compile`` matches them to their output (tf_keras compile_utils.match_dtype_and_rank): a vector
    against a matrix gets a last axis, and the dtype of the output within the same kind (float, int)."""
    import tensorflow as tf

    if y.shape.rank == 1 and out.shape.rank == 2:
        y = tf.expand_dims(y, axis=-1)
    if (y.dtype.is_floating and out.dtype.is_floating) or (y.dtype.is_integer and out.dtype.is_integer):
        y = tf.cast(y, out.dtype)
    return y


def per_output_values(job: Objective) -> Callable[[Any, Any], dict[str, Any]]:
    """``(labels dict, outputs dict) -> {output name: weight x its per-example losses}`` (``loss_per_output``)."""
    import tensorflow as tf

    losses = _per_output(job, tf.keras.losses.Reduction.NONE)
    weights = loss_weights_of(job)

    def values(y: Any, out: Any) -> dict[str, Any]:
        return {name: loss(_match(y[name], out[name]), out[name]) * weights[name] for name, loss in losses.items()}

    return values


def _weighted_sum(job: Objective) -> Callable[[Any, Any], Any]:
    """``(labels dict, outputs dict) -> [batch]``: the sum of ``per_output_values``, in the outputs' sorted order
    (Keras' order for a dict; common/training/outputs.py)."""
    parts = per_output_values(job)

    def objective(y: Any, out: Any) -> Any:
        total = None
        for value in parts(y, out).values():
            total = value if total is None else total + value
        return total

    return objective


def check_loss_takes(job: Objective, output_shape: tuple[Any, ...], labels: np.ndarray,
                     num_classes: int | None) -> None:
    """UserCodeError (exit 2) naming ``loss`` unless the loss takes a model output of ``output_shape`` with labels
    like ``labels`` and returns one value per example: checked in every rank before the first step."""
    import tensorflow as tf

    k = len(labels)
    shape = (k, *(d or 1 for d in output_shape[1:]))
    what = f"loss = {job.loss!r} with the model's output of shape {tuple(output_shape)} and labels {labels.dtype} " \
           f"of shape {(None, *labels.shape[1:])}"
    if job.loss == DEFAULT_LOSS and num_classes and (output_shape[-1] or num_classes) < num_classes:
        raise usercode.UserCodeError(f"{what}: the model gives {output_shape[-1]} logit(s) per example, fewer than "
                                     f"num_classes = {num_classes} (one per class)")
    try:
        values = per_example_loss(job)(tf.constant(labels), tf.zeros(shape, tf.float32))
    except usercode.UserCodeError:
        raise
    except Exception as e:
        raise usercode.UserCodeError(f"{what}: {one_line(e)}") from None
    if tuple(values.shape) != (k,):
        hint = " (Keras squeezes an output of shape (batch, 1) against labels of shape (batch,): give the labels " \
               "shape (N, 1))" if labels.ndim == 1 and shape[1:] == (1,) else ""
        raise usercode.UserCodeError(f"{what}: gives shape {tuple(values.shape)}, not one value per example "
                                     f"({k},){hint}")


def replica_objective(job: Objective, model: Any, global_batch: int, replicas: int) -> Callable[[Any, Any], Any]:
    """The custom loop's ``(x, y) -> (share, outputs)``: this replica's share of the objective, sum(per-example loss)
    / ``global_batch`` + regularisation / ``replicas``, and the model's outputs (call it inside the replica function,
    under a GradientTape: ``common.training.step``)."""
    import tensorflow as tf

    loss_obj = per_example_loss(job)

    def objective(x: Any, y: Any) -> Any:
        out = model(x, training=True)
        # Divide by the GLOBAL batch: the backends then SUM gradients across replicas.
        loss = tf.nn.compute_average_loss(loss_obj(y, out), global_batch_size=global_batch)
        if model.losses:
            # Regularisation counted once in total, not once per replica (tf.nn.scale_regularization_loss only
            # knows tf.distribute's replica count, not Horovod's, so divide explicitly).
            loss += tf.add_n(model.losses) / replicas
        return loss, out

    return objective


def fit_objective(model: Any, forward: Callable[[Any], Any], outside: int,
                  structure_loss: Callable[[Any, Any], Any] | None = None) -> Callable[[Any, Any], Any]:
    """Keras ``fit``'s ``(x, y) -> (share, outputs)``: the model's compiled loss (``fit_loss``, through
    ``model.compute_loss``, which also feeds Keras' loss metric), which tf_keras divides by the replicas tf.distribute
    knows (``LossesContainer.__call__``, tf_keras/src/engine/compile_utils.py), then divided by ``outside``: the
    replicas of the run it does not know (Horovod's ranks; 1 under MWMS and for a worker of parameter-server training,
    which updates alone), so that the SUM reduction gives the global-batch mean, the custom loop's quantity.

    ``structure_loss``: a user's per-example loss over a multi-output model's structures, which ``compile`` would
    apply to each output apart: computed here by Keras' rule for one loss instead (the batch mean, plus the
    regularisation, both divided by tf.distribute's replicas; common/training/outputs.py). ``forward``: the model's
    forward pass (jit-compiled with ``xla``: the collective-free part only)."""
    import tensorflow as tf

    def objective(x: Any, y: Any) -> Any:
        out = forward(x)
        if structure_loss is None:
            loss = model.compute_loss(x, y, out, None)
        else:
            in_sync = tf.distribute.get_strategy().num_replicas_in_sync
            loss = tf.reduce_mean(structure_loss(y, out))
            if model.losses:
                loss += tf.add_n(model.losses)
            loss = loss / in_sync if in_sync > 1 else loss
        return (loss / outside if outside > 1 else loss), out

    return objective


def recorded_loss(share: Any, replicas: Any) -> Any:
    """The inverse of the scaling above, for the record: this replica's own mean loss (+ regularisation) from its
    ``share`` of the objective. Dividing by the global batch (= per-replica batch x ``replicas``) and the
    regularisation by ``replicas`` are both undone by one multiplication by ``replicas``. The loop picks the dtypes
    (a Python int, or a tensor cast to the loss' dtype; the share cast first where the record is float64), so the
    recorded values stay exactly what each loop computed."""
    return share * replicas


def mean_over_ranks(losses: Sequence[float]) -> float:
    """One step's loss over the whole global batch from each rank's (or local replica's) mean loss: every replica
    has the same batch size, so the mean of their means is the global mean. Summed in rank order in float64."""
    return sum(losses) / len(losses)


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


def lr_schedule(job: Objective, lr: float, steps_per_epoch: int, total_steps: int,
                replicas: int) -> Callable[[int], Any]:
    """``step -> LR`` to set before 0-based global ``step``, or None to leave it where it is: the warm-up
    (``lr_at_step``, from ``lr / replicas``: the recipe's ``lr_replicas``), then the job's ``lr_schedule`` over the
    ``total_steps - warm-up`` steps after it: constant (None), cosine (from ``lr`` to 0 at the end of the run), or
    the user's schedule, made once here by ``function(lr, decay_steps, **lr_schedule_args)`` (a
    LearningRateSchedule of the job's Keras family) and evaluated at the steps since the warm-up ended.
    UserCodeError (exit 2) naming ``lr_schedule`` otherwise."""
    import math

    warm = job.warmup_epochs * steps_per_epoch
    decay = max(total_steps - warm, 1)
    user = _user_schedule(job, lr, decay) if usercode.is_ref(job.lr_schedule) else None

    def at(step: int) -> float | None:
        if step < warm:
            return lr_at_step(step, lr, steps_per_epoch, replicas, job.warmup_epochs)
        if user is not None:
            return float(user(step - warm))
        if job.lr_schedule == "cosine":
            return lr * 0.5 * (1.0 + math.cos(math.pi * min(step - warm, decay) / decay))
        return None

    return at


def _user_schedule(job: Objective, lr: float, decay_steps: int) -> Any:
    import tensorflow as tf

    schedule = usercode.call("lr_schedule", job.lr_schedule, lr, decay_steps, **job.lr_schedule_args)
    if job.keras == 3:
        import keras

        base, family = keras.optimizers.schedules.LearningRateSchedule, "keras.optimizers.schedules (Keras 3)"
    else:
        base, family = tf.keras.optimizers.schedules.LearningRateSchedule, "tf.keras.optimizers.schedules (tf_keras)"
    if not isinstance(schedule, base):
        kind = f"{type(schedule).__module__}.{type(schedule).__name__}"
        raise usercode.UserCodeError(f"lr_schedule = {job.lr_schedule!r} returned a {kind}, not a "
                                     f"LearningRateSchedule of {family}, the family of keras = {job.keras}")
    return schedule

