"""The input function: this worker's TFRecord files, parsed, shuffled and batched, never held in memory.

``train(input_context, global_batch_size, data_dir)`` is the tf.distribute contract: shard by
``input_context.input_pipeline_id`` (here by file: worker i reads every num_input_pipelines-th file), batch with
``input_context.get_per_replica_batch_size(global_batch_size)``. Deterministic (a seeded shuffle, files in order,
``deterministic=True`` maps), so both backends feed each worker the same batches.
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


def _read(tf: Any, files: list[str], batch: int, shuffle: int, drop: bool) -> Any:
    ds = tf.data.TFRecordDataset(files)  # one file after the other: a fixed order
    ds = ds.map(lambda r: parse(tf, r), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if shuffle:
        ds = ds.shuffle(shuffle, seed=7)
    ds = ds.padded_batch(batch, padded_shapes=({"tokens": [None], "value": [1]}, []), drop_remainder=drop)
    return ds.prefetch(tf.data.AUTOTUNE)


def train(input_context: Any, global_batch_size: int, data_dir: str, shuffle_buffer: int = 256) -> dict[str, Any]:
    import tensorflow as tf

    mine = _mine(input_context, data_dir, "train")
    batch = input_context.get_per_replica_batch_size(global_batch_size)
    return {"train": _read(tf, mine, batch, shuffle_buffer, drop=True),
            # this worker's share of the validation files: twinbench sums every worker's numbers
            "validation": _read(tf, _mine(input_context, data_dir, "valid"), 64, 0, drop=False),
            "files": mine}
