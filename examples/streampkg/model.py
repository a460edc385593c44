"""A two-input model: the variable-length ``tokens`` (embedded, averaged over the non-padding ones) and ``value``."""

from __future__ import annotations

from typing import Any


def build(input_shape: dict[str, tuple[Any, ...]], num_classes: int, vocab: int = 64, width: int = 16) -> Any:
    import tensorflow as tf

    tokens = tf.keras.Input(shape=input_shape["tokens"], dtype=tf.int32, name="tokens")
    value = tf.keras.Input(shape=input_shape["value"], name="value")
    embedded = tf.keras.layers.Embedding(vocab, width, mask_zero=True)(tokens)
    pooled = tf.keras.layers.GlobalAveragePooling1D()(embedded)
    x = tf.keras.layers.Concatenate()([pooled, tf.keras.layers.Dense(width, activation="relu")(value)])
    x = tf.keras.layers.Dense(width, activation="relu")(x)
    return tf.keras.Model({"tokens": tokens, "value": value}, tf.keras.layers.Dense(num_classes)(x), name="stream")
