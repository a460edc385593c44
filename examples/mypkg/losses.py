"""A custom per-example loss: twinbench calls ``fn(y_true, y_pred)`` and expects one value per example."""

from __future__ import annotations

from typing import Any

SMOOTHING = 0.1


def label_smoothed_ce(y_true: Any, y_pred: Any) -> Any:
    """Cross-entropy of the logits ``y_pred`` [batch, classes] against integer labels ``y_true`` [batch], each
    one-hot target smoothed towards uniform by SMOOTHING; returns [batch]."""
    import tensorflow as tf

    classes = tf.shape(y_pred)[-1]
    onehot = tf.one_hot(tf.cast(tf.reshape(y_true, [-1]), tf.int32), classes, dtype=y_pred.dtype)
    target = onehot * (1.0 - SMOOTHING) + SMOOTHING / tf.cast(classes, y_pred.dtype)
    return tf.nn.softmax_cross_entropy_with_logits(labels=target, logits=y_pred)
