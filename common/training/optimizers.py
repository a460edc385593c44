"""The job's optimizer, in the job's Keras family: tf_keras *legacy* optimizers for ``keras = 2`` (Horovod's LR
callbacks and the loops set their ``lr``), Keras 3's for ``keras = 3``.

``optimizer`` is a builtin name (sgd, momentum, adam, adamw: with ``keras = 2`` twinbench's legacy AdamW,
common/training/legacy_adamw.py, as tf_keras has none), built with ``optimizer_args`` as keyword arguments of its
constructor, or ``"package.module:function"``, called as ``function(learning_rate, **optimizer_args)`` with the
run's learning rate (after ``lr_scaling``). A model the model function compiled brings its own optimizer instead
(common/training/compiled.py). An optimizer of the other family, or
arguments its constructor refuses, is one line naming the key (exit 2, in every rank before the first step).
"""

from __future__ import annotations

import sys
from typing import Any

from common.core.errors import one_line
from common.training import keras3
from common.training.compiled import Compiled
from common.training.legacy_adamw import adamw_class
from common.workload import usercode
from common.workload.job import Job


def build_optimizer(job: Job, lr: float, compiled: Compiled | None = None) -> Any:
    """The job's optimizer with learning rate ``lr`` (a Python float: the loops set it from the host per step); the
    model function's compiled one, rebuilt, when it returned a compiled model (``compiled``)."""
    import tensorflow as tf

    if compiled is not None:
        optimizer = compiled.rebuild(lr)
    elif usercode.is_ref(job.optimizer):
        optimizer = usercode.call("optimizer", job.optimizer, lr, **job.optimizer_args)
    elif job.keras == 3:
        import keras

        opts = keras.optimizers
        ctor = {"sgd": opts.SGD, "momentum": opts.SGD, "adam": opts.Adam, "adamw": opts.AdamW}[job.optimizer]
        optimizer = _construct(job, ctor, lr)
    else:
        legacy = tf.keras.optimizers.legacy
        ctor = {"sgd": legacy.SGD, "momentum": legacy.SGD, "adam": legacy.Adam, "adamw": adamw_class()}[job.optimizer]
        optimizer = _construct(job, ctor, lr)
    if job.keras == 3:
        keras3.check_optimizer(job, optimizer)
    elif not isinstance(optimizer, tf.keras.optimizers.legacy.Optimizer):
        kind = f"{type(optimizer).__module__}.{type(optimizer).__name__}"
        other = " (a Keras 3 optimizer: set keras = 3 to use it)" if kind.startswith("keras.") else ""
        raise usercode.UserCodeError(f"optimizer = {job.optimizer!r} returned a {kind}{other}, not a "
                                     "tf.keras.optimizers.legacy optimizer, which keras = 2 runs need (Horovod's fit "
                                     "wraps it and sets its lr)")
    if (job.warmup_epochs or job.lr_schedule != "constant") and _has_own_schedule(optimizer):
        # the loops set the LR from the host (objective.lr_schedule): an optimizer's own schedule has no value to set
        raise usercode.UserCodeError(f"optimizer = {job.optimizer!r} has a learning-rate schedule of its own: give it "
                                     "as lr_schedule instead, or set lr_schedule = \"constant\" and warmup_epochs = 0")
    return optimizer


def _has_own_schedule(optimizer: Any) -> bool:
    """Was the optimizer given a LearningRateSchedule rather than a number (either Keras family)?"""
    import tensorflow as tf

    lr = getattr(optimizer, "_learning_rate", None)  # Keras 3
    if lr is None and hasattr(optimizer, "_get_hyper"):  # tf_keras legacy
        lr = optimizer._get_hyper("learning_rate")
    kinds = [tf.keras.optimizers.schedules.LearningRateSchedule]
    if "keras" in sys.modules:
        kinds.append(sys.modules["keras"].optimizers.schedules.LearningRateSchedule)
    return isinstance(lr, tuple(kinds))


def _construct(job: Job, ctor: Any, lr: float) -> Any:
    kwargs = {"momentum": job.momentum} if job.optimizer == "momentum" else {}
    try:
        return ctor(learning_rate=lr, **{**kwargs, **job.optimizer_args})
    except (TypeError, ValueError) as e:
        raise usercode.UserCodeError(f"optimizer_args = {job.optimizer_args!r} for optimizer = {job.optimizer!r}: "
                                     f"{one_line(e)}") from None
