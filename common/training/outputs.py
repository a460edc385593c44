"""Models with several outputs: their outputs checked against the job's loss and labels before the first step. The
loss itself, in every loop and in fit, is common/training/objective.py's.

Two ways to give the loss of such a model (the job keys: ``common/workload/job.py``):

- ``loss = "package.module:function"``: ``fn(y_true, y_pred) -> [batch]`` gets the labels and the model's outputs
  in their structures (dicts, tuples) and returns one value per example. The custom loops call it as every
  per-example loss (``common.training.objective.replica_objective``). Keras ``compile`` would instead apply one
  loss to each output separately, so ``fit`` compiles no loss and its objective computes it
  (``objective.structure_loss``, then ``objective.fit_objective``) by Keras' rule for one loss: the batch mean,
  divided by the strategy's replicas, plus the regularisation divided the same way (tf_keras/src/engine/
  compile_utils.py, ``LossesContainer.__call__``).
- ``loss_per_output = {name = loss}`` (and ``loss_weights``): the model returns a dict of outputs, the labels are a
  dict with the same keys, and the per-example objective is sum over outputs of weight x that output's
  per-example loss. ``fit`` compiles ``loss=dict, loss_weights=dict`` (``objective.compile_loss``; Keras sums
  weight x batch mean per output: the same quantity); the custom loops use ``objective.per_example_loss``, labels
  first matched to their output's dtype and rank as ``compile`` matches them (``match_dtype_and_rank`` in the same
  file).

Checked in every rank before the first step (``check``): each mismatch one line naming its job key, exit 2.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from common.core.errors import one_line
from common.training import objective
from common.training.objective import Objective
from common.workload import usercode
from common.workload.job import DEFAULT_LOSS, Job


# -- the check before the first step --------------------------------------------------------------------------------
def check(job: Job, model: Any, labels: Any, num_classes: int | None, spec: Objective | None = None) -> None:
    """UserCodeError (exit 2, one line naming the key) unless the job's loss takes the model's outputs with labels
    like ``labels`` (NumPy, in their structure; None: not known, the structure alone is checked). ``spec``: the
    run's recipe (its loss and metrics: a compiled model's), else the job's keys."""
    import tensorflow as tf

    spec = spec or job
    out = model.output
    if not tf.nest.is_nested(out):
        if spec.loss_per_output:
            raise usercode.UserCodeError(f"loss_per_output: model = {job.model!r} has one output: give its loss "
                                         "with loss")
        if labels is not None and tf.nest.is_nested(labels):
            raise usercode.UserCodeError(f"dataset = {job.dataset!r}: labels are a {type(labels).__name__} but "
                                         f"model = {job.model!r} has one output")
        if labels is not None:
            objective.check_loss_takes(spec, tuple(model.output_shape), labels, num_classes)
        return
    names = sorted(out) if isinstance(out, dict) else None
    _check_keys(job, spec, out, names)
    if labels is None:
        return
    if spec.loss_per_output:
        if not isinstance(labels, dict):
            raise usercode.UserCodeError(f"dataset = {job.dataset!r}: labels are a {type(labels).__name__}: "
                                         "loss_per_output takes a dict of labels by output name")
        missing = [n for n in names or [] if n not in labels]
        if missing:
            raise usercode.UserCodeError(f"dataset = {job.dataset!r}: the labels have no key {missing[0]!r} for "
                                         f"the model's output {missing[0]!r} (labels: {sorted(labels)})")
    _check_values(spec, out, labels)


def _check_keys(job: Job, spec: Objective, out: Any, names: list[str] | None) -> None:
    what = f"model = {job.model!r} has outputs {names if names is not None else f'[{len(out)} in a list]'}"
    if spec.metrics:
        raise usercode.UserCodeError(f"metrics = {list(spec.metrics)}: {what}; metrics are computed for "
                                     "single-output models only (the validation loss is computed all the same)")
    if spec.loss_per_output:
        if names is None:
            raise usercode.UserCodeError(f"loss_per_output: {what}: return a dict of outputs by name (or give "
                                         "loss = \"package.module:function\" taking the structures)")
        extra = sorted(set(spec.loss_per_output) - set(names))
        missing = sorted(set(names) - set(spec.loss_per_output))
        if extra:
            raise usercode.UserCodeError(f"loss_per_output[{extra[0]!r}]: the model has no output {extra[0]!r} "
                                         f"({what})")
        if missing:
            raise usercode.UserCodeError(f"loss_per_output: no loss for the model's output {missing[0]!r} ({what}; "
                                         "a weight of 0 in loss_weights leaves an output out)")
    elif not usercode.is_ref(spec.loss):
        shown = f"loss = {spec.loss!r}" if spec.loss != DEFAULT_LOSS else "loss (the default)"
        raise usercode.UserCodeError(f"{shown}: {what}: give loss_per_output = {{name = \"loss\", ...}} or loss = "
                                     "\"package.module:function\" taking the label and output structures")


def _check_values(job: Objective, out: Any, labels: Any) -> None:
    """The per-example objective on zero outputs and the sample labels: one value per example."""
    import tensorflow as tf

    k = len(tf.nest.flatten(labels)[0])
    zeros = tf.nest.map_structure(lambda t: tf.zeros((k, *(d or 1 for d in tuple(t.shape)[1:])), tf.float32), out)
    key = "loss_per_output" if job.loss_per_output else f"loss = {job.loss!r}"
    try:
        y = tf.nest.map_structure(tf.constant, labels)
        if job.loss_per_output:  # each output's own: a sum would broadcast one value per batch over the examples
            values = {f"loss_per_output[{n!r}]": v for n, v in objective.per_output_values(job)(y, zeros).items()}
        else:
            values = {key: objective.per_example_loss(job)(y, zeros)}
    except usercode.UserCodeError:
        raise
    except Exception as e:
        raise usercode.UserCodeError(f"{key} with the model's outputs {_shapes(out)} and labels {_shapes(labels)}: "
                                     f"{one_line(e)}") from None
    for name, v in values.items():
        if tuple(v.shape) != (k,):
            raise usercode.UserCodeError(f"{name} gives shape {tuple(v.shape)} for {k} examples, not one value per "
                                         f"example ({k},)")


def _shapes(struct: Any) -> Any:
    import tensorflow as tf

    def shape(t: Any) -> Any:
        return (None, *tuple(t.shape)[1:]) if isinstance(t, np.ndarray) else tuple(t.shape)

    return tf.nest.map_structure(shape, struct)
