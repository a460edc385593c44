"""Writes the example's TFRecords: ``python examples/streampkg/records.py DIR [--shards 4] [--per-shard 128]``:
``train-*`` shards and two ``valid-*`` shards of 64 examples (another seed).

Schema (``tf.train.Example``): ``tokens``, a variable-length list of int64 in [1, VOCAB) (0 is padding);
``value``, one float; ``label``, an int64 class in [0, CLASSES) that depends on both, so there is something to learn.
Deterministic from ``seed``: the same files on every machine.
"""

from __future__ import annotations

import argparse
from pathlib import Path

VOCAB = 64
CLASSES = 4


def write(directory: str | Path, shards: int = 4, per_shard: int = 128, seed: int = 0,
          prefix: str = "train") -> list[str]:
    """Write ``shards`` files ``PREFIX-NNNNN-of-NNNNN.tfrecord`` of ``per_shard`` examples into ``directory``."""
    import numpy as np
    import tensorflow as tf

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for s in range(shards):
        path = out / f"{prefix}-{s:05d}-of-{shards:05d}.tfrecord"
        with tf.io.TFRecordWriter(str(path)) as w:
            for _ in range(per_shard):
                tokens = rng.integers(1, VOCAB, size=int(rng.integers(2, 12)))
                value = float(rng.normal())
                label = (int(tokens.mean() * CLASSES // VOCAB) + (value > 0)) % CLASSES
                ex = tf.train.Example(features=tf.train.Features(feature={
                    "tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=tokens.tolist())),
                    "value": tf.train.Feature(float_list=tf.train.FloatList(value=[value])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                }))
                w.write(ex.SerializeToString())
        paths.append(str(path))
    return paths


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("directory")
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--per-shard", type=int, default=128)
    a = p.parse_args()
    print("\n".join(write(a.directory, a.shards, a.per_shard) + write(a.directory, 2, 64, seed=1, prefix="valid")))
