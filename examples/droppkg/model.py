"""A small MLP with Dropout: twinbench calls ``build(input_shape, num_classes, **model_args)``."""

from __future__ import annotations

from typing import Any


def build(input_shape: tuple[int, ...], num_classes: int | None, hidden: int = 32, rate: float = 0.25) -> Any:
    """Dense + ReLU of width ``hidden``, Dropout of ``rate`` (active in training only), then ``num_classes`` logits."""
    import tensorflow as tf

    inputs = tf.keras.Input(shape=input_shape, name="features")
    x = tf.keras.layers.Dense(hidden, activation="relu", name="hidden")(inputs)
    x = tf.keras.layers.Dropout(rate, name="dropout")(x)
    outputs = tf.keras.layers.Dense(num_classes or 1, name="head")(x)
    return tf.keras.Model(inputs, outputs, name="droppkg_mlp")
