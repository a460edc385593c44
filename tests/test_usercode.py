"""Your model, your data, your loss: the job keys, the code digest in the job hash, pythonpath,
the user's arrays, and bad input through the real CLI (one line naming the key, exit 2, nothing written).

Everything here is one process; the parity of the example on both backends is in tests/test_usercode_parity.py.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # legacy Keras 2 before TensorFlow loads

import json
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from common.workload import data as data_mod
from common.workload import usercode
from common.workload.job import DEFAULT_LOSS, Job, JobError, job_from_dict, load_job
from tests.aids.refusals import refuse_jobs
from tests.conftest import REPO, base_env

EXAMPLES = REPO / "examples"
MY_JOB = EXAMPLES / "my_job.toml"
MY_REGRESSION = EXAMPLES / "my_regression.toml"
# The shipped jobs' hashes before these keys existed (recorded when the work started): they must never change.
BUILTIN_HASHES = {"smoke": "a322b69b10eb7a0f", "cnn_fashion_mnist": "91655e5697be1621",
                  "resnet50_cifar10": "806e2acd62ac4edb", "resnet50_imagenet": "6fd84e1cd7ca28b3",
                  "resnet56_cifar10": "079a9c18b59bf6a6"}


pytestmark = pytest.mark.usefixtures("restore_sys_path")  # load_job moves sys.path


def copy_examples(dest: Path) -> Path:
    """A copy of examples/ (job files and package) under ``dest``; returns the copied my_job.toml."""
    shutil.copytree(EXAMPLES, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest / "my_job.toml"


# -- job keys and identity ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(BUILTIN_HASHES))
def test_builtin_job_hashes_unchanged(name):
    job = load_job(REPO / "jobs" / f"{name}.toml")
    assert job.code_digest == "" and job.pythonpath == ()
    assert job.job_hash == BUILTIN_HASHES[name]


def test_example_job_keys():
    job = load_job(MY_JOB)
    assert (job.model, job.dataset, job.loss) == ("mypkg.model:build", "mypkg.data:load",
                                                  "mypkg.losses:label_smoothed_ce")
    assert job.model_args == {"hidden": [32, 32]} and job.dataset_args["classes"] == 4
    assert job.metrics == ("accuracy",)
    assert job.pythonpath == (str(EXAMPLES),)  # resolved against the job file's directory
    assert len(job.code_digest) == 16
    assert job.num_classes == 0  # not set: inferred from the labels
    assert sys.path[0] == str(EXAMPLES)


def test_new_keys_hashed_only_when_not_at_their_default():
    base = Job()
    assert Job(loss=DEFAULT_LOSS, metrics=(), eval_every_epochs=1, target_metric="", target_value=0.0,
               model_args={}, dataset_args={}, code_digest="").job_hash == base.job_hash
    assert Job(pythonpath=("/somewhere",)).job_hash == base.job_hash  # where the code lies is not the job
    for kw in ({"loss": "mse"}, {"metrics": ("accuracy",)}, {"eval_every_epochs": 2},
               {"metrics": ("accuracy",), "target_metric": "accuracy", "target_value": 0.9},
               {"code_digest": "0123456789abcdef"}):
        assert Job(**kw).job_hash != base.job_hash, kw


def test_pythonpath_relative_to_the_job_file_from_another_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # neither the repository nor examples/
    job = load_job(MY_JOB)
    assert job.pythonpath == (str(EXAMPLES),)
    monkeypatch.chdir(REPO / "docs")
    again = load_job("../examples/my_job.toml")  # a relative job path: resolved against this cwd, then its dir
    assert again.pythonpath == (str(EXAMPLES),) and again.job_hash == job.job_hash
    assert data_mod.dataset_info(again)[:2] == (1024, (16,))  # the module is found from here


def test_editing_the_users_code_changes_the_hash_and_moving_it_does_not(tmp_path):
    here = load_job(MY_JOB)
    moved = load_job(copy_examples(tmp_path / "a"))
    assert moved.pythonpath == (str(tmp_path / "a"),)
    assert moved.job_hash == here.job_hash  # same code elsewhere: same job
    model_py = tmp_path / "a" / "mypkg" / "model.py"
    model_py.write_text(model_py.read_text().replace('activation: str = "relu"', 'activation: str = "tanh"'))
    edited = load_job(tmp_path / "a" / "my_job.toml")
    assert edited.code_digest != here.code_digest and edited.job_hash != here.job_hash
    # a helper module of the same package counts too (the model may import it)
    helper = tmp_path / "a" / "mypkg" / "layers.py"
    helper.write_text("WIDTH = 3\n")
    assert load_job(tmp_path / "a" / "my_job.toml").job_hash not in (edited.job_hash, here.job_hash)
    # arguments are part of the job
    assert load_job(MY_JOB, ['model_args={"hidden": [8]}']).job_hash != here.job_hash
    assert load_job(MY_JOB, ['dataset_args={"seed": 8}']).job_hash != here.job_hash


def test_results_job_dict_loads_where_the_code_is_not(tmp_path):
    job = load_job(copy_examples(tmp_path / "gone"))
    record_job = json.loads(json.dumps(job.to_dict()))  # as the results JSON holds it
    shutil.rmtree(tmp_path / "gone")
    again = job_from_dict(record_job)
    assert again == job and again.job_hash == job.job_hash


def test_set_new_keys(tmp_path, monkeypatch):
    (tmp_path / "lib" / "pk").mkdir(parents=True)
    (tmp_path / "lib" / "pk" / "__init__.py").write_text("")
    (tmp_path / "lib" / "pk" / "m.py").write_text("def model(s, n):\n    pass\n\ndef data():\n    pass\n")
    (tmp_path / "other").mkdir()
    monkeypatch.chdir(tmp_path)
    job = load_job(None, ["model=pk.m:model", 'model_args={"width": 3, "names": ["a"]}', "dataset=pk.m:data",
                          "dataset_args={}", "loss=mse", "metrics=accuracy, mae", "pythonpath=lib,other",
                          "eval_every_epochs=2", "target_metric=mae", "target_value=0.5"])
    assert job.model_args == {"width": 3, "names": ["a"]} and job.dataset_args == {}
    assert job.metrics == ("accuracy", "mae") and job.loss == "mse"
    assert job.pythonpath == (str(tmp_path / "lib"), str(tmp_path / "other"))
    assert (job.eval_every_epochs, job.target_metric, job.target_value) == (2, "mae", 0.5)
    assert len(job.code_digest) == 16


@pytest.mark.parametrize("sets, fragment", [
    (["model=pkg.mod:"], "expected \"package.module:function\""),
    (["dataset=:fn"], "expected \"package.module:function\""),
    (["loss=not a loss"], "use a tf.keras.losses name"),
    (['model_args={"w": 1}'], "model_args applies to a user model"),
    (["model_args=[1]"], "expected a table"),
    (["model_args={bad json"], "expected a table"),
    (["metrics=accuracy,accuracy"], "metrics lists a name twice"),
    (["target_metric=auc"], "use \"loss\" or one of metrics"),
    (["eval_every_epochs=0"], "eval_every_epochs must be >= 1"),
    (["code_digest=abc"], "computed by twinbench"),
    (["num_classes=0"], "num_classes must be >= 2"),
    (["model=pk.m:f", "weight_decay=0.1", "pythonpath=."], "weight_decay applies to builtin models"),
])
def test_bad_new_keys_are_one_line_job_errors(sets, fragment):
    with pytest.raises(JobError) as e:
        load_job(None, sets)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_code_digest_cannot_be_set_in_a_job_file(tmp_path):
    (tmp_path / "j.toml").write_text('code_digest = "0123456789abcdef"\n')
    with pytest.raises(JobError, match="computed by twinbench"):
        load_job(tmp_path / "j.toml")


# -- the user's data ------------------------------------------------------------------------------------------
def test_user_arrays_validation_split_and_classes():
    job = load_job(MY_JOB)
    n, shape, classes = data_mod.dataset_info(job)
    assert (n, shape, classes) == (1024, (16,), 4)
    vx, vy = data_mod.validation_arrays(job)
    assert vx.shape == (256, 16) and vx.dtype == np.float32 and vy.shape == (256,)
    assert sorted(data_mod.label_sample(job).tolist()) == [0, 3]  # the smallest and the largest label
    assert data_mod.validation_arrays(load_job(REPO / "jobs" / "smoke.toml")) is None  # builtin: none
    regression = load_job(MY_REGRESSION)
    n, shape, classes = data_mod.dataset_info(regression)
    assert (n, shape, classes) == (1024, (8,), None)  # float targets: no classes
    assert data_mod.validation_arrays(regression)[1].dtype == np.float32


def test_explicit_num_classes_is_checked_against_the_labels():
    job = load_job(MY_JOB, ["num_classes=6"])
    assert data_mod.dataset_info(job)[2] == 6  # set explicitly: the job's value, not max(label) + 1
    with pytest.raises(usercode.UserCodeError, match=r"labels out of range for num_classes = 3: found 0..3"):
        data_mod.dataset_info(load_job(MY_JOB, ["num_classes=3"]))


def test_tf_dataset_is_materialised_and_loss_checks(tmp_path):
    """One TensorFlow start for the checks that need it in process: tf.data input, and the loss vs the output."""
    tf = pytest.importorskip("tensorflow")
    from common.training import objective

    pkg = tmp_path / "tfdmat"  # a name no other test of the worker imports (sys.modules keeps packages)
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "d.py").write_text(textwrap.dedent("""
        import numpy as np
        import tensorflow as tf
        X = np.arange(40, dtype=np.float32).reshape(20, 2)
        Y = np.arange(20, dtype=np.int64) % 3
        def plain():
            return {"train": tf.data.Dataset.from_tensor_slices((X, Y)), "validation": (X[:4], Y[:4])}
        def batched():
            return tf.data.Dataset.from_tensor_slices((X, Y)).batch(4)
        def endless():
            return tf.data.Dataset.from_tensor_slices((X, Y)).repeat()
        def mapped():
            return tf.data.Dataset.from_tensor_slices((X, Y)).repeat().batch(4).map(lambda x, y: (x, y))
    """))
    (tmp_path / "j.toml").write_text('pythonpath = ["."]\ndataset = "tfdmat.d:plain"\n')
    job = load_job(tmp_path / "j.toml")
    data = usercode.load_data(job)
    assert data.x.shape == (20, 2) and (data.y == np.arange(20) % 3).all() and data.num_classes == 3
    for fn in ("batched", "endless"):  # their last batch() / repeat() removed: one pass of the 20 examples
        assert usercode.load_data(load_job(tmp_path / "j.toml", [f"dataset=tfdmat.d:{fn}"])).x.shape == (20, 2)
    with pytest.raises(usercode.UserCodeError, match=r"is infinite and batched \(batch\(4\) under map\(\)\)"):
        usercode.load_data(load_job(tmp_path / "j.toml", ["dataset=tfdmat.d:mapped"]))
    # the loss against the model's output: one value per example, or one line naming the key
    mse = Job(loss="mse")
    objective.check_loss_takes(mse, (None, 1), np.zeros((2, 1), np.float32), None)
    with pytest.raises(usercode.UserCodeError, match=r"give the labels shape \(N, 1\)"):
        objective.check_loss_takes(mse, (None, 1), np.zeros(2, np.float32), None)
    with pytest.raises(usercode.UserCodeError, match="not a tf.keras.losses name"):
        objective.per_example_loss(Job(loss="nosuchloss"))
    assert tf.is_tensor(objective.per_example_loss(Job(loss="MeanSquaredError"))(tf.zeros((3, 1)), tf.ones((3, 1))))


# -- bad input through the real CLI ---------------------------------------------------------------------------
BAD_PACKAGE = """
import numpy as np

def data(n=64):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 4)).astype(np.float32), rng.integers(0, 3, size=n).astype(np.int32)

def short():
    x, y = data()
    return x, y[:-1]

def floats():
    x, _ = data()
    return x, x[:, 0]

def boom():
    raise RuntimeError("no data today\\nsecond line")

def model(input_shape, num_classes):
    import tensorflow as tf
    return tf.keras.Sequential([tf.keras.Input(input_shape), tf.keras.layers.Dense(num_classes)])

def model_one_output(input_shape, num_classes):
    import tensorflow as tf
    return tf.keras.Sequential([tf.keras.Input(input_shape), tf.keras.layers.Dense(1)])

def model_boom(input_shape, num_classes):
    raise ValueError("bad width")

def model_keras3(input_shape, num_classes):
    import keras
    return keras.Sequential([keras.Input(input_shape), keras.layers.Dense(num_classes)])

def model_compiled(*, loss_only=False):
    import tensorflow as tf
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)])
    if loss_only:  # compile()'s default optimizer: rmsprop
        model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    else:
        model.compile(optimizer=tf.keras.optimizers.SGD(learning_rate=0.001), loss="mse")
    return model
"""

# case -> (job file lines, the key the error names, a fragment of the message); from model_raises on they
# need TensorFlow
BAD_CASES = {
    "no_module": ('model = "nopkg.m:build"', "model", "module 'nopkg' not found"),
    "no_function": ('model = "pkg.things:nosuch"', "model", "has no function 'nosuch'"),
    "import_fails": ('model = "pkg.broken:build"', "model", "No module named 'nonexistent_dependency_xyz'"),
    "dataset_raises": ('dataset = "pkg.things:boom"', "dataset", "raised RuntimeError: no data today"),
    "different_lengths": ('dataset = "pkg.things:short"', "dataset", "arrays of different lengths: 64 features, 63"),
    "labels_out_of_range": ("num_classes = 2", "num_classes", "labels out of range for num_classes = 2"),
    "no_pythonpath_dir": ('pythonpath = ["nowhere"]', "pythonpath", "'nowhere' is not a directory"),
    "model_raises": ('model = "pkg.things:model_boom"', "model", "raised ValueError: bad width"),
    "output_vs_loss": ('model = "pkg.things:model_one_output"', "loss", "1 logit(s) per example, fewer than "
                       "num_classes = 3"),
    "keras3": ('model = "pkg.things:model_keras3"', "model", "returned a Keras 3 model"),
    "builtin_model_without_classes": ('dataset = "pkg.things:floats"\nmodel = "mlp"', "model",
                                      "its labels are not integers, so set num_classes"),
    # a compiled model (common/training/compiled.py): a job key set to the default value still contradicts it
    "compiled_vs_job_key": ('model = "pkg.things:model_compiled"\nlearning_rate = 0.01', "learning_rate",
                            "learning_rate = 0.01 in the job, but model = 'pkg.things:model_compiled' compiled "
                            "learning_rate 0.001"),
    "compiled_default_rmsprop": ('model = "pkg.things:model_compiled"\nmodel_args = { loss_only = true }', "model",
                                 "(compile()'s default optimizer is rmsprop), which twinbench cannot rebuild"),
}
TF_LOG_PREFIXES = ("I0000", "W0000", "E0000", "WARNING: All log messages")  # TensorFlow's own start-up lines


def _bad_job(tmp: Path, line: str) -> Path:
    (tmp / "pkg").mkdir(exist_ok=True)
    (tmp / "pkg" / "__init__.py").write_text("")
    (tmp / "pkg" / "things.py").write_text(BAD_PACKAGE)
    (tmp / "pkg" / "broken.py").write_text("import nonexistent_dependency_xyz\n")
    keys = {"pythonpath": '["."]', "model": '"pkg.things:model"', "dataset": '"pkg.things:data"'}
    for one in line.splitlines():
        keys[one.split("=")[0].strip()] = one.split("=", 1)[1].strip()
    job = tmp / "bad.toml"
    job.write_text("steps = 3\nper_replica_batch_size = 8\n" + "".join(f"{k} = {v}\n" for k, v in keys.items()))
    return job


@pytest.fixture(scope="module")
def bad_input(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict[str, Any], Path]]:
    """Every case above in one process (tests/aids/refusals.py: ``backends.native``'s ``__main__`` per case, each
    with its own job and package ``pkg``, dropped between cases), with its results directory."""
    return refuse_jobs({case: _bad_job(tmp_path_factory.mktemp("bad"), line)
                        for case, (line, _, _) in BAD_CASES.items()}, base_env())


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_user_code_is_one_line_naming_the_key_and_exit_2(bad_input, case):
    _, key, fragment = BAD_CASES[case]
    got, results = bad_input[case]
    ours = [ln for ln in got["stderr"].splitlines() if ln.strip() and not ln.startswith(TF_LOG_PREFIXES)]
    assert got["rc"] == 2, got["stderr"][-3000:]
    assert len(ours) == 1, ours
    assert ours[0].startswith("backends.native: error: ") and "Traceback" not in got["stderr"]
    assert any(f"{key}{sep}" in ours[0] for sep in (" = ", " entry", " '")) or f"for {key}" in ours[0], ours[0]
    assert fragment in ours[0], ours[0]
    assert not results.exists() or not any(results.iterdir())  # nothing written
