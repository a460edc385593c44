"""``optimizer = "adamw"`` with ``keras = 2``: twinbench's legacy AdamW (common/training/legacy_adamw.py).

In process: its updates equal tf_keras' new AdamW (dense and sparse gradients) and Keras 3's AdamW (dense), with
the learning rate changed between steps the way the loops set it; with ``weight_decay = 0`` it is legacy Adam
exactly; Horovod's ``DistributedOptimizer`` rebuilds it with its weight decay; its bad arguments are one line.
Real processes: the smoke job with ``optimizer = "adamw"`` at 2 workers, per-step losses native = horovod, in fit
and in the custom loop, and unlike the same job with adam
(one worker with the double batch: the same math as two).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tf.keras = tf_keras before TensorFlow loads, as in every run

from typing import Any

import numpy as np
import pytest

from common.workload.job import Job
from tests.conftest import first_divergence

WD = 0.05
LRS = (0.01, 0.01, 0.03, 0.02, 0.005)  # a new learning rate before steps 3, 4 and 5
RTOL = 1e-5


def _legacy(**kw: Any) -> Any:
    from common.training.legacy_adamw import adamw_class

    return adamw_class()(learning_rate=LRS[0], **kw)


def _set_legacy_lr(optimizer: Any, lr: float) -> None:
    """As the loops do (common/training/keras3.py learning_rate_setter, loops.py WarmupLR)."""
    import tensorflow as tf

    tf.keras.backend.set_value(optimizer.lr, lr)


def _initial() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {"kernel": rng.normal(size=(3, 4)).astype(np.float32), "bias": rng.normal(size=4).astype(np.float32)}


def _dense_grad(name: str, value: np.ndarray, step: int) -> np.ndarray:
    """A gradient that depends on the variable (so a wrong update changes every later one) and on the step."""
    return (np.sin(value * (step + 1)) + 0.1 * (step + 1) * (name == "bias")).astype(np.float32)


def _run_dense(make: Any, set_lr: Any, as_variable: Any, compiled: bool = False) -> dict[str, np.ndarray]:
    """``compiled``: apply in a tf.function, as the loops do, the LR still set from the host between calls."""
    import tensorflow as tf

    optimizer = make()
    variables = {k: as_variable(v) for k, v in _initial().items()}

    def apply(grads: list[Any]) -> None:
        optimizer.apply_gradients(zip(grads, variables.values(), strict=True))

    apply = tf.function(apply) if compiled else apply
    for step, lr in enumerate(LRS):
        set_lr(optimizer, lr)
        apply([_dense_grad(k, np.asarray(v.numpy()), step) for k, v in variables.items()])
    return {k: np.asarray(v.numpy()) for k, v in variables.items()}


def _assert_close(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-6, atol=1e-6, err_msg=k)


def test_dense_updates_equal_tf_keras_and_keras3_adamw():
    import keras
    import tensorflow as tf

    ours = _run_dense(lambda: _legacy(weight_decay=WD), _set_legacy_lr, tf.Variable)
    tfk = _run_dense(lambda: tf.keras.optimizers.AdamW(learning_rate=LRS[0], weight_decay=WD),
                     lambda o, lr: o.learning_rate.assign(lr), tf.Variable)
    k3 = _run_dense(lambda: keras.optimizers.AdamW(learning_rate=LRS[0], weight_decay=WD),
                    lambda o, lr: o.learning_rate.assign(lr), keras.Variable)
    _assert_close(ours, tfk)
    _assert_close(ours, k3)
    _assert_close(_run_dense(lambda: _legacy(weight_decay=WD), _set_legacy_lr, tf.Variable, compiled=True), tfk)
    adam = _run_dense(lambda: tf.keras.optimizers.legacy.Adam(learning_rate=LRS[0]), _set_legacy_lr, tf.Variable)
    assert not np.allclose(ours["kernel"], adam["kernel"], rtol=1e-6, atol=1e-6)  # the decay was applied


def _run_sparse(make: Any, set_lr: Any) -> tuple[np.ndarray, np.ndarray]:
    """An embedding table read through tf.gather (an IndexedSlices gradient) and a dense kernel after it."""
    import tensorflow as tf

    rng = np.random.default_rng(3)
    table = tf.Variable(rng.normal(size=(6, 3)).astype(np.float32))
    kernel = tf.Variable(rng.normal(size=(3, 2)).astype(np.float32))
    optimizer = make()
    for step, lr in enumerate(LRS):
        set_lr(optimizer, lr)
        with tf.GradientTape() as tape:
            rows = tf.gather(table, [step % 6, (step + 3) % 6])  # distinct rows, 4 of 6 untouched
            loss = tf.reduce_sum(tf.tanh(rows @ kernel) * (step + 1.0))
        grads = tape.gradient(loss, [table, kernel])
        assert isinstance(grads[0], tf.IndexedSlices)
        optimizer.apply_gradients(zip(grads, [table, kernel], strict=True))
    return table.numpy(), kernel.numpy()


def test_sparse_updates_equal_tf_keras_adamw():
    import tensorflow as tf

    ours = _run_sparse(lambda: _legacy(weight_decay=WD), _set_legacy_lr)
    tfk = _run_sparse(lambda: tf.keras.optimizers.AdamW(learning_rate=LRS[0], weight_decay=WD),
                      lambda o, lr: o.learning_rate.assign(lr))
    _assert_close({"table": ours[0], "kernel": ours[1]}, {"table": tfk[0], "kernel": tfk[1]})
    adam = _run_sparse(lambda: tf.keras.optimizers.legacy.Adam(learning_rate=LRS[0]), _set_legacy_lr)
    assert not np.allclose(ours[0], adam[0], rtol=1e-6, atol=1e-6)  # the untouched rows decayed too


def test_zero_weight_decay_is_legacy_adam_exactly():
    import tensorflow as tf

    ours = _run_dense(lambda: _legacy(weight_decay=0.0), _set_legacy_lr, tf.Variable)
    adam = _run_dense(lambda: tf.keras.optimizers.legacy.Adam(learning_rate=LRS[0]), _set_legacy_lr, tf.Variable)
    assert all(np.array_equal(ours[k], adam[k]) for k in ours)
    sparse = _run_sparse(lambda: _legacy(weight_decay=0.0), _set_legacy_lr)
    sparse_adam = _run_sparse(lambda: tf.keras.optimizers.legacy.Adam(learning_rate=LRS[0]), _set_legacy_lr)
    assert all(np.array_equal(a, b) for a, b in zip(sparse, sparse_adam, strict=True))


def test_the_job_builds_it_with_keras3s_default_and_horovod_rebuilds_it():
    import horovod.tensorflow.keras as hvd
    import keras
    import tensorflow as tf

    from common.training.optimizers import build_optimizer

    job = Job(optimizer="adamw")  # keras = 2 validates
    optimizer = build_optimizer(job, 0.02)
    assert isinstance(optimizer, tf.keras.optimizers.legacy.Adam)
    assert optimizer.weight_decay == keras.optimizers.AdamW().weight_decay == 0.004
    optimizer = build_optimizer(Job(optimizer="adamw", optimizer_args={"weight_decay": WD, "beta_1": 0.8}), 0.02)
    wrapped = hvd.DistributedOptimizer(optimizer)  # a subclass rebuilt with from_config(get_config())
    assert isinstance(wrapped, type(optimizer)) and wrapped is not optimizer
    assert wrapped.weight_decay == WD and wrapped.get_config()["beta_1"] == pytest.approx(0.8)


@pytest.mark.parametrize("args, fragment", [
    ({"nosuch": 1}, "nosuch"),
    ({"weight_decay": "high"}, "weight_decay must be a number"),
])
def test_bad_arguments_are_one_line(args, fragment):
    from common.training.optimizers import build_optimizer
    from common.workload.usercode import UserCodeError

    with pytest.raises(UserCodeError) as e:
        build_optimizer(Job(optimizer="adamw", optimizer_args=args), 0.02)
    assert str(e.value).startswith(f"optimizer_args = {args!r} for optimizer = 'adamw': ") and fragment in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.distributed
@pytest.mark.parametrize("mode", ["fit"])  # fit: Horovod rebuilds the optimizer from get_config (weight_decay's risk);
# the custom loop applies it as it applies every legacy optimizer, whose parity tests/test_parity.py holds
def test_adamw_native_vs_horovod_two_workers(runner, mode):
    extra = ("--set", f"mode={mode}", "--set", "steps=6", "--set", "learning_rate=0.01")
    adamw = (*extra, "--set", "optimizer=adamw", "--set", 'optimizer_args={"weight_decay": 0.5}')
    nat, hvd = runner("native", *adamw), runner("horovod", *adamw)
    assert nat["job"]["optimizer"] == hvd["job"]["optimizer"] == "adamw" and nat["job"]["keras"] == 2
    assert nat["world_size"] == hvd["world_size"] == 2 and nat["mode"] == hvd["mode"] == mode
    assert len(nat["step_losses"]) == 6
    msg = first_divergence(nat["step_losses"], hvd["step_losses"], RTOL)
    assert msg is None, f"adamw {mode}: native vs horovod: {msg}\n{nat['step_losses']}\n{hvd['step_losses']}"
    # The decay was applied: the same job with adam differs. Adam's run at 1 worker with the double batch (one
    # process, not two): the same math as 2 x 16 to RTOL (tests/test_parity.py::test_two_workers_equal_one_worker_
    # double_batch), so a divergence beyond RTOL is the decay's.
    adam = runner("native", *extra, "--set", "optimizer=adam", "--set", "per_replica_batch_size=32", workers=1)
    assert adam["global_batch_size"] == nat["global_batch_size"]
    assert first_divergence(nat["step_losses"], adam["step_losses"], RTOL) is not None
