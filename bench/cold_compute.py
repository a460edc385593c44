"""How much slower a step's compute phase runs right after the process has waited: the effect behind the
breakdown's compute phase growing on a slow link (tests/test_cluster_runs.py's shaped-link test).

One process, no network, no twinbench code: the breakdown's compute phase (forward + backward of the smoke MLP
with a 1024-unit hidden layer, batch 16, local gradients only) timed by ``tf.timestamp()`` inside one
``tf.function``, followed by a wait standing in for a slow all-reduce: ``sleep`` (the core goes idle, as it does
while a rank waits on a slow link) or ``spin`` (the core stays busy for as long). Waits are interleaved round by
round so a drift of the machine hits them alike; prints the median compute time per wait and its ratio to no wait.

    python -m bench.cold_compute --waits-ms 0,5,30,130 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cold_compute", description=__doc__.split("\n\n")[0])
    parser.add_argument("--waits-ms", default="0,5,30,130",
                        help="waits after each compute phase, ms (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per wait and round (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="intra/inter-op threads, as a rank of two on two "
                        "cores gets (default: %(default)s)")
    args = parser.parse_args(argv)
    waits = [float(w) for w in args.waits_ms.split(",")]

    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    model = tf.keras.Sequential([tf.keras.layers.Flatten(input_shape=(28, 28, 1)),
                                 tf.keras.layers.Dense(1024, activation="relu"), tf.keras.layers.Dense(10)])
    optimizer = tf.keras.optimizers.SGD(0.01, momentum=0.9)
    x = tf.random.uniform([16, 28, 28, 1], seed=1)
    y = tf.random.uniform([16], 0, 10, tf.int32, seed=2)
    setting = {"ms": 0.0, "spin": False}

    def wait(_: tf.Tensor) -> float:
        end = time.perf_counter() + setting["ms"] / 1e3
        if setting["spin"]:
            while time.perf_counter() < end:  # busy: the core never idles
                pass
        else:
            time.sleep(setting["ms"] / 1e3)
        return 0.0

    @tf.function
    def step() -> tf.Tensor:
        t1 = tf.timestamp()
        with tf.control_dependencies([t1]):
            xx = tf.identity(x)
        with tf.GradientTape() as tape:
            logits = model(xx)
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
        grads = tape.gradient(loss, model.trainable_variables)
        with tf.control_dependencies(grads):
            t2 = tf.timestamp()
        done = tf.py_function(wait, [t2], tf.float32)  # the stand-in for a slow collective
        with tf.control_dependencies([done]):
            grads = [tf.identity(g) for g in grads]
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return t2 - t1

    for _ in range(5):
        step()
    medians: dict[tuple[str, float], list[float]] = {}
    for r in range(args.rounds):
        order = [(mode, w) for w in waits for mode in ("sleep", "spin") if w > 0 or mode == "sleep"]
        for mode, w in order if r % 2 == 0 else order[::-1]:
            setting.update(ms=w, spin=mode == "spin")
            step()  # this wait's first step follows the previous setting's wait: not counted
            times = [float(step()) * 1e3 for _ in range(args.steps)]
            medians.setdefault((mode, w), []).append(statistics.median(times))
    base = statistics.median(medians[("sleep", 0.0)])
    print(f"compute phase after a wait ({args.rounds} interleaved rounds x {args.steps} steps, {args.threads} "
          "thread(s)); median of the rounds' medians:")
    for (mode, w), ms in sorted(medians.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        m = statistics.median(ms)
        print(f"  {'no wait' if w == 0 else f'{mode} {w:g} ms':>14}: {m:.3f} ms  ({m / base:.2f}x; rounds "
              f"{min(ms):.3f}-{max(ms):.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
