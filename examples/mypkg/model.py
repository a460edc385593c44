"""A small MLP: twinbench calls ``build(input_shape, num_classes, **model_args)``."""

from __future__ import annotations

from typing import Any


def build(input_shape: tuple[int, ...], num_classes: int | None, hidden: tuple[int, ...] = (32,),
          activation: str = "relu") -> Any:
    """Dense layers of widths ``hidden``, then ``num_classes`` logits (or one value for regression: None)."""
    import tensorflow as tf

    inputs = tf.keras.Input(shape=input_shape, name="features")
    x = tf.keras.layers.Flatten()(inputs)
    for i, width in enumerate(hidden):
        x = tf.keras.layers.Dense(width, activation=activation, name=f"hidden_{i}")(x)
    outputs = tf.keras.layers.Dense(num_classes or 1, name="head")(x)
    return tf.keras.Model(inputs, outputs, name="mypkg_mlp")
