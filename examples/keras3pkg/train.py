"""Your optimizer and learning-rate schedule: twinbench calls ``adamw(learning_rate, **optimizer_args)`` and
``cosine(learning_rate, decay_steps, **lr_schedule_args)``, with the run's learning rate (after ``lr_scaling``) and the
steps after the warm-up."""

from __future__ import annotations

from typing import Any


def adamw(learning_rate: float, weight_decay: float = 0.01) -> Any:
    """AdamW whose decoupled weight decay spares the biases and the norms' scales (vectors)."""
    import keras

    optimizer = keras.optimizers.AdamW(learning_rate=learning_rate, weight_decay=weight_decay)
    optimizer.exclude_from_weight_decay(var_names=["bias", "scale"])
    return optimizer


def cosine(learning_rate: float, decay_steps: int, warmup_steps: int = 0, floor: float = 0.0) -> Any:
    """A linear warm-up from 0 to ``learning_rate`` over ``warmup_steps``, then a cosine decay to ``floor`` x
    ``learning_rate`` at the end of the run. The warm-up is the schedule's own: unlike ``warmup_epochs`` (Horovod's
    rule, from LR / replicas), it does not depend on the number of replicas, so 1 worker x 2b = 2 workers x b."""
    import keras

    return keras.optimizers.schedules.CosineDecay(0.0, decay_steps - warmup_steps, alpha=floor,
                                                  warmup_target=learning_rate, warmup_steps=warmup_steps)
