"""Two-input models: the variable-length ``tokens`` (embedded, averaged over the non-padding ones) and ``value``;
``build`` has one output (class logits), ``heads`` two (a dict: class probabilities and a float)."""

from __future__ import annotations

from typing import Any


def _trunk(tf: Any, input_shape: dict[str, tuple[Any, ...]], vocab: int, width: int) -> tuple[Any, Any, Any]:
    tokens = tf.keras.Input(shape=input_shape["tokens"], dtype=tf.int32, name="tokens")
    value = tf.keras.Input(shape=input_shape["value"], name="value")
    embedded = tf.keras.layers.Embedding(vocab, width, mask_zero=True)(tokens)
    pooled = tf.keras.layers.GlobalAveragePooling1D()(embedded)
    x = tf.keras.layers.Concatenate()([pooled, tf.keras.layers.Dense(width, activation="relu")(value)])
    return tokens, value, tf.keras.layers.Dense(width, activation="relu")(x)


def build(input_shape: dict[str, tuple[Any, ...]], num_classes: int, vocab: int = 64, width: int = 16) -> Any:
    import tensorflow as tf

    tokens, value, x = _trunk(tf, input_shape, vocab, width)
    return tf.keras.Model({"tokens": tokens, "value": value}, tf.keras.layers.Dense(num_classes)(x), name="stream")


def heads(input_shape: dict[str, tuple[Any, ...]], num_classes: int, vocab: int = 64, width: int = 16) -> Any:
    """Outputs by name, as the job's loss_per_output names them: ``label`` (probabilities: the loss
    "sparse_categorical_crossentropy" by name takes probabilities, as in Keras compile) and ``length``."""
    import tensorflow as tf

    tokens, value, x = _trunk(tf, input_shape, vocab, width)
    outputs = {"label": tf.keras.layers.Dense(num_classes, activation="softmax", name="label")(x),
               "length": tf.keras.layers.Dense(1, name="length")(x)}
    return tf.keras.Model({"tokens": tokens, "value": value}, outputs, name="stream_heads")
