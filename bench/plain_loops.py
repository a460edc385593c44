"""Minimal hand-written data-parallel loops, the baseline twinbench's overhead is measured against.

``python -m bench.plain_loops native|horovod STEPS WARMUP [--feed const|tfdata] [--job FILE] [--set key=value ...]
[--cpu-bind cores]``: the job's model, optimizer, LR and per-replica batch (built with twinbench's own model/optimizer
factories, which are not overhead), bound and threaded as twinbench would (``configure_threads``), trained by a plain
MWMS custom loop (native: ``strategy.run`` on this worker's batch; TF_CONFIG for several workers, none for one) or a
plain Horovod DistributedGradientTape loop (horovodrun for several ranks; one rank needs no launcher: ``hvd.init()``
alone is a world of one). No host sync, no recording: what a user would write. A ``keras = 3`` job gets the same
loops with its Keras 3 model and optimizer; Horovod's then averages the tape's gradients in one
``hvd.grouped_allreduce`` and broadcasts the TensorFlow variables under Keras 3's, since Horovod's tape wrapper and
Keras module cannot take Keras 3 variables.

The floor must not share the costs of what it measures, so neither loop uses tf.distribute's distributed input
(``distribute_datasets_from_function`` / ``experimental_distribute_dataset``, a MultiDeviceIterator under MWMS, which
halved a CPU CNN's throughput: docs/findings.md). Each worker is fed the way the field's own benchmarks feed it:

- ``--feed const``: one batch, made once from the job's own pipeline (the first element of
  ``common.workload.data.make_train_dataset``, so the shapes and dtypes are the job's) and reused at every step, as
  Horovod's synthetic benchmark does (horovod/horovod examples/tensorflow2/tensorflow2_synthetic_benchmark.py: ``data =
  tf.random.uniform([args.batch_size, 224, 224, 3])`` built once, read by every ``benchmark_step``): no input cost;
- ``--feed tfdata`` (default): this worker's plain tf.data iterator (``iter(make_train_dataset(job, gb, rank,
  size))``, the exact sharding both backends use), ``next(it)`` inside the tf.function, its tensors passed as they
  are to ``strategy.run`` (native) or to the model (Horovod): twinbench's own input path, without twinbench.

Each rank prints one JSON line with its wall time over the timed steps. ``PLAIN_SYNC=1`` reads the loss after every
step, to show the price of a per-step sync (twinbench's ``sync_every_steps = 1``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from common.cluster.placement import CPU_BIND
from common.core import registry

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

FEEDS = ("const", "tfdata")


def make_batches(job: Any, gb: int, rank: int, size: int, feed: str) -> Callable[[], Any]:
    """A zero-argument function, called inside the step's tf.function, giving this worker's (images, labels)."""
    from common.workload.data import make_train_dataset

    ds = make_train_dataset(job, gb, rank, size)
    if feed == "const":
        # made once, captured by the step: every step reads the same tensors; the iterator (and its prefetching
        # threads) is dropped here
        xb, yb = next(iter(ds))
        return lambda: (xb, yb)
    it = iter(ds)
    return lambda: next(it)


def _horovod_loop(tf: Any, job: Any, batches: Callable[[], Any], lr: float) -> tuple[Any, Any]:
    """Horovod's documented custom loop: DistributedGradientTape, broadcast after the first step."""
    import horovod.tensorflow as hvd

    from common.training.train import build_optimizer
    from common.workload.models import build_model

    loss_obj = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    model = build_model(job, tuple(job.image_shape), job.num_classes)
    opt = build_optimizer(job, lr)

    keras3 = job.keras == 3

    @tf.function
    def step() -> Any:
        xb, yb = batches()
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_obj(yb, model(xb, training=True)))
        if keras3:  # Horovod's tape wrapper and Keras module cannot take Keras 3 variables (Horovod issue 4290)
            grads = tape.gradient(loss, model.trainable_variables)
            if hvd.size() > 1:
                grads = hvd.grouped_allreduce(grads, op=hvd.Average)
        else:
            grads = hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    step()
    if keras3:  # the TensorFlow variables under Keras 3's
        hvd.broadcast_variables([v.value for v in model.variables], 0)
        hvd.broadcast_variables([v.value for v in opt.variables], 0)
    else:
        hvd.broadcast_variables(model.variables, 0)
        hvd.broadcast_variables(opt.variables(), 0)
    return step, float


def _mwms_loop(tf: Any, strategy: Any, job: Any, batches: Callable[[], Any], gb: int, lr: float) -> tuple[Any, Any]:
    """The MWMS custom loop of TensorFlow's tutorials, loss over the global batch, but this one-replica worker's
    batch handed to ``strategy.run`` as plain tensors instead of through the distributed input."""
    from common.training.train import build_optimizer
    from common.workload.models import build_model

    loss_obj = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    with strategy.scope():
        model = build_model(job, tuple(job.image_shape), job.num_classes)
        opt = build_optimizer(job, lr)

    def step_fn(xb: Any, yb: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_obj(yb, model(xb, training=True)), global_batch_size=gb)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def step() -> Any:
        return strategy.run(step_fn, args=batches())

    step()
    return step, lambda t: float(strategy.experimental_local_results(t)[0])


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", choices=registry.names())
    p.add_argument("steps", type=int)
    p.add_argument("warmup", type=int)
    p.add_argument("--feed", choices=FEEDS, default="tfdata",
                   help="const: one batch reused every step; tfdata: this worker's tf.data iterator (default)")
    p.add_argument("--job", default="jobs/smoke.toml")
    p.add_argument("--set", action="append", default=[], dest="sets")
    p.add_argument("--cpu-bind", choices=CPU_BIND, default="none", help="as twinbench's --cpu-bind (default none)")
    return p


def time_steps(step: Any, value: Any, steps: int, warm: int) -> float:
    """Wall seconds of ``steps - warm`` steps, after ``warm`` more untimed ones (the loop's builder ran the first,
    traced step)."""
    for _ in range(warm - 1):
        step()
    value(step())
    t0 = time.perf_counter()
    last = None
    sync = os.environ.get("PLAIN_SYNC") == "1"
    for _ in range(steps - warm):
        last = step()
        if sync:
            value(last)
    value(last)  # wait for the end
    return time.perf_counter() - t0


def main() -> int:
    a = parser().parse_args()
    if a.warmup < 1 or a.steps <= a.warmup:
        print("bench.plain_loops: need 1 <= WARMUP < STEPS", file=sys.stderr)
        return 2
    from common.workload.job import load_job

    job = load_job(a.job, a.sets)
    kind = a.kind
    import tensorflow as tf

    from common.cluster.placement import configure_threads

    if kind == "horovod":
        import horovod.tensorflow as hvd

        hvd.init()  # under horovodrun, or alone: a world of one
        local_rank, local_size = hvd.local_rank(), hvd.local_size()
    else:
        from backends.native_cluster import local_place

        local_rank, local_size = local_place()
    # the thread budget (and binding) twinbench gives each local rank, before the runtime starts
    configure_threads(local_size, 0, local_rank, a.cpu_bind)
    if kind == "horovod":
        rank, size = hvd.rank(), hvd.size()
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()  # before any other op; no TF_CONFIG: one worker
        rank = strategy.cluster_resolver.task_id or 0
        size = strategy.num_replicas_in_sync
    tf.keras.utils.set_random_seed(job.seed)
    gb = job.per_replica_batch_size * size
    lr = job.scaled_learning_rate(size)
    batches = make_batches(job, gb, rank, size, a.feed)
    if kind == "horovod":
        step, value = _horovod_loop(tf, job, batches, lr)
    else:
        step, value = _mwms_loop(tf, strategy, job, batches, gb, lr)
    wall = time_steps(step, value, a.steps, a.warmup)
    print(json.dumps({"rank": rank, "wall": wall, "timed_steps": a.steps - a.warmup, "global_batch": gb,
                      "feed": a.feed, "size": size}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
