"""A job shaped like TensorFlow's "Multi-worker training with Keras" tutorial (its ``build_and_compile_cnn_model()``:
no arguments, compiled with SGD(learning_rate=0.001), SparseCategoricalCrossentropy(from_logits=True) and
["accuracy"]) on both backends at 2 workers in Keras fit: the same per-step losses, and the record says what was
compiled (the learning rate scaled by the job's lr_scaling, the optimizer class, no schedule, the loss and metrics)
instead of the job's defaults (learning_rate 0.01).

Two runs (native --nproc 2, Horovod under mpirun -np 2), once per module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from common.workload.job import job_from_dict
from tests.conftest import backend_cmd, only_result, run, same_losses, user_job

pytestmark = pytest.mark.distributed

TUTORIAL = '''
import numpy as np
import tensorflow as tf


def mnist_dataset():
    rng = np.random.default_rng(0)
    x = rng.random((192, 8, 8, 1), dtype=np.float32)
    y = rng.integers(0, 10, size=192).astype(np.int64)
    return {"train": (x[:160], y[:160]), "validation": (x[160:], y[160:])}


def build_and_compile_cnn_model():
    model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(8, 8, 1)),
        tf.keras.layers.Conv2D(4, 3, activation="relu"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(16, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=tf.keras.optimizers.SGD(learning_rate=0.001), metrics=["accuracy"])
    return model
'''
STEPS = 10  # one epoch of 160 samples at a global batch of 16


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    job = user_job(tmp_path_factory.mktemp("tutorial"), "tutpkg", TUTORIAL, {
        "pythonpath": '["."]', "model": '"tutpkg.fns:build_and_compile_cnn_model"',
        "dataset": '"tutpkg.fns:mnist_dataset"', "per_replica_batch_size": "8", "epochs": "1",
        "lr_scaling": '"linear"', "sync_every_steps": "5"})
    got = {}
    for kind in ("native", "horovod"):
        out: Path = tmp_path_factory.mktemp(f"compiled-{kind}")
        run(backend_cmd(kind, out, job=str(job)))
        got[kind] = only_result(out)
    return got


def test_a_compiled_model_trains_to_the_same_losses_on_both_backends(records):
    msg = same_losses({"native": records["native"], "horovod": records["horovod"]})
    assert msg is None, msg
    for r in records.values():
        assert r["world_size"] == 2 and r["mode"] == "fit" and len(r["step_losses"]) == STEPS
        assert r["weights_consistent"]
    assert records["native"]["trainable_weights_digest"] == records["horovod"]["trainable_weights_digest"]


def test_the_record_says_what_was_compiled(records):
    for kind, r in records.items():
        assert r["learning_rate"] == pytest.approx(0.002, rel=1e-7), kind  # 0.001 x 2 replicas (lr_scaling linear)
        compiled = r["compiled"]
        assert compiled["optimizer"]["class"].endswith("optimizers.legacy.gradient_descent.SGD"), compiled
        assert compiled["optimizer"]["compiled_class"] == "tf_keras.src.optimizers.sgd.SGD"
        assert compiled["optimizer"]["config"]["momentum"] == 0 and compiled["schedule"] is None
        assert compiled["learning_rate"] == 0.001
        assert (compiled["loss"], compiled["metrics"]) == ("sparse_categorical_crossentropy", ["accuracy"])
        assert job_from_dict(r["job"]).job_hash == r["job_hash"]  # the job's identity is the file's, as loaded
        # the compiled metrics are evaluated: the validation split's accuracy, alike on both backends
        assert [sorted(e) for e in r["evaluations"]][-1:] == [["accuracy", "epoch", "loss", "seconds", "step",
                                                              "wall_time"]], r["evaluations"]
    nat, hvd = (records[k]["evaluations"][-1] for k in ("native", "horovod"))
    assert nat["accuracy"] == hvd["accuracy"] and nat["loss"] == pytest.approx(hvd["loss"], rel=1e-5)
