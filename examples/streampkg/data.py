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


def train(input_context: Any, global_batch_size: int, data_dir: str, shuffle_buffer: int = 256) -> dict[str, Any]:
    import tensorflow as tf

    files = sorted(str(p) for p in Path(data_dir).glob("train-*.tfrecord"))
    if not files:
        raise FileNotFoundError(f"no train-*.tfrecord in {data_dir} (write them: python examples/streampkg/records.py "
                                f"{data_dir})")
    mine = files[input_context.input_pipeline_id::input_context.num_input_pipelines]
    batch = input_context.get_per_replica_batch_size(global_batch_size)
    ds = tf.data.TFRecordDataset(mine)  # one file after the other: a fixed order
    ds = ds.map(lambda r: parse(tf, r), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.shuffle(shuffle_buffer, seed=7)
    ds = ds.padded_batch(batch, padded_shapes=({"tokens": [None], "value": [1]}, []), drop_remainder=True)
    return {"train": ds.prefetch(tf.data.AUTOTUNE), "files": mine}
