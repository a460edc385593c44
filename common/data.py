"""Training data for both backends: dispatch to the dataset registry, and the one sharded tf.data pipeline.

Which datasets exist, their files, checks, info and loaders live in ``common.datasets`` (one entry per dataset, in
``DATASETS``); this module looks a job's dataset up there. ``dataset_info`` and ``load_arrays`` never import
TensorFlow, so a bad ``data_dir`` is rejected before TF starts; only ``make_train_dataset`` imports it.

Parity rule (both backends call ``make_train_dataset``; see its docstring): one global shuffle of the whole
training set with the job's seed, cut into global batches of G samples, global batch k split into consecutive
per-replica slots of b samples. Concatenating every replica's batch k therefore gives exactly batch k of
``shuffle(n, seed).batch(G, drop_remainder=True)``, whatever the number of processes or replicas per process.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from common.datasets import DATASETS, DataError, list_image_folder
from common.job import Job

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["DataError", "dataset_info", "list_image_folder", "load_arrays", "make_train_dataset", "shard_geometry"]


# ----------------------------------------------------------------------------------------------------------------
# Public: info and loaders
# ----------------------------------------------------------------------------------------------------------------
def dataset_info(job: Job) -> tuple[int, tuple[int, int, int], int]:
    """(training samples, (H, W, C), num_classes) from file headers only; DataError if files are missing/corrupt.

    No TensorFlow import, cheap (idx/npz headers, file listings; CIFAR batches are unpickled to count them).
    """
    n, shape, classes = DATASETS[job.dataset].info(job)
    if n < 1:
        raise DataError(f"{job.dataset}: the training files in {job.data_dir} hold no samples")
    return n, shape, classes


def load_arrays(job: Job, scaled: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The whole training set in memory: (images [N,H,W,C], int32 labels [N]); not for image_folder.

    scaled=True (default: what the model sees) gives float32 in [0, 1] (uint8 / 255, the same arithmetic as the
    pipeline); scaled=False gives the raw uint8, which the pipeline keeps in memory (4x smaller) and scales only
    for the samples a rank actually uses.
    """
    load = DATASETS[job.dataset].load
    if load is None:
        raise DataError(f"load_arrays: dataset {job.dataset!r} is decoded in the tf.data pipeline, not in memory")
    x, y = load(job)
    if scaled:
        return x.astype(np.float32) / np.float32(255), y
    return x, y


# ----------------------------------------------------------------------------------------------------------------
# Public: the sharded training pipeline
# ----------------------------------------------------------------------------------------------------------------
def shard_geometry(global_batch_size: int, pipeline_index: int, num_pipelines: int,
                   replicas_per_pipeline: int = 1) -> tuple[int, int, int]:
    """(per-replica batch b, first and one-past-last position of this pipeline's slots in a global batch)."""
    if num_pipelines < 1 or replicas_per_pipeline < 1:
        raise DataError(f"num_pipelines ({num_pipelines}) and replicas_per_pipeline ({replicas_per_pipeline}) "
                        "must be >= 1")
    if not 0 <= pipeline_index < num_pipelines:
        raise DataError(f"pipeline_index {pipeline_index} is not in [0, {num_pipelines})")
    replicas = num_pipelines * replicas_per_pipeline
    if global_batch_size < 1 or global_batch_size % replicas:
        raise DataError(f"global batch size {global_batch_size} is not a positive multiple of the {replicas} "
                        f"replicas ({num_pipelines} pipelines x {replicas_per_pipeline} replicas each)")
    b = global_batch_size // replicas
    lo = pipeline_index * replicas_per_pipeline * b
    return b, lo, lo + replicas_per_pipeline * b


def make_train_dataset(job: Job, global_batch_size: int, pipeline_index: int, num_pipelines: int,
                       replicas_per_pipeline: int = 1, start_step: int = 0) -> tf.data.Dataset:
    """Infinite per-replica batches (images float32 [b,H,W,C] in [0,1], labels int32 [b]) of one input pipeline.

    b = global_batch_size // (num_pipelines * replicas_per_pipeline). Rule, identical on every rank and backend:
    the n training samples are shuffled as a whole (buffer n, seed job.seed, a new order every epoch), the last
    incomplete global batch is dropped, and global batch k (G = global_batch_size consecutive samples) is split
    into G/b replica slots in order; this pipeline yields its replicas_per_pipeline consecutive slots of global
    batch 0, then of global batch 1, ... An epoch is n // G steps. Equivalent to filtering the enumerated shuffle
    by slot; implemented by shuffling indices and slicing each global batch, then gathering/decoding only the
    samples of this pipeline.

    replicas_per_pipeline defaults to 1, one replica per process (Horovod; MWMS with one device per worker); with
    several local replicas, consecutive elements go to consecutive local replicas, as tf.distribute feeds them.

    The caller must have called ``tf.keras.utils.set_random_seed(job.seed)``: tf.data pairs the op seed with the
    global seed, so another global seed would give another order (checked). Iterate each dataset object once:
    a second iterator continues the reshuffle sequence instead of restarting it.
    """
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf

    b, lo, hi = shard_geometry(global_batch_size, pipeline_index, num_pipelines, replicas_per_pipeline)
    # tf.data derives the shuffle seeds from (global seed, op seed): pin both so all ranks agree.
    seeds = tf.compat.v1.get_seed(job.seed)
    if seeds[0] != job.seed % (2**31 - 1):
        raise RuntimeError(f"make_train_dataset: call tf.keras.utils.set_random_seed({job.seed}) first "
                           f"(global seed is {seeds[0]}): the shuffle order depends on it")
    files = DATASETS[job.dataset].files  # None: the dataset is in memory as arrays
    if files is not None:
        n, (h, w, c), _ = dataset_info(job)  # e.g. a directory listing; files are read later, only this rank's
        paths, labels, _ = files(job)
    else:
        images, labels = load_arrays(job, scaled=False)  # raw uint8: 4x less memory than float32
        n, h, w, c = images.shape
    if n < global_batch_size:
        raise DataError(f"{job.dataset}: {n} training samples are fewer than one global batch of {global_batch_size}")

    # Shuffle indices, not samples: the permutation of ShuffleDataset depends only on (seeds, buffer, n), so this
    # is the order shuffle(...) of the samples themselves would give, with an n-int64 buffer instead of the data.
    ds = tf.data.Dataset.range(n).shuffle(n, seed=job.seed, reshuffle_each_iteration=True)
    # Global batches first (drops the incomplete last one), then this pipeline's contiguous slots of each: the
    # order inside the slice is the slot order, so replica r of this pipeline gets rows [r*b, (r+1)*b).
    # repeat() right after the shuffle+batch: each repetition re-iterates the shuffle (a new order per epoch), and
    # skip(start_step) then resumes an interrupted run exactly where it stopped, skipping indices, not images.
    ds = ds.batch(global_batch_size, drop_remainder=True).repeat().skip(start_step).map(lambda idx: idx[lo:hi])

    if files is not None:
        paths_t, labels_t = tf.constant(paths), tf.constant(labels)

        def decode(i: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            raw = tf.io.decode_image(tf.io.read_file(paths_t[i]), channels=c, expand_animations=False)
            img = tf.image.resize(raw, (h, w))  # bilinear, float32 still in [0, 255]; identity at the same size
            return img / 255.0, labels_t[i]

        # decode after slicing: a rank never reads another rank's files; deterministic=True keeps slot order
        ds = ds.unbatch().map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        ds = ds.batch(b, drop_remainder=True)
    else:
        images_t, labels_t = tf.constant(images), tf.constant(labels)
        reps = replicas_per_pipeline

        def gather(idx: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            x = tf.cast(tf.gather(images_t, idx), tf.float32) / 255.0  # same float32 division as load_arrays
            return tf.reshape(x, (reps, b, h, w, c)), tf.reshape(tf.gather(labels_t, idx), (reps, b))

        # one element per replica slot, in slot order
        ds = ds.map(gather, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).unbatch()

    options = tf.data.Options()
    options.deterministic = True
    # sharding is done above; letting tf.distribute shard again would drop or duplicate samples
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.prefetch(tf.data.AUTOTUNE).with_options(options)
