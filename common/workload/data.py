"""Training data for both backends: dispatch to the dataset registry, and the one sharded tf.data pipeline.

Which datasets exist, their files, checks, info and loaders live in ``common.workload.datasets`` (one entry per
dataset, in ``DATASETS``); this module looks a job's dataset up there. ``dataset_info`` and ``load_arrays`` never import
TensorFlow, so a bad ``data_dir`` is rejected before TF starts; only ``make_train_dataset`` imports it.

Parity rule (both backends call ``make_train_dataset``; see its docstring): one global shuffle of the whole
training set with the job's seed, cut into global batches of G samples, global batch k split into consecutive
per-replica slots of b samples. Concatenating every replica's batch k therefore gives exactly batch k of
``shuffle(n, seed).batch(G, drop_remainder=True)``, whatever the number of processes or replicas per process.
TFRecord shards keep the rule by reading each record by its byte offset (``common.workload.tfrecord``), except with the
opt-in ``tfrecord_sharding = "files"`` (each rank streams its own shards: fastest, no cross-world-size parity).
A user dataset (``dataset = "package.module:function"``, ``common.workload.usercode``) is a pair of arrays in memory,
used as given (no scaling), through the same rule.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from common.core.errors import UsageError
from common.workload import inputfn, tfrecord, usercode
from common.workload.datasets import DATASETS, DataError, list_image_folder
from common.workload.job import Job

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["DataError", "DataFacts", "DataUsageError", "check_sharding", "dataset_info", "facts", "label_sample",
           "list_image_folder",
           "load_arrays", "make_train_dataset", "shard_geometry", "streams", "validation_arrays"]


# ----------------------------------------------------------------------------------------------------------------
# Public: info and loaders
# ----------------------------------------------------------------------------------------------------------------
def dataset_info(job: Job) -> tuple[int, tuple[int, ...], int | None]:
    """(training samples, input shape, num_classes) from file headers only; DataError if files are missing/corrupt.

    No TensorFlow import, cheap (idx/npz headers, file listings; CIFAR batches are unpickled to count them). A user
    dataset is loaded (once per process): its input shape is its features' ``x.shape[1:]``, its num_classes None
    for labels that are not integers (``common.workload.usercode.UserCodeError`` if its function fails).
    """
    if streams(job):  # known only in the ranks, from the dataset the function returns there
        raise DataError(f"dataset = {job.dataset!r} is an input function: its size is known only in the ranks")
    if usercode.is_ref(job.dataset):
        facts = DataFacts.of(usercode.load_data(job))
        return facts.samples, facts.input_shape, facts.num_classes
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
    spec = DATASETS.get(job.dataset)
    load = spec.load if spec is not None else None
    if load is None:  # a user dataset too: usercode.load_data(job) has its arrays, as given
        raise DataError(f"load_arrays: dataset {job.dataset!r} is decoded in the tf.data pipeline, not in memory")
    x, y = load(job)
    if scaled:
        return x.astype(np.float32) / np.float32(255), y
    return x, y


def validation_arrays(job: Job) -> tuple[np.ndarray, np.ndarray] | None:
    """The validation split as a user dataset gave it, None for builtin datasets and user datasets without one."""
    if not usercode.is_ref(job.dataset) or streams(job):
        return None
    return usercode.load_data(job).validation


def streams(job: Job) -> bool:
    """Is the job's dataset an input function (``common.workload.inputfn``), called only in the ranks?"""
    return inputfn.is_input_fn(job)


@dataclass(frozen=True)
class DataFacts:
    """What a run plans and builds by: the training data's size and shapes, worked out once per process (``facts``),
    before TensorFlow starts where the data allows (``common.cli.prepare``), then carried by the run's plan
    (``common.training.context.Plan``). An input function's are known only in the ranks (its pipeline's facts)."""

    samples: int  # training samples
    input_shape: tuple[int, ...]  # one sample's features
    num_classes: int | None  # None: labels that are not class indices
    call: str = ""  # a user dataset function's call, as the banner says it: "fn(batch_size=64)"
    done: tuple[str, ...] = ()  # what twinbench did to the tf.data.Dataset it returned, per split (the banner's)

    @classmethod
    def of(cls, data: Any) -> DataFacts:
        """A user dataset's (``usercode.load_data`` / ``load_before_tf``): its arrays' size and shapes."""
        return cls(len(data.x), data.input_shape, data.num_classes, data.call, tuple(data.done))

    def record(self) -> dict[str, Any] | None:
        """The record's ``input.dataset``: the function's call and what twinbench did to the tf.data.Dataset it
        returned (each operation of its pipeline, per split); None when it returned arrays."""
        return {"call": self.call, "done": list(self.done)} if self.done else None

    def labels(self, job: Job) -> np.ndarray:
        """A few training labels, the smallest and largest among them (integer labels): what the loss is checked
        on."""
        return label_sample(job, self.num_classes)


def facts(job: Job) -> DataFacts:
    """``dataset_info`` as the plan carries it (a user dataset function is called once per process)."""
    return DataFacts(*dataset_info(job))


def label_sample(job: Job, num_classes: int | None = None) -> np.ndarray:
    """A few training labels, the smallest and largest among them (integer labels): what the loss is checked on.
    ``num_classes``: a builtin dataset's, when known (else read from its files)."""
    if not usercode.is_ref(job.dataset):
        classes = num_classes if num_classes is not None else dataset_info(job)[2]
        return np.array([0, (classes or 1) - 1], np.int32)
    y = usercode.load_data(job).y
    if np.issubdtype(y.dtype, np.integer) and y.ndim == 1:
        return y[[int(np.argmin(y)), int(np.argmax(y))]]
    return y[:2]


# ----------------------------------------------------------------------------------------------------------------
# Public: the sharded training pipeline
# ----------------------------------------------------------------------------------------------------------------
def shard_geometry(global_batch_size: int, pipeline_index: int, num_pipelines: int,
                   replicas_per_pipeline: int = 1, per_replica_batch: int | None = None) -> tuple[int, int, int]:
    """(per-replica batch b, first and one-past-last position of this pipeline's slots in a global batch).

    ``per_replica_batch``: b as the run's plan defines it (the global batch is made of b per replica), checked
    against ``global_batch_size``; without it (a caller that knows only the global batch) b is its share."""
    if num_pipelines < 1 or replicas_per_pipeline < 1:
        raise DataError(f"num_pipelines ({num_pipelines}) and replicas_per_pipeline ({replicas_per_pipeline}) "
                        "must be >= 1")
    if not 0 <= pipeline_index < num_pipelines:
        raise DataError(f"pipeline_index {pipeline_index} is not in [0, {num_pipelines})")
    replicas = num_pipelines * replicas_per_pipeline
    b = global_batch_size // replicas if per_replica_batch is None else per_replica_batch
    if global_batch_size < 1 or b < 1 or b * replicas != global_batch_size:
        raise DataError(f"global batch size {global_batch_size} is not a positive multiple of the {replicas} "
                        f"replicas ({num_pipelines} pipelines x {replicas_per_pipeline} replicas each)")
    lo = pipeline_index * replicas_per_pipeline * b
    return b, lo, lo + replicas_per_pipeline * b


def make_train_dataset(job: Job, global_batch_size: int, pipeline_index: int, num_pipelines: int,
                       replicas_per_pipeline: int = 1, start_step: int = 0, *,
                       per_replica_batch: int | None = None) -> tf.data.Dataset:
    """Infinite per-replica batches (images float32 [b,H,W,C] in [0,1], labels int32 [b]) of one input pipeline.

    b = per_replica_batch (the run's plan), else global_batch_size // (num_pipelines * replicas_per_pipeline).
    Rule, identical on every rank and backend:
    the n training samples are shuffled as a whole (buffer n, seed job.seed, a new order every epoch), the last
    incomplete global batch is dropped, and global batch k (G = global_batch_size consecutive samples) is split
    into G/b replica slots in order; this pipeline yields its replicas_per_pipeline consecutive slots of global
    batch 0, then of global batch 1, ... An epoch is n // G steps. Equivalent to filtering the enumerated shuffle
    by slot; implemented by shuffling indices and slicing each global batch, then gathering/decoding only the
    samples of this pipeline (TFRecords: reading only its records, by byte offset).

    The one exception is ``tfrecord_sharding = "files"``: each pipeline reads its own shards (round robin) in its
    own shuffled order, faster but without the rule (no parity across world sizes or backends' pipelines).

    replicas_per_pipeline defaults to 1, one replica per process (Horovod; MWMS with one device per worker); with
    several local replicas, consecutive elements go to consecutive local replicas, as tf.distribute feeds them.

    The caller must have called ``tf.keras.utils.set_random_seed(job.seed)``: tf.data pairs the op seed with the
    global seed, so another global seed would give another order (checked). Iterate each dataset object once:
    a second iterator continues the reshuffle sequence instead of restarting it.
    """
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf

    b, lo, hi = shard_geometry(global_batch_size, pipeline_index, num_pipelines, replicas_per_pipeline,
                               per_replica_batch)
    # tf.data derives the shuffle seeds from (global seed, op seed): pin both so all ranks agree.
    seeds = tf.compat.v1.get_seed(job.seed)
    if seeds[0] != job.seed % (2**31 - 1):
        raise RuntimeError(f"make_train_dataset: call tf.keras.utils.set_random_seed({job.seed}) first "
                           f"(global seed is {seeds[0]}): the shuffle order depends on it")
    slots = _Slots(global_batch_size, b, lo, hi, replicas_per_pipeline, start_step)
    spec = DATASETS.get(job.dataset)
    if spec is None:  # a user dataset: its arrays as given
        data = usercode.load_data(job)
        ds = _array_stream(tf, job, slots, data.x, data.y, scale=False)
    elif spec.records is not None:
        ds = _tfrecord_stream(tf, job, spec.records(job), slots, pipeline_index, num_pipelines)
    elif spec.files is not None:
        ds = _file_stream(tf, job, slots)
    else:
        ds = _array_stream(tf, job, slots, *load_arrays(job, scaled=False), scale=True)  # raw uint8: 4x smaller

    options = tf.data.Options()
    options.deterministic = True
    # sharding is done above; letting tf.distribute shard again would drop or duplicate samples
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.prefetch(tf.data.AUTOTUNE).with_options(options)


class DataUsageError(DataError, UsageError):
    """Data that cannot feed this world size, found once it is known (TensorFlow running): exit status 2."""


@dataclass(frozen=True)
class _Slots:
    """This pipeline's share of every global batch: G samples, b per replica, positions [lo, hi)."""

    global_batch: int
    b: int
    lo: int
    hi: int
    replicas: int  # replicas fed by this pipeline
    start_step: int  # global batches already consumed (resume)

    @property
    def per_step(self) -> int:
        """Samples this pipeline feeds per global step: b for each of its replicas."""
        return self.b * self.replicas


def _global_slots(tf: Any, job: Job, n: int, s: _Slots) -> tf.data.Dataset:
    """The parity rule as a stream of index vectors: this pipeline's [lo, hi) slice of every global batch."""
    if n < s.global_batch:
        raise DataError(f"{job.dataset}: {n} training samples are fewer than one global batch of {s.global_batch}")
    # Shuffle indices, not samples: the permutation of ShuffleDataset depends only on (seeds, buffer, n), so this
    # is the order shuffle(...) of the samples themselves would give, with an n-int64 buffer instead of the data.
    ds = tf.data.Dataset.range(n).shuffle(n, seed=job.seed, reshuffle_each_iteration=True)
    # Global batches first (drops the incomplete last one), then this pipeline's contiguous slots of each: the
    # order inside the slice is the slot order, so replica r of this pipeline gets rows [r*b, (r+1)*b).
    # repeat() right after the shuffle+batch: each repetition re-iterates the shuffle (a new order per epoch), and
    # skip(start_step) then resumes an interrupted run exactly where it stopped, skipping indices, not images.
    return ds.batch(s.global_batch, drop_remainder=True).repeat().skip(s.start_step).map(lambda idx: idx[s.lo:s.hi])


def _array_stream(tf: Any, job: Job, s: _Slots, images: np.ndarray, labels: np.ndarray,
                  scale: bool) -> tf.data.Dataset:
    """Samples gathered from arrays in memory: uint8 images scaled to [0, 1] (builtins), or as given (user data)."""
    n = len(images)
    ds = _global_slots(tf, job, n, s)
    reps, b = s.replicas, s.b
    x_shape, y_shape = (reps, b, *images.shape[1:]), (reps, b, *labels.shape[1:])
    # a user's arrays are gathered by numpy where the pipeline runs in this process (made eagerly); a parameter
    # server's workers run it elsewhere (traced by the coordinator), where only tensors reach them
    rows = _numpy_rows(tf, images, labels) if not scale and tf.executing_eagerly() else \
        _tensor_rows(tf, images, labels, scale)

    def gather(idx: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        x, y = rows(idx)
        return tf.reshape(x, x_shape), tf.reshape(y, y_shape)

    # one element per replica slot, in slot order
    return ds.map(gather, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).unbatch()


def _tensor_rows(tf: Any, images: np.ndarray, labels: np.ndarray, scale: bool) -> Any:
    """``idx -> (images[idx], labels[idx])`` by ``tf.gather`` from tensors of the arrays (a copy of them)."""
    images_t, labels_t = tf.constant(images), tf.constant(labels)

    def rows(idx: Any) -> tuple[Any, Any]:
        x = tf.gather(images_t, idx)
        if scale:
            x = tf.cast(x, tf.float32) / 255.0  # same float32 division as load_arrays
        return x, tf.gather(labels_t, idx)

    return rows


def _numpy_rows(tf: Any, images: np.ndarray, labels: np.ndarray) -> Any:
    """``idx -> (images[idx], labels[idx])`` by numpy indexing of the arrays as they are (a ``tf.numpy_function``):
    only the batch is copied into TensorFlow. A tensor of the arrays would be a copy of the data (``tf.constant``
    copies a numpy array, and TensorFlow cannot take a numpy buffer that is not 64-byte aligned), and tf.data's
    static optimizations copy a tensor the pipeline captures once more, rewriting the pipeline through its
    serialised graph (bench/input_memory.py --in-memory)."""
    dtypes = (tf.as_dtype(images.dtype), tf.as_dtype(labels.dtype))

    def take(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return images[idx], labels[idx]

    def rows(idx: Any) -> tuple[Any, Any]:
        return tuple(tf.numpy_function(take, [idx], dtypes, stateful=False))

    return rows


def _file_stream(tf: Any, job: Job, s: _Slots) -> tf.data.Dataset:
    n, (h, w, c), _ = dataset_info(job)  # e.g. a directory listing; files are read later, only this rank's
    paths, labels, _ = DATASETS[job.dataset].files(job)
    ds = _global_slots(tf, job, n, s)
    paths_t, labels_t = tf.constant(paths), tf.constant(labels)

    def decode(i: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        raw = tf.io.decode_image(tf.io.read_file(paths_t[i]), channels=c, expand_animations=False)
        img = tf.image.resize(raw, (h, w))  # bilinear, float32 still in [0, 255]; identity at the same size
        return img / 255.0, labels_t[i]

    # decode after slicing: a rank never reads another rank's files; deterministic=True keeps slot order
    ds = ds.unbatch().map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.batch(s.b, drop_remainder=True)


def check_sharding(job: Job, global_batch_size: int, num_pipelines: int) -> None:
    """DataUsageError (exit 2) if ``tfrecord_sharding = "files"`` cannot feed num_pipelines; no TensorFlow needed.

    Every pipeline needs a shard of its own, and its shards must hold one step of its replicas' samples.
    """
    spec = DATASETS.get(job.dataset)  # None: a user dataset, always the exact rule
    if spec is None or spec.records is None or job.tfrecord_sharding != "files":
        return
    _, lo, hi = shard_geometry(global_batch_size, 0, num_pipelines)  # one pipeline's share of a global step
    _check_files_mode(job, spec.records(job), num_pipelines, hi - lo)


def _check_files_mode(job: Job, index: tfrecord.RecordIndex, num_pipelines: int, step: int) -> None:
    """``check_sharding`` once the geometry is known: ``step`` samples per pipeline and global step."""
    shards = len(index.paths)
    if shards < num_pipelines:
        raise DataUsageError(f"tfrecord: tfrecord_sharding = \"files\" needs a shard per input pipeline: {shards} "
                             f"shards for {num_pipelines} pipelines; use more shards, fewer workers or "
                             "tfrecord_sharding = \"exact\"")
    fewest, worst = min((int(index.counts[p::num_pipelines].sum()), p) for p in range(num_pipelines))
    if fewest < step:
        raise DataUsageError(f"tfrecord: pipeline {worst}'s shards hold {fewest} records, fewer than its {step} per "
                             "step; use tfrecord_sharding = \"exact\"")


def _tfrecord_stream(tf: Any, job: Job, index: tfrecord.RecordIndex, s: _Slots, pipeline_index: int,
                     num_pipelines: int) -> tf.data.Dataset:
    """Exact: the rule's index stream, each record read by offset. Files: this pipeline's shards, streamed."""
    _, shape, num_classes = dataset_info(job)
    if job.tfrecord_sharding == "files":
        _check_files_mode(job, index, num_pipelines, s.per_step)
        ds = tfrecord.read_by_files(tf, index, pipeline_index, num_pipelines, job.seed, s.start_step * s.per_step)
    else:
        ds = tfrecord.read_by_index(tf, index, _global_slots(tf, job, index.size, s).unbatch())
    decode = tfrecord.decoder(tf, shape, num_classes, job.tfrecord_label_offset)
    return ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).batch(s.b, drop_remainder=True)
