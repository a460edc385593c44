"""Minimal hand-written data-parallel loops, the baseline twinbench's overhead is measured against.

``python -m bench.plain_loops native|horovod STEPS PER_REPLICA_BATCH WARMUP``: the smoke job's MLP on the same
synthetic data, the IDRIS-page MWMS custom loop (native, TF_CONFIG) or a plain Horovod DistributedGradientTape
loop (under horovodrun). No per-step host sync, no recording: what a user would write. Each rank prints one JSON
line with its wall time over the timed steps. ``PLAIN_SYNC=1`` reads the loss after every step, as twinbench must
to time each step: the difference between the two is the price of per-step timing.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


def main() -> int:
    kind, steps, b, warm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    import tensorflow as tf

    # the same thread budget twinbench gives each rank (common.train.configure_threads), set before the runtime
    local = 2
    threads = max(1, len(os.sched_getaffinity(0)) // local)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, threads)))
    if kind == "horovod":
        import horovod.tensorflow as hvd

        hvd.init()
        rank, size = hvd.rank(), hvd.size()
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()  # before any other op, from TF_CONFIG
        rank = strategy.cluster_resolver.task_id or 0
        size = strategy.num_replicas_in_sync
    tf.keras.utils.set_random_seed(1234)
    gb = b * size
    rng = tf.random.Generator.from_seed(1)
    x = rng.uniform([1024, 28, 28, 1])
    y = tf.cast(tf.math.floormod(tf.range(1024), 10), tf.int32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1024, seed=1234)

    def build() -> tf.keras.Model:
        return tf.keras.Sequential([tf.keras.layers.Flatten(input_shape=(28, 28, 1)),
                                    tf.keras.layers.Dense(64, activation="relu"), tf.keras.layers.Dense(10)])

    loss_obj = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    if kind == "horovod":
        model = build()
        opt = tf.keras.optimizers.legacy.SGD(0.05, momentum=0.9)
        it = iter(ds.shard(size, rank).batch(b, drop_remainder=True).repeat().prefetch(tf.data.AUTOTUNE))

        @tf.function
        def step() -> tf.Tensor:
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
    else:
        with strategy.scope():
            model = build()
            opt = tf.keras.optimizers.legacy.SGD(0.05, momentum=0.9)
        it = iter(strategy.experimental_distribute_dataset(
            ds.batch(gb, drop_remainder=True).repeat().prefetch(tf.data.AUTOTUNE)))

        def step_fn(xb: tf.Tensor, yb: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_obj(yb, model(xb, training=True)), global_batch_size=gb)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        @tf.function
        def step() -> tf.Tensor:
            return strategy.run(step_fn, args=next(it))

        step()
    for _ in range(warm - 1):
        step()
    float(tf.reduce_sum(strategy.experimental_local_results(step())) if kind != "horovod" else step())
    t0 = time.perf_counter()
    last = None
    sync = os.environ.get("PLAIN_SYNC") == "1"
    for _ in range(steps - warm):
        last = step()
        if sync:
            float(last if kind == "horovod" else strategy.experimental_local_results(last)[0])
    float(last if kind == "horovod" else strategy.experimental_local_results(last)[0])  # wait for the end
    wall = time.perf_counter() - t0
    print(json.dumps({"rank": rank, "wall": wall, "timed_steps": steps - warm, "global_batch": gb}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
