"""The tfrecord dataset: ImageNet's TFRecord shards, counted without TensorFlow, read in the exact global order.

The shards are written here the way ImageNet's build scripts (tf_cnn_benchmarks, Model Garden) write them: files
train-NNNNN-of-NNNNN of tf.train.Example records with a JPEG in image/encoded, a 1-based int64 image/class/label
and the other keys of that format, through TensorFlow's own TFRecordWriter.
"""

import dataclasses
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # legacy Keras 2 before TensorFlow loads

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from common.core.errors import UsageError
from common.workload import data, tfrecord
from common.workload.data import DataError, DataUsageError
from common.workload.job import Job, JobError, load_job
from tests.conftest import REPO, backend_cmd, base_env, first_divergence, only_result, run

SHAPE = (8, 8, 3)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Each test indexes into its own cache directory, and no index survives in memory between tests."""
    monkeypatch.setenv("TWINBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(tfrecord, "_MEMO", {})


# ----------------------------------------------------------------------------------------------------------------
# writers of the real format
# ----------------------------------------------------------------------------------------------------------------
def _bytes(*v: bytes) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=list(v)))


def _ints(*v: int) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=list(v)))


def _floats(*v: float) -> tf.train.Feature:
    return tf.train.Feature(float_list=tf.train.FloatList(value=list(v)))


def imagenet_example(img: np.ndarray, label: int, name: str) -> bytes:
    """One record as build_imagenet_data.py writes it (its keys, a JPEG, the 1-based label)."""
    h, w, _ = img.shape
    feature = {
        "image/height": _ints(h), "image/width": _ints(w), "image/colorspace": _bytes(b"RGB"),
        "image/channels": _ints(3), "image/class/label": _ints(label),
        "image/class/synset": _bytes(f"n{label:08d}".encode()), "image/class/text": _bytes(f"class {label}".encode()),
        "image/object/bbox/xmin": _floats(0.1), "image/object/bbox/xmax": _floats(0.9),
        "image/object/bbox/ymin": _floats(0.2), "image/object/bbox/ymax": _floats(0.8),
        "image/object/bbox/label": _ints(label), "image/format": _bytes(b"JPEG"),
        "image/filename": _bytes(f"{name}.JPEG".encode()), "image/encoded": _bytes(tf.io.encode_jpeg(img).numpy()),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_shards(d: Path, counts: list[int], labels: list[int] | None = None, shape: tuple[int, ...] = SHAPE,
                 seed: int = 0) -> list[int]:
    """train-i-of-N shards holding counts[i] records; labels default to 1..n (unique: a label names its record)."""
    d.mkdir(parents=True, exist_ok=True)
    n = sum(counts)
    labels = list(range(1, n + 1)) if labels is None else labels
    images = np.random.default_rng(seed).integers(0, 256, size=(n, *shape), dtype=np.uint8)
    k = 0
    for s, count in enumerate(counts):
        with tf.io.TFRecordWriter(str(d / f"train-{s:05d}-of-{len(counts):05d}")) as w:
            for _ in range(count):
                w.write(imagenet_example(images[k], labels[k], f"img_{k}"))
                k += 1
    return labels


def tfrecord_job(d: Path, n_classes: int, **kw) -> Job:
    return Job(dataset="tfrecord", data_dir=str(d), image_shape=SHAPE, num_classes=n_classes, seed=5, **kw)


def global_batches(job: Job, global_batch: int, num_pipelines: int, replicas_per_pipeline: int, steps: int,
                   start_step: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per step, every replica's batch concatenated in global replica order (what the parity rule promises)."""
    tf.keras.utils.set_random_seed(job.seed)
    its = [iter(data.make_train_dataset(job, global_batch, p, num_pipelines, replicas_per_pipeline, start_step))
           for p in range(num_pipelines)]
    out = []
    for _ in range(steps):
        parts = [next(it) for it in its for _ in range(replicas_per_pipeline)]
        out.append((np.concatenate([x.numpy() for x, _ in parts]), np.concatenate([y.numpy() for _, y in parts])))
    return out


# ----------------------------------------------------------------------------------------------------------------
# counting, naming and framing: no TensorFlow involved
# ----------------------------------------------------------------------------------------------------------------
def test_counts_records_from_the_framing_and_caches_the_index(tmp_path, monkeypatch):
    write_shards(tmp_path, [5, 0, 7])  # an empty shard is a valid TFRecord file
    (tmp_path / "validation-00000-of-00001").write_bytes(b"")  # ImageNet's directory holds these too: ignored
    job = tfrecord_job(tmp_path, 12)
    assert data.dataset_info(job) == (12, SHAPE, 12)
    index = tfrecord.record_index(tmp_path)
    assert index.counts.tolist() == [5, 0, 7] and index.shard_ids().tolist() == [0] * 5 + [2] * 7
    # every offset points at the record TensorFlow reads at that position: [length, crc, data, crc]
    for path, offsets in zip(index.paths, np.split(index.offsets, np.cumsum(index.counts)[:-1]), strict=True):
        blob = Path(path).read_bytes()
        by_offset = [blob[o + 12:o + 12 + int.from_bytes(blob[o:o + 8], "little")] for o in offsets]
        assert by_offset == [r.numpy() for r in tf.data.TFRecordDataset(path)]
    # the cache answers the next process: no shard is walked again, until one changes
    assert tfrecord.cache_path(tmp_path).is_file()
    walked = []
    real_walk = tfrecord.walk
    monkeypatch.setattr(tfrecord, "walk", lambda p: walked.append(p.name) or real_walk(p))
    monkeypatch.setattr(tfrecord, "_MEMO", {})
    assert tfrecord.record_index(tmp_path).counts.tolist() == [5, 0, 7] and walked == []
    write_shards(tmp_path / "new", [3])
    os.replace(tmp_path / "new" / "train-00000-of-00001", tmp_path / "train-00001-of-00003")
    assert data.dataset_info(job)[0] == 15
    assert walked == ["train-00001-of-00003"]


def test_counting_does_not_import_tensorflow(tmp_path):
    write_shards(tmp_path, [3, 4])
    code = ("import sys; from common.workload import data; from common.workload.job import Job; "
            f"print(data.dataset_info(Job(dataset='tfrecord', data_dir=sys.argv[1], image_shape={SHAPE}))[0]); "
            "assert 'tensorflow' not in sys.modules")
    env = {**base_env(), "TWINBENCH_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "7"


def test_index_command_line(tmp_path, capsys):
    write_shards(tmp_path / "shards", [2, 3])
    assert tfrecord.main([str(tmp_path / "shards")]) == 0
    assert capsys.readouterr().out.startswith("5 records in 2 shards")
    assert tfrecord.main([str(tmp_path)]) == 2  # no shards there: one line, status 2
    assert "tfrecord: error: no training shards" in capsys.readouterr().err


@pytest.mark.parametrize("names, fragment", [
    ([], "no training shards train-NNNNN-of-NNNNN"),
    (["train-0-of-2"], "does not follow ImageNet's shard naming"),
    (["train-00000-of-00001.tfrecord"], "does not follow ImageNet's shard naming"),
    (["train-00000-of-00003", "train-00002-of-00003"], "1 of 3 shards missing in .*, first train-00001-of-00003"),
    (["train-00000-of-00002", "train-00001-of-00003"], "disagree on their count"),
    (["train-00000-of-00001", "train-00001-of-00001"], "numbered beyond its own count of 1 shards"),
])
def test_shard_naming_errors_are_one_line(tmp_path, names, fragment):
    for name in names:
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(DataError, match=f"^tfrecord: .*{fragment}") as e:
        data.dataset_info(tfrecord_job(tmp_path, 10))
    assert "\n" not in str(e.value)


def test_missing_data_dir_tells_to_set_it(tmp_path):
    with pytest.raises(DataError, match="is not a directory: set data_dir"):
        data.dataset_info(tfrecord_job(tmp_path / "nowhere", 10))


@pytest.mark.parametrize("damage, fragment", [
    (lambda b: b[:-30], r"record at byte \d+ claims \d+ bytes, past the end of the file"),
    (lambda b: b + b"\x00" * 5, r"truncated record header at byte \d+"),
    (lambda b: b[:8] + bytes([b[8] ^ 1]) + b[9:], r"corrupt record framing at byte 0 \(length checksum mismatch\)"),
])
def test_corrupt_framing_is_a_data_error_naming_the_byte(tmp_path, damage, fragment):
    write_shards(tmp_path, [2, 3])
    shard = tmp_path / "train-00001-of-00002"
    shard.write_bytes(damage(shard.read_bytes()))
    with pytest.raises(DataError, match=f"tfrecord: {shard}: {fragment}") as e:
        data.dataset_info(tfrecord_job(tmp_path, 5))
    assert "\n" not in str(e.value)


def test_compressed_shards_are_refused(tmp_path):
    with tf.io.TFRecordWriter(str(tmp_path / "train-00000-of-00001"), options="GZIP") as w:
        w.write(imagenet_example(np.zeros(SHAPE, np.uint8), 1, "x"))
    with pytest.raises(DataError, match="not an uncompressed TFRecord file"):
        data.dataset_info(tfrecord_job(tmp_path, 2))


def test_job_keys_are_validated_and_hashed_only_for_tfrecord():
    base = Job(dataset="tfrecord", data_dir="d")
    assert Job(dataset="tfrecord", data_dir="d", tfrecord_sharding="files").job_hash != base.job_hash
    assert Job(dataset="tfrecord", data_dir="d", tfrecord_label_offset=0).job_hash != base.job_hash
    for other in (Job(), Job(dataset="cifar10", data_dir="d", model="resnet56")):
        for kw in ({"tfrecord_sharding": "files"}, {"tfrecord_label_offset": 0}):
            assert dataclasses.replace(other, **kw).job_hash == other.job_hash, kw
    with pytest.raises(JobError, match="unknown tfrecord_sharding 'random': use exact or files"):
        Job(tfrecord_sharding="random")
    with pytest.raises(JobError, match="tfrecord_label_offset must be >= 0"):
        Job(tfrecord_label_offset=-1)
    with pytest.raises(DataError, match="channels must be 1 or 3"):
        data.dataset_info(Job(dataset="tfrecord", data_dir="d", image_shape=(8, 8, 4)))


def test_shipped_imagenet_job(tmp_path):
    job = load_job(REPO / "jobs" / "resnet50_imagenet.toml")
    assert (job.model, job.dataset, job.image_shape, job.num_classes) == ("ResNet50", "tfrecord", (224, 224, 3), 1000)
    assert (job.tfrecord_label_offset, job.tfrecord_sharding, job.optimizer) == (1, "exact", "momentum")
    assert job.lr_scaling == "linear" and job.warmup_epochs > 0
    with pytest.raises(DataError, match="set data_dir"):  # its placeholder directory does not exist
        data.dataset_info(job)
    with pytest.raises(JobError, match="dataset 'tfrecord' needs data_dir"):
        load_job(REPO / "jobs" / "resnet50_imagenet.toml", ["data_dir="])


# ----------------------------------------------------------------------------------------------------------------
# exact mode: the parity rule of common.workload.data over records read by offset
# ----------------------------------------------------------------------------------------------------------------
def test_exact_mode_is_the_global_shuffle_of_the_record_stream(tmp_path):
    labels = write_shards(tmp_path, [9, 7, 10])  # 26 records: 3 global batches of 8 per epoch, 2 dropped
    job = tfrecord_job(tmp_path, 26)
    steps = 8  # into the third epoch: repeat and reshuffle
    one = global_batches(job, 8, 1, 1, steps)  # 1 pipeline x 8
    # the definition: shuffle(n, seed) of the records in file order, batch(G, drop_remainder=True), repeat
    tf.keras.utils.set_random_seed(job.seed)
    records = list(tf.data.TFRecordDataset(tfrecord.record_index(tmp_path).paths))
    decode = tfrecord.decoder(tf, SHAPE, 26, 1)
    order = tf.data.Dataset.range(26).shuffle(26, seed=job.seed, reshuffle_each_iteration=True)
    order = order.batch(8, drop_remainder=True).repeat()
    for (x, y), idx in zip(one, order.take(steps), strict=True):
        ref = [decode(records[i]) for i in idx.numpy()]
        np.testing.assert_array_equal(x, np.stack([r[0].numpy() for r in ref]))
        np.testing.assert_array_equal(y, [labels[i] - 1 for i in idx.numpy()])
    for pipelines, reps in [(2, 1), (2, 2)]:  # 2 x b = 1 x 2b; 2 workers x 2 local replicas
        for k, ((x, y), (x1, y1)) in enumerate(zip(global_batches(job, 8, pipelines, reps, steps), one,
                                                   strict=True)):
            np.testing.assert_array_equal(x, x1, err_msg=f"images of global batch {k}, {pipelines}x{reps}")
            np.testing.assert_array_equal(y, y1, err_msg=f"labels of global batch {k}, {pipelines}x{reps}")


def test_exact_mode_resumes_and_reads_only_its_own_records(tmp_path):
    write_shards(tmp_path, [6, 6])
    job = tfrecord_job(tmp_path, 12)
    full = global_batches(job, 4, 2, 1, 7)
    resumed = global_batches(job, 4, 2, 1, 3, start_step=4)
    assert [y.tolist() for _, y in resumed] == [y.tolist() for _, y in full[4:7]]  # crosses the epoch boundary
    # corrupt one record's JPEG (same length, so the framing stays valid): only its owner fails on batch 0
    tf.keras.utils.set_random_seed(job.seed)
    first = next(iter(tf.data.Dataset.range(12).shuffle(12, seed=job.seed).batch(4))).numpy().tolist()
    index = tfrecord.record_index(tmp_path)
    victim = first[0]  # pipeline 0's first sample
    shard = Path(index.paths[index.shard_ids()[victim]])
    blob = bytearray(shard.read_bytes())
    at = blob.index(b"\xff\xd8\xff", int(index.offsets[victim]))  # the JPEG's start-of-image marker
    blob[at:at + 3] = b"BAD"
    shard.write_bytes(bytes(blob))
    tf.keras.utils.set_random_seed(job.seed)
    ok = data.make_train_dataset(job, 4, 1, 2)
    assert next(iter(ok))[0].shape == (2, *SHAPE)
    with pytest.raises(tf.errors.DataLossError, match="corrupted record"):  # the reader checks the data's CRC
        next(iter(data.make_train_dataset(job, 4, 0, 2)))


def test_label_offset(tmp_path):
    write_shards(tmp_path, [4], labels=[0, 1, 2, 3])  # 0-based shards
    tf.keras.utils.set_random_seed(5)
    _, y = next(iter(data.make_train_dataset(tfrecord_job(tmp_path, 4, tfrecord_label_offset=0), 4, 0, 1)))
    assert sorted(y.numpy().tolist()) == [0, 1, 2, 3]
    tf.keras.utils.set_random_seed(5)
    with pytest.raises(tf.errors.InvalidArgumentError, match="tfrecord_label_offset"):  # label 0 - 1 = -1
        next(iter(data.make_train_dataset(tfrecord_job(tmp_path, 4), 4, 0, 1)))


# ----------------------------------------------------------------------------------------------------------------
# files mode: each pipeline streams its own shards
# ----------------------------------------------------------------------------------------------------------------
def pipeline_labels(job: Job, pipeline: int, batches: int, start_step: int = 0) -> list[int]:
    tf.keras.utils.set_random_seed(job.seed)
    ds = data.make_train_dataset(job, 8, pipeline, 2, 1, start_step)
    return [int(v) for _, y in ds.take(batches) for v in y.numpy()]


def test_files_mode_reads_disjoint_shards_round_robin(tmp_path):
    labels = write_shards(tmp_path, [8, 4, 4, 8])  # pipeline 0: shards 0 and 2 (12); pipeline 1: 1 and 3 (12)
    job = tfrecord_job(tmp_path, 24, tfrecord_sharding="files")
    by_shard = np.split(np.asarray(labels) - 1, [8, 12, 16])
    seen = []
    for p in (0, 1):
        got = pipeline_labels(job, p, 6)  # two epochs of 3 batches of 4
        own = sorted(np.concatenate(by_shard[p::2]).tolist())
        assert sorted(got[:12]) == sorted(got[12:]) == own  # every own record once per epoch
        assert got[:12] != got[12:]  # reshuffled each epoch
        assert got == pipeline_labels(job, p, 6)  # deterministic
        assert pipeline_labels(job, p, 4, start_step=2) == got[8:]  # resume skips within the epoch it lands in
        seen.append(set(got))
    assert not seen[0] & seen[1]


def test_files_mode_needs_a_shard_and_a_step_per_pipeline(tmp_path):
    write_shards(tmp_path / "one", [16])
    job = tfrecord_job(tmp_path / "one", 16, tfrecord_sharding="files")
    data.check_sharding(dataclasses.replace(job, tfrecord_sharding="exact"), 8, 2)  # exact mode: any shard count
    with pytest.raises(DataUsageError, match="1 shards for 2 pipelines; use more shards") as e:
        data.check_sharding(job, 8, 2)  # callable before TensorFlow starts
    assert isinstance(e.value, UsageError)  # the runner ends the run with status 2
    tf.keras.utils.set_random_seed(job.seed)
    with pytest.raises(DataUsageError, match="1 shards for 2 pipelines"):
        data.make_train_dataset(job, 8, 1, 2)
    write_shards(tmp_path / "uneven", [16, 3], labels=list(range(1, 20)))
    with pytest.raises(DataUsageError, match="pipeline 1's shards hold 3 records, fewer than its 4 per step"):
        data.check_sharding(tfrecord_job(tmp_path / "uneven", 19, tfrecord_sharding="files"), 8, 2)


# ----------------------------------------------------------------------------------------------------------------
# a real run: both backends, 2 workers, exact mode
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.distributed
def test_real_runs_on_tfrecords_native_horovod_and_one_worker_agree(tmp_path):
    """Exact mode end to end: both backends at 2 workers x 8, and native at 1 worker x 16, give the same losses."""
    write_shards(tmp_path / "shards", [20, 20, 24], labels=[1 + k % 10 for k in range(64)], shape=(12, 12, 3))
    env = {**base_env(), "TWINBENCH_CACHE": str(tmp_path / "cache")}
    sets = ["--set", "dataset=tfrecord", "--set", f"data_dir={tmp_path / 'shards'}", "--set", "image_shape=12,12,3",
            "--set", "steps=8"]
    out = {}
    for kind, workers, per_replica in [("native", 2, 8), ("horovod", 2, 8), ("native", 1, 16)]:
        results = tmp_path / f"{kind}{workers}"
        run(backend_cmd(kind, results, *sets, "--set", f"per_replica_batch_size={per_replica}", workers=workers),
            env=env)
        out[kind, workers] = only_result(results)
    nat, hvd, one = out["native", 2], out["horovod", 2], out["native", 1]
    assert nat["job_hash"] == hvd["job_hash"] and nat["job"]["tfrecord_sharding"] == "exact"
    assert nat["job"]["dataset"] == "tfrecord" and nat["world_size"] == hvd["world_size"] == 2
    assert len(nat["step_losses"]) == 8 and len(set(nat["step_losses"])) > 1  # it trained on changing batches
    for other, what in [(hvd, "native vs horovod, 2 workers"), (one, "2 workers x 8 vs 1 worker x 16")]:
        msg = first_divergence(nat["step_losses"], other["step_losses"], 1e-5)
        assert msg is None, f"{what}: {msg}"
    assert nat["weights_consistent"] and hvd["weights_consistent"]


@pytest.mark.distributed
def test_files_mode_with_too_few_shards_exits_2(tmp_path):
    """One shard for two workers: a real run stops with one line and status 2 (the check runs in make_plan)."""
    write_shards(tmp_path / "one", [32], labels=[1 + k % 10 for k in range(32)], shape=(12, 12, 3))
    env = {**base_env(), "TWINBENCH_CACHE": str(tmp_path / "cache")}
    proc = run(backend_cmd("native", tmp_path / "res", "--set", "dataset=tfrecord", "--set",
                           f"data_dir={tmp_path / 'one'}", "--set", "image_shape=12,12,3", "--set",
                           "tfrecord_sharding=files", "--set", "per_replica_batch_size=4", "--set", "steps=2"),
               env=env, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "1 shards for 2 pipelines" in proc.stderr and "Traceback" not in proc.stderr
