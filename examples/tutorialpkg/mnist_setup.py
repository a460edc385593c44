"""TensorFlow's "Multi-worker training with Keras" tutorial's ``mnist_setup.py``, in its shape, with synthetic digits.

The tutorial's two functions as it writes them: ``mnist_dataset(batch_size)`` returns a shuffled, repeated, batched
``tf.data.Dataset`` (the tutorial calls it with the global batch size), and ``build_and_compile_cnn_model()`` a
compiled CNN. The one change: ``tf.keras.datasets.mnist.load_data()`` downloads, so ``_synthetic_mnist`` makes
deterministic 28x28 uint8 "digits" (a template per class plus noise) with numpy instead. twinbench takes the
functions as they are (``examples/tutorial_job.toml``): it passes the global batch to ``batch_size``,
removes the last ``repeat()`` and ``batch()``, reads one pass of the examples and shuffles, batches and shards them
itself.
"""

import numpy as np
import tensorflow as tf

SAMPLES = 8192  # the tutorial's MNIST has 60000; fewer keep the example quick on a CPU


def _synthetic_mnist(samples=SAMPLES, seed=0):
    """(x_train uint8 [N, 28, 28], y_train uint8 [N]) as mnist.load_data() returns the training split."""
    rng = np.random.default_rng(seed)
    templates = rng.integers(0, 256, size=(10, 28, 28))
    y = rng.integers(0, 10, size=samples)
    noise = rng.integers(-64, 65, size=(samples, 28, 28))
    x = np.clip(templates[y] + noise, 0, 255).astype(np.uint8)
    return x, y.astype(np.uint8)


def mnist_dataset(batch_size):
    x_train, y_train = _synthetic_mnist()
    # The `x` arrays are uint8 in [0, 255]: float32 in [0, 1], as the tutorial converts them.
    x_train = x_train / np.float32(255)
    y_train = y_train.astype(np.int64)
    train_dataset = tf.data.Dataset.from_tensor_slices(
        (x_train, y_train)).shuffle(60000).repeat().batch(batch_size)
    return train_dataset


def build_and_compile_cnn_model():
    model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(28, 28)),
        tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(32, 3, activation="relu"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=0.001),
        metrics=["accuracy"])
    return model
