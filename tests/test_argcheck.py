"""Mistakes caught before the queue (common.workload.argcheck): the job's ``*_args`` against the user functions'
parameters read from their source (nothing imported), builtin optimizers' arguments, and the job's paths; refused by
``common.sweep submit`` (dry run too) and ``common.check`` in one line, exit 2, naming the key. No TensorFlow, except
the one test that compares the builtin optimizers' table with the installed Keras."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from common import check
from common.sweep import cli as sweep_cli
from common.workload import argcheck
from common.workload.job import load_job
from tests.conftest import REPO, user_job

SOURCE = '''
import functools


def build(input_shape, num_classes, width=32, blocks=2):
    return None


def needs(input_shape, num_classes, width):
    return None


def anything(input_shape, num_classes, **kwargs):
    return None


def one_positional(input_shape):
    return None


def star(*args, **kwargs):
    return None


def stream(input_context, global_batch_size, data_dir, shuffle=8):
    return None


def load(seed=0, samples=64):
    return None


def loss(y_true, y_pred):
    return None


def bad_loss(y):
    return None


def sched(learning_rate, decay_steps, floor=0.0):
    return None


def opt(learning_rate, *, weight_decay=0.01):
    return None


@functools.lru_cache
def wrapped(input_shape, num_classes):
    return None


from os.path import join as joined  # noqa
aliased = build


class Model:
    def __init__(self, input_shape, num_classes, depth=3):
        pass
'''


@pytest.fixture
def job_at(tmp_path, restore_sys_path):
    """A job on the package ``argpkg`` (module ``fns`` = SOURCE) with these keys (TOML text)."""
    def make(**keys: str) -> Path:
        values = {"pythonpath": '["."]', "model": '"argpkg.fns:build"', "dataset": '"argpkg.fns:load"',
                  "num_classes": "3", **keys}
        return user_job(tmp_path, "argpkg", SOURCE, values)
    return make


def problems(path: Path) -> list[str]:
    return argcheck.problems(load_job(path))


def test_the_parameters_are_read_from_the_source_without_importing(job_at):
    load_job(job_at())
    params = argcheck.source_params("model", "argpkg.fns:build")
    assert params.positional == ("input_shape", "num_classes", "width", "blocks") and not params.var_kwargs
    assert params.required == {"input_shape", "num_classes"}
    assert argcheck.source_params("model", "argpkg.fns:Model").positional == ("input_shape", "num_classes", "depth")
    assert "argpkg.fns" not in sys.modules
    # shown plainly or not at all: decorated, assigned, imported names are not checked (no refusal without certainty)
    for name in ("wrapped", "aliased", "joined"):
        assert argcheck.source_params("model", f"argpkg.fns:{name}") is None, name


@pytest.mark.parametrize("keys, fragment", [
    ({"model_args": "{ dimm = 64 }"}, "model_args: 'dimm' is not a parameter of argpkg.fns:build: "
                                      "build(input_shape, num_classes, width, blocks)"),
    ({"model": '"argpkg.fns:needs"'}, "model_args: argpkg.fns:needs needs 'width' (no default)"),
    ({"model": '"argpkg.fns:one_positional"'}, "takes 1 positional argument(s), twinbench passes 2 (input_shape, "
                                               "num_classes)"),
    ({"model_args": "{ num_classes = 4 }"}, "model_args: 'num_classes' is already passed"),
    ({"model": '"argpkg.fns:buildd"'}, "model = 'argpkg.fns:buildd': module 'argpkg.fns'"),
    ({"dataset_args": "{ sead = 1 }"}, "dataset_args: 'sead' is not a parameter of argpkg.fns:load (did you mean "
                                       "'seed'?)"),
    ({"dataset": '"argpkg.fns:stream"'}, "dataset_args: argpkg.fns:stream needs 'data_dir' (no default)"),
    ({"loss": '"argpkg.fns:bad_loss"'}, "loss = 'argpkg.fns:bad_loss': bad_loss(y) takes 1 positional"),
    ({"lr_schedule": '"argpkg.fns:sched"', "lr_schedule_args": "{ flor = 0.1 }"}, "lr_schedule_args: 'flor'"),
    ({"optimizer": '"argpkg.fns:opt"', "optimizer_args": "{ weight_decy = 0.1 }"},
     "optimizer_args: 'weight_decy' is not a parameter of argpkg.fns:opt (did you mean 'weight_decay'?)"),
    ({"optimizer": '"adam"', "optimizer_args": "{ beta1 = 0.8 }"},
     "optimizer_args: 'beta1' is not an argument of the adam optimizer (keras = 2) (did you mean 'beta_1'?)"),
])
def test_a_call_the_function_would_refuse_is_one_line_naming_the_key(job_at, keys, fragment):
    try:
        found = problems(job_at(**keys))
    except argcheck.usercode.UserCodeError as e:  # a missing function: load_job finds the module, argcheck the name
        found = [str(e)]
    assert found and fragment in found[0], found


@pytest.mark.parametrize("keys", [
    {"model_args": "{ width = 8, blocks = 1 }"},
    {"model": '"argpkg.fns:anything"', "model_args": "{ whatever = 1, dimm = 64 }"},  # **kwargs accepts anything
    {"model": '"argpkg.fns:star"', "model_args": "{ x = 1 }"},
    {"model": '"argpkg.fns:wrapped"', "model_args": "{ nope = 1 }"},  # not shown plainly: not checked
    {"model": '"argpkg.fns:Model"', "model_args": "{ depth = 1 }"},
    {"dataset": '"argpkg.fns:stream"', "dataset_args": '{ data_dir = "/tmp" }'},  # global_batch_size: twinbench's
    {"loss": '"argpkg.fns:loss"', "optimizer": '"argpkg.fns:opt"', "lr_schedule": '"argpkg.fns:sched"'},
    {"optimizer": '"adamw"', "optimizer_args": "{ weight_decay = 0.01, clipnorm = 1.0 }"},
])
def test_calls_the_function_takes_pass(job_at, keys):
    assert problems(job_at(**keys)) == []


def test_the_shipped_jobs_and_examples_pass():
    """No false refusal on what the repository ships (their data is not here: paths are not asked)."""
    jobs = sorted([*(REPO / "examples").glob("*.toml"), *(REPO / "jobs").glob("*.toml")])
    assert len(jobs) >= 8
    saved = list(sys.path)
    try:
        for path in jobs:
            assert argcheck.problems(load_job(path)) == [], path
    finally:
        sys.path[:] = saved


def test_missing_paths_data_dir_path_like_args_and_globs(tmp_path, job_at):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a-0.tfrecord").write_text("")
    job = load_job(job_at(dataset='"argpkg.fns:stream"', dataset_args=f'{{ data_dir = "{tmp_path}/nope" }}'))
    assert argcheck.missing_paths(job, tmp_path) == [
        f"dataset_args.data_dir = '{tmp_path}/nope': '{tmp_path}/nope' does not exist here"]
    job = load_job(job_at(dataset='"argpkg.fns:anything"',
                          dataset_args='{ data_dir = "data", files = ["./data/a-*.tfrecord", "data/b-*"], '
                                       'name = "a/b", mode = "./x" }'))
    assert argcheck.missing_paths(job, tmp_path) == [
        f"dataset_args.files = 'data/b-*': no file matches '{tmp_path}/data/b-*' here",
        f"dataset_args.mode = './x': '{tmp_path}/x' does not exist here"]  # "a/b" under a plain key: not a path
    assert argcheck.missing_paths(load_job(job_at(data_dir='"data"')), tmp_path) == []
    assert "data_dir = 'gone'" in argcheck.missing_paths(load_job(job_at(data_dir='"gone"')), tmp_path)[0]


def _sweep(job: Path, tmp_path: Path, *extra: str) -> int:
    argv = ["submit", "--job", str(job), "--sizes", "1,2", "--gres-per-node", "2", "--results", str(tmp_path / "sw"),
            "--dry-run", *extra]
    try:
        return sweep_cli.main(argv)
    except SystemExit as e:
        return int(e.code)


def test_sweep_dry_run_refuses_a_misspelt_argument_and_a_missing_directory(job_at, tmp_path, capsys):
    assert _sweep(job_at(model_args="{ dimm = 64 }"), tmp_path) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("common.sweep: error: model_args: 'dimm' is not a parameter"), err
    stream = job_at(dataset='"argpkg.fns:stream"', dataset_args=f'{{ data_dir = "{tmp_path}/missing" }}')
    assert _sweep(stream, tmp_path) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "dataset_args.data_dir" in err[0] and "does not exist here" in err[0], err
    assert err[0].endswith("(or pass --skip-data-check if the data is only visible on compute nodes)"), err
    assert not (tmp_path / "sw").exists()
    # the data only on the compute nodes: --skip-data-check leaves the paths to them, the arguments are still checked
    assert _sweep(stream, tmp_path, "--skip-data-check") == 0
    assert _sweep(job_at(model_args="{ dimm = 64 }"), tmp_path, "--skip-data-check") == 2


def test_check_refuses_before_any_run(job_at, capsys, monkeypatch):
    monkeypatch.setattr(check, "run_one", lambda *a: pytest.fail("a run started"))
    with pytest.raises(SystemExit) as e:
        check.main(["--job", str(job_at(model_args="{ dimm = 64 }"))])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "model_args: 'dimm'" in err[0], err


def test_the_builtin_optimizers_table_is_the_installed_keras(monkeypatch):
    """What each builtin's constructor takes, as the installed tf_keras (legacy) and Keras 3 declare it."""
    import inspect

    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    import keras
    import tensorflow as tf

    from common.training.legacy_adamw import adamw_class

    legacy = tf.keras.optimizers.legacy
    ctors = {(2, "sgd"): legacy.SGD, (2, "adam"): legacy.Adam, (2, "adamw"): adamw_class(),
             (3, "sgd"): keras.optimizers.SGD, (3, "adam"): keras.optimizers.Adam,
             (3, "adamw"): keras.optimizers.AdamW}
    base = {2: argcheck._LEGACY_BASE, 3: argcheck._KERAS3_BASE}
    for (family, name), ctor in ctors.items():
        declared = {p for p, v in inspect.signature(ctor.__init__).parameters.items()
                    if v.kind is not v.VAR_KEYWORD} - {"self", "learning_rate"}
        assert argcheck.BUILTIN_OPTIMIZER_ARGS[(family, name)] == declared | base[family], (family, name)
