"""A dataset function returning a ``tf.data.Dataset`` (common/workload/tfdata.py): the tutorials' shape (a batch-size
parameter, an unseeded shuffle, ``repeat()`` and ``batch()`` last) and the pipelines Horovod's scripts write
(``repeat().shuffle(n).batch(b)``, ``shard(...)``, ``take(n)``) read as one pass of their examples, each operation
said, every problem named in one refusal, the pass held once (views of a ``from_tensor_slices``' tensors), and the
real launch on both backends at 2 workers: the function runs after the backend configured TensorFlow (no
"TensorFlow started before twinbench could configure it"), the same losses and evaluations on both, the banner and
the record say what twinbench did, and no GPU-probe lines on a machine without a GPU.

TensorFlow processes: 4 in ``launched`` (native --nproc 2: a parent that never imports TensorFlow and 2 workers;
Horovod: 2 ranks under mpirun, each probing the function in a graph first), and this process; the tutorial
example's check (8 runs) runs only once ``argcheck`` accepts its functions (see the test).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from common.core import tfquiet
from common.workload import argcheck, tfdata, usercode
from common.workload.job import job_from_dict, load_job
from tests.conftest import REPO, backend_cmd, first_divergence, only_result, run, user_job

TUTORIAL_JOB = REPO / "examples" / "tutorial_job.toml"
# The tutorial's mnist_dataset(batch_size) with TensorFlow imported inside the functions (the module imports none),
# a validation split as an unbatched finite tf.data.Dataset, and what cannot be read.
SOURCE = textwrap.dedent('''
    import numpy as np

    def _arrays(n, seed):
        rng = np.random.default_rng(seed)
        y = rng.integers(0, 4, size=n)
        x = (rng.normal(size=(n, 8)) + 2.0 * y[:, None]).astype(np.float32)
        return x, y.astype(np.int64)

    def tutorial(batch_size):
        import tensorflow as tf
        train = tf.data.Dataset.from_tensor_slices(_arrays(512, 0)).shuffle(512).repeat().batch(batch_size)
        return {"train": train, "validation": tf.data.Dataset.from_tensor_slices(_arrays(96, 1))}

    def unbatched():
        import tensorflow as tf
        return tf.data.Dataset.from_tensor_slices(_arrays(64, 0))

    def arrays():
        return _arrays(64, 0)

    def horovod(batch_size):
        import tensorflow as tf
        return tf.data.Dataset.from_tensor_slices(_arrays(512, 0)).repeat().shuffle(10000).batch(batch_size)

    def _source():
        import tensorflow as tf
        return tf.data.Dataset.from_tensor_slices(_arrays(512, 0))

    def sharded():  # shard(hvd.size(), hvd.rank()) as a rank of two would call it
        return _source().shard(2, 1).shuffle(512).repeat().batch(16)

    def one_shard():
        return _source().shard(1, 0).repeat().batch(16)

    def taken():
        return _source().take(100).shuffle(100).batch(16)

    def picked():  # the shuffle below take() picks which 100 examples
        return _source().shuffle(512).take(100).batch(16)

    def batches_taken():
        return _source().batch(8).take(5).repeat()

    def length():  # Horovod's tensorflow2_mnist.py: dataset.take(steps) over the repeated stream
        return _source().repeat().shuffle(1000).batch(16).take(10)

    def mapped():
        return _source().map(lambda x, y: (2 * x, y)).shuffle(512).batch(16)

    def filtered():
        return _source().filter(lambda x, y: y < 2).batch(16)

    def shard_under_map():
        return _source().shard(2, 1).map(lambda x, y: (x, y)).batch(16)

    def shard_under_take():
        return _source().shard(2, 1).take(100).batch(16)

    def bad(batch_size):
        import tensorflow as tf
        ds = tf.data.Dataset.from_tensor_slices(_arrays(64, 0)).repeat().batch(4).map(lambda x, y: (x, y))
        return ds.repeat().batch(batch_size)

    def mlp(input_shape, num_classes):
        import tensorflow as tf
        inputs = tf.keras.Input(shape=input_shape)
        return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes)(tf.keras.layers.Dense(16)(inputs)))
''')
JOB = {"pythonpath": '["."]', "dataset": '"tfd.fns:tutorial"', "model": '"tfd.fns:mlp"', "metrics": '["accuracy"]',
       "per_replica_batch_size": "16", "steps": "8", "steps_per_epoch": "4"}


@pytest.fixture
def job_file(tmp_path, restore_sys_path, monkeypatch) -> Path:
    monkeypatch.setattr(usercode, "_WORLD", {})  # no replica count left by another test
    monkeypatch.setattr(usercode, "_MEMO", {})
    return user_job(tmp_path, "tfd", SOURCE, JOB)


# -- the loader, in this process --------------------------------------------------------------------------------
def test_the_tutorial_shape_is_one_pass_of_its_examples_with_the_global_batch(job_file):
    usercode.set_replicas(2)
    data = usercode.load_data(load_job(job_file))
    assert data.call == "tutorial(batch_size=32)"  # the global batch: 16 per replica x 2
    assert data.done[0] == ("training: shuffle(512): replaced by twinbench's seeded shuffle of the "
                            "whole pass; repeat(): removed, one pass read (twinbench repeats it); batch(32): removed "
                            "(twinbench batches); read one pass, 512 examples")
    assert data.done[1] == "validation: read one pass, 96 examples"
    x, y = _arrays(job_file, 512)
    assert np.array_equal(data.x, x) and np.array_equal(data.y, y)  # each example once, in the source's order


def _arrays(job_file: Path, n: int) -> tuple[np.ndarray, np.ndarray]:
    sys.path.insert(0, str(job_file.parent))
    from tfd import fns

    return fns._arrays(n, 0)


def _read(job_file: Path, fn: str) -> usercode.UserData:
    return usercode.load_data(load_job(job_file, [f"dataset=tfd.fns:{fn}"]))


def test_horovods_pipeline_line_is_read_as_written_and_held_once(job_file):
    """``repeat().shuffle(10000).batch(128)``: one pass, in the source's order, each operation said; the arrays
    are views of the tensors from_tensor_slices holds (no copy of the data)."""
    usercode.set_replicas(2)
    data = usercode.load_data(load_job(job_file, ["dataset=tfd.fns:horovod"]))
    assert data.done == ("training: repeat() before shuffle(): one pass read, twinbench repeats and shuffles with the "
                         "job's seed; shuffle(10000): replaced by twinbench's seeded shuffle of the whole pass; "
                         "batch(32): removed (twinbench batches); read one pass, 512 examples",)
    x, y = _arrays(job_file, 512)
    assert np.array_equal(data.x, x) and np.array_equal(data.y, y)
    tf = sys.modules["tensorflow"]
    t, labels = tf.constant(x), tf.constant(y)
    ds = tf.data.Dataset.from_tensor_slices((t, labels)).repeat().shuffle(100).batch(8)
    vx, vy, _ = tfdata.read(tf, "p.m:f", ds, "training", usercode.UserCodeError)
    assert np.shares_memory(vx, np.from_dlpack(t)) and np.shares_memory(vy, np.from_dlpack(labels))
    assert np.array_equal(vx, x) and not vx.flags.writeable


def test_shard_is_undone_or_a_no_op_and_take_kept_or_a_length(job_file):
    x, y = _arrays(job_file, 512)
    said = {fn: _read(job_file, fn) for fn in ("sharded", "one_shard", "taken", "batches_taken", "length")}
    assert said["sharded"].done[0].startswith("training: shard(2, 1): undone, every example read once (twinbench "
                                              "shards them exactly itself); shuffle(512): replaced")
    assert said["one_shard"].done[0].startswith("training: shard(1, 0): one shard, a no-op; repeat(): removed")
    for fn in ("sharded", "one_shard", "length"):  # every example, once, in the source's order
        assert np.array_equal(said[fn].x, x) and np.array_equal(said[fn].y, y), fn
    assert said["length"].done[0] == (
        "training: repeat() before shuffle(): one pass read, twinbench repeats and shuffles with the job's seed; "
        "shuffle(1000): replaced by twinbench's seeded shuffle of the whole pass; batch(16): removed (twinbench "
        "batches); take(10): the length of a repeated stream, removed (the job's steps set the run's length); read "
        "one pass, 512 examples")
    assert said["taken"].done[0] == ("training: take(100): kept, 100 examples; shuffle(100): replaced by twinbench's "
                                     "seeded shuffle of the whole pass; batch(16): removed (twinbench batches); read "
                                     "one pass, 100 examples")
    assert np.array_equal(said["taken"].x, x[:100])
    assert said["batches_taken"].done[0] == ("training: take(5): kept, 40 examples; repeat(): removed, one pass read "
                                             "(twinbench repeats it); read one pass, 40 examples")
    assert np.array_equal(said["batches_taken"].x, x[:40]) and np.array_equal(said["batches_taken"].y, y[:40])


def test_a_shuffle_under_a_kept_take_picks_the_examples_with_the_jobs_seed(job_file):
    x, _ = _arrays(job_file, 512)
    picked = _read(job_file, "picked")
    assert picked.done[0].startswith("training: shuffle(512) under take(100): kept, it picks the examples (the "
                                     "job's seed); take(100): kept, 100 examples; batch(16): removed")
    rows = {r.tobytes() for r in x}
    assert len({r.tobytes() for r in picked.x}) == 100 and {r.tobytes() for r in picked.x} <= rows
    assert not np.array_equal(picked.x, x[:100])
    usercode._MEMO.clear()  # called again: its unseeded shuffle draws the same examples (the job's seed)
    assert np.array_equal(_read(job_file, "picked").x, picked.x)


def test_a_pass_that_is_not_a_slice_of_tensors_is_read_once_into_arrays(job_file):
    """A map: allocated once from tf.data's length; a filter (length unknown): concatenated."""
    x, y = _arrays(job_file, 512)
    mapped, filtered = _read(job_file, "mapped"), _read(job_file, "filtered")
    assert np.array_equal(mapped.x, 2 * x) and np.array_equal(mapped.y, y) and mapped.x.flags.owndata
    assert np.array_equal(filtered.x, x[y < 2]) and np.array_equal(filtered.y, y[y < 2])


def test_a_shard_that_cannot_be_undone_is_refused_in_one_line(job_file):
    for fn, problem in (("shard_under_map", "is sharded (shard(2, 1) under map())"),
                        ("shard_under_take", "is sharded (shard(2, 1) under take(100): each rank would keep other "
                                             "examples)")):
        with pytest.raises(usercode.UserCodeError) as e:
            _read(job_file, fn)
        assert "\n" not in str(e.value) and problem in str(e.value), str(e.value)


def test_the_probe_graph_makes_big_arrays_placeholders_not_constants():
    """A function probed in a graph is never run there: a big numpy array becomes a placeholder (a constant copies
    it several times over); a small one stays a constant, and outside the probe constants are constants."""
    tf = tfquiet.import_tensorflow()
    big = np.zeros((tfdata.LIGHT_BYTES // 4,), np.float32)
    with tf.Graph().as_default():
        with tfdata._light_constants(tf):
            light, small = tf.constant(big), tf.constant(np.zeros(4))
            ds = tf.data.Dataset.from_tensor_slices((big, big))
        assert (light.op.type, light.shape, small.op.type) == ("Placeholder", big.shape, "Const")
        assert tfdata.is_dataset(ds)
        assert tf.constant(big).op.type == "Const"
    ok, out = tfdata.probe(lambda: tf.data.Dataset.from_tensor_slices(big), 1)
    assert (ok, out) == (False, None)


def test_a_dataset_that_cannot_be_read_names_every_problem_in_one_line(job_file):
    with pytest.raises(usercode.UserCodeError) as e:
        usercode.load_data(load_job(job_file, ["dataset=tfd.fns:bad"]))
    message = str(e.value)
    assert "\n" not in message and "after removing its last batch(16), repeat()" in message, message
    assert "is infinite and batched (batch(4) under map()) and repeated (repeat() under batch())" in message


def test_arrays_refused_for_every_problem_at_once():
    with pytest.raises(usercode.UserCodeError) as e:
        usercode._pair("p.m:f", (np.array(["a", "b"]), np.arange(3)), "training")
    assert str(e.value) == ("dataset = 'p.m:f': training features must be a numeric array with a first (sample) "
                            "dimension, got <U1 of shape (2,); and training arrays of different lengths: 2 features, "
                            "3 labels")


def test_before_tensorflow_is_configured_only_arrays_are_kept(job_file):
    """The graph probe keeps a function's arrays; a dataset, or a batch-size parameter, waits for the ranks."""
    assert usercode.load_before_tf(load_job(job_file)) is None  # batch_size: the world size is not known yet
    assert usercode.load_before_tf(load_job(job_file, ["dataset=tfd.fns:unbatched"])) is None
    data = usercode.load_before_tf(load_job(job_file, ["dataset=tfd.fns:arrays"]))
    assert data is not None and data.x.shape == (64, 8) and data.num_classes == 4
    ok, out = tfdata.probe(lambda: ([1.0], [2]), 1)
    assert ok and out == ([1.0], [2])


def test_the_gpu_probe_lines_are_dropped_and_nothing_else():
    text = ("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
            "I0000 00:00:1 1 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.\n"
            "E0000 00:00:1 1 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: (303)\n"
            "E0000 something real\n")
    assert tfquiet.keep(text) == ("WARNING: All log messages before absl::InitializeLog() is called are written to "
                                  "STDERR\nE0000 something real\n")


def test_only_a_terminal_or_a_pipe_is_tidied_a_run_log_keeps_every_line(tmp_path, monkeypatch):
    """No TensorFlow: where fd 2 points decides (the launch tests below show the lines gone through a pipe)."""
    monkeypatch.delenv("TWINBENCH_TF_NOISE", raising=False)
    monkeypatch.setattr(tfquiet, "has_gpu_node", lambda: False)
    saved = os.dup(2)
    try:
        with (tmp_path / "log").open("w") as log:
            os.dup2(log.fileno(), 2)
            as_log = tfquiet.should_filter()
        read, write = os.pipe()
        os.dup2(write, 2)
        as_pipe = tfquiet.should_filter()
        monkeypatch.setenv("TWINBENCH_TF_NOISE", "1")
        kept = tfquiet.should_filter()
        os.close(read)
        os.close(write)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    assert (as_log, as_pipe, kept) == (False, True, False)
    monkeypatch.setattr(tfquiet, "has_gpu_node", lambda: True)  # a GPU's failed cuInit is a real error
    assert not tfquiet.should_filter()


# -- through a real launch, both backends at 2 workers ------------------------------------------------------------
@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> dict[str, tuple[dict[str, Any], subprocess.CompletedProcess[str]]]:
    """Native with the batch size left to twinbench (the function waits for the ranks: it needs the world size);
    Horovod with ``dataset_args = { batch_size = 32 }`` (the function is probed in a graph before TensorFlow is
    configured, returns a dataset, and is called again in the ranks): the two ways a dataset reaches the ranks."""
    tmp = tmp_path_factory.mktemp("tfdata")
    jobs = {"native": user_job(tmp, "tfd", SOURCE, JOB, "implicit.toml"),
            "horovod": user_job(tmp, "tfd", SOURCE, {**JOB, "dataset_args": "{ batch_size = 32 }"}, "given.toml")}
    got = {}
    for kind, job in jobs.items():
        out = tmp / f"r-{kind}"
        cmd = [c for c in backend_cmd(kind, out, job=str(job)) if c != "--quiet"]  # the banner
        proc = run(cmd)
        got[kind] = only_result(out), proc
    return got


def test_a_tf_data_function_runs_on_both_backends_to_the_same_losses(launched):
    nat, hvd = launched["native"][0], launched["horovod"][0]
    assert nat["world_size"] == hvd["world_size"] == 2 and nat["global_batch_size"] == 32
    assert nat["job"]["dataset_args"] == {} and hvd["job"]["dataset_args"] == {"batch_size": 32}
    assert nat["initial_weights_digest"] == hvd["initial_weights_digest"]
    msg = first_divergence(nat["step_losses"], hvd["step_losses"], 1e-5)  # two jobs (dataset_args), the same data
    assert msg is None, msg
    assert [e["step"] for e in nat["evaluations"]] == [e["step"] for e in hvd["evaluations"]] == [4, 8]
    for a, b in zip(nat["evaluations"], hvd["evaluations"], strict=True):
        assert abs(a["accuracy"] - b["accuracy"]) <= 1e-6 and abs(a["loss"] - b["loss"]) <= 1e-5 * a["loss"]


@pytest.mark.parametrize("kind, given", [("native", " (batch_size = the global batch, 16 per replica x 2)"),
                                         ("horovod", "")])
def test_the_banner_says_what_twinbench_did_once_and_no_gpu_probe_lines(launched, kind, given):
    proc = launched[kind][1]
    text = proc.stdout + proc.stderr
    line = (f"[twinbench] dataset: tutorial(batch_size=32){given}: training: shuffle(512): replaced by twinbench's "
            "seeded shuffle of the whole pass; repeat(): removed, one pass read (twinbench repeats it); batch(32): "
            "removed (twinbench batches); read one pass, 512 examples; validation: read one pass, 96 examples")
    assert text.count(line) == 1, text[-3000:]
    said = launched[kind][0]["input"]["dataset"]  # and the record says it
    assert said["call"] == "tutorial(batch_size=32)" and said["done"][0].startswith("training: shuffle(512): replaced")
    if not tfquiet.has_gpu_node():
        assert "Could not find cuda drivers" not in text and "cuInit" not in text, text[-3000:]


# -- the tutorial example -------------------------------------------------------------------------------------------
def test_check_passes_on_the_tutorial_example(tmp_path, restore_sys_path):
    """common.check on the tutorial's mnist_setup.py as written (a batched, repeated dataset function taking the batch
    size; a model function without arguments that compiles SGD(learning_rate=0.001)), with a job file alone: both
    backends at 1 and 2 workers, fit and the custom loop, agree; every run trained at the compiled learning rate."""
    assert argcheck.problems(load_job(TUTORIAL_JOB)) == []
    from tests.test_check import _check

    proc = _check("--job", str(TUTORIAL_JOB), "--steps", "6", "--results", str(tmp_path), timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "pairs agree to 1e-05" in proc.stdout, proc.stdout
    records = [json.loads(f.read_text()) for f in tmp_path.glob("*/*.json")]
    assert len(records) == 8, [r.get("backend") for r in records]
    for rec in records:  # what the tutorial compiled, not twinbench's defaults (momentum, learning_rate 0.01)
        compiled = rec["compiled"]
        assert rec["learning_rate"] == compiled["learning_rate"] == pytest.approx(0.001), compiled
        assert compiled["optimizer"]["class"].endswith("optimizers.legacy.gradient_descent.SGD"), compiled
        assert compiled["optimizer"]["compiled_class"] == "tf_keras.src.optimizers.sgd.SGD"
        assert compiled["optimizer"]["config"]["momentum"] == 0 and compiled["schedule"] is None
        assert (compiled["loss"], compiled["metrics"]) == ("sparse_categorical_crossentropy", ["accuracy"])
        assert job_from_dict(rec["job"]).job_hash == rec["job_hash"]  # the job's identity is the file's, as loaded

