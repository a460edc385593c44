"""Native input: how a tf.distribute worker is fed (``NativeBackend.make_dataset``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


@functools.cache
def _per_worker_dataset_class() -> type:
    import tensorflow as tf

    class PerWorkerDataset(tf.distribute.DistributedDataset):
        """This worker's own ``tf.data.Dataset`` (a worker with one replica), presented as a
        ``tf.distribute.DistributedDataset`` so that Keras ``fit`` takes it as already distributed: it would
        otherwise distribute it again, through the MultiDeviceIterator. Iterating it iterates the dataset: ``next``
        gives plain tensors, which ``strategy.run`` hands to the worker's single replica as they are."""

        def __init__(self, dataset: Any) -> None:
            self.dataset = dataset

        def __iter__(self) -> Any:
            return iter(self.dataset)

        @property
        def element_spec(self) -> Any:
            return self.dataset.element_spec

    return PerWorkerDataset


def per_worker_dataset(dataset: Any) -> Any:
    """``dataset`` as the input of a one-replica worker (``PerWorkerDataset``)."""
    return _per_worker_dataset_class()(dataset)


def worker_slots(ds: Any, workers: int, per: int, index: Any) -> Any:
    """From every replica slot of each global batch (in slot order), worker ``index``'s ``per`` slots: what
    ``common.workload.data`` gives pipeline ``index`` of ``workers`` pipelines with ``per`` replicas each."""
    if per == 1:
        return ds.shard(workers, index)
    return ds.batch(per, drop_remainder=True).shard(workers, index).unbatch()


def coordinator_dataset_fn(dataset_fn: Callable[[int, int, int], Any], workers: int, per: int) -> Callable[[Any], Any]:
    """``input_context -> tf.data.Dataset`` run on each worker of parameter-server training: its slots of every
    global batch (``backends.native_ps`` creates it on every worker through the coordinator).

    The coordinator traces it once for all workers, so the worker's index is a tensor known only when it
    runs there: build every slot of each global batch (``common.workload.data``'s order), keep the worker's share.
    The cost: each worker prepares the whole global batch and keeps 1/W of it.
    """
    import tensorflow as tf

    def fn(input_context: Any) -> Any:
        ds = dataset_fn(0, 1, workers * per)  # one pipeline feeding every replica slot, in slot order
        return worker_slots(ds, workers, per, tf.distribute.coordinator.experimental_get_current_worker_index())

    return fn
