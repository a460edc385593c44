"""The objective both backends minimise, in one place: the loss, its scaling to the global batch, the
regularisation, and the learning-rate schedule with warm-up.

The rules are the tf.distribute tutorial's, so that MWMS and Horovod compute the same math:
- each replica's objective is sum(per-example loss) / GLOBAL batch + regularisation / replicas, and the backends
  SUM gradients across replicas (MWMS ``apply_gradients``; Horovod ``op=Sum``), which equals the gradient of the
  global-batch mean loss plus the regularisation counted once (``replica_objective``);
- in Keras ``fit`` the loss is the compiled ``fit_loss``: under a strategy Keras applies the same rule itself;
  under Horovod each rank's Keras loss is its local mean and ``DistributedOptimizer`` averages, the same quantity;
- the LR warm-up is Horovod's ``LearningRateWarmupCallback`` rule (``warmup_multiplier``), re-implemented for the
  native backend and the custom loop, momentum correction off on both sides.
Every loop (fit, custom loop, the breakdown diagnostic, parameter-server training) takes its loss from here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from common.workload.job import Job


def per_example_loss(job: Job) -> Any:
    """The job's loss, one value per example (no reduction): the model outputs logits."""
    import tensorflow as tf

    return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=tf.keras.losses.Reduction.NONE)


def fit_loss(job: Job) -> Any:
    """The same loss for ``Model.compile``, with Keras' own reduction (Keras scales it for the strategy)."""
    import tensorflow as tf

    return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def replica_objective(job: Job, model: Any, global_batch: int, replicas: int) -> Callable[[Any, Any], Any]:
    """``(x, y) -> scalar``: this replica's share of the objective, sum(per-example loss) / ``global_batch`` +
    regularisation / ``replicas`` (call it inside the replica function, under a GradientTape)."""
    import tensorflow as tf

    loss_obj = per_example_loss(job)

    def objective(x: Any, y: Any) -> Any:
        # Divide by the GLOBAL batch: the backends then SUM gradients across replicas.
        loss = tf.nn.compute_average_loss(loss_obj(y, model(x, training=True)), global_batch_size=global_batch)
        if model.losses:
            # Regularisation counted once in total, not once per replica (tf.nn.scale_regularization_loss only
            # knows tf.distribute's replica count, not Horovod's, so divide explicitly).
            loss += tf.add_n(model.losses) / replicas
        return loss

    return objective


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
