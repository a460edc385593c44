"""The one training step of every loop (Keras ``fit``, the custom loop, Keras 3, the ``--diagnose breakdown`` probe and
parameter-server training), as a single-replica computation (Model Garden's Task): what one replica computes, then the
backend's one gradient reduction, then the update.

    gradients(x, y)  forward, the objective (``common.training.objective``: the custom loop's, or the compiled Keras
                     loss for ``fit``), this replica's own gradients: no collective (the loss scale of mixed precision
                     applied and removed here, the one tape of the project)
    reduce(grads)    ``Backend.reduce_gradients``: the SUM over every replica of the run (a collective), unless the
                     backend declares that its optimizer reduces (``Capabilities.optimizer_reduces``)
    apply(grads)     the optimizer's update with the already reduced gradients, which it must not reduce again

``train(x, y)`` runs the three in order; the breakdown calls them one by one with a timestamp between them
(``common.diagnostics.breakdown``), so it times the very step that trains.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from common.training.context import RunContext
from common.training.objective import recorded_loss, replica_objective


class Trained(NamedTuple):
    """What one replica's step gives its loop."""

    loss: Any  # this replica's own mean loss (+ regularisation), for the record (``recorded_loss``)
    outputs: Any  # the model's outputs of this step (fit's metrics are computed on them)
    update: Any  # what ``apply_gradients`` returned (the input clock waits for it)


@dataclass(frozen=True)
class ReplicaStep:
    """One replica's step, in three phases (call it in the replica function, ``Backend.run_step``)."""

    objective: Callable[[Any, Any], tuple[Any, Any]]  # (x, y) -> (this replica's loss share, the model's outputs)
    variables: list[Any]  # the model's trainable variables, in the order gradients come
    optimizer: Any  # tf_keras (a LossScaleOptimizer with mixed precision) or Keras 3
    reduce_fn: Callable[[list[Any]], list[Any]]  # the backend's reduce_gradients
    replicas: int  # the replica count the objective's share is of (undone for the record by this)
    mixed: bool = False  # tf_keras mixed precision: the optimizer is a LossScaleOptimizer
    optimizer_reduces: bool = False  # the backend's Capabilities.optimizer_reduces: no reduction of ours

    def gradients(self, x: Any, y: Any) -> tuple[Any, list[Any], Any]:
        """Forward and objective under a tape: this replica's loss share, its own (unreduced) gradients, and the
        model's outputs."""
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss, outputs = self.objective(x, y)
            target = self.optimizer.get_scaled_loss(loss) if self.mixed else loss
        grads = tape.gradient(target, self.variables)
        if self.mixed:
            grads = self.optimizer.get_unscaled_gradients(grads)
        return loss, list(grads), outputs

    def reduce(self, grads: list[Any]) -> list[Any]:
        """The backend's reduction of the gradients that exist (a variable the loss does not reach has None); none
        where the optimizer reduces itself."""
        if self.optimizer_reduces:
            return grads
        present = [g for g in grads if g is not None]
        reduced = iter(self.reduce_fn(present) if present else [])
        return [None if g is None else next(reduced) for g in grads]

    def apply(self, grads: list[Any]) -> Any:
        """The update from reduced gradients; returns what ``apply_gradients`` returned."""
        return apply_reduced(self.optimizer, list(zip(grads, self.variables)), self.optimizer_reduces)

    def record(self, loss: Any) -> Any:
        """This replica's recorded loss from its share (``objective.recorded_loss``)."""
        return recorded_loss(loss, self.replicas)

    def train(self, x: Any, y: Any) -> Trained:
        """The whole step: gradients, the reduction, the update."""
        loss, grads, outputs = self.gradients(x, y)
        update = self.apply(self.reduce(grads))
        return Trained(self.record(loss), outputs, update)

    def run(self, x: Any, y: Any) -> Any:
        """The whole step; this replica's recorded loss (what ``Backend.run_step`` is given)."""
        return self.train(x, y).loss


def make_step(ctx: RunContext, model: Any, optimizer: Any, global_batch: int | None = None,
              replicas: int | None = None) -> ReplicaStep:
    """The custom loop's step: the objective over ``global_batch`` samples and ``replicas`` replicas (default: the
    plan's; parameter-server training passes one worker's), jit-compiled with ``xla`` (the collective-free part only:
    Horovod's allreduce is not an XLA op)."""
    import tensorflow as tf

    job, plan = ctx.job, ctx.plan
    replicas = plan.replicas if replicas is None else replicas
    global_batch = plan.global_batch if global_batch is None else global_batch
    objective = replica_objective(ctx.trained_by, model, global_batch, replicas)  # the recipe's loss
    if job.xla:
        objective = tf.function(objective, jit_compile=True)
    return ReplicaStep(objective, model.trainable_variables, optimizer, ctx.backend.reduce_gradients, replicas,
                       mixed=bool(job.mixed_precision),
                       optimizer_reduces=ctx.backend.capabilities().optimizer_reduces)


def apply_reduced(optimizer: Any, grads_and_vars: list[tuple[Any, Any]], optimizer_reduces: bool = False) -> Any:
    """``apply_gradients`` of gradients already reduced by the backend, without a second reduction.

    Both Keras families SUM the gradients across tf.distribute replicas inside ``apply_gradients`` by themselves
    (MultiWorkerMirroredStrategy's replica context: tf_keras in ``_aggregate_gradients``, Keras 3 in
    ``_backend_update_step`` -> ``_all_reduce_sum_gradients``, keras/src/backend/tensorflow/optimizer.py); Horovod's
    collectives are invisible to them. So that every backend reduces in one place, ``reduce``: tf_keras is told
    ``experimental_aggregate_gradients=False``; Keras 3 has no such argument, so its ``_all_reduce_sum_gradients``
    (its only reduction; a replica context's SUM, what ``reduce`` just did) is the identity on this optimizer.
    ``optimizer_reduces``: the backend leaves the reduction to the optimizer (``Capabilities.optimizer_reduces``).
    """
    if optimizer_reduces:
        return optimizer.apply_gradients(grads_and_vars)
    if _is_keras3_optimizer(optimizer):
        if "_all_reduce_sum_gradients" not in vars(optimizer):
            optimizer._all_reduce_sum_gradients = list  # (grads_and_vars) -> the same pairs, as a list
        return optimizer.apply_gradients(grads_and_vars)
    return optimizer.apply_gradients(grads_and_vars, experimental_aggregate_gradients=False)


def _is_keras3_optimizer(optimizer: Any) -> bool:
    import sys

    keras = sys.modules.get("keras")  # not imported: nothing can be a Keras 3 optimizer
    return keras is not None and isinstance(optimizer, keras.optimizers.Optimizer)
