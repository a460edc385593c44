"""common.workload.data: the sharding rule both backends rely on for parity (formats: tests/test_datasets.py)."""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # legacy Keras 2 before TensorFlow loads


import numpy as np
import pytest
import tensorflow as tf

from common.workload import data
from common.workload.data import DataError
from common.workload.job import Job

# Small synthetic set for the sharding tests: 100 samples do not fill the last global batch of 12 (8 steps of 12
# per epoch, 4 samples dropped), so the drop rule is exercised too.
N, G = 100, 12


def synthetic_job(**kw) -> Job:
    return Job(**{"dataset": "synthetic", "synthetic_samples": N, "image_shape": (4, 4, 1), "seed": 7, **kw})


# ----------------------------------------------------------------------------------------------------------------
# helpers for the pipeline
# ----------------------------------------------------------------------------------------------------------------
def pipelines(job: Job, global_batch: int, num_pipelines: int, replicas_per_pipeline: int = 1) -> list:
    tf.keras.utils.set_random_seed(job.seed)  # what every backend does before building its input
    return [iter(data.make_train_dataset(job, global_batch, p, num_pipelines, replicas_per_pipeline))
            for p in range(num_pipelines)]


def global_batches(job: Job, global_batch: int, num_pipelines: int, replicas_per_pipeline: int,
                   steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per step, the concatenation of every replica's batch in global replica order."""
    its = pipelines(job, global_batch, num_pipelines, replicas_per_pipeline)
    out = []
    for _ in range(steps):
        parts = [next(it) for it in its for _ in range(replicas_per_pipeline)]  # pipeline-major = slot order
        out.append((np.concatenate([p[0].numpy() for p in parts]), np.concatenate([p[1].numpy() for p in parts])))
    return out


def reference_batches(job: Job, global_batch: int, steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The definition: shuffle the whole training set with the job seed, batch(G, drop_remainder=True), repeat."""
    tf.keras.utils.set_random_seed(job.seed)
    x, y = data.load_arrays(job)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(y), seed=job.seed, reshuffle_each_iteration=True)
    ds = ds.batch(global_batch, drop_remainder=True).repeat()
    return [(a.numpy(), b.numpy()) for a, b in ds.take(steps)]


def unique_images(n: int, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, *shape), dtype=np.uint8)


def row_keys(images: np.ndarray) -> list[bytes]:
    return [row.tobytes() for row in images]


# ----------------------------------------------------------------------------------------------------------------
# sharding rule
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("num_pipelines,replicas_per_pipeline", [(1, 1), (2, 1), (3, 1), (2, 2), (1, 4)])
def test_union_of_shards_is_the_reference_global_batch(num_pipelines, replicas_per_pipeline):
    job = synthetic_job()
    steps = 2 * (N // G) + 3  # into the third epoch: covers repeat and reshuffle
    got = global_batches(job, G, num_pipelines, replicas_per_pipeline, steps)
    ref = reference_batches(job, G, steps)
    for k, ((x, y), (rx, ry)) in enumerate(zip(got, ref, strict=True)):
        np.testing.assert_array_equal(x, rx, err_msg=f"images of global batch {k}")
        np.testing.assert_array_equal(y, ry, err_msg=f"labels of global batch {k}")


def test_per_replica_batch_shapes_and_options():
    job = synthetic_job()
    tf.keras.utils.set_random_seed(job.seed)
    ds = data.make_train_dataset(job, G, 1, 2, 3)
    images, labels = ds.element_spec
    assert images.shape.as_list() == [2, 4, 4, 1] and images.dtype == tf.float32  # 12 // (2 x 3)
    assert labels.shape.as_list() == [2] and labels.dtype == tf.int32
    assert ds.cardinality().numpy() == tf.data.INFINITE_CARDINALITY
    opts = ds.options()
    assert opts.deterministic is True
    assert opts.experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.OFF


def test_no_sample_seen_twice_within_an_epoch():
    job = synthetic_job()
    x, _ = data.load_arrays(job)
    assert len(set(row_keys(x))) == N  # synthetic samples are all distinct, so bytes identify a sample
    spe = N // G
    epochs = global_batches(job, G, 2, 2, 2 * spe)
    for e in range(2):
        keys = [k for gx, _ in epochs[e * spe:(e + 1) * spe] for k in row_keys(gx)]
        assert len(keys) == spe * G and len(set(keys)) == spe * G


def test_one_pipeline_of_2b_equals_two_pipelines_of_b():
    job = synthetic_job()
    one = global_batches(job, G, 1, 1, 10)  # b = 12
    two = global_batches(job, G, 2, 1, 10)  # b = 6
    for (x1, y1), (x2, y2) in zip(one, two, strict=True):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)


def test_replicas_per_pipeline_order():
    # pipeline 0 of 1 with 2 replicas yields slot 0, slot 1, slot 0, slot 1...: exactly pipelines 0 and 1 of 2
    job = synthetic_job()
    (two_reps,) = pipelines(job, G, 1, 2)
    single = pipelines(job, G, 2, 1)
    for step in range(9):
        for slot in range(2):
            a, la = next(two_reps)
            b, lb = next(single[slot])
            assert a.shape == (6, 4, 4, 1)
            np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=f"step {step} slot {slot}")
            np.testing.assert_array_equal(la.numpy(), lb.numpy())


def test_every_epoch_is_a_new_order_of_the_same_samples():
    job = synthetic_job(synthetic_samples=96)  # 8 full global batches: every sample in every epoch
    spe = 96 // G
    batches = global_batches(job, G, 2, 1, 3 * spe)
    orders = [np.concatenate([gx for gx, _ in batches[e * spe:(e + 1) * spe]]) for e in range(3)]
    assert sorted(row_keys(orders[0])) == sorted(row_keys(orders[1])) == sorted(row_keys(orders[2]))
    assert not np.array_equal(orders[0], orders[1])
    assert not np.array_equal(orders[1], orders[2])


def test_seed_changes_the_order(tmp_path):
    # on-disk data: the samples do not depend on the seed, only their order does
    x = unique_images(24, (28, 28))
    np.savez(tmp_path / "mnist.npz", x_train=x, y_train=np.arange(24) % 10)
    a, b = (global_batches(Job(dataset="mnist", data_dir=str(tmp_path), seed=s), 8, 1, 1, 3) for s in (1, 2))
    first_epoch = [np.concatenate([gx for gx, _ in run]) for run in (a, b)]
    assert sorted(row_keys(first_epoch[0])) == sorted(row_keys(first_epoch[1]))
    assert not np.array_equal(first_epoch[0], first_epoch[1])


def test_invalid_geometry_and_too_little_data():
    job = synthetic_job()
    tf.keras.utils.set_random_seed(job.seed)
    with pytest.raises(DataError, match="not a positive multiple of the 4 replicas"):
        data.make_train_dataset(job, 10, 0, 2, 2)
    with pytest.raises(DataError, match="pipeline_index 2"):
        data.make_train_dataset(job, 12, 2, 2)
    with pytest.raises(DataError, match="fewer than one global batch of 128"):
        data.make_train_dataset(job, 128, 0, 1)


def test_requires_the_job_seed_as_global_seed():
    job = synthetic_job()
    tf.keras.utils.set_random_seed(job.seed + 1)
    with pytest.raises(RuntimeError, match="set_random_seed"):
        data.make_train_dataset(job, G, 0, 1)


def test_start_step_resumes_the_stream_exactly():
    """An interrupted run restarts the data at the step it stopped at (the rule resume relies on)."""
    job = Job(synthetic_samples=40, image_shape=(2, 2, 1), seed=7)
    tf.keras.utils.set_random_seed(job.seed)
    full = [y.numpy().tolist() for _, y in data.make_train_dataset(job, 8, 1, 2).take(13)]
    tf.keras.utils.set_random_seed(job.seed)
    resumed = [y.numpy().tolist() for _, y in data.make_train_dataset(job, 8, 1, 2, start_step=7).take(6)]
    assert resumed == full[7:13]  # crosses the epoch boundary at step 5 and 10


def test_user_arrays_are_gathered_by_numpy_to_what_tensors_give(monkeypatch):
    """A user's arrays feed the pipeline by numpy indexing (no tensor copy of the data, bench/input_memory.py
    --in-memory): batch for batch what tf.gather from tensors of them gives, with several replicas per pipeline; a
    pipeline traced in a graph (a parameter server's coordinator) gathers from tensors, which its workers get."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(N, 3, 2)).astype(np.float32), rng.integers(0, 5, size=N)
    job = synthetic_job()
    _, lo, hi = data.shard_geometry(G, 1, 2, 2)
    slots = data._Slots(G, 3, lo, hi, 2, 0)

    def batches() -> list[tuple[np.ndarray, np.ndarray]]:
        tf.keras.utils.set_random_seed(job.seed)
        return [(a.numpy(), b.numpy()) for a, b in data._array_stream(tf, job, slots, x, y, scale=False).take(20)]

    by_numpy = batches()
    monkeypatch.setattr(data, "_numpy_rows", lambda tf_, a, b: data._tensor_rows(tf_, a, b, False))
    by_tensors = batches()
    assert len(by_numpy) == 20 and by_numpy[0][0].shape == (3, 3, 2) and by_numpy[0][0].dtype == np.float32
    for (ax, ay), (bx, by) in zip(by_numpy, by_tensors, strict=True):
        assert np.array_equal(ax, bx) and np.array_equal(ay, by)
    called = []
    monkeypatch.setattr(data, "_numpy_rows", lambda *a: called.append(a))
    with tf.Graph().as_default():
        data._array_stream(tf, job, slots, x, y, scale=False)
    assert called == []
