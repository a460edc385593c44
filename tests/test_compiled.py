"""A model its function returned compiled (TensorFlow's multi-worker tutorial's ``build_and_compile_cnn_model()``):
taken as the job's optimizer, learning rate, loss and metrics (common/training/compiled.py), refused in one line when
a job key says otherwise or when it cannot be carried over exactly; and a model function without arguments.

One process: the pure-Python checks first, then the ones that build models (TensorFlow in process, no run started),
then three short native runs of the tutorial's compiled job under lr_scaling = "linear" (one identity, one recipe,
and --lr-replicas). The runs of a compiled job on both backends: the tutorial example's common.check
(tests/test_tfdata.py: every pair agrees, every record holds what was compiled); the refusals through the real command
line in tests/test_usercode.py (BAD_CASES).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # legacy Keras 2 before TensorFlow loads

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from common.workload import argcheck, usercode
from common.workload.job import Job, given_keys, load_job
from tests.conftest import REPO, backend_cmd, first_divergence, only_result, run, user_job

pytestmark = pytest.mark.usefixtures("restore_sys_path")  # load_job moves sys.path

SOURCE = '''
import tensorflow as tf


def layers():
    return [tf.keras.layers.InputLayer(input_shape=(6,)), tf.keras.layers.Dense(8, activation="relu"),
            tf.keras.layers.Dense(3)]


def tutorial():  # the tutorial's shape: no arguments, compiled
    model = tf.keras.Sequential(layers())
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=tf.keras.optimizers.SGD(learning_rate=0.001), metrics=["accuracy"])
    return model


def uncompiled(width=8):
    return tf.keras.Sequential(layers())


def compiled_with(**kwargs):
    model = tf.keras.Sequential(layers())
    model.compile(**kwargs)
    return model


class OwnStep(tf.keras.Sequential):
    def train_step(self, data):
        return super().train_step(data)


def own_step():
    model = OwnStep(layers())
    model.compile(optimizer=tf.keras.optimizers.legacy.SGD(0.1), loss="mse")
    return model


def keras3():
    import keras
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def my_loss(y_true, y_pred):
    return tf.reduce_sum(y_pred, axis=-1)


def own_loss():
    model = tf.keras.Sequential(layers())
    model.compile(optimizer="sgd", loss=my_loss)
    return model
'''


# -- pure Python: who is passed input_shape, num_classes; which keys the job file gave ---------------------------
def test_model_inputs_passed_only_to_functions_with_positional_parameters():
    def none(): ...
    def kw_only(*, width=3): ...
    def both(input_shape, num_classes): ...
    def one(input_shape): ...
    def star(*args): ...
    assert [usercode.takes_model_inputs(f) for f in (none, kw_only, both, one, star)] == [False, False, True, True,
                                                                                         True]
    assert not usercode.takes_model_inputs(one, {"input_shape": 3})  # its one positional given by model_args
    assert usercode.takes_model_inputs(both, {"num_classes": 3})  # as today: refused ("already passed")


def test_argcheck_reads_a_function_without_arguments_as_called_without_them(tmp_path):
    src = "def tutorial():\n    pass\n\ndef kw(*, width=3):\n    pass\n\ndef one(input_shape):\n    pass\n"
    base = {"pythonpath": '["."]'}
    assert argcheck.problems(load_job(user_job(tmp_path, "ac0", src, {**base, "model": '"ac0.fns:tutorial"'}))) == []
    job = load_job(user_job(tmp_path, "ac0", src, {**base, "model": '"ac0.fns:kw"', "model_args": "{ width = 4 }"}))
    assert argcheck.problems(job) == []
    job = load_job(user_job(tmp_path, "ac0", src, {**base, "model": '"ac0.fns:tutorial"', "model_args": "{ w = 4 }"}))
    assert argcheck.problems(job) == ["model_args: 'w' is not a parameter of ac0.fns:tutorial: tutorial()"]
    one = {**base, "model": '"ac0.fns:one"'}
    job = load_job(user_job(tmp_path, "ac0", src, {**one, "model_args": "{ input_shape = 2 }"}))
    assert argcheck.problems(job) == []
    job = load_job(user_job(tmp_path, "ac0", src, one))
    assert argcheck.problems(job)[0].endswith("one(input_shape) takes 1 positional argument(s), twinbench passes 2 "
                                              "(input_shape, num_classes)")


def test_given_keys_tell_a_key_set_to_its_default_from_an_absent_one(tmp_path):
    (tmp_path / "a.toml").write_text("learning_rate = 0.01\nsteps = 4\n")  # 0.01 is the default
    job = load_job(tmp_path / "a.toml", ["optimizer=sgd"])
    assert {"learning_rate", "steps", "optimizer"} <= given_keys(job) and "loss" not in given_keys(job)
    assert job == Job(steps=4, name="a")  # not a field: equality and the hash ignore it
    assert given_keys(Job(steps=4)) == {"steps"}  # made without a file: the keys off their default


# -- with TensorFlow: what a compiled model brings, and what is refused ---------------------------------------
@pytest.fixture(scope="module")
def tf() -> Any:
    return pytest.importorskip("tensorflow")


def _built(tf: Any, tmp: Path, fn: str, lines: dict[str, str] | None = None, sets: tuple[str, ...] = ()) -> Any:
    """(job, the model build_model returns) for ``pkg.fns:fn``: the way ``train.build`` calls it."""
    from common.workload import models

    values = {"pythonpath": '["."]', "model": f'"cpk.fns:{fn}"', **(lines or {})}
    job = load_job(user_job(tmp, "cpk", SOURCE, values), list(sets))
    tf.keras.utils.set_random_seed(1)
    return job, models.build_model(job, (6,), 3)


def _from(tf: Any, tmp: Path, fn: str, lines: dict[str, str] | None = None, sets: tuple[str, ...] = ()) -> Any:
    from common.training import compiled

    job, model = _built(tf, tmp, fn, lines, sets)
    return job, compiled.from_model(tf, job, model)


def test_the_tutorials_compiled_model_is_the_jobs_objective(tf, tmp_path):
    from common.training import compiled as cm
    from common.training.context import Plan, RunContext
    from common.training.optimizers import build_optimizer
    from common.workload.job import DEFAULT_LOSS

    job, got = _from(tf, tmp_path, "tutorial", sets=("lr_scaling=linear",))
    assert got.optimizer_class is tf.keras.optimizers.legacy.SGD  # the legacy twin the keras = 2 loops need
    assert got.compiled_class == "tf_keras.src.optimizers.sgd.SGD"
    assert (got.learning_rate, got.schedule, got.loss, got.metrics) == (0.001, None, DEFAULT_LOSS, ("accuracy",))
    recipe = cm.recipe(job, got, 2)  # lr_scaling applies to the compiled learning rate, for 2 replicas
    assert (recipe.source, recipe.base_learning_rate, recipe.learning_rate) == ("compiled", 0.001, 0.002)
    assert (recipe.loss, recipe.metrics, recipe.lr_replicas) == (DEFAULT_LOSS, ("accuracy",), 2)
    assert recipe.optimizer.endswith("legacy.gradient_descent.SGD") and recipe.optimizer_config["momentum"] == 0
    assert "learning_rate" not in recipe.optimizer_config and recipe.compiled_class == got.compiled_class
    assert job.learning_rate == 0.01  # the job (its identity) is the file's: the recipe holds what trains
    optimizer = build_optimizer(job, recipe.learning_rate, got)
    assert type(optimizer) is tf.keras.optimizers.legacy.SGD
    assert optimizer.get_config()["learning_rate"] == pytest.approx(0.002) and optimizer.get_config()["momentum"] == 0
    record = got.record()
    assert record["optimizer"]["class"].endswith("legacy.gradient_descent.SGD") and record["learning_rate"] == 0.001
    run = RunContext(job, None, None, Plan(16, 4, 8, 2), recipe)  # type: ignore[arg-type]
    assert "LR 0.002 (base 0.001, scaling linear; the model function's compiled SGD(learning_rate 0.001" in \
        cm.banner(run, got)
    as_if = RunContext(job, None, None, Plan(32, 4, 8, 1), recipe)  # type: ignore[arg-type]
    assert "scaling linear as if 2 replicas (--lr-replicas)" in cm.banner(as_if, got)


def test_an_uncompiled_model_and_no_arguments(tf, tmp_path):
    from common.training import compiled

    job, model = _built(tf, tmp_path, "uncompiled", {"model_args": "{ width = 4 }"})
    assert compiled.from_model(tf, job, model) is None and model.output_shape == (None, 3)


def test_legacy_optimizer_and_schedule_rebuilt_from_their_config(tf, tmp_path):
    job, got = _from(tf, tmp_path, "compiled_with", {"model_args": '{ optimizer = "adam", loss = "mse" }'})
    assert got.optimizer_class is tf.keras.optimizers.legacy.Adam and got.loss == "mse" and got.metrics is None
    src = SOURCE + '''

def scheduled():
    sched = tf.keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=10, decay_rate=0.5)
    model = tf.keras.Sequential(layers())
    model.compile(optimizer=tf.keras.optimizers.legacy.SGD(sched, momentum=0.9), loss="mse")
    return model
'''
    from common.training import compiled

    job = load_job(user_job(tmp_path, "cpk2", src, {"pythonpath": '["."]', "model": '"cpk2.fns:scheduled"'}))
    from common.workload import models

    got = compiled.from_model(tf, job, models.build_model(job, (6,), 3))
    assert got.schedule["class"].endswith("ExponentialDecay") and got.schedule["config"]["decay_steps"] == 10
    assert got.learning_rate == 0.05 and got.record()["optimizer"]["config"]["momentum"] == 0.9  # float32, shown short
    rebuilt = got.rebuild(99.0)  # a schedule keeps its own values, whatever the plan's LR
    assert float(rebuilt._get_hyper("learning_rate")(10)) == pytest.approx(0.025)
    with pytest.raises(usercode.UserCodeError, match="compiled with a learning-rate schedule .* lr_scaling = 'linear'"):
        compiled.from_model(tf, dataclasses.replace(job, lr_scaling="linear"), models.build_model(job, (6,), 3))


@pytest.mark.parametrize("lines, match", [
    ({"learning_rate": "0.01"}, r"^learning_rate = 0.01 in the job, but model = 'cpk.fns:tutorial' compiled "
                                r"learning_rate 0.001"),
    ({"optimizer": '"adam"'}, r"^optimizer = 'adam' in the job, but .* compiled tf_keras.src.optimizers.sgd.SGD "
                              r"\(learning_rate 0.001, momentum=0.0, nesterov=False\)"),
    ({"optimizer": '"momentum"'}, r"^optimizer = 'momentum' in the job"),
    ({"optimizer_args": "{ momentum = 0.9 }"}, r"^optimizer_args momentum = 0.9 in the job, but .* momentum = 0.0"),
    ({"loss": '"mse"'}, r"^loss = 'mse' in the job, but .* compiled loss 'sparse_categorical_crossentropy'"),
    ({"metrics": '["mae"]'}, r"^metrics = \('mae',\) in the job, but .* compiled metrics \['accuracy'\]"),
])
def test_a_job_key_that_contradicts_the_compiled_model_is_refused(tf, tmp_path, lines, match):
    with pytest.raises(usercode.UserCodeError, match=match):
        _from(tf, tmp_path, "tutorial", lines)


@pytest.mark.parametrize("lines", [
    {"learning_rate": "0.001", "optimizer": '"sgd"', "loss": '"sparse_categorical_crossentropy"',
     "metrics": '["accuracy"]', "optimizer_args": "{ nesterov = false }"},
])
def test_job_keys_that_agree_with_the_compiled_model_are_accepted(tf, tmp_path, lines):
    _, got = _from(tf, tmp_path, "tutorial", lines)
    assert got.learning_rate == 0.001


@pytest.mark.parametrize("fn, model_args, match", [
    ("compiled_with", '{ loss = "mse" }', r"compiled with tf_keras.src.optimizers.rmsprop.RMSprop \(compile\(\)'s "
                                          r"default optimizer is rmsprop\), which twinbench cannot rebuild"),
    ("compiled_with", '{ optimizer = "sgd", loss = "mse", loss_weights = [2.0] }',
     r"compile\(loss_weights=\[2.0\]\).*set loss_per_output and loss_weights"),
    ("compiled_with", '{ optimizer = "sgd", loss = "mse", steps_per_execution = 4 }', "set steps_per_execution"),
    ("compiled_with", '{ optimizer = "sgd", loss = "mse", jit_compile = true }', "set xla in the job"),
    ("compiled_with", '{ optimizer = "sgd", loss = "mse", weighted_metrics = ["mae"] }', "set metrics in the job"),
    ("own_loss", "", "compiled with loss my_loss, which twinbench cannot carry over exactly: compile without a loss "
                     "and set loss"),
    ("own_step", "", "overrides train_step"),
])
def test_what_cannot_be_carried_over_exactly_is_refused(tf, tmp_path, fn, model_args, match):
    lines = {"model_args": model_args} if model_args else {}
    with pytest.raises(usercode.UserCodeError, match=match):
        _from(tf, tmp_path, fn, lines)


def test_a_compiled_loss_with_settings_of_its_own_is_refused_and_the_tutorials_is_the_default(tf):
    from common.training import objective
    from common.workload.job import DEFAULT_LOSS

    losses = tf.keras.losses
    assert objective.compiled_loss("m:f", losses.SparseCategoricalCrossentropy(from_logits=True)) == DEFAULT_LOSS
    assert objective.compiled_loss("m:f", "sparse_categorical_crossentropy") == "SparseCategoricalCrossentropy"
    assert objective.compiled_loss("m:f", losses.MeanSquaredError()) == "MeanSquaredError"
    assert objective.compiled_loss("m:f", losses.mean_absolute_error) == "mean_absolute_error"
    with pytest.raises(usercode.UserCodeError, match=r"compiled with loss CategoricalCrossentropy\(.*label_smoothing"):
        objective.compiled_loss("m:f", losses.CategoricalCrossentropy(label_smoothing=0.1))
    with pytest.raises(usercode.UserCodeError, match="reduction='sum'"):
        objective.compiled_loss("m:f", losses.MeanSquaredError(reduction="sum"))


def test_a_compiled_keras3_model_is_refused(tf, tmp_path):
    from common.workload import models

    job = load_job(user_job(tmp_path, "cpk", SOURCE, {"pythonpath": '["."]', "model": '"cpk.fns:keras3"',
                                                      "keras": "3", "mode": '"ctl"'}))
    with pytest.raises(usercode.UserCodeError, match="returned a compiled Keras 3 model"):
        models.build_model(job, (6,), 3)


# -- pure Python: the recipe of a job's keys, --lr-replicas ----------------------------------------------------------
def test_a_jobs_keys_are_its_recipe_and_lr_replicas_scales_them(tmp_path):
    from common import cli
    from common.training import compiled

    job = Job(optimizer="momentum", momentum=0.8, learning_rate=0.1, lr_scaling="linear", metrics=["accuracy"])
    recipe = compiled.recipe(job, None, 4)
    assert (recipe.source, recipe.optimizer, dict(recipe.optimizer_config)) == ("job", "momentum", {"momentum": 0.8})
    assert (recipe.base_learning_rate, recipe.learning_rate, recipe.lr_replicas) == (0.1, 0.4, 4)
    assert recipe.record()["metrics"] == ["accuracy"] and recipe.record()["compiled_class"] is None
    assert compiled.recipe(dataclasses.replace(job, lr_scaling="none"), None, 4).learning_rate == 0.1
    args = cli.base_parser("p", "d").parse_args(["--lr-replicas", "2", "--results", str(tmp_path)])
    assert cli.prepare("p", args, 0.0)[1].lr_replicas == 2
    with pytest.raises(SystemExit) as e:
        cli.prepare("p", cli.base_parser("p", "d").parse_args(["--lr-replicas", "0"]), 0.0)
    assert e.value.code == 2


def test_the_runs_first_lines_and_summary_say_where_the_recipes_metrics_are_reported():
    from common.training import compiled, evaluate, train

    recipe = compiled.recipe(Job(metrics=["accuracy"]), None, 1)
    line = train.metrics_line(recipe)
    assert line is not None and "['accuracy'] (the job's): reported on the validation data only" in line
    assert "not on the training batches" in line
    assert train.metrics_line(compiled.recipe(Job(), None, 1)) is None  # no metrics: nothing to say
    last = [{"epoch": 1.0, "step": 4, "loss": 0.5, "accuracy": 0.75, "seconds": 0.1, "wall_time": 1.0}]
    # a compiled model's metrics are the recipe's: the summary line names them although the job file has none
    assert evaluate.summary_line(last, Job(), None, ["accuracy"]).endswith("loss 0.5000, accuracy 0.7500")
    assert evaluate.summary_line(last, Job(), None).endswith("loss 0.5000")


def test_a_checkpoint_resumes_only_at_the_learning_rate_it_trained_at(tmp_path):
    """--lr-replicas is no part of the job hash: a checkpoint written at another LR is refused, not mixed in."""
    import json
    import types

    from common.core.errors import UsageError
    from common.training import compiled, train
    from common.training.context import Plan, RunContext

    job = Job(name="r", lr_scaling="linear", learning_rate=0.1)
    (tmp_path / "meta.json").write_text(json.dumps({"job_hash": job.job_hash, "job_name": "r", "world_size": 1,
                                                    "step": 2, "learning_rate": 0.2}))
    backend = types.SimpleNamespace(is_chief=True, allgather=lambda x: [x], name="native",
                                    capabilities=lambda: types.SimpleNamespace(variant=None))
    opts = types.SimpleNamespace(resume_from=str(tmp_path), results_dir=str(tmp_path), verbose=False)
    ctx = RunContext(job, backend, opts, Plan(4, 2, 4, 1))  # type: ignore[arg-type]
    built = train.Built(None, None, None, compiled.recipe(job, None, 1))  # 0.1: the run's own 1 replica
    with pytest.raises(UsageError, match="trained at learning rate 0.2 and this run would train at 0.1"):
        train.find_resume(ctx, built)


# -- runs: the tutorial's compiled SGD 0.001 under lr_scaling = "linear" ------------------------------------------
TUTORIAL = str(REPO / "examples" / "tutorial_job.toml")
LINEAR = ("--set", "mode=ctl", "--set", "steps=5", "--set", "lr_scaling=linear")


def test_one_identity_one_recipe_and_lr_replicas_give_two_workers_steps(tmp_path):
    """A compiled model's run and its --diagnose breakdown carry the job file's hash and the recipe that trained
    (the compiled SGD 0.001, scaled for --lr-replicas 2); 1 worker x 2b with --lr-replicas 2 takes the same steps as
    2 workers x b (what common.check compares), with no job key the compiled model would refuse."""
    one = ("--set", "per_replica_batch_size=32", "--lr-replicas", "2")
    run(backend_cmd("native", tmp_path / "one", *LINEAR, *one, workers=1, job=TUTORIAL))
    run(backend_cmd("native", tmp_path / "two", *LINEAR, "--set", "per_replica_batch_size=16", job=TUTORIAL))
    run(backend_cmd("native", tmp_path / "diag", *LINEAR, *one, "--diagnose", "breakdown", workers=1, job=TUTORIAL))
    train, two, diag = (only_result(tmp_path / d) for d in ("one", "two", "diag"))
    assert diag["kind"] == "breakdown" and diag["job_hash"] == train["job_hash"] and diag["job"] == train["job"]
    for rec in (train, two, diag):
        recipe = rec["recipe"]
        assert recipe["source"] == "compiled" and recipe["optimizer"].endswith("legacy.gradient_descent.SGD")
        assert recipe["compiled_class"] == "tf_keras.src.optimizers.sgd.SGD", recipe
        assert (recipe["base_learning_rate"], recipe["learning_rate"], recipe["lr_replicas"]) == (0.001, 0.002, 2)
        assert (recipe["loss"], recipe["metrics"]) == ("sparse_categorical_crossentropy", ["accuracy"])
        assert rec["job"]["learning_rate"] == 0.01  # the job file's (its default): the identity, not what trained
    assert train["learning_rate"] == two["learning_rate"] == 0.002
    assert train["global_batch_size"] == two["global_batch_size"] == 32
    assert first_divergence(train["step_losses"], two["step_losses"], 1e-5) is None, \
        first_divergence(train["step_losses"], two["step_losses"], 1e-5)
    assert diag["step_losses"] == train["step_losses"]  # the breakdown trains the same math, bit for bit here
