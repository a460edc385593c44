"""The input functions: this worker's TFRecord files, parsed, shuffled and batched, never held in memory.

``train(input_context, global_batch_size, data_dir)`` is the tf.distribute contract: shard by
``input_context.input_pipeline_id`` (here by file: worker i reads every num_input_pipelines-th file), batch with
``input_context.get_per_replica_batch_size(global_batch_size)``. Deterministic (a seeded shuffle, files in order,
``deterministic=True`` maps), so both backends feed each worker the same batches. ``heads`` reads the same records
with two targets, ``{"label": class, "length": tokens / MAX_TOKENS}``, for the two-output model (``model.heads``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def parse(tf: Any, record: Any) -> tuple[dict[str, Any], Any]:
    spec = {"tokens": tf.io.VarLenFeature(tf.int64), "value": tf.io.FixedLenFeature([1], tf.float32),
            "label": tf.io.FixedLenFeature([], tf.int64)}
    ex = tf.io.parse_single_example(record, spec)
    tokens = tf.cast(tf.sparse.to_dense(ex["tokens"]), tf.int32)
    return {"tokens": tokens, "value": ex["value"]}, tf.cast(ex["label"], tf.int32)


def _mine(input_context: Any, data_dir: str, prefix: str) -> list[str]:
    files = sorted(str(p) for p in Path(data_dir).glob(f"{prefix}-*.tfrecord"))
    if not files:
        raise FileNotFoundError(f"no {prefix}-*.tfrecord in {data_dir} (write them: python "
                                f"examples/streampkg/records.py {data_dir})")
    return files[input_context.input_pipeline_id::input_context.num_input_pipelines]


MAX_TOKENS = 12  # records.py writes 2..11 tokens per example


def two_targets(features: dict[str, Any], label: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The class and a float target read from the same record (the share of the longest token list)."""
    import tensorflow as tf

    length = tf.cast(tf.shape(features["tokens"])[0], tf.float32) / MAX_TOKENS
    return features, {"label": label, "length": tf.reshape(length, [1])}


def _read(tf: Any, files: list[str], batch: int, shuffle: int, drop: bool, both: bool = False) -> Any:
    ds = tf.data.TFRecordDataset(files)  # one file after the other: a fixed order
    ds = ds.map(lambda r: parse(tf, r), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if both:
        ds = ds.map(two_targets, deterministic=True)
    if shuffle:
        ds = ds.shuffle(shuffle, seed=7)
    labels = {"label": [], "length": [1]} if both else []
    ds = ds.padded_batch(batch, padded_shapes=({"tokens": [None], "value": [1]}, labels), drop_remainder=drop)
    return ds.prefetch(tf.data.AUTOTUNE)


def train(input_context: Any, global_batch_size: int, data_dir: str, shuffle_buffer: int = 256) -> dict[str, Any]:
    import tensorflow as tf

    mine = _mine(input_context, data_dir, "train")
    batch = input_context.get_per_replica_batch_size(global_batch_size)
    return {"train": _read(tf, mine, batch, shuffle_buffer, drop=True),
            # this worker's share of the validation files: twinbench sums every worker's numbers
            "validation": _read(tf, _mine(input_context, data_dir, "valid"), 64, 0, drop=False),
            "files": mine}


def heads(input_context: Any, global_batch_size: int, data_dir: str, shuffle_buffer: int = 256) -> dict[str, Any]:
    """``train``'s data with two targets: labels ``{"label": class, "length": [share of the longest]}``."""
    import tensorflow as tf

    mine = _mine(input_context, data_dir, "train")
    batch = input_context.get_per_replica_batch_size(global_batch_size)
    return {"train": _read(tf, mine, batch, shuffle_buffer, drop=True, both=True),
            "validation": _read(tf, _mine(input_context, data_dir, "valid"), 64, 0, drop=False, both=True),
            "files": mine}
