"""Native input: how a tf.distribute worker is fed (``NativeBackend.make_dataset``)."""

from __future__ import annotations

import functools
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
