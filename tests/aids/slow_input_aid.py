"""A test aid from outside twinbench: every batch of the training input becomes available ``seconds`` later (a
sleep in the consumer's fetch, after the prefetch buffer), so each step waits for it and the input-wait measure
must see it. twinbench has no such code: ``patch`` wraps ``training_input`` (the dataset function every rank's
training input is built from, ``common.training.train``) of the process it runs in (``sitecustomize.py``)."""

from __future__ import annotations

from typing import Any

ENV = "TWINBENCH_TEST_SLOW_INPUT"  # seconds per batch; unset or 0: the input as it is


def slowed(dataset: Any, seconds: float) -> Any:
    """``dataset`` with every element delayed by ``seconds``."""
    # tf.data's own sleep transformation (C++, no Python in the pipeline: a Python function there can deadlock
    # the interpreter's exit); internal to TensorFlow, which is why only a test aid uses it.
    from tensorflow.python.data.experimental.ops import testing

    return dataset.apply(testing.sleep(int(seconds * 1e6)))


def patch(train_module: Any, seconds: float) -> None:
    """Make ``train_module.training_input``'s datasets (``common.training.train``) slow by ``seconds`` a batch."""
    training_input = train_module.training_input

    def slow_training_input(*args: Any, **kwargs: Any) -> Any:
        dataset_fn = training_input(*args, **kwargs)
        return lambda *where: slowed(dataset_fn(*where), seconds)

    train_module.training_input = slow_training_input
