"""What twinbench adds inside each custom-loop step, timed in one process with the variants interleaved.

``python -m bench.step_extras [--steps 300] [--repeats 12] [--set key=value ...]``: one process, no strategy, the
job's model on its own pipeline (jobs/smoke.toml by default), three tf.functions over the same model and iterator:
``plain`` (fetch, forward, backward, apply), ``+input clock`` (the fetch timed as in the real loop,
``common.training.inputwait.InputClock.fetch``) and ``+all`` (also the loss ring write and the step counter, as
``common.training.loops.run_ctl``). Blocks of ``--steps`` steps of each, in alternating order, each ended by one host
read; prints the median time per step and the ratio to ``plain``. In one process the machine's drift hits all three
alike, which is what the cross-process ``bench.overhead`` cannot resolve on short steps. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--job", default="jobs/smoke.toml")
    p.add_argument("--set", action="append", default=[], dest="sets", help="job override key=value")
    p.add_argument("--steps", type=int, default=300, help="steps per timed block (default 300)")
    p.add_argument("--repeats", type=int, default=12, help="blocks of each variant (default 12)")
    a = p.parse_args()
    if a.steps < 1 or a.repeats < 1:
        print("bench.step_extras: --steps and --repeats must be >= 1", file=sys.stderr)
        return 2
    from common.workload.job import load_job

    job = load_job(a.job, a.sets)
    import tensorflow as tf

    from common.cluster.placement import configure_threads
    from common.training import inputwait
    from common.training.loops import LossRing
    from common.training.train import build_optimizer
    from common.workload.data import make_train_dataset
    from common.workload.models import build_model

    configure_threads(1, 0)
    tf.keras.utils.set_random_seed(job.seed)
    model = build_model(job, tuple(job.image_shape), job.num_classes)
    opt = build_optimizer(job, job.learning_rate)
    loss_obj = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    it = iter(make_train_dataset(job, job.per_replica_batch_size, 0, 1))
    clock = inputwait.InputClock("fetch", 0)
    counter = tf.Variable(0, dtype=tf.int64, trainable=False)
    ring = LossRing(job.sync_interval, 1)

    def body(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(loss_obj(y, model(x, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def plain() -> Any:
        return body(*next(it))

    @tf.function
    def with_clock() -> Any:
        return body(*clock.fetch(lambda: next(it), counter))

    @tf.function
    def with_all() -> Any:  # what run_ctl's train_step adds around the step (one local replica)
        written = ring.write(counter, [body(*clock.fetch(lambda: next(it), counter))])
        with tf.control_dependencies([written]):
            return counter.assign_add(1)

    variants = {"plain": plain, "+input clock": with_clock, "+all": with_all}
    for f in variants.values():  # trace and warm up
        for _ in range(20):
            out = f()
        out.numpy()
    per_step: dict[str, list[float]] = {k: [] for k in variants}
    for rep in range(a.repeats):
        order = list(variants.items())
        for name, f in order if rep % 2 == 0 else reversed(order):
            t0 = time.perf_counter()
            for _ in range(a.steps):
                out = f()
            out.numpy()  # the block's one host read: waits for its steps
            per_step[name].append((time.perf_counter() - t0) / a.steps)
    base = statistics.median(per_step["plain"])
    for name, v in per_step.items():
        med = statistics.median(v)
        print(f"{name}: {med * 1e6:.1f} us/step median ({min(v) * 1e6:.1f}-{max(v) * 1e6:.1f}) over {a.repeats} "
              f"blocks of {a.steps}, {med / base:.3f} x plain, {(med - base) * 1e6:+.1f} us", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
