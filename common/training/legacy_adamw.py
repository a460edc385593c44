"""AdamW as a tf_keras *legacy* optimizer, for ``keras = 2`` jobs with ``optimizer = "adamw"``.

tf_keras ships AdamW only as a new-style optimizer (tf_keras/src/optimizers/adamw.py), and ``keras = 2`` runs need
a ``tf.keras.optimizers.legacy`` one (what Horovod's Keras module wraps, horovod/_keras/__init__.py: a subclass of
the optimizer's class rebuilt with ``from_config(get_config())``), and the LR callbacks and the loops set its ``lr``
from the host each step.

``AdamW`` is legacy Adam (tf_keras/src/optimizers/legacy/adam.py) with the decoupled weight decay of Keras 3's
AdamW and tf_keras' new one (keras/src/optimizers/base_optimizer.py and tf_keras/src/optimizers/optimizer.py,
``_apply_weight_decay``): ``var -= var * weight_decay * lr`` before the Adam update, where ``lr`` is the learning
rate in effect, not Adam's bias-corrected step size (legacy Adam's ``apply_state[...]["lr_t"]``). The sparse apply
decays the whole variable too, as both do. Every trainable variable is decayed (no exclusions, their default).
"""

from __future__ import annotations

import functools
import numbers
from typing import Any

DEFAULT_WEIGHT_DECAY = 0.004  # Keras 3's and tf_keras' AdamW default (keras/src/optimizers/adamw.py)


@functools.cache
def adamw_class() -> Any:
    """The class (made once, on first use: importing this module does not start TensorFlow, whose ``tf.keras`` must
    be tf_keras by then, TF_USE_LEGACY_KERAS=1)."""
    import tensorflow as tf

    class AdamW(tf.keras.optimizers.legacy.Adam):
        """Legacy Adam plus decoupled weight decay (``weight_decay``, a number: 0 is legacy Adam exactly)."""

        def __init__(self, learning_rate: Any = 0.001, weight_decay: float = DEFAULT_WEIGHT_DECAY,
                     beta_1: Any = 0.9, beta_2: Any = 0.999, epsilon: float = 1e-7, amsgrad: bool = False,
                     name: str = "AdamW", **kwargs: Any) -> None:
            if isinstance(weight_decay, bool) or not isinstance(weight_decay, numbers.Real):
                raise ValueError(f"weight_decay must be a number, got {weight_decay!r}")
            super().__init__(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
                             amsgrad=amsgrad, name=name, **kwargs)
            self.weight_decay = float(weight_decay)

        def _decay(self, var: Any, apply_state: Any) -> Any:
            """``var -= var * weight_decay * lr_t``: the op the Adam update must follow."""
            var_device, var_dtype = var.device, var.dtype.base_dtype
            coefficients = ((apply_state or {}).get((var_device, var_dtype))
                            or self._fallback_apply_state(var_device, var_dtype))
            wd = tf.cast(self.weight_decay, var_dtype)
            return var.assign_sub(var * wd * coefficients["lr_t"], use_locking=self._use_locking)

        def _resource_apply_dense(self, grad: Any, var: Any, apply_state: Any = None) -> Any:
            if not self.weight_decay:
                return super()._resource_apply_dense(grad, var, apply_state)
            with tf.control_dependencies([self._decay(var, apply_state)]):
                return super()._resource_apply_dense(grad, var, apply_state)

        def _resource_apply_sparse(self, grad: Any, var: Any, indices: Any, apply_state: Any = None) -> Any:
            if not self.weight_decay:
                return super()._resource_apply_sparse(grad, var, indices, apply_state)
            with tf.control_dependencies([self._decay(var, apply_state)]):
                return super()._resource_apply_sparse(grad, var, indices, apply_state)

        def get_config(self) -> dict[str, Any]:
            return {**super().get_config(), "weight_decay": self.weight_decay}

    return AdamW
