"""Training data for both backends: on-disk loaders (numpy, no TensorFlow) and the one sharded tf.data pipeline.

Nothing is ever downloaded: every real dataset is read from ``job.data_dir`` in the exact format Keras caches it
(``mnist.npz``, the four Fashion-MNIST idx ``.gz`` files, the CIFAR-10 python pickle batches) or, for
``image_folder``, from ``data_dir/<class_name>/*.{jpg,jpeg,png}``. ``dataset_info`` and the loaders never import
TensorFlow, so a bad ``data_dir`` is rejected before TF starts; only ``make_train_dataset`` imports it.

Parity rule (both backends call ``make_train_dataset``; see its docstring): one global shuffle of the whole
training set with the job's seed, cut into global batches of G samples, global batch k split into consecutive
per-replica slots of b samples. Concatenating every replica's batch k therefore gives exactly batch k of
``shuffle(n, seed).batch(G, drop_remainder=True)``, whatever the number of processes or replicas per process.
"""

from __future__ import annotations

import gzip
import os
import pickle
import struct
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from common.job import Job

if TYPE_CHECKING:
    import tensorflow as tf


class DataError(ValueError):
    """Training data is missing, corrupt or inconsistent with the job; the message is one line for the user."""


# Shape (H, W, C) and class count of the datasets whose files fix them; synthetic / image_folder use the job's.
FIXED_SPECS: dict[str, tuple[tuple[int, int, int], int]] = {
    "mnist": ((28, 28, 1), 10),
    "fashion_mnist": ((28, 28, 1), 10),
    "cifar10": ((32, 32, 3), 10),
}
# File suffixes (lower-cased) that count as images in an image_folder class directory.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
# Fashion-MNIST training files as keras.datasets.fashion_mnist stores them (labels first, as Keras lists them).
FASHION_TRAIN_FILES = ("train-labels-idx1-ubyte.gz", "train-images-idx3-ubyte.gz")
# CIFAR-10 training batches of the python version, as keras.datasets.cifar10 reads them.
CIFAR_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
_NO_DOWNLOAD = "nothing is downloaded; set data_dir to the directory holding it"


# ----------------------------------------------------------------------------------------------------------------
# Locating files
# ----------------------------------------------------------------------------------------------------------------
def _data_dir(job: Job) -> Path:
    return Path(job.data_dir).expanduser()


def _mnist_path(job: Job) -> Path:
    p = _data_dir(job) / "mnist.npz"
    if not p.is_file():
        raise DataError(f"mnist: expected file {p} not found ({_NO_DOWNLOAD})")
    return p


def _find_in_dir_or_subdir(job: Job, subdir: str, names: tuple[str, ...], what: str) -> list[Path]:
    """``names`` in data_dir, else in data_dir/subdir (Keras' cache layout, so data_dir=~/.keras/datasets works)."""
    base = _data_dir(job)
    for d in (base, base / subdir):
        if (d / names[0]).is_file():
            for name in names:
                if not (d / name).is_file():
                    raise DataError(f"{what}: expected file {d / name} not found ({_NO_DOWNLOAD})")
            return [d / name for name in names]
    raise DataError(f"{what}: expected file {base / names[0]} (or {base / subdir / names[0]}) not found "
                    f"({_NO_DOWNLOAD})")


# ----------------------------------------------------------------------------------------------------------------
# Format readers
# ----------------------------------------------------------------------------------------------------------------
def _npz_member_header(zf: zipfile.ZipFile, key: str, path: Path) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of one array of an .npz from its .npy header only (no data is read)."""
    try:
        with zf.open(f"{key}.npy") as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, _, dtype = np.lib.format.read_array_header_2_0(f)
    except KeyError:
        raise DataError(f"mnist: {path} has no array {key!r} (expected x_train, y_train, x_test, y_test)") from None
    except (ValueError, OSError, zipfile.BadZipFile) as e:
        raise DataError(f"mnist: {path} is corrupt ({key}: {e})") from None
    return tuple(shape), np.dtype(dtype)


def _mnist_count(path: Path) -> int:
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise DataError(f"mnist: {path} is not a valid .npz file ({e})") from None
    with zf:
        xs, xd = _npz_member_header(zf, "x_train", path)
        ys, _ = _npz_member_header(zf, "y_train", path)
    if xs[1:] not in ((28, 28), (28, 28, 1)) or xd != np.uint8:
        raise DataError(f"mnist: {path} x_train must be uint8 of shape (N, 28, 28), got {xd} {xs}")
    if len(ys) != 1 or ys[0] != xs[0]:
        raise DataError(f"mnist: {path} y_train shape {ys} does not match x_train shape {xs}")
    return xs[0]


def _load_mnist(path: Path) -> tuple[np.ndarray, np.ndarray]:
    n = _mnist_count(path)
    try:
        # allow_pickle=False: the Keras file holds plain arrays, and a pickle could run code
        with np.load(path, allow_pickle=False) as f:
            x, y = f["x_train"], f["y_train"]
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
        raise DataError(f"mnist: {path} is corrupt ({e})") from None
    return x.reshape(n, 28, 28, 1), _labels(y, 10, f"mnist: {path}")


# idx format (http://yann.lecun.com/exdb/mnist/): big-endian magic 0x0801 (uint8 vector) / 0x0803 (uint8 3-D),
# then one big-endian uint32 per dimension, then the raw uint8 data.
_IDX_MAGIC = {1: 0x0801, 3: 0x0803}


def _idx_header(path: Path, ndim: int, head: bytes) -> tuple[int, ...]:
    size = 4 + 4 * ndim
    if len(head) < size:
        raise DataError(f"fashion_mnist: {path} is truncated (no idx header)")
    magic, *dims = struct.unpack(f">{1 + ndim}I", head[:size])
    if magic != _IDX_MAGIC[ndim]:
        raise DataError(f"fashion_mnist: {path} is not an idx{ndim} uint8 file (magic {magic:#x})")
    return tuple(dims)


def _gzip_payload_size(path: Path) -> int:
    """Uncompressed size: the gzip trailer (ISIZE, size mod 2^32 of the last member) when it is plausible."""
    with open(path, "rb") as f:
        f.seek(-4, os.SEEK_END)
        return struct.unpack("<I", f.read(4))[0]


def _fashion_dims(path: Path, ndim: int) -> tuple[int, ...]:
    """idx dims read from the first bytes of the .gz, plus a cheap completeness check via the gzip trailer."""
    try:
        with gzip.open(path, "rb") as f:
            dims = _idx_header(path, ndim, f.read(4 + 4 * ndim))
        expected = 4 + 4 * ndim + int(np.prod(dims))
        if _gzip_payload_size(path) != expected % 2**32:
            # multi-member gzip files have no whole-file trailer: count the bytes before calling it truncated
            with gzip.open(path, "rb") as f:
                total = sum(len(chunk) for chunk in iter(lambda: f.read(1 << 20), b""))
            if total != expected:
                raise DataError(f"fashion_mnist: {path} holds {total} bytes, its idx header promises {expected} "
                                "(truncated or corrupt)")
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise DataError(f"fashion_mnist: {path} is not a valid gzip file ({e})") from None
    return dims


def _fashion_count(label_path: Path, image_path: Path) -> int:
    (n,) = _fashion_dims(label_path, 1)
    dims = _fashion_dims(image_path, 3)
    if dims != (n, 28, 28):
        raise DataError(f"fashion_mnist: {image_path} has shape {dims}, expected ({n}, 28, 28) to match {label_path}")
    return n


def _load_fashion(label_path: Path, image_path: Path) -> tuple[np.ndarray, np.ndarray]:
    n = _fashion_count(label_path, image_path)
    try:
        with gzip.open(label_path, "rb") as f:
            y = np.frombuffer(f.read(), np.uint8, offset=8)
        with gzip.open(image_path, "rb") as f:
            x = np.frombuffer(f.read(), np.uint8, offset=16)
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise DataError(f"fashion_mnist: cannot read {label_path.parent} ({e})") from None
    if y.size != n or x.size != n * 28 * 28:
        raise DataError(f"fashion_mnist: {image_path.parent} idx files are truncated or corrupt")
    return x.reshape(n, 28, 28, 1), _labels(y, 10, f"fashion_mnist: {label_path}")


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR-10 python batch -> (uint8 [N,32,32,3], labels). Pickle, as Keras reads it: only trusted files."""
    try:
        with open(path, "rb") as f:
            d = pickle.load(f, encoding="bytes")
        data, labels = d[b"data"], d[b"labels"]
    except (OSError, EOFError, pickle.UnpicklingError, KeyError, TypeError, ValueError, AttributeError) as e:
        raise DataError(f"cifar10: {path} is not a CIFAR-10 python batch ({type(e).__name__}: {e})") from None
    data = np.asarray(data)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072 or len(labels) != data.shape[0]:
        raise DataError(f"cifar10: {path} must hold b'data' uint8 (N, 3072) and N b'labels', "
                        f"got {data.dtype} {data.shape} and {len(labels)} labels")
    # rows are channel-planar (R plane, G plane, B plane of 32x32): to NHWC
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), np.asarray(labels)


def _load_cifar(paths: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    parts = [_read_cifar_batch(p) for p in paths]
    x = np.ascontiguousarray(np.concatenate([p[0] for p in parts]))
    return x, _labels(np.concatenate([p[1] for p in parts]), 10, f"cifar10: {paths[0].parent}")


def _labels(y: np.ndarray, num_classes: int, where: str) -> np.ndarray:
    y = np.asarray(y)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"{where}: labels must be a vector of integers, got {y.dtype} {y.shape}")
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise DataError(f"{where}: labels must be in [0, {num_classes}), found {y.min()}..{y.max()}")
    return y.astype(np.int32)


def list_image_folder(job: Job) -> tuple[list[str], np.ndarray, list[str]]:
    """(file paths, int32 labels, class names) of ``data_dir/<class>/**/*.{jpg,jpeg,png}``.

    Classes are the sub-directories sorted by name (label i = i-th name, as Keras' image_dataset_from_directory
    does); files are sorted by path, so every rank sees the same list. Hidden entries are ignored.
    """
    root = _data_dir(job)
    if not root.is_dir():
        raise DataError(f"image_folder: data_dir {root} is not a directory ({_NO_DOWNLOAD})")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise DataError(f"image_folder: {root} has no class sub-directories (expected {root}/<class_name>/*.png)")
    if len(classes) != job.num_classes:
        raise DataError(f"image_folder: {root} has {len(classes)} class directories but num_classes = "
                        f"{job.num_classes}; set num_classes = {len(classes)}")
    paths: list[str] = []
    labels: list[int] = []
    for label, name in enumerate(classes):
        files = sorted(str(p) for p in (root / name).rglob("*")
                       if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file()
                       and not any(part.startswith(".") for part in p.relative_to(root).parts))
        paths += files
        labels += [label] * len(files)
    if not paths:
        raise DataError(f"image_folder: no {'/'.join(IMAGE_EXTENSIONS)} files under {root}/<class_name>/")
    return paths, np.asarray(labels, np.int32), classes


def _synthetic(job: Job) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic from job.seed: uint8 images = (class template + uniform noise) / 2, labels uniform.

    Integer arithmetic only, so every machine (and every rank) builds bit-identical data; a class is visible in
    its image (the template), so the loss of any model goes down.
    """
    rng = np.random.default_rng(job.seed)
    h, w, c = job.image_shape
    n = job.synthetic_samples
    labels = rng.integers(0, job.num_classes, size=n, dtype=np.int32)
    templates = rng.integers(0, 256, size=(job.num_classes, h, w, c), dtype=np.uint8)
    images = rng.integers(0, 256, size=(n, h, w, c), dtype=np.uint8)
    chunk = 1024  # in-place, in slices: no full-size uint16 temporary for large synthetic images
    for s in range(0, n, chunk):
        mixed = (images[s:s + chunk].astype(np.uint16) + templates[labels[s:s + chunk]]) // 2
        images[s:s + chunk] = mixed.astype(np.uint8)
    return images, labels


# ----------------------------------------------------------------------------------------------------------------
# Public: info and loaders
# ----------------------------------------------------------------------------------------------------------------
def dataset_info(job: Job) -> tuple[int, tuple[int, int, int], int]:
    """(training samples, (H, W, C), num_classes) from file headers only; DataError if files are missing/corrupt.

    No TensorFlow import, cheap (idx/npz headers, file listings; CIFAR batches are unpickled to count them).
    """
    if job.dataset == "synthetic":
        return job.synthetic_samples, _shape3(job.image_shape), job.num_classes
    if job.dataset == "image_folder":
        if job.image_shape[2] not in (1, 3, 4):
            raise DataError(f"image_folder: image_shape channels must be 1, 3 or 4, got {job.image_shape[2]}")
        paths, _, classes = list_image_folder(job)
        return len(paths), _shape3(job.image_shape), len(classes)
    shape, classes = FIXED_SPECS[job.dataset]
    if job.dataset == "mnist":
        n = _mnist_count(_mnist_path(job))
    elif job.dataset == "fashion_mnist":
        n = _fashion_count(*_find_in_dir_or_subdir(job, "fashion-mnist", FASHION_TRAIN_FILES, "fashion_mnist"))
    else:
        n = sum(len(_read_cifar_batch(p)[1])
                for p in _find_in_dir_or_subdir(job, "cifar-10-batches-py", CIFAR_TRAIN_FILES, "cifar10"))
    if n < 1:
        raise DataError(f"{job.dataset}: the training files in {job.data_dir} hold no samples")
    return n, shape, classes


def _shape3(shape: tuple[int, ...]) -> tuple[int, int, int]:
    h, w, c = shape
    return h, w, c


def load_arrays(job: Job, scaled: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The whole training set in memory: (images [N,H,W,C], int32 labels [N]); not for image_folder.

    scaled=True (default: what the model sees) gives float32 in [0, 1] (uint8 / 255, the same arithmetic as the
    pipeline); scaled=False gives the raw uint8, which the pipeline keeps in memory (4x smaller) and scales only
    for the samples a rank actually uses.
    """
    if job.dataset == "synthetic":
        x, y = _synthetic(job)
    elif job.dataset == "mnist":
        x, y = _load_mnist(_mnist_path(job))
    elif job.dataset == "fashion_mnist":
        x, y = _load_fashion(*_find_in_dir_or_subdir(job, "fashion-mnist", FASHION_TRAIN_FILES, "fashion_mnist"))
    elif job.dataset == "cifar10":
        x, y = _load_cifar(_find_in_dir_or_subdir(job, "cifar-10-batches-py", CIFAR_TRAIN_FILES, "cifar10"))
    else:
        raise DataError(f"load_arrays: dataset {job.dataset!r} is decoded in the tf.data pipeline, not in memory")
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
    if job.dataset == "image_folder":
        n, (h, w, c), _ = dataset_info(job)  # a directory listing; files are read later, only this rank's
        paths, labels, _ = list_image_folder(job)
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

    if job.dataset == "image_folder":
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
