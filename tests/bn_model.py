"""The tests' smallest BatchNorm model (a user model: ``--set model=tests.bn_model:build``): two 3x3 convolutions,
each followed by BatchNormalization, on the tests' 8x8 images. What the BatchNorm tests prove is model-agnostic (the
backends handle every non-trainable float variable alike, common/training/train.py and backends/*.py); ResNet-20's
own graph costs each process about 2 CPU-s more to build and trace than this one."""

from __future__ import annotations

from typing import Any

# the --set values that give the tests' BatchNorm job: this model on 8x8x1 synthetic images, 4 steps
JOB = ("--set", "model=tests.bn_model:build", "--set", "image_shape=8,8,1", "--set", "steps=4")


def build(input_shape: tuple[int, ...], num_classes: int | None, filters: int = 8) -> Any:
    """conv (stride 2) + BatchNorm + ReLU, conv + BatchNorm + ReLU, global average pooling, ``num_classes`` logits."""
    import tensorflow as tf

    L = tf.keras.layers
    inputs = tf.keras.Input(shape=input_shape, name="images")
    x = inputs
    for i, stride in enumerate((2, 1)):
        x = L.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False, name=f"conv_{i}")(x)
        # momentum 0.9 (ResNet-20's): the moving statistics move visibly within a few steps
        x = L.ReLU()(L.BatchNormalization(momentum=0.9, name=f"bn_{i}")(x))
    x = L.GlobalAveragePooling2D()(x)
    return tf.keras.Model(inputs, L.Dense(num_classes or 1, name="head")(x), name="tests_bn")
