"""The job's loss keys for a model with several outputs, checked without TensorFlow (``common.workload.job`` calls
``problem``; the objective itself is ``common.training.outputs``).

- ``loss_per_output``: a table output name -> loss, each a ``tf.keras.losses`` name or ``"package.module:function"``
  (a per-example loss of that output). The model returns a dict of outputs with exactly those names, and the labels
  are a dict with the same keys; the per-example objective is the weighted sum of the outputs' per-example losses,
  what Keras ``compile(loss=dict, loss_weights=dict)`` minimises.
- ``loss_weights``: a table output name -> number, only with ``loss_per_output``; an output it does not name weighs
  1.0 (Keras' default).

``loss`` and ``loss_per_output`` are exclusive: ``loss = "package.module:function"`` is the other way to train a
model with several outputs (one function taking the label and output structures).
"""

from __future__ import annotations

import math
from typing import Any

from common.workload import usercode


def is_loss_name(value: Any) -> bool:
    """A ``tf.keras.losses`` name as a job may spell it (checked against Keras once TensorFlow runs)."""
    return isinstance(value, str) and bool(value) and value.replace("_", "").isalnum()


def problem(job: Any, default_loss: str) -> str | None:
    """Why the job's ``loss_per_output`` / ``loss_weights`` cannot be used (one line naming the key), or None."""
    per, weights = job.loss_per_output, job.loss_weights
    if weights and not per:
        return "loss_weights applies to loss_per_output (a loss per output): set loss_per_output too"
    if not per:
        return None
    if job.loss != default_loss:
        return f"loss = {job.loss!r} and loss_per_output: give one of them (loss_per_output: a loss per output; " \
               "loss = \"package.module:function\": one loss over all outputs)"
    for name, value in per.items():
        if not isinstance(value, str) or not (is_loss_name(value) or usercode.is_ref(value)):
            return f"loss_per_output[{name!r}] = {value!r}: use a tf.keras.losses name (such as \"mse\") or " \
                   "\"package.module:function\""
        if usercode.is_ref(value) and usercode.check_ref(f"loss_per_output[{name!r}]", value):
            return usercode.check_ref(f"loss_per_output[{name!r}]", value)
    for name, w in weights.items():
        if name not in per:
            return f"loss_weights[{name!r}]: no such output in loss_per_output ({', '.join(sorted(per))})"
        if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w) or w < 0:
            return f"loss_weights[{name!r}] must be a number >= 0, got {w!r}"
    if job.metrics:
        return f"metrics = {list(job.metrics)} with loss_per_output: metrics are computed for single-output models " \
               "only (the validation loss is always computed; target_metric = \"loss\" works)"
    return None


def weights(job: Any) -> dict[str, float]:
    """Every output's weight: ``loss_weights``' where given, else 1.0."""
    return {name: float(job.loss_weights.get(name, 1.0)) for name in sorted(job.loss_per_output)}

