"""Does an input function's memory stay flat as the data grows, and does twinbench keep its throughput? Is a
dataset function's in-memory data held once?

``python -m bench.input_memory [--sizes-mb 20,100] [--record-kb 4] [--batch 64] [--repeats 1] [--dir DIR]``: for
each size, writes TFRecord shards of that many megabytes in a schema of their own (a float32 vector of
``--record-kb`` KiB, a variable-length list of 1-11 int ids and an int label, made here: nothing is downloaded), then
reads one pass of them with each side, in an order rotated each repeat so the machine's drifts hit all sides alike:

- twinbench, each backend (``python -m backends.native`` / ``backends.horovod``) on 1 worker, ``dataset`` an input
  function (written to a temporary package) streaming the shards into a two-input model (the vector, and the ids
  padded to 8 through an embedding), custom loop; its record gives the peak RSS and images/s;
- a plain loop: the same tf.data pipeline, model and optimizer in a hand-written ``tf.function`` step, timed from
  after its first step to the last (peak RSS from ``getrusage``).

Prints one line per run, then per size and backend: peak RSS of both (MiB), median throughput of both and the median
ratio with its min-max over the repeats. Flat memory means the peak RSS does not grow with the size (an in-memory
dataset would grow by the data itself); the target is throughput within 5% of the plain loop (ratio >= 0.95). A
benchmark, not a test: figures depend on the machine and its load.

``python -m bench.input_memory --in-memory [--examples 60000] [--tiny 2048] [--sources arrays,tfdata]
[--backends native,horovod] [--modes fit,ctl] [--steps 20]``: the other question, for data held in memory. A dataset
function (written to a temporary package) returns an MNIST-shaped set, ``examples`` x 28 x 28 float32 and int64
labels, either as numpy arrays (``arrays``: a module that never imports TensorFlow) or as Horovod's example's
pipeline over them, ``from_tensor_slices((x, y)).repeat().shuffle(10000).batch(128)`` (``tfdata``), or the same
line over tensors TensorFlow made itself (``tensors``). Each (source, backend, mode) trains a flatten-dense model for
``steps`` steps on 1 worker, once on the big set and once on ``tiny`` examples; the line per configuration gives
both peak RSS (the record's), their difference, its ratio to the data's size (features and labels) and whether it
meets the target: at most 1.5x the data's size above the tiny run, or, when higher, what the function itself peaks
at in a plain process (``tfdata``: TensorFlow's conversion of the numpy arrays holds two copies of them at once,
in the user's own code), printed first per source.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from bench.overhead import bench_env, rotation
from common.cluster import machine
from common.core import registry

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable

PIPELINE = '''
from pathlib import Path

TOKENS = 8  # the variable-length feature is padded (or cut) to this many ids


def read(input_context, global_batch_size, data_dir, features):
    import tensorflow as tf

    files = sorted(str(p) for p in Path(data_dir).glob("*.tfrecord"))
    mine = files[input_context.input_pipeline_id::input_context.num_input_pipelines]
    spec = {"x": tf.io.FixedLenFeature([features], tf.float32), "tokens": tf.io.VarLenFeature(tf.int64),
            "y": tf.io.FixedLenFeature([], tf.int64)}

    def parse(r):
        ex = tf.io.parse_single_example(r, spec)
        tokens = tf.sparse.to_dense(ex["tokens"])[:TOKENS]
        tokens = tf.ensure_shape(tf.pad(tokens, [[0, TOKENS - tf.shape(tokens)[0]]]), [TOKENS])
        return {"x": ex["x"], "tokens": tf.cast(tokens, tf.int32)}, tf.cast(ex["y"], tf.int32)

    ds = tf.data.TFRecordDataset(mine).map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    b = input_context.get_per_replica_batch_size(global_batch_size)
    return {"train": ds.batch(b, drop_remainder=True).prefetch(tf.data.AUTOTUNE), "files": mine}


def model(input_shape, num_classes):
    import tensorflow as tf

    L = tf.keras.layers
    x = tf.keras.Input(shape=(input_shape["x"][-1],), name="x")
    tokens = tf.keras.Input(shape=(TOKENS,), dtype="int32", name="tokens")
    pooled = L.GlobalAveragePooling1D()(L.Embedding(100, 8)(tokens))
    return tf.keras.Model({"x": x, "tokens": tokens}, L.Dense(num_classes)(L.Concatenate()([x, pooled])))
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
m = model({"x": (features,), "tokens": (8,)}, 10)
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
    per_record = features * 4 + 64
    n = megabytes * 2**20 // per_record
    rng = np.random.default_rng(0)
    row = rng.normal(size=features).astype(np.float32).tolist()  # one payload: writing stays fast
    ids = rng.integers(0, 100, size=11).tolist()
    for s in range(shards):
        with tf.io.TFRecordWriter(str(directory / f"part-{s:03d}.tfrecord")) as w:
            for i in range(s, n, shards):
                ex = tf.train.Example(features=tf.train.Features(feature={
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=row)),
                    # a variable-length id list (1-11 ids): not ImageNet's schema, nor any fixed shape
                    "tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=ids[:1 + i % 11])),
                    "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 10])),
                }))
                w.write(ex.SerializeToString())
    return n


def twinbench_run(kind: str, root: Path, data: Path, features: int, batch: int, steps: int) -> dict[str, float]:
    """One pass on 1 worker of backend ``kind`` (a plain process, no launcher): its images/s and peak RSS."""
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
    out = root / f"results-{data.name}-{kind}"
    shutil.rmtree(out, ignore_errors=True)
    # bench.overhead's environment: a one-rank Horovod run without a launcher is an MPI singleton, which needs PATH
    cmd = registry.load(kind).local_command(1, ["--job", str(job), "--results", str(out), "--quiet"], python=PY)
    subprocess.run(cmd, cwd=REPO, env=bench_env(), check=True, capture_output=True, text=True)
    rec = json.loads(next(out.glob("*.json")).read_text())
    peak = max(int((m or {}).get("peak_rss_bytes") or 0) for m in machine.section(rec["machine"], "memory"))
    return {"images_per_sec": rec["images_per_sec"], "peak_rss": peak}


def plain_run(base: Path, data: Path, features: int, batch: int, steps: int) -> dict[str, float]:
    proc = subprocess.run([PY, "-c", PLAIN, str(base), str(data), str(features), str(batch), str(steps)],
                          check=True, capture_output=True, text=True, env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    return json.loads(proc.stdout.strip().splitlines()[-1])


def one_size(base: Path, mb: int, features: int, batch: int, repeats: int) -> None:
    """Writes ``mb`` MB of records, then ``repeats`` rounds of the sides in rotated order; prints the figures."""
    data = base / f"data-{mb}mb"
    n = write_records(data, mb, features)
    steps = n // batch
    sides = [*registry.names(), "plain"]
    got: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    for i in range(repeats):
        for side in rotation(sides, i):  # each side goes first in turn: the machine's drifts hit all alike
            r = plain_run(base, data, features, batch, steps) if side == "plain" else \
                twinbench_run(side, base, data, features, batch, steps)
            got[side].append(r)
            print(f"{mb} MB repeat {i + 1}/{repeats}: {side:<8} {r['images_per_sec']:9.0f} img/s, peak RSS "
                  f"{r['peak_rss'] / 2**20:.0f} MiB", flush=True)
    plain = got["plain"]
    for kind in registry.names():
        ratios = [t["images_per_sec"] / p["images_per_sec"] for t, p in zip(got[kind], plain)]
        print(f"{mb} MB ({n} records, {steps} steps): {kind} peak RSS {_peak(got[kind]):.0f} MiB (plain "
              f"{_peak(plain):.0f}); median img/s {_median(got[kind]):.0f} vs plain {_median(plain):.0f}; ratio "
              f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) over {repeats} repeats "
              "(target >= 0.95)", flush=True)


IN_MEMORY_TARGET = 1.5  # peak RSS above the tiny run, in units of the data's size
ARRAYS = """
import numpy as np


def mnist_like(n):
    \"\"\"n x 28 x 28 float32 in [0, 1) and int64 labels 0..9, made in place (no float64 temporary).\"\"\"
    rng = np.random.default_rng(0)
    return rng.random((n, 28, 28), dtype=np.float32), rng.integers(0, 10, size=n)
"""
TFDATA = """
import tensorflow as tf

from memorypkg.arrays import mnist_like


def pipeline(n):
    \"\"\"Horovod's tensorflow2_keras_mnist.py pipeline line, as written, over the numpy arrays.\"\"\"
    return tf.data.Dataset.from_tensor_slices(mnist_like(n)).repeat().shuffle(10000).batch(128)


def tensors(n):
    \"\"\"The same line over tensors TensorFlow made in place (no numpy array converted, no temporary).\"\"\"
    x = tf.fill((n, 28, 28), 0.5)
    y = tf.range(n, dtype=tf.int64) % 10
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().shuffle(10000).batch(128)


def model(input_shape, num_classes):
    inputs = tf.keras.Input(shape=input_shape)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes)(tf.keras.layers.Flatten()(inputs)))
"""
# the function alone, in a plain process with TensorFlow imported first (as in a run): its own peak RSS
ALONE = """
import json, os, sys
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import tensorflow as tf
sys.path.insert(0, sys.argv[1])
from importlib import import_module
module, name = sys.argv[2].split(":")
held = getattr(import_module(module), name)(int(sys.argv[3]))
with open("/proc/self/status") as f:
    peak = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
print(json.dumps({"peak_rss": peak}))
"""
SOURCES = {"arrays": "memorypkg.arrays:mnist_like", "tfdata": "memorypkg.tfd:pipeline",
           "tensors": "memorypkg.tfd:tensors"}


def in_memory_run(root: Path, kind: str, source: str, mode: str, n: int, steps: int) -> int:
    """Peak RSS (bytes) of one 1-worker run of backend ``kind`` on ``n`` examples from ``source``."""
    job = root / f"memory-{source}-{mode}-{n}.toml"
    job.write_text(textwrap.dedent(f"""\
        pythonpath = ["."]
        model = "memorypkg.tfd:model"
        dataset = "{SOURCES[source]}"
        dataset_args = {{ n = {n} }}
        num_classes = 10
        per_replica_batch_size = 64
        steps = {steps}
        mode = "{mode}"
        """))
    out = root / f"results-{job.stem}-{kind}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = registry.load(kind).local_command(1, ["--job", str(job), "--results", str(out), "--quiet"], python=PY)
    proc = subprocess.run(cmd, cwd=REPO, env=bench_env(), capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"bench.input_memory: {' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    rec = json.loads(next(out.glob("*.json")).read_text())
    return max(int((m or {}).get("peak_rss_bytes") or 0) for m in machine.section(rec["machine"], "memory"))


def alone_run(root: Path, source: str, n: int) -> int:
    """Peak RSS (bytes) of a plain process that calls the dataset function and holds what it returned."""
    proc = subprocess.run([PY, "-c", ALONE, str(root), SOURCES[source], str(n)], env=bench_env(),
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])["peak_rss"]


def in_memory(base: Path, a: argparse.Namespace) -> bool:
    """One line per source (the function alone) and per (source, backend, mode): peak RSS on the big and the tiny
    set, the difference and its ratio to the data's size; True when every configuration meets the target."""
    pkg = base / "memorypkg"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "arrays.py").write_text(ARRAYS)
    (pkg / "tfd.py").write_text(TFDATA)
    size = a.examples * (28 * 28 * 4 + 8)  # float32 features, int64 labels
    print(f"in-memory data: {a.examples} x 28 x 28 float32 + int64 labels = {size / 2**20:.0f} MiB; tiny set "
          f"{a.tiny} examples; {a.steps} steps at batch 64 on 1 worker; target: peak RSS above the tiny run <= "
          f"{IN_MEMORY_TARGET}x the data, or the function's own peak above its tiny call when that is higher (what "
          "the user's code costs anywhere)", flush=True)
    met = True
    for source in a.sources.split(","):
        alone = (alone_run(base, source, a.examples) - alone_run(base, source, a.tiny)) / size
        target = max(IN_MEMORY_TARGET, alone)
        print(f"{source:<7} the function alone: {alone:.2f}x the data above its tiny call", flush=True)
        for kind in a.backends.split(","):
            for mode in a.modes.split(","):
                big, tiny = (in_memory_run(base, kind, source, mode, n, a.steps) for n in (a.examples, a.tiny))
                above = big - tiny
                met &= above / size <= target
                print(f"{source:<7} {kind:<7} {mode:<3}: peak RSS {big / 2**20:6.0f} MiB, tiny {tiny / 2**20:5.0f} "
                      f"MiB, above {above / 2**20:5.0f} MiB = {above / size:.2f}x the data (target <= {target:.2f}x: "
                      f"{'met' if above / size <= target else 'MISSED'})", flush=True)
    return met


def _peak(runs: list[dict[str, float]]) -> float:
    return max(r["peak_rss"] for r in runs) / 2**20


def _median(runs: list[dict[str, float]]) -> float:
    return statistics.median(r["images_per_sec"] for r in runs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes-mb", default="20,100")
    p.add_argument("--record-kb", type=int, default=4)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=1, help="rounds of the three sides per size, rotated (default 1)")
    p.add_argument("--dir", default=None, help="where to write the data (default: a temporary directory)")
    p.add_argument("--in-memory", action="store_true", help="measure a dataset function's in-memory data instead")
    p.add_argument("--examples", type=int, default=60000, help="--in-memory: the big set (default: MNIST's size)")
    p.add_argument("--tiny", type=int, default=2048, help="--in-memory: the baseline set (default 2048)")
    p.add_argument("--sources", default="arrays,tfdata,tensors", help="--in-memory: of arrays, tfdata, tensors")
    p.add_argument("--backends", default=",".join(registry.names()), help="--in-memory: backends measured")
    p.add_argument("--modes", default="fit,ctl", help="--in-memory: fit, ctl or both")
    p.add_argument("--steps", type=int, default=20, help="--in-memory: steps per run (default 20)")
    a = p.parse_args()
    if a.in_memory:
        return _in_memory_main(a)
    try:
        sizes = [int(s) for s in a.sizes_mb.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1 or a.repeats < 1 or a.record_kb < 1 or a.batch < 1:
        print(f"bench.input_memory: need --sizes-mb of positive integers (got {a.sizes_mb!r}) and --repeats, "
              "--record-kb, --batch >= 1", file=sys.stderr)
        return 2
    features = a.record_kb * 256
    base = Path(a.dir or tempfile.mkdtemp(prefix="twinbench-input-memory-"))
    pkg = base / "benchpkg"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "fns.py").write_text(PIPELINE)
    for mb in sizes:
        one_size(base, mb, features, a.batch, a.repeats)
    print(f"data in {base}; peak RSS of this process {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MiB")
    return 0


def _in_memory_main(a: argparse.Namespace) -> int:
    bad = [f"--{k} {v!r}" for k, v, ok in (
        ("sources", a.sources, set(a.sources.split(",")) <= set(SOURCES)),
        ("backends", a.backends, set(a.backends.split(",")) <= set(registry.names())),
        ("modes", a.modes, set(a.modes.split(",")) <= {"fit", "ctl"}),
        ("examples/--tiny", f"{a.examples}/{a.tiny}", 128 <= a.tiny < a.examples), ("steps", a.steps, a.steps >= 1))
        if not ok]
    if bad:
        print(f"bench.input_memory: bad {', '.join(bad)}", file=sys.stderr)
        return 2
    base = Path(a.dir or tempfile.mkdtemp(prefix="twinbench-in-memory-"))
    met = in_memory(base, a)
    print("in-memory target met in every configuration" if met else
          "in-memory target MISSED in some configuration", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
