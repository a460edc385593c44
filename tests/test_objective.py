"""The objective's one home (common.training.objective): what every loop minimises, checked against a hand
computation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from common.training import objective
from common.workload.job import Job


def test_replica_objective_is_summed_loss_over_global_batch_plus_regularisation_over_replicas():
    tf = pytest.importorskip("tensorflow")
    tf.keras.utils.set_random_seed(3)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(
        3, kernel_regularizer=tf.keras.regularizers.L2(0.1))])
    x = np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32)
    y = np.array([0, 2, 1, 2], dtype=np.int32)
    share, out = objective.replica_objective(Job(), model, global_batch=8, replicas=2)(x, y)
    got = float(share)
    assert out.shape == (4, 3)  # the model's outputs, for fit's metrics
    logits = model(x).numpy().astype(np.float64)
    ce = [math.log(np.exp(r).sum()) - r[c] for r, c in zip(logits, y)]  # cross-entropy from logits, per example
    reg = 0.1 * float((model.layers[-1].kernel.numpy().astype(np.float64) ** 2).sum())
    assert got == pytest.approx(sum(ce) / 8 + reg / 2, rel=1e-5)


def test_fit_loss_is_the_same_loss_with_keras_reduction():
    tf = pytest.importorskip("tensorflow")
    logits = tf.constant([[2.0, 0.5, -1.0], [0.1, 0.2, 0.3]])
    y = tf.constant([0, 2])
    per = objective.per_example_loss(Job())(y, logits).numpy()
    assert per.shape == (2,)
    assert float(objective.fit_loss(Job())(y, logits)) == pytest.approx(per.mean(), rel=1e-6)


def test_fit_compiles_its_loss_from_the_objective_and_the_output_check_builds_none():
    """fit's loss has one home: ``compile_loss`` gives ``compile`` the job's loss (a dict with every output's weight
    for ``loss_per_output``, None for one user loss over a multi-output model's structures, which ``structure_loss``
    gives fit's objective instead); common.training.outputs only checks."""
    tf = pytest.importorskip("tensorflow")
    from common.training import outputs

    inp = tf.keras.Input((3,))
    single = tf.keras.Model(inp, tf.keras.layers.Dense(2)(inp))
    multi = tf.keras.Model(inp, {"a": tf.keras.layers.Dense(2)(inp), "b": tf.keras.layers.Dense(1)(inp)})
    assert not objective.is_multi(single) and objective.is_multi(multi)
    one = objective.compile_loss(Job(), single)
    assert set(one) == {"loss"} and isinstance(one["loss"], tf.keras.losses.SparseCategoricalCrossentropy)
    assert objective.structure_loss(Job(), single) is None
    per = Job(loss_per_output={"a": "mse", "b": "mae"}, loss_weights={"a": 0.5})
    both = objective.compile_loss(per, multi)
    assert sorted(both["loss"]) == ["a", "b"] and both["loss_weights"] == {"a": 0.5, "b": 1.0}
    assert objective.structure_loss(per, multi) is None  # compile has it, per output
    user = Job(loss="operator:sub")  # any importable function: it is only resolved here, never called
    assert objective.compile_loss(user, multi) == {"loss": None}
    assert objective.structure_loss(user, multi).name == "sub"  # fit's objective applies it to the structures
    assert not {"is_multi", "compile_loss", "structure_loss", "fit_loss"} & set(vars(outputs))


@pytest.mark.parametrize("replicas", [2, 8])
def test_warmup_goes_from_one_over_replicas_to_one(replicas):
    spe, warm, lr = 10, 3, 0.8
    first = objective.lr_at_step(0, lr, spe, replicas, warm)
    last = objective.lr_at_step(spe * warm - 1, lr, spe, replicas, warm)
    assert first == pytest.approx(lr / replicas * (1 + (replicas - 1) / (spe * warm)))
    assert last == pytest.approx(lr)
    assert objective.lr_at_step(spe * warm, lr, spe, replicas, warm) is None  # after warm-up: left as it is
    assert objective.lr_at_step(0, lr, spe, replicas, 0) is None
