"""Keras 3 (job key ``keras = 3``) in twinbench's custom loop: the optimizer, the step, and what the backends need
to read and write Keras 3 variables.

Keras 3 (``import keras``) lives in the same process as tf_keras (``tf.keras`` under ``TF_USE_LEGACY_KERAS=1``).
It trains with the custom loop's one step (``common.training.step``: this replica's gradients,
``Backend.reduce_gradients``, then ``apply_gradients`` told not to reduce again).
Horovod's Keras module is never given Keras 3 objects (it needs ``.ref()`` on variables, Horovod issue 4290): the
backends broadcast the variables underneath (``tf_variables``).

Only the custom loop: Keras 3's ``fit`` under MultiWorkerMirroredStrategy fails (``common.workload.job`` refuses
``mode = "fit"`` with ``keras = 3`` before TensorFlow starts).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from common.core.errors import UsageError
from common.workload.job import Job

# Optimizer settings Keras 3 applies to each replica's gradients *before* its all-reduce (base_optimizer.py,
# ``apply``): twinbench's step hands the optimizer gradients already summed over replicas (common.training.step),
# so they would act on the sum, not where Keras 3 puts them; refused rather than changed.
PER_REPLICA_SETTINGS = ("clipnorm", "clipvalue", "global_clipnorm", "gradient_accumulation_steps", "loss_scale_factor")


def seed(job: Job) -> None:
    """Keras 3's own seeds (its initializers draw from Python's ``random``): identical weights on every rank."""
    import keras

    keras.utils.set_random_seed(job.seed)


def check_optimizer(job: Job, optimizer: Any) -> None:
    """UsageError (one line, naming ``optimizer``) unless ``optimizer`` is a Keras 3 optimizer without per-replica
    gradient settings."""
    import keras

    if not isinstance(optimizer, keras.optimizers.Optimizer):
        kind = f"{type(optimizer).__module__}.{type(optimizer).__name__}"
        raise UsageError(f"optimizer = {job.optimizer!r} gave a {kind}, not a Keras 3 optimizer (keras.optimizers), "
                         "but the job has keras = 3")
    used = [name for name in PER_REPLICA_SETTINGS if getattr(optimizer, name, None)]
    if used:
        raise UsageError(f"optimizer = {job.optimizer!r} sets {', '.join(used)}: Keras 3 applies it to each "
                         "replica's gradients before their all-reduce, but twinbench's step gives it gradients already "
                         "summed over replicas (so it would act on the sum); leave it unset")


def create_slots(optimizer: Any, model: Any) -> None:
    """The optimizer's variables now (under the backend's scope), so a checkpoint can be restored before step 1."""
    optimizer.build(model.trainable_variables)


def learning_rate_setter(job: Job, optimizer: Any) -> Callable[[float], None]:
    """Sets the optimizer's learning rate from the host between steps (the warm-up), in either Keras family."""
    if job.keras == 3:
        return lambda value: optimizer.learning_rate.assign(value)
    import tensorflow as tf

    return lambda value: tf.keras.backend.set_value(optimizer.lr, value)


def _is_keras3(obj: Any) -> bool:
    keras = sys.modules.get("keras")  # not imported: nothing can be a Keras 3 object
    if keras is None:
        return False
    # Keras 3.3 (NGC 25.02's) exports keras.Variable as a shim (keras/src/backend/exports.py) that its variables are
    # not instances of; their base there is keras.src.backend.common.variables.KerasVariable (later: Variable)
    base = getattr(sys.modules.get("keras.src.backend.common.variables"), "KerasVariable", keras.Variable)
    return isinstance(obj, keras.Variable | base)


def tf_variables(variables: list[Any]) -> list[Any]:
    """The TensorFlow variables under Keras 3 ones (``v.value``), others as they are: what Horovod's broadcast and
    allreduce take."""
    return [v.value if _is_keras3(v) else v for v in variables]


def per_worker_state(model: Any) -> list[Any]:
    """A Keras 3 model's non-trainable float variables (BatchNorm moving statistics) as TensorFlow variables; []
    for a tf_keras model. Keras 3 creates them without aggregation (``add_weight``'s default "none",
    keras/src/layers/layer.py), so under MWMS each worker updates its own copy from its own batches, where tf_keras'
    are ON_READ with MEAN aggregation (MWMS reads their mean over replicas): their mean is what the backends save."""
    import tensorflow as tf

    return [v.value for v in model.non_trainable_variables if _is_keras3(v) and tf.as_dtype(v.dtype).is_floating]


def optimizer_variables(optimizer: Any) -> list[Any]:
    """An optimizer's variables as TensorFlow variables (tf_keras: a method; Keras 3: a property)."""
    found = optimizer.variables
    return tf_variables(list(found() if callable(found) else found))


def versions(job: Job) -> dict[str, str]:
    """The record's versions entry for Keras 3 (tf_keras' own version is already there): {} for keras = 2."""
    if job.keras != 3:
        return {}
    import keras

    return {"keras": str(keras.__version__)}
