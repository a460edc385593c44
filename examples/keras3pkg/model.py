"""A Keras 3 MLP with a layer of its own: twinbench calls ``build(input_shape, num_classes, **model_args)``."""

from __future__ import annotations

from typing import Any


def build(input_shape: tuple[int, ...], num_classes: int | None, width: int = 32, blocks: int = 2) -> Any:
    """Dense stem, ``blocks`` residual blocks of the RMS-normalised kind below, then ``num_classes`` logits."""
    import keras
    from keras import ops

    class RMSNorm(keras.layers.Layer):
        """x / rms(x) * scale, written with keras.ops (backend-agnostic Keras 3 code)."""

        def __init__(self, epsilon: float = 1e-6, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.epsilon = epsilon

        def build(self, input_shape: tuple[int, ...]) -> None:
            self.scale = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="scale")

        def call(self, x: Any) -> Any:
            rms = ops.sqrt(ops.mean(ops.square(x), axis=-1, keepdims=True) + self.epsilon)
            return x / rms * self.scale

    inputs = keras.Input(shape=input_shape, name="features")
    x = keras.layers.Dense(width, activation="gelu", name="stem")(keras.layers.Flatten()(inputs))
    for i in range(blocks):
        y = keras.layers.Dense(width, activation="gelu", name=f"block_{i}")(RMSNorm(name=f"norm_{i}")(x))
        x = ops.add(x, y)
    outputs = keras.layers.Dense(num_classes or 1, name="head")(RMSNorm(name="norm_out")(x))
    return keras.Model(inputs, outputs, name="keras3pkg_mlp")
