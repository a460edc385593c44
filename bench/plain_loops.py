"""Minimal hand-written data-parallel loops, the baseline twinbench's overhead is measured against.

``python -m bench.plain_loops native|horovod STEPS WARMUP [--job FILE] [--set key=value ...] [--cpu-bind cores]``:
the job's model, optimizer, LR and per-replica batch (built with twinbench's own model/optimizer factories, which
are not overhead), bound and threaded as twinbench would (``configure_threads``), on the job's own input pipeline
(``common.data.make_train_dataset``, the exact sharding both backends use: the data is the job's, not the
harness', so the ratio isolates what twinbench adds around the step), trained by the
IDRIS-page MWMS custom loop (native, TF_CONFIG; datasets from a function, as twinbench) or a plain Horovod
DistributedGradientTape loop (under horovodrun). No host sync, no recording: what a user would write. Each rank
prints one JSON line with its wall time over the timed steps. ``PLAIN_SYNC=1`` reads the loss after every step, to
show the price of a per-step sync (twinbench's ``sync_every_steps = 1``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import backends
from backends.base import CPU_BIND

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def _horovod_loop(tf: Any, job: Any, ds: Any, b: int, lr: float) -> tuple[Any, Any]:
    """Horovod's documented custom loop: shard, DistributedGradientTape, broadcast after the first step."""
    import horovod.tensorflow as hvd

    from common.models import build_model
    from common.train import build_optimizer

    shape = tuple(job.image_shape)
    loss_obj = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    model = build_model(job, shape, job.num_classes)
    opt = build_optimizer(job, lr)
    it = iter(ds(hvd.rank(), hvd.size()))

    @tf.function
    def step() -> Any:
        xb, yb = next(it)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_obj(yb, model(xb, training=True)))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    step()
    hvd.broadcast_variables(model.variables, 0)
    hvd.broadcast_variables(opt.variables(), 0)
    return step, float


def _mwms_loop(tf: Any, strategy: Any, job: Any, ds: Any, gb: int, lr: float) -> tuple[Any, Any]:
    """The IDRIS-page MWMS custom loop: experimental_distribute_dataset, loss over the global batch."""
    from common.models import build_model
    from common.train import build_optimizer

    shape = tuple(job.image_shape)
    loss_obj = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    with strategy.scope():
        model = build_model(job, shape, job.num_classes)
        opt = build_optimizer(job, lr)
    it = iter(strategy.distribute_datasets_from_function(
        lambda ctx: ds(ctx.input_pipeline_id, ctx.num_input_pipelines)))

    def step_fn(xb: Any, yb: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_obj(yb, model(xb, training=True)), global_batch_size=gb)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def step() -> Any:
        return strategy.run(step_fn, args=next(it))

    step()
    return step, lambda t: float(strategy.experimental_local_results(t)[0])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("kind", choices=backends.names())
    p.add_argument("steps", type=int)
    p.add_argument("warmup", type=int)
    p.add_argument("--job", default="jobs/smoke.toml")
    p.add_argument("--set", action="append", default=[], dest="sets")
    p.add_argument("--cpu-bind", choices=CPU_BIND, default="none", help="as twinbench's --cpu-bind (default none)")
    a = p.parse_args()
    from common.job import load_job

    job = load_job(a.job, a.sets)
    kind, steps, warm, b = a.kind, a.steps, a.warmup, job.per_replica_batch_size
    import tensorflow as tf

    from backends.base import configure_threads

    if kind == "horovod":
        import horovod.tensorflow as hvd

        hvd.init()
        local_rank, local_size = hvd.local_rank(), hvd.local_size()
    else:
        from backends.native_cluster import local_place

        local_rank, local_size = local_place()
    # the thread budget (and binding) twinbench gives each local rank, before the runtime starts
    configure_threads(local_size, 0, local_rank, a.cpu_bind)
    if kind == "horovod":
        rank, size = hvd.rank(), hvd.size()
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()  # before any other op, from TF_CONFIG
        rank = strategy.cluster_resolver.task_id or 0
        size = strategy.num_replicas_in_sync
    tf.keras.utils.set_random_seed(job.seed)
    gb = b * size
    lr = job.scaled_learning_rate(size)
    from common.data import make_train_dataset

    def ds(index: int, count: int) -> Any:
        return make_train_dataset(job, gb, index, count)
    step, value = _horovod_loop(tf, job, ds, b, lr) if kind == "horovod" else _mwms_loop(tf, strategy, job, ds, gb, lr)

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
    wall = time.perf_counter() - t0
    print(json.dumps({"rank": rank, "wall": wall, "timed_steps": steps - warm, "global_batch": gb}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
