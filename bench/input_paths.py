"""How MWMS is fed, without twinbench: one process, the job's model, three inputs (a figure, not a test).

``python -m bench.input_paths [--feeds distributed,per-worker,const] [--repeats 2] [--steps 60] [--set k=v ...]``
runs, interleaved, a plain MWMS custom loop (one worker, no TF_CONFIG) on MobileNetV2 64x64x3, batch 32 (the
``real`` preset of bench.overhead) fed by:
- ``distributed``: the job's pipeline through ``strategy.distribute_datasets_from_function`` (under MWMS always a
  MultiDeviceIterator: tensorflow/python/distribute/input_lib.py ``_should_use_multi_device_iterator``);
- ``per-worker``: the same pipeline's own iterator, its tensors passed straight to ``strategy.run`` (what twinbench
  now does for a one-replica worker);
- ``const``: one batch made once and reused (Horovod's synthetic benchmark).
Each run is a fresh process; it prints images/s and the process's user and system CPU seconds over the timed steps.
``--env NAME=VALUE`` (repeatable) adds a variable to every run, e.g. ``TF_CPU_ALLOCATOR_USE_BFC=true``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FEEDS = ("distributed", "per-worker", "const")
REAL = ("model=MobileNetV2", "image_shape=[64,64,3]", "per_replica_batch_size=32")


def one_run(feed: str, steps: int, warm: int, sets: list[str]) -> dict[str, Any]:
    """In this process: build, train ``steps`` steps fed by ``feed``, time the last ``steps - warm``."""
    import tensorflow as tf

    from common.training.train import build_optimizer
    from common.workload.data import make_train_dataset
    from common.workload.job import load_job
    from common.workload.models import build_model

    job = load_job(str(REPO / "jobs" / "smoke.toml"), sets)
    tf.config.threading.set_intra_op_parallelism_threads(os.cpu_count() or 1)  # twinbench's budget at 1 process
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    tf.keras.utils.set_random_seed(job.seed)
    gb = job.per_replica_batch_size
    loss_obj = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    with strategy.scope():
        model = build_model(job, tuple(job.image_shape), job.num_classes)
        opt = build_optimizer(job, job.learning_rate)

    def step_fn(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_obj(y, model(x, training=True)), global_batch_size=gb)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    if feed == "distributed":
        it = iter(strategy.distribute_datasets_from_function(
            lambda ctx: make_train_dataset(job, gb, ctx.input_pipeline_id, ctx.num_input_pipelines)))
    else:
        it = iter(make_train_dataset(job, gb, 0, 1))
    fixed = next(it) if feed == "const" else None

    @tf.function
    def step() -> Any:
        return strategy.run(step_fn, args=tuple(fixed if fixed is not None else next(it)))

    for _ in range(warm):
        out = step()
    float(strategy.experimental_local_results(out)[0])
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(steps - warm):
        out = step()
    float(strategy.experimental_local_results(out)[0])
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    return {"feed": feed, "images_per_sec": gb * (steps - warm) / wall, "user": r1.ru_utime - r0.ru_utime,
            "sys": r1.ru_stime - r0.ru_stime, "wall": wall}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--feeds", default=",".join(FEEDS), help=f"comma-separated, of {', '.join(FEEDS)}")
    p.add_argument("--repeats", type=int, default=2, help="interleaved rounds (default 2)")
    p.add_argument("--steps", type=int, default=60, help="steps per run, of which --warmup untimed (default 60)")
    p.add_argument("--warmup", type=int, default=10, help="untimed first steps (default 10)")
    p.add_argument("--set", action="append", default=[], dest="sets", help="job override key=value (after REAL)")
    p.add_argument("--env", action="append", default=[], help="NAME=VALUE for every run")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: run one feed in this process
    a = p.parse_args()
    sets = [*REAL, *a.sets]
    if a.one:
        print(json.dumps(one_run(a.one, a.steps, a.warmup, sets)), flush=True)
        return 0
    feeds = [f for f in a.feeds.split(",") if f]
    if any(f not in FEEDS for f in feeds) or a.repeats < 1 or not 0 < a.warmup < a.steps:
        print(f"bench.input_paths: feeds must be among {FEEDS}, --repeats >= 1, 0 < --warmup < --steps",
              file=sys.stderr)
        return 2
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO))
    env.pop("TF_CONFIG", None)
    env.update(kv.split("=", 1) for kv in a.env)
    got: dict[str, list[dict[str, Any]]] = {f: [] for f in feeds}
    for i in range(a.repeats):
        for f in feeds[i % len(feeds):] + feeds[:i % len(feeds)]:  # a different feed first each round
            cmd = [sys.executable, "-m", "bench.input_paths", "--one", f, "--steps", str(a.steps),
                   "--warmup", str(a.warmup), *(x for s in a.sets for x in ("--set", s))]
            out = subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True, text=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            got[f].append(r)
            print(f"round {i + 1} {f:11s} {r['images_per_sec']:7.1f} img/s  user {r['user']:5.1f} s  "
                  f"sys {r['sys']:5.1f} s  wall {r['wall']:5.1f} s", flush=True)
    for f, rs in got.items():
        ips = [r["images_per_sec"] for r in rs]
        extra = f" ({' '.join(a.env)})" if a.env else ""
        print(f"{f:11s} median {statistics.median(ips):7.1f} img/s ({min(ips):.1f}-{max(ips):.1f}), median sys "
              f"{statistics.median(r['sys'] for r in rs):.1f} s over {len(rs)} runs{extra}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
