"""common.workload.datasets: each dataset's on-disk format read back from files written here, its DataError messages,
and the registry (a dataset is one entry)."""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # legacy Keras 2 before TensorFlow loads

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from common.workload import data, datasets
from common.workload.data import DataError
from common.workload.job import Job, JobError
from tests.test_data import G, N, global_batches, pipelines, reference_batches, synthetic_job, unique_images


# ----------------------------------------------------------------------------------------------------------------
# writers of the real on-disk formats
# ----------------------------------------------------------------------------------------------------------------
def write_idx_gz(path: Path, arr: np.ndarray) -> None:
    arr = np.asarray(arr, np.uint8)
    # idx header: 0x00, 0x00, type 0x08 (ubyte), ndim; then big-endian uint32 sizes
    header = struct.pack(f">{1 + arr.ndim}I", 0x0800 | arr.ndim, *arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + arr.tobytes())


def write_fashion(d: Path, x: np.ndarray, y: np.ndarray) -> None:
    d.mkdir(parents=True, exist_ok=True)
    write_idx_gz(d / "train-labels-idx1-ubyte.gz", y)
    write_idx_gz(d / "train-images-idx3-ubyte.gz", x)
    write_idx_gz(d / "t10k-labels-idx1-ubyte.gz", y[:3])
    write_idx_gz(d / "t10k-images-idx3-ubyte.gz", x[:3])


def write_cifar(d: Path, images: np.ndarray, labels: np.ndarray, sizes: tuple[int, ...]) -> None:
    """images NHWC uint8 split over data_batch_1..5 with the given sizes, in the python-pickle batch format."""
    d.mkdir(parents=True, exist_ok=True)
    start = 0
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name, k in zip(names, sizes + (2,), strict=True):
        img = images[start:start + k] if name != "test_batch" else images[:k]
        lab = labels[start:start + k] if name != "test_batch" else labels[:k]
        start += k if name != "test_batch" else 0
        # rows: R plane, G plane, B plane (channel-planar 3x32x32 flattened)
        rows = img.transpose(0, 3, 1, 2).reshape(len(img), 3072)
        batch = {b"batch_label": name.encode(), b"labels": [int(v) for v in lab], b"data": rows,
                 b"filenames": [f"{i}.png".encode() for i in range(len(img))]}
        with open(d / name, "wb") as f:
            pickle.dump(batch, f, protocol=2)


def write_png(path: Path, img: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(tf.io.encode_png(img).numpy())


# ----------------------------------------------------------------------------------------------------------------
# synthetic
# ----------------------------------------------------------------------------------------------------------------
def test_synthetic_info_and_arrays():
    job = synthetic_job(num_classes=5)
    assert data.dataset_info(job) == (N, (4, 4, 1), 5)
    x, y = data.load_arrays(job)
    assert x.shape == (N, 4, 4, 1) and x.dtype == np.float32
    assert y.shape == (N,) and y.dtype == np.int32
    assert 0.0 <= x.min() and x.max() <= 1.0
    assert set(np.unique(y)) == set(range(5))


def test_synthetic_is_deterministic_per_seed():
    a = data.load_arrays(synthetic_job())
    b = data.load_arrays(synthetic_job())
    c = data.load_arrays(synthetic_job(seed=8))
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(a[0], c[0])


def test_synthetic_labels_are_learnable():
    # a nearest-class-mean classifier fitted on half the data must beat chance (10%) by far on the other half
    job = Job(dataset="synthetic", synthetic_samples=400, image_shape=(8, 8, 1), seed=3)
    x, y = data.load_arrays(job)
    x = x.reshape(len(x), -1)
    means = np.stack([x[:200][y[:200] == k].mean(0) for k in range(10)])
    pred = np.argmin(((x[200:, None, :] - means[None]) ** 2).sum(-1), axis=1)
    assert (pred == y[200:]).mean() > 0.9


# ----------------------------------------------------------------------------------------------------------------
# MNIST (mnist.npz, as keras.datasets.mnist caches it)
# ----------------------------------------------------------------------------------------------------------------
def test_mnist_npz_round_trip(tmp_path):
    x = unique_images(30, (28, 28))
    y = np.arange(30, dtype=np.uint8) % 10
    np.savez(tmp_path / "mnist.npz", x_train=x, y_train=y, x_test=x[:5], y_test=y[:5])
    job = Job(dataset="mnist", data_dir=str(tmp_path))
    assert data.dataset_info(job) == (30, (28, 28, 1), 10)
    raw, labels = data.load_arrays(job, scaled=False)
    np.testing.assert_array_equal(raw, x[..., None])
    np.testing.assert_array_equal(labels, y)
    assert labels.dtype == np.int32
    scaled, _ = data.load_arrays(job)
    assert scaled.dtype == np.float32 and scaled.shape == (30, 28, 28, 1)
    np.testing.assert_array_equal(scaled, x[..., None].astype(np.float32) / 255)


def test_mnist_missing_names_expected_file(tmp_path):
    job = Job(dataset="mnist", data_dir=str(tmp_path / "nowhere"))
    with pytest.raises(DataError, match=str(tmp_path / "nowhere" / "mnist.npz")) as e:
        data.dataset_info(job)
    assert "\n" not in str(e.value)


def test_mnist_corrupt_or_incomplete(tmp_path):
    (tmp_path / "mnist.npz").write_bytes(b"not a zip file at all")
    job = Job(dataset="mnist", data_dir=str(tmp_path))
    with pytest.raises(DataError, match="mnist.npz"):
        data.dataset_info(job)
    np.savez(tmp_path / "mnist.npz", x_train=unique_images(3, (28, 28)))  # y_train missing
    with pytest.raises(DataError, match="y_train"):
        data.dataset_info(job)
    np.savez(tmp_path / "mnist.npz", x_train=unique_images(3, (28, 28)), y_train=np.array([0, 1, 12]))
    with pytest.raises(DataError, match=r"\[0, 10\)"):
        data.load_arrays(job)


# ----------------------------------------------------------------------------------------------------------------
# Fashion-MNIST (four idx .gz files, as keras.datasets.fashion_mnist caches them)
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("subdir", ["", "fashion-mnist"])
def test_fashion_idx_round_trip(tmp_path, subdir):
    x = unique_images(25, (28, 28), seed=1)
    y = (np.arange(25, dtype=np.uint8) * 3) % 10
    write_fashion(tmp_path / subdir, x, y)
    job = Job(dataset="fashion_mnist", data_dir=str(tmp_path))
    assert data.dataset_info(job) == (25, (28, 28, 1), 10)
    raw, labels = data.load_arrays(job, scaled=False)
    np.testing.assert_array_equal(raw, x[..., None])
    np.testing.assert_array_equal(labels, y)
    # what keras.datasets.fashion_mnist.load_data does with the same bytes (fixed 8 / 16 byte offsets)
    with gzip.open(tmp_path / subdir / "train-images-idx3-ubyte.gz", "rb") as f:
        keras_x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(25, 28, 28)
    np.testing.assert_array_equal(raw[..., 0], keras_x)


def test_fashion_missing_and_truncated(tmp_path):
    job = Job(dataset="fashion_mnist", data_dir=str(tmp_path))
    with pytest.raises(DataError, match=str(tmp_path / "train-labels-idx1-ubyte.gz")):
        data.dataset_info(job)
    x, y = unique_images(10, (28, 28)), np.zeros(10, np.uint8)
    write_fashion(tmp_path, x, y)
    (tmp_path / "train-images-idx3-ubyte.gz").unlink()
    with pytest.raises(DataError, match=str(tmp_path / "train-images-idx3-ubyte.gz")):
        data.dataset_info(job)
    # header promises 10 images, the payload holds 9
    with gzip.open(tmp_path / "train-images-idx3-ubyte.gz", "wb") as f:
        f.write(struct.pack(">4I", 0x0803, 10, 28, 28) + x[:9].tobytes())
    with pytest.raises(DataError, match="truncated"):
        data.dataset_info(job)
    # wrong magic (an idx1 file where the images belong)
    write_idx_gz(tmp_path / "train-images-idx3-ubyte.gz", y)
    with pytest.raises(DataError, match="idx3"):
        data.dataset_info(job)


# ----------------------------------------------------------------------------------------------------------------
# CIFAR-10 (python pickle batches)
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("subdir", ["", "cifar-10-batches-py"])
def test_cifar_pickle_round_trip(tmp_path, subdir):
    x = unique_images(12, (32, 32, 3), seed=2)
    y = np.array([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8])
    write_cifar(tmp_path / subdir, x, y, sizes=(3, 2, 4, 1, 2))
    job = Job(dataset="cifar10", data_dir=str(tmp_path))
    assert data.dataset_info(job) == (12, (32, 32, 3), 10)
    raw, labels = data.load_arrays(job, scaled=False)
    np.testing.assert_array_equal(raw, x)  # NHWC, channel-planar rows transposed back, batches 1..5 in order
    np.testing.assert_array_equal(labels, y)
    assert labels.dtype == np.int32 and raw.dtype == np.uint8


def test_cifar_missing_batch_and_corrupt(tmp_path):
    job = Job(dataset="cifar10", data_dir=str(tmp_path))
    with pytest.raises(DataError, match=str(tmp_path / "data_batch_1")):
        data.dataset_info(job)
    write_cifar(tmp_path, unique_images(5, (32, 32, 3)), np.arange(5), sizes=(1, 1, 1, 1, 1))
    (tmp_path / "data_batch_3").unlink()
    with pytest.raises(DataError, match=str(tmp_path / "data_batch_3")):
        data.dataset_info(job)
    (tmp_path / "data_batch_3").write_bytes(b"\x80\x02garbage")
    with pytest.raises(DataError, match="data_batch_3"):
        data.dataset_info(job)


# ----------------------------------------------------------------------------------------------------------------
# image folder
# ----------------------------------------------------------------------------------------------------------------
def make_folder(root: Path, counts: dict[str, int], shape: tuple[int, int, int]) -> dict[bytes, int]:
    """PNG images, each unique, under root/<class>/; returns {image bytes: expected label}."""
    expected = {}
    classes = sorted(counts)
    for label, name in enumerate(classes):
        imgs = unique_images(counts[name], shape, seed=10 + label)
        for i, img in enumerate(imgs):
            write_png(root / name / f"img_{i}.png", img)
            expected[img.tobytes()] = label
    return expected


def test_image_folder_labels_and_pixels(tmp_path):
    shape = (6, 5, 3)
    expected = make_folder(tmp_path, {"zebra": 3, "ant": 4, "mole": 5}, shape)
    (tmp_path / "ant" / "notes.txt").write_text("not an image")
    (tmp_path / ".hidden").mkdir()
    job = Job(dataset="image_folder", data_dir=str(tmp_path), image_shape=shape, num_classes=3, seed=5)
    assert data.dataset_info(job) == (12, shape, 3)
    paths, labels, classes = data.list_image_folder(job)
    assert classes == ["ant", "mole", "zebra"]  # alphabetical: ant=0, mole=1, zebra=2
    assert [Path(p).parent.name for p in paths] == ["ant"] * 4 + ["mole"] * 5 + ["zebra"] * 3
    np.testing.assert_array_equal(labels, [0] * 4 + [1] * 5 + [2] * 3)
    (it,) = pipelines(job, 12, 1)
    images, got_labels = next(it)
    assert images.dtype == tf.float32 and images.shape == (12, *shape)
    assert got_labels.dtype == tf.int32
    # every file exactly once per epoch, pixels round-trip through PNG decode (/255, same size: no resampling)
    seen = {}
    for img, lab in zip(images.numpy(), got_labels.numpy(), strict=True):
        key = np.round(img * 255).astype(np.uint8).tobytes()
        np.testing.assert_allclose(img, np.frombuffer(key, np.uint8).reshape(shape) / 255, atol=1e-6)
        seen[key] = int(lab)
    assert seen == expected


def test_image_folder_resizes_jpeg_and_grey(tmp_path):
    for i, (h, w) in enumerate([(20, 30), (7, 9)]):
        img = unique_images(1, (h, w, 3), seed=i)[0]
        (tmp_path / "a").mkdir(exist_ok=True)
        (tmp_path / "a" / f"{i}.JPEG").write_bytes(tf.io.encode_jpeg(img).numpy())
        write_png(tmp_path / "b" / f"{i}.png", img)
    job = Job(dataset="image_folder", data_dir=str(tmp_path), image_shape=(8, 8, 1), num_classes=2)
    assert data.dataset_info(job) == (4, (8, 8, 1), 2)
    (it,) = pipelines(job, 4, 1)
    images, labels = next(it)
    assert images.shape == (4, 8, 8, 1)
    assert 0.0 <= float(tf.reduce_min(images)) and float(tf.reduce_max(images)) <= 1.0
    assert sorted(labels.numpy().tolist()) == [0, 0, 1, 1]


def test_image_folder_errors(tmp_path):
    job = Job(dataset="image_folder", data_dir=str(tmp_path / "missing"), num_classes=2)
    with pytest.raises(DataError, match=str(tmp_path / "missing")):
        data.dataset_info(job)
    make_folder(tmp_path, {"a": 1, "b": 1, "c": 1}, (4, 4, 1))
    with pytest.raises(DataError, match="3 class directories but num_classes = 2"):
        data.dataset_info(Job(dataset="image_folder", data_dir=str(tmp_path), num_classes=2))


def test_image_folder_rank_decodes_only_its_own_files(tmp_path):
    # one corrupt file: only the pipeline whose slot holds it in global batch 0 may fail on its first batch
    make_folder(tmp_path, {"a": 4, "b": 4}, (4, 4, 1))
    job = Job(dataset="image_folder", data_dir=str(tmp_path), image_shape=(4, 4, 1), num_classes=2, seed=11)
    paths, _, _ = data.list_image_folder(job)
    bad = 5
    Path(paths[bad]).write_bytes(b"corrupt, not a png")
    tf.keras.utils.set_random_seed(job.seed)
    order = next(iter(tf.data.Dataset.range(8).shuffle(8, seed=job.seed).batch(8))).numpy().tolist()
    owner = order.index(bad) // 4  # 2 pipelines x b=4
    its = pipelines(job, 8, 2)
    images, _ = next(its[1 - owner])  # reads only its own 4 files
    assert images.shape == (4, 4, 4, 1)
    with pytest.raises(tf.errors.InvalidArgumentError):
        next(its[owner])


# ----------------------------------------------------------------------------------------------------------------
# the registry: a dataset is one entry in common.workload.datasets
# ----------------------------------------------------------------------------------------------------------------
def test_a_dataset_registered_in_datasets_alone_is_a_valid_job_dataset():
    x, y = unique_images(30, (4, 4, 1), seed=2), (np.arange(30) % 3).astype(np.int32)
    datasets.register(datasets.DatasetSpec("toy_arrays", "30 fixed 4x4 images (test only)",
                                           info=lambda job: (30, (4, 4, 1), 3), load=lambda job: (x, y),
                                           needs_data_dir=False))
    try:
        job = Job(dataset="toy_arrays", seed=3)  # job validation knows it: nothing else was edited
        assert Job(dataset="toy_arrays", seed=3, image_shape=(8, 8, 1)).job_hash == job.job_hash  # not read
        assert data.dataset_info(job) == (30, (4, 4, 1), 3)
        raw, labels = data.load_arrays(job, scaled=False)
        assert raw is x and labels is y
        got = global_batches(job, G, 2, 1, 3)
        for (gx, gy), (rx, ry) in zip(got, reference_batches(job, G, 3), strict=True):
            np.testing.assert_array_equal(gx, rx)
            np.testing.assert_array_equal(gy, ry)
        with pytest.raises(ValueError, match="already registered"):
            datasets.register(datasets.DatasetSpec("toy_arrays", "again", info=lambda job: (1, (1, 1, 1), 2),
                                                   load=lambda job: (x, y)))
    finally:
        del datasets.DATASETS["toy_arrays"]
    with pytest.raises(JobError, match="unknown dataset 'toy_arrays'"):
        Job(dataset="toy_arrays")
    with pytest.raises(ValueError, match="exactly one of load= and files="):
        datasets.register(datasets.DatasetSpec("toy_none", "neither", info=lambda job: (1, (1, 1, 1), 2)))
    assert "toy_none" not in datasets.DATASETS


@pytest.mark.parametrize("name", [name for name, spec in datasets.DATASETS.items() if spec.load is None])
def test_load_arrays_refuses_datasets_decoded_in_the_pipeline(name, tmp_path):
    with pytest.raises(DataError, match="decoded in the tf.data pipeline"):
        data.load_arrays(Job(dataset=name, data_dir=str(tmp_path)))
