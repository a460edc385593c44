"""Multi-output models (common/training/outputs.py, the job keys in common/workload/job.py): the keys and their
hashes, each bad input as one line naming the key (exit 2, nothing written), one user loss over the structures equal
to the same math given per output, fit = custom loop on one worker, and at 2 workers native = Horovod for
examples/stream_heads_job.toml (fit and custom loop) and for a Keras 3 model fed by an input function.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tf.keras = tf_keras before TensorFlow loads, as in every run

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from common.workload.job import Job, JobError
from tests.aids.refusals import refuse_jobs
from tests.conftest import REPO, backend_cmd, base_env, first_divergence, only_result, run, user_job
from tests.test_usercode import TF_LOG_PREFIXES

RTOL = 1e-5
PACKAGE = '''
def data(input_context, global_batch_size, labels="dict"):
    import tensorflow as tf
    n = 64
    x = tf.reshape(tf.range(n * 4, dtype=tf.float32), [n, 4]) / 100.0
    y = {"cls": tf.range(n) % 3, "reg": tf.reshape(tf.range(n, dtype=tf.float32) / n, [n, 1])}
    if labels == "cls only":
        y = {"cls": y["cls"]}
    b = input_context.get_per_replica_batch_size(global_batch_size)
    ds = tf.data.Dataset.from_tensor_slices(({"a": x, "b": x * 2}, y))
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id).batch(b, drop_remainder=True)
    return {"train": ds, "validation": ds}


def _layers(k, single=False):
    a, b = k.Input(shape=(4,), name="a"), k.Input(shape=(4,), name="b")
    h = k.layers.Dense(8, activation="relu")(k.layers.Concatenate()([a, b]))
    if single:
        return k.Model({"a": a, "b": b}, k.layers.Dense(3)(h))
    return k.Model({"a": a, "b": b}, {"cls": k.layers.Dense(3, name="cls")(h), "reg": k.layers.Dense(1, name="reg")(h)})


def model(input_shape, num_classes):
    import tensorflow as tf
    return _layers(tf.keras)


def single(input_shape, num_classes):
    import tensorflow as tf
    return _layers(tf.keras, single=True)


def keras3(input_shape, num_classes):
    import keras
    return _layers(keras)


def ce(y_true, y_pred):
    import tensorflow as tf
    return tf.keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)


def batch_mean(y_true, y_pred):  # one value per batch, not per example
    import tensorflow as tf
    return tf.reduce_mean(tf.square(y_true - y_pred))


def both(y_true, y_pred):  # one loss over the structures: the same math as loss_per_output below
    import tensorflow as tf
    mse = tf.reduce_mean(tf.square(y_true["reg"] - y_pred["reg"]), axis=-1)
    return ce(y_true["cls"], y_pred["cls"]) + 0.5 * mse
'''
PER_OUTPUT = {"loss_per_output": '{ cls = "mopkg.fns:ce", reg = "mse" }', "loss_weights": "{ reg = 0.5 }"}


pytestmark = pytest.mark.usefixtures("restore_sys_path")


def _job(tmp: Path, **keys: str) -> Path:
    values = {"pythonpath": '["."]', "model": '"mopkg.fns:model"', "dataset": '"mopkg.fns:data"', "num_classes": "3",
              "per_replica_batch_size": "8", "steps": "6", "sync_every_steps": "1", **keys}
    return user_job(tmp, "mopkg", PACKAGE, values, f"job-{len(list(tmp.glob('job-*.toml')))}.toml")


def _native(job: Path, results: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "backends.native", "--job", str(job), "--results", str(results),
                           "--quiet"], cwd=REPO, env=base_env(), capture_output=True, text=True, timeout=180)


# -- the keys (no TensorFlow) ---------------------------------------------------------------------------------
def test_the_keys_are_hashed_only_when_set():
    assert Job(loss_per_output={}, loss_weights={}).job_hash == Job().job_hash  # older hashes stay valid
    per = Job(loss_per_output={"cls": "mse", "reg": "mse"})
    assert per.job_hash != Job().job_hash
    assert Job(loss_per_output=per.loss_per_output, loss_weights={"reg": 0.5}).job_hash != per.job_hash


@pytest.mark.parametrize("kw, fragment", [
    ({"loss_weights": {"a": 1.0}}, "loss_weights applies to loss_per_output"),
    ({"loss_per_output": {"a": "mse"}, "loss": "mse"}, "loss = 'mse' and loss_per_output: give one of them"),
    ({"loss_per_output": {"a": 3}}, "loss_per_output['a'] = 3: use a tf.keras.losses name"),
    ({"loss_per_output": {"a": "mse"}, "loss_weights": {"b": 1}}, "loss_weights['b']: no such output"),
    ({"loss_per_output": {"a": "mse"}, "loss_weights": {"a": -1}}, "loss_weights['a'] must be a number >= 0"),
    ({"loss_per_output": {"a": "mse"}, "metrics": ("accuracy",)}, "metrics are computed for single-output models"),
])
def test_bad_keys_are_one_line_job_errors(kw, fragment):
    with pytest.raises(JobError) as e:
        Job(**kw)
    assert fragment in str(e.value) and "\n" not in str(e.value)


# -- bad input in the ranks: one line naming the key, exit 2, nothing written ----------------------------------
BAD_CASES = {
    "an output the model lacks": ({"loss_per_output": '{ cls = "mopkg.fns:ce", reg = "mse", aux = "mse" }'},
                                  "loss_per_output['aux']: the model has no output 'aux'"),
    "an output without a loss": ({"loss_per_output": '{ cls = "mopkg.fns:ce" }'},
                                 "loss_per_output: no loss for the model's output 'reg'"),
    "labels missing a key": ({**PER_OUTPUT, "dataset_args": '{ labels = "cls only" }'},
                             "the labels have no key 'reg' for the model's output 'reg'"),
    "a builtin loss": ({}, "loss (the default): model = 'mopkg.fns:model' has outputs ['cls', 'reg']"),
    "metrics": ({"loss": '"mopkg.fns:both"', "metrics": '["accuracy"]'},
                "metrics = ['accuracy']: model = 'mopkg.fns:model' has outputs ['cls', 'reg']"),
    "a loss per output of one output": ({**PER_OUTPUT, "model": '"mopkg.fns:single"'},
                                        "loss_per_output: model = 'mopkg.fns:single' has one output"),
    "a loss that is no per-example loss": ({"loss_per_output": '{ cls = "mopkg.fns:ce", reg = '
                                                               '"mopkg.fns:batch_mean" }'},
                                           "loss_per_output['reg'] gives shape () for 2 examples"),
}


@pytest.fixture(scope="module")
def bad_input(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict[str, Any], Path]]:
    """Every case above in one process (tests/aids/refusals.py: ``backends.native``'s ``__main__`` per case, each
    with its own job and package; they fail after TensorFlow started, in the ranks), with its results directory."""
    return refuse_jobs({case: _job(tmp_path_factory.mktemp("bad"), **keys) for case, (keys, _) in BAD_CASES.items()},
                       base_env())


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_input_is_one_line_naming_the_key_and_exit_2(bad_input, case):
    fragment = BAD_CASES[case][1]
    got, results = bad_input[case]
    ours = [ln for ln in got["stderr"].splitlines() if ln.strip() and not ln.startswith(TF_LOG_PREFIXES)]
    assert got["rc"] == 2, got["stderr"][-3000:]
    assert len(ours) == 1 and "Traceback" not in got["stderr"], ours
    assert ours[0].startswith("backends.native: error: ") and fragment in ours[0], ours[0]
    assert not results.exists() or not any(results.iterdir())


# -- one worker: the structure loss = the loss per output, fit = custom loop ------------------------------------
@pytest.fixture(scope="module")
def one_worker(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("multi1")
    runs = {f"{loss} {mode}": {**(PER_OUTPUT if loss == "per output" else {"loss": '"mopkg.fns:both"'}),
                               "mode": f'"{mode}"'} for loss in ("per output", "structure") for mode in ("fit", "ctl")}
    runs["keras3 per output ctl"] = {**PER_OUTPUT, "keras": "3", "mode": '"ctl"', "model": '"mopkg.fns:keras3"'}
    runs["keras3 structure ctl"] = {"loss": '"mopkg.fns:both"', "keras": "3", "mode": '"ctl"',
                                    "model": '"mopkg.fns:keras3"'}
    out = {}
    for name, keys in runs.items():
        results = tmp / name.replace(" ", "-")
        proc = _native(_job(tmp, **keys), results)
        assert proc.returncode == 0, f"{name}: {proc.stderr[-3000:]}"
        out[name] = only_result(results)
    return out


@pytest.mark.parametrize("loss", ["per output", "structure"])
def test_fit_equals_the_custom_loop_on_one_worker(one_worker, loss):
    fit, ctl = one_worker[f"{loss} fit"], one_worker[f"{loss} ctl"]
    assert fit["initial_weights_digest"] == ctl["initial_weights_digest"]
    assert first_divergence(fit["step_losses"], ctl["step_losses"], RTOL) is None
    assert first_divergence([e["loss"] for e in fit["evaluations"]], [e["loss"] for e in ctl["evaluations"]],
                            RTOL) is None


@pytest.mark.parametrize("family", ["", "keras3 "])
def test_one_loss_over_the_structures_is_the_loss_per_output(one_worker, family):
    """both(y, out) = ce(cls) + 0.5 mse(reg): the same numbers as loss_per_output with loss_weights."""
    per, whole = one_worker[f"{family}per output ctl"], one_worker[f"{family}structure ctl"]
    assert first_divergence(per["step_losses"], whole["step_losses"], RTOL) is None
    assert len(set(per["step_losses"])) > 1 and per["evaluations"]  # it trained, and validated


# -- two workers: native = Horovod --------------------------------------------------------------------------------
def _two_workers(tmp: Path, job: Path, *extra: str) -> dict[str, dict[str, Any]]:
    out = {}
    for kind in ("native", "horovod"):
        results = tmp / f"{kind}{'-'.join(extra).replace('=', '')}"
        run(backend_cmd(kind, results, *extra, workers=2, job=str(job)))
        out[kind] = only_result(results)
    return out


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, dict[str, Any]]]:
    """examples/stream_heads_job.toml on small records, 8 steps, both modes, both backends at 2 workers."""
    root = tmp_path_factory.mktemp("heads")
    shutil.copytree(REPO / "examples", root / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    run([sys.executable, str(root / "examples" / "streampkg" / "records.py"), str(root / "data"), "--per-shard",
         "32"])
    args = json.dumps({"data_dir": str(root / "data")})
    job = root / "examples" / "stream_heads_job.toml"
    return {mode: _two_workers(root, job, "--set", f"mode={mode}", "--set", "steps=8", "--set", "steps_per_epoch=4",
                               "--set", f"dataset_args={args}", "--set", "per_replica_batch_size=8")
            for mode in ("fit", "ctl")}


@pytest.mark.parametrize("mode", ["fit", "ctl"])
def test_example_with_a_loss_per_output_same_losses_on_both_backends(example, mode):
    native, horovod = example[mode]["native"], example[mode]["horovod"]
    assert native["job_hash"] == horovod["job_hash"] and native["job"]["loss_per_output"]
    assert first_divergence(native["step_losses"], horovod["step_losses"], RTOL) is None
    assert first_divergence([e["loss"] for e in native["evaluations"]], [e["loss"] for e in horovod["evaluations"]],
                            RTOL) is None
    assert len(native["evaluations"]) == 2


def test_example_fit_equals_the_custom_loop_at_2_workers(example):
    """Also the proof, for an input function streaming examples/streampkg's TFRecords, that tests/test_inputfn.py's
    check of the streamed example (the custom loop only) leaves here."""
    for kind in ("native", "horovod"):
        fit, ctl = example["fit"][kind], example["ctl"][kind]
        assert first_divergence(fit["step_losses"], ctl["step_losses"], RTOL) is None, kind


def test_keras3_model_fed_by_an_input_function_same_losses_on_both_backends(tmp_path):
    """Keras 3's custom loop, a two-input, two-output model, an input function sharding by its context."""
    job = _job(tmp_path, keras="3", mode='"ctl"', model='"mopkg.fns:keras3"', **PER_OUTPUT)
    runs = _two_workers(tmp_path, job)
    native, horovod = runs["native"], runs["horovod"]
    assert native["versions"].get("keras", "").startswith("3") and native["job_hash"] == horovod["job_hash"]
    assert native["input"]["pipeline"]["per_rank"][0]["fingerprint"] != \
        native["input"]["pipeline"]["per_rank"][1]["fingerprint"]  # sharded: each worker its own batches
    assert first_divergence(native["step_losses"], horovod["step_losses"], RTOL) is None
    assert len(set(native["step_losses"])) > 1
