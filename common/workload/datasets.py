"""The dataset registry: each dataset's name, file checks, info and array loading, next to its format readers.

Adding a dataset touches this file only: write its readers and one ``register(DatasetSpec(...))`` in a section of
its own; ``common.workload.job`` takes the valid names (and which job keys the dataset reads) from ``DATASETS``, and
``common.workload.data`` dispatches ``dataset_info``, ``load_arrays`` and ``make_train_dataset`` through it.
Registration order is the order job errors list the names in.

Nothing is ever downloaded: every real dataset is read from ``job.data_dir`` in the exact format Keras caches it
(``mnist.npz``, the four Fashion-MNIST idx ``.gz`` files, the CIFAR-10 python pickle batches) or, for
``image_folder``, from ``data_dir/<class_name>/*.{jpg,jpeg,png}``, or, for ``tfrecord``, from ImageNet's
``train-NNNNN-of-NNNNN`` TFRecord shards (format and record index in ``common.workload.tfrecord``). This module never
imports TensorFlow (so ``common.workload.job`` can validate against it before TF starts), nor ``common.workload.job``
(which imports it): a job is anything with the fields of ``DatasetJob``.
"""

from __future__ import annotations

import gzip
import os
import pickle
import struct
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from common.workload import tfrecord


class DataError(ValueError):
    """Training data is missing, corrupt or inconsistent with the job; the message is one line for the user."""


class DatasetJob(Protocol):
    """The job fields datasets read: a ``common.workload.job.Job`` (not imported here, ``common.workload.job``
    imports this module)."""

    @property
    def data_dir(self) -> str: ...
    @property
    def image_shape(self) -> tuple[int, ...]: ...
    @property
    def num_classes(self) -> int: ...
    @property
    def synthetic_samples(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def tfrecord_label_offset(self) -> int: ...


# (training samples, (H, W, C), number of classes)
DatasetInfo = tuple[int, tuple[int, int, int], int]


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset. Exactly one of ``load`` (arrays in memory), ``files`` (one file per sample) and ``records``
    (TFRecord shards); the last two are decoded in the tf.data pipeline."""

    name: str
    description: str  # one line
    info: Callable[[DatasetJob], DatasetInfo]  # file checks from headers / listings only (cheap); DataError if bad
    load: Callable[[DatasetJob], tuple[np.ndarray, np.ndarray]] | None = None  # raw uint8 [N,H,W,C], int32 [N]
    files: Callable[[DatasetJob], tuple[list[str], np.ndarray, list[str]]] | None = None  # paths, labels, classes
    records: Callable[[DatasetJob], tfrecord.RecordIndex] | None = None  # every record's shard and byte offset
    needs_data_dir: bool = True  # files come from job.data_dir: a job without data_dir is rejected
    job_fields: tuple[str, ...] = ()  # job keys it reads among image_shape, num_classes, synthetic_samples (hashed)


DATASETS: dict[str, DatasetSpec] = {}  # name -> spec, in registration order


def register(spec: DatasetSpec) -> DatasetSpec:
    """Add a dataset to ``DATASETS`` (ValueError for a duplicate name or not exactly one of load / files / records)."""
    if spec.name in DATASETS:
        raise ValueError(f"dataset {spec.name!r} is already registered")
    if sum(x is not None for x in (spec.load, spec.files, spec.records)) != 1:
        raise ValueError(f"dataset {spec.name!r}: give exactly one of load= and files= (or records= for TFRecords)")
    DATASETS[spec.name] = spec
    return spec


_NO_DOWNLOAD = "nothing is downloaded; set data_dir to the directory holding it"


# ----------------------------------------------------------------------------------------------------------------
# Shared helpers
# ----------------------------------------------------------------------------------------------------------------
def _data_dir(job: DatasetJob) -> Path:
    return Path(job.data_dir).expanduser()


def _find_in_dir_or_subdir(job: DatasetJob, subdir: str, names: tuple[str, ...], what: str) -> list[Path]:
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


def _labels(y: np.ndarray, num_classes: int, where: str) -> np.ndarray:
    y = np.asarray(y)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"{where}: labels must be a vector of integers, got {y.dtype} {y.shape}")
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise DataError(f"{where}: labels must be in [0, {num_classes}), found {y.min()}..{y.max()}")
    return y.astype(np.int32)


def _shape3(shape: tuple[int, ...]) -> tuple[int, int, int]:
    h, w, c = shape
    return h, w, c


# ----------------------------------------------------------------------------------------------------------------
# synthetic
# ----------------------------------------------------------------------------------------------------------------
def _synthetic(job: DatasetJob) -> tuple[np.ndarray, np.ndarray]:
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


register(DatasetSpec(
    "synthetic", "deterministic class templates + noise, from the job's seed, image_shape, num_classes",
    info=lambda job: (job.synthetic_samples, _shape3(job.image_shape), job.num_classes),
    load=_synthetic, needs_data_dir=False, job_fields=("image_shape", "num_classes", "synthetic_samples")))


# ----------------------------------------------------------------------------------------------------------------
# mnist: data_dir/mnist.npz
# ----------------------------------------------------------------------------------------------------------------
def _mnist_path(job: DatasetJob) -> Path:
    p = _data_dir(job) / "mnist.npz"
    if not p.is_file():
        raise DataError(f"mnist: expected file {p} not found ({_NO_DOWNLOAD})")
    return p


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


register(DatasetSpec(
    "mnist", "MNIST digits, data_dir/mnist.npz (keras.datasets.mnist's file)",
    info=lambda job: (_mnist_count(_mnist_path(job)), (28, 28, 1), 10),
    load=lambda job: _load_mnist(_mnist_path(job))))


# ----------------------------------------------------------------------------------------------------------------
# fashion_mnist: the two training idx .gz files in data_dir or data_dir/fashion-mnist
# ----------------------------------------------------------------------------------------------------------------
# Fashion-MNIST training files as keras.datasets.fashion_mnist stores them (labels first, as Keras lists them).
FASHION_TRAIN_FILES = ("train-labels-idx1-ubyte.gz", "train-images-idx3-ubyte.gz")


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


def _fashion_files(job: DatasetJob) -> list[Path]:
    return _find_in_dir_or_subdir(job, "fashion-mnist", FASHION_TRAIN_FILES, "fashion_mnist")


register(DatasetSpec(
    "fashion_mnist", "Fashion-MNIST, Keras' idx .gz files in data_dir or data_dir/fashion-mnist",
    info=lambda job: (_fashion_count(*_fashion_files(job)), (28, 28, 1), 10),
    load=lambda job: _load_fashion(*_fashion_files(job))))


# ----------------------------------------------------------------------------------------------------------------
# cifar10: data_batch_1..5 in data_dir or data_dir/cifar-10-batches-py
# ----------------------------------------------------------------------------------------------------------------
# CIFAR-10 training batches of the python version, as keras.datasets.cifar10 reads them.
CIFAR_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))


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


def _cifar_files(job: DatasetJob) -> list[Path]:
    return _find_in_dir_or_subdir(job, "cifar-10-batches-py", CIFAR_TRAIN_FILES, "cifar10")


register(DatasetSpec(
    "cifar10", "CIFAR-10, the python pickle batches in data_dir or data_dir/cifar-10-batches-py",
    info=lambda job: (sum(len(_read_cifar_batch(p)[1]) for p in _cifar_files(job)), (32, 32, 3), 10),
    load=lambda job: _load_cifar(_cifar_files(job))))


# ----------------------------------------------------------------------------------------------------------------
# image_folder: data_dir/<class_name>/**/*.{jpg,jpeg,png}, decoded in the tf.data pipeline
# ----------------------------------------------------------------------------------------------------------------
# File suffixes (lower-cased) that count as images in an image_folder class directory.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")


def list_image_folder(job: DatasetJob) -> tuple[list[str], np.ndarray, list[str]]:
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


def _image_folder_info(job: DatasetJob) -> DatasetInfo:
    if job.image_shape[2] not in (1, 3, 4):
        raise DataError(f"image_folder: image_shape channels must be 1, 3 or 4, got {job.image_shape[2]}")
    paths, _, classes = list_image_folder(job)
    return len(paths), _shape3(job.image_shape), len(classes)


register(DatasetSpec(
    "image_folder", "images in data_dir/<class_name>/, resized to image_shape; classes sorted by name",
    info=_image_folder_info, files=list_image_folder, job_fields=("image_shape", "num_classes")))


# ----------------------------------------------------------------------------------------------------------------
# tfrecord: ImageNet's data_dir/train-NNNNN-of-NNNNN TFRecord shards (tf.train.Example: JPEG + int64 label)
# ----------------------------------------------------------------------------------------------------------------
def _tfrecord_index(job: DatasetJob) -> tfrecord.RecordIndex:
    try:
        return tfrecord.record_index(_data_dir(job))
    except tfrecord.FormatError as e:
        raise DataError(f"tfrecord: {e}") from None


def _tfrecord_info(job: DatasetJob) -> DatasetInfo:
    if job.image_shape[2] not in (1, 3):
        raise DataError(f"tfrecord: image_shape channels must be 1 or 3 (JPEG), got {job.image_shape[2]}")
    return _tfrecord_index(job).size, _shape3(job.image_shape), job.num_classes


# Labels: image/class/label - tfrecord_label_offset must be in [0, num_classes). The offset defaults to 1 because
# ImageNet's build scripts store 1..1000 (Model Garden subtracts 1 too); tf_cnn_benchmarks' 1001-class setup is
# offset 0 with num_classes = 1001. Checked per record in the pipeline: counting never reads the Examples.
register(DatasetSpec(
    "tfrecord", "ImageNet-style data_dir/train-NNNNN-of-NNNNN TFRecords (JPEG + label), resized to image_shape",
    info=_tfrecord_info, records=_tfrecord_index,
    job_fields=("image_shape", "num_classes", "tfrecord_sharding", "tfrecord_label_offset")))
