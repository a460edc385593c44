"""Does an input function's memory stay flat as the data grows, and does twinbench keep its throughput?

``python -m bench.input_memory [--sizes-mb 20,100] [--record-kb 4] [--batch 64] [--dir DIR]``: for each size, writes
TFRecord shards of that many megabytes (records of one float32 vector of ``--record-kb`` KiB and an int label, made
here: nothing is downloaded), then reads one pass of them twice, in turn:

- twinbench: ``python -m backends.native`` on 1 worker, ``dataset`` an input function (written to a temporary
  package) streaming the shards, a one-layer model, custom loop; its record gives the peak RSS and images/s;
- a plain loop: the same tf.data pipeline, model and optimizer in a hand-written ``tf.function`` step, timed from
  after its first step to the last (peak RSS from ``getrusage``).

Prints one line per size: peak RSS of both (MiB) and throughput of both with their ratio. Flat memory means the
peak RSS does not grow with the size (an in-memory dataset would grow by the data itself); the target is
throughput within 5% of the plain loop. A benchmark, not a test: figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from common.cluster import machine

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable

PIPELINE = '''
from pathlib import Path


def read(input_context, global_batch_size, data_dir, features):
    import tensorflow as tf

    files = sorted(str(p) for p in Path(data_dir).glob("*.tfrecord"))
    mine = files[input_context.input_pipeline_id::input_context.num_input_pipelines]
    spec = {"x": tf.io.FixedLenFeature([features], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)}

    def parse(r):
        ex = tf.io.parse_single_example(r, spec)
        return ex["x"], tf.cast(ex["y"], tf.int32)

    ds = tf.data.TFRecordDataset(mine).map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    b = input_context.get_per_replica_batch_size(global_batch_size)
    return {"train": ds.batch(b, drop_remainder=True).prefetch(tf.data.AUTOTUNE), "files": mine}


def model(input_shape, num_classes):
    import tensorflow as tf

    inputs = tf.keras.Input(shape=input_shape)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes)(inputs))
'''

PLAIN = '''
import json, os, resource, sys, time
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import tensorflow as tf
sys.path.insert(0, sys.argv[1])
from benchpkg.fns import model, read

data_dir, features, batch, steps = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
tf.keras.utils.set_random_seed(1234)
ctx = tf.distribute.InputContext(1, 0, 1)
ds = read(ctx, batch, data_dir, features)["train"]
m = model((features,), 10)
opt = tf.keras.optimizers.legacy.SGD(0.01)
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
it = iter(ds)

@tf.function
def step():
    x, y = next(it)
    with tf.GradientTape() as tape:
        loss = loss_fn(y, m(x, training=True))
    opt.apply_gradients(zip(tape.gradient(loss, m.trainable_variables), m.trainable_variables))
    return loss

step().numpy()
t = time.perf_counter()
for _ in range(steps - 1):
    last = step()
last.numpy()
dt = time.perf_counter() - t
print(json.dumps({"images_per_sec": batch * (steps - 1) / dt,
                  "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
'''


def write_records(directory: Path, megabytes: int, features: int, shards: int = 8) -> int:
    """Shards of ``megabytes`` in total; returns the number of records."""
    import numpy as np
    import tensorflow as tf

    directory.mkdir(parents=True, exist_ok=True)
    per_record = features * 4 + 32
    n = megabytes * 2**20 // per_record
    rng = np.random.default_rng(0)
    row = rng.normal(size=features).astype(np.float32).tolist()  # one payload: writing stays fast
    for s in range(shards):
        with tf.io.TFRecordWriter(str(directory / f"part-{s:03d}.tfrecord")) as w:
            for i in range(s, n, shards):
                ex = tf.train.Example(features=tf.train.Features(feature={
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=row)),
                    "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 10])),
                }))
                w.write(ex.SerializeToString())
    return n


def twinbench_run(root: Path, data: Path, features: int, batch: int, steps: int) -> dict[str, float]:
    job = root / "job.toml"
    job.write_text(textwrap.dedent(f'''\
        pythonpath = ["."]
        model = "benchpkg.fns:model"
        dataset = "benchpkg.fns:read"
        dataset_args = {{ data_dir = "{data}", features = {features} }}
        num_classes = 10
        per_replica_batch_size = {batch}
        steps = {steps}
        mode = "ctl"
        '''))
    out = root / f"results-{data.name}"
    shutil.rmtree(out, ignore_errors=True)
    env = {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(REPO),
           "PATH": str(Path(PY).parent)}
    subprocess.run([PY, "-m", "backends.native", "--job", str(job), "--results", str(out), "--quiet"], cwd=REPO,
                   env=env, check=True, capture_output=True, text=True)
    rec = json.loads(next(out.glob("*.json")).read_text())
    peak = max(int((m or {}).get("peak_rss_bytes") or 0) for m in machine.section(rec["machine"], "memory"))
    return {"images_per_sec": rec["images_per_sec"], "peak_rss": peak}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes-mb", default="20,100")
    p.add_argument("--record-kb", type=int, default=4)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--dir", default=None, help="where to write the data (default: a temporary directory)")
    a = p.parse_args()
    features = a.record_kb * 256
    base = Path(a.dir or tempfile.mkdtemp(prefix="twinbench-input-memory-"))
    pkg = base / "benchpkg"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "fns.py").write_text(PIPELINE)
    print(f"{'data MiB':>8} {'records':>8} {'steps':>6} {'twinbench RSS MiB':>18} {'plain RSS MiB':>14} "
          f"{'twinbench img/s':>16} {'plain img/s':>12} {'ratio':>6}", flush=True)
    for mb in (int(s) for s in a.sizes_mb.split(",")):
        data = base / f"data-{mb}mb"
        n = write_records(data, mb, features)
        steps = n // a.batch
        t = twinbench_run(base, data, features, a.batch, steps)
        proc = subprocess.run([PY, "-c", PLAIN, str(base), str(data), str(features), str(a.batch), str(steps)],
                              check=True, capture_output=True, text=True, env={"TF_CPP_MIN_LOG_LEVEL": "2"})
        plain = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{mb:>8} {n:>8} {steps:>6} {t['peak_rss'] / 2**20:>18.0f} {plain['peak_rss'] / 2**20:>14.0f} "
              f"{t['images_per_sec']:>16.0f} {plain['images_per_sec']:>12.0f} "
              f"{t['images_per_sec'] / plain['images_per_sec']:>6.2f}", flush=True)
    print(f"data in {base}; peak RSS of this process {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MiB")


if __name__ == "__main__":
    main()
