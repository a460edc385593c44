"""Input functions (``dataset = "pkg.mod:fn"`` whose first parameter is ``input_context``): detected without
calling them, never called where a job is checked or a sweep submitted, the same context on both backends, bad
input as one line naming the key (exit 2, nothing written), and the streamed example (examples/streampkg: its
own TFRecords, a two-input model) checked by ``python -m common.check`` in the custom loop: native = Horovod at 1
and 2 workers, the same data fingerprints; the check's data comparison and its unsharded warning on made-up records.

The streamed example in Keras fit is proven by runs other files make: native = Horovod at 2 workers with the same
losses, validation numbers and per-worker files (tests/test_slurm.py::test_srun_runs_the_users_own_job_on_both_backends
[stream_job]: the job's own mode, fit, under srun and horovodrun), and fit = custom loop at 2 workers on both backends
for an input function streaming these TFRecords (tests/test_multioutput.py::
test_example_fit_equals_the_custom_loop_at_2_workers: streampkg's two-output pipeline).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # legacy Keras 2 before TensorFlow loads

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from common import check
from common.core.errors import EXIT_PREEMPTED
from common.workload import data as data_mod
from common.workload import inputfn
from common.workload.job import Job, JobError, load_job
from tests.aids.refusals import refuse_jobs
from tests.conftest import REPO, base_env, only_result, signal_env, user_job
from tests.test_check import _check as check_command
from tests.test_usercode import TF_LOG_PREFIXES

EXAMPLES = REPO / "examples"
STREAM_JOB = EXAMPLES / "stream_job.toml"
# Functions for the bad-input cases; each call leaves a marker file (the login-node tests look for it).
BAD_PACKAGE = '''
import os
from pathlib import Path


def _mark():
    marker = os.environ.get("INPUTFN_MARKER")
    if marker:
        Path(marker).write_text("called")


def _pairs(tf, n=64):
    x = tf.reshape(tf.range(n * 4, dtype=tf.float32), [n, 4]) / 100.0
    return tf.data.Dataset.from_tensor_slices((x, tf.range(n) % 3))


def good(input_context, global_batch_size):
    import tensorflow as tf
    _mark()
    b = input_context.get_per_replica_batch_size(global_batch_size)
    ds = _pairs(tf).shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds.batch(b, drop_remainder=True)


def unbatched(input_context):
    import tensorflow as tf
    return _pairs(tf).shard(input_context.num_input_pipelines, input_context.input_pipeline_id)


def not_a_dataset(input_context):
    return [1, 2, 3]


def raises(input_context):
    raise RuntimeError("the disk is on fire\\nsecond line")


def infinite(input_context, global_batch_size):
    import tensorflow as tf
    return _pairs(tf).repeat().batch(input_context.get_per_replica_batch_size(global_batch_size))


def no_files(input_context, global_batch_size):
    return {"train": good(input_context, global_batch_size), "files": []}


def strings(input_context):
    import tensorflow as tf
    return tf.data.Dataset.from_tensor_slices((["a", "b"], [0, 1])).batch(8)


def named(input_context, global_batch_size):
    import tensorflow as tf
    ds = good(input_context, global_batch_size)
    return ds.map(lambda x, y: ({"a": x, "b": x}, y))


def shuffled(input_context, global_batch_size):
    import tensorflow as tf
    b = input_context.get_per_replica_batch_size(global_batch_size)
    ds = _pairs(tf).shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds.shuffle(64, seed=3).batch(b, drop_remainder=True)  # a new order every pass


def per_backend(input_context, global_batch_size):
    # neither sharded (every worker the same batches) nor the same on both backends (the order reads the launcher)
    import tensorflow as tf
    b = input_context.get_per_replica_batch_size(global_batch_size)
    seed = 1 if "HOROVOD_RANK" in os.environ else 2  # set by horovodrun (2 workers), not for one rank alone
    return _pairs(tf).shuffle(64, seed=seed).batch(b, drop_remainder=True)


def dict_labels(input_context, global_batch_size):
    return good(input_context, global_batch_size).map(lambda x, y: (x, {"a": y, "b": y}))


def five_wide(input_shape, num_classes):
    import tensorflow as tf
    inputs = tf.keras.Input(shape=(5,), name="wide")
    return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes)(inputs))


def model(input_shape, num_classes):
    import tensorflow as tf
    inputs = tf.keras.Input(shape=input_shape)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes)(inputs))


def two_inputs(input_shape, num_classes):
    import tensorflow as tf
    a, c = tf.keras.Input(shape=(4,), name="a"), tf.keras.Input(shape=(4,), name="c")
    out = tf.keras.layers.Dense(num_classes)(tf.keras.layers.Concatenate()([a, c]))
    return tf.keras.Model({"a": a, "c": c}, out)
'''


pytestmark = pytest.mark.usefixtures("restore_sys_path")


def _job(tmp: Path, **keys: str) -> Path:
    return user_job(tmp, "ifpkg", BAD_PACKAGE, {"pythonpath": '["."]', "model": '"ifpkg.fns:model"',
                                                "dataset": '"ifpkg.fns:good"', "num_classes": "3",
                                                "per_replica_batch_size": "8", **keys})


def _native(job: Path, results: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "backends.native", "--job", str(job), "--results", str(results),
                           "--quiet", *extra], cwd=REPO, env={**base_env(), **(env or {})}, capture_output=True,
                          text=True, timeout=180)


# -- what it is, without calling it ---------------------------------------------------------------------------
def test_detected_from_the_source_without_importing(tmp_path):
    job = load_job(_job(tmp_path))
    assert inputfn.is_input_fn(job) and data_mod.streams(job)
    assert "ifpkg.fns" not in sys.modules  # read by ast, not imported
    assert not data_mod.streams(load_job(EXAMPLES / "my_job.toml"))  # load(**dataset_args): in memory
    assert not data_mod.streams(Job())
    with pytest.raises(data_mod.DataError, match="input function"):
        data_mod.dataset_info(job)  # its size is known only in the ranks
    assert data_mod.validation_arrays(job) is None


def test_the_hash_covers_the_functions_source(tmp_path):
    path = _job(tmp_path)
    before = load_job(path).job_hash
    fns = tmp_path / "ifpkg" / "fns.py"
    fns.write_text(fns.read_text().replace("% 3", "% 2"))
    assert load_job(path).job_hash != before


def test_input_batched_hashed_only_when_false_and_only_for_user_data():
    assert Job(input_batched=True).job_hash == Job().job_hash  # older jobs keep their hashes
    user = {"dataset": "ifpkg.fns:good", "num_classes": 3}
    assert Job(**user, input_batched=False).job_hash != Job(**user).job_hash
    with pytest.raises(JobError, match="input_batched applies to a user input function"):
        Job(input_batched=False)


def test_the_context_is_tf_distributes():
    import tensorflow as tf

    ctx = inputfn.input_context(tf, 1, 2, 3)
    assert isinstance(ctx, tf.distribute.InputContext)
    assert (ctx.input_pipeline_id, ctx.num_input_pipelines, ctx.num_replicas_in_sync) == (1, 2, 6)
    assert ctx.get_per_replica_batch_size(48) == 8


@pytest.mark.parametrize("command", ["check", "sweep"])
def test_never_called_where_the_job_is_checked_or_a_sweep_submitted(tmp_path, command):
    """The entry points that may run on a login node (the check's plan before its runs, a sweep's submit)."""
    job = _job(tmp_path)
    marker = tmp_path / "called"
    if command == "sweep":
        cmd = [sys.executable, "-m", "common.sweep", "submit", "--job", str(job), "--sizes", "1,2", "--results",
               str(tmp_path / "sweep"), "--dry-run"]
    else:  # a results "directory" that is a file: refused after the job and its data are checked, before any run
        cmd = [sys.executable, "-m", "common.check", "--job", str(job), "--results", str(job)]
    proc = subprocess.run(cmd, cwd=REPO, env={**base_env(), "INPUTFN_MARKER": str(marker)}, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == (0 if command == "sweep" else 2), proc.stderr[-2000:]
    assert command == "sweep" or "--results" in proc.stderr or "results" in proc.stderr, proc.stderr[-2000:]
    assert not marker.exists()


# -- bad input: one line naming the key, exit 2, nothing written -----------------------------------------------
BAD_CASES = {
    "not a dataset": ({"dataset": '"ifpkg.fns:not_a_dataset"'}, "dataset", "returned a builtins.list"),
    "raises": ({"dataset": '"ifpkg.fns:raises"'}, "dataset", "raised RuntimeError: the disk is on fire"),
    "infinite without steps": ({"dataset": '"ifpkg.fns:infinite"'}, "dataset", "infinite or of unknown length"),
    "no files for a worker": ({"dataset": '"ifpkg.fns:no_files"'}, "dataset", "some workers would get nothing"),
    "unbatched": ({"dataset": '"ifpkg.fns:unbatched"'}, "dataset", "set input_batched = false"),
    "strings": ({"dataset": '"ifpkg.fns:strings"'}, "dataset", "must be numeric tensors"),
    "dict labels": ({"dataset": '"ifpkg.fns:dict_labels"'}, "dataset", "labels are a dict"),
    "inputs not the features": ({"dataset": '"ifpkg.fns:named"', "model": '"ifpkg.fns:two_inputs"'}, "model",
                                "no feature 'c'"),
    "input shape not the features'": ({"model": '"ifpkg.fns:five_wide"'}, "model",
                                      "input 'wide' takes shape (None, 5), features is (None, 4)"),
}


@pytest.fixture(scope="module")
def bad_input(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict[str, Any], Path]]:
    """Every case above in one process (tests/aids/refusals.py: ``backends.native``'s ``__main__`` per case, each
    with its own job and package; they fail after TensorFlow started, in the ranks), with its results directory."""
    return refuse_jobs({case: _job(tmp_path_factory.mktemp("bad"), **keys, steps="0" if "infinite" in case else "3")
                        for case, (keys, _, _) in BAD_CASES.items()}, base_env())


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_input_function_is_one_line_naming_the_key_and_exit_2(bad_input, case):
    _, key, fragment = BAD_CASES[case]
    got, results = bad_input[case]
    ours = [ln for ln in got["stderr"].splitlines() if ln.strip() and not ln.startswith(TF_LOG_PREFIXES)]
    assert got["rc"] == 2, got["stderr"][-3000:]
    assert len(ours) == 1 and "Traceback" not in got["stderr"], ours
    assert ours[0].startswith(f"backends.native: error: {key} = "), ours[0]
    assert fragment in ours[0], ours[0]
    assert not results.exists() or not any(results.iterdir())


def test_finite_function_epochs_from_its_cardinality_and_twinbench_batching(tmp_path):
    """64 examples of batch 8: 8 steps a pass; 2 epochs = 16 steps. Unbatched + input_batched = false: the same
    batches, so the same losses and fingerprint."""
    own = _native(_job(tmp_path, epochs="2"), tmp_path / "own")
    assert own.returncode == 0, own.stderr[-3000:]
    mine = only_result(tmp_path / "own")
    ours = _native(_job(tmp_path, epochs="2", dataset='"ifpkg.fns:unbatched"', input_batched="false"),
                   tmp_path / "ours")
    assert ours.returncode == 0, ours.stderr[-3000:]
    theirs = only_result(tmp_path / "ours")
    assert (mine["steps_per_epoch"], mine["steps"]) == (8, 16)
    p = mine["input"]["pipeline"]
    assert p["steps_per_pass"] == 8 and p["per_rank"][0]["batches_per_epoch"] == 8 and p["batched_by"] == "function"
    assert theirs["input"]["pipeline"]["batched_by"] == "twinbench"
    assert theirs["input"]["pipeline"]["per_rank"][0]["fingerprint"] == p["per_rank"][0]["fingerprint"]
    assert theirs["step_losses"] == mine["step_losses"]


def test_preempted_and_resumed_run_sees_the_same_batches(tmp_path):
    """8 steps a pass, preempted after step 5 of 12, resumed: the same losses as a run straight through (the
    resumed stream skips the steps done, across the pass boundary, in the function's reshuffled order)."""
    job = _job(tmp_path, dataset='"ifpkg.fns:shuffled"', steps="12", mode='"ctl"', sync_every_steps="1")
    extra = ("--preempt-check-steps", "1")
    first = _native(job, tmp_path / "resumed", *extra, env=signal_env(5))
    assert first.returncode == EXIT_PREEMPTED, first.stderr[-3000:]
    again = _native(job, tmp_path / "resumed", *extra)
    assert again.returncode == 0, again.stderr[-3000:]
    straight = _native(job, tmp_path / "straight", *extra)
    assert straight.returncode == 0, straight.stderr[-3000:]
    resumed, whole = only_result(tmp_path / "resumed"), only_result(tmp_path / "straight")
    assert resumed["resumed_from_step"] == 5
    assert resumed["step_losses"] == whole["step_losses"] and resumed["weights_digest"] == whole["weights_digest"]


# -- the check's data comparison (made-up records) -------------------------------------------------------------
def _rec(prints: list[str] | None, losses: tuple[float, ...] = (1.0, 0.5)) -> dict[str, Any]:
    pipeline = {"per_rank": [{"fingerprint": f} for f in prints]} if prints is not None else None
    return {"step_losses": list(losses), "input": {"pipeline": pipeline} if pipeline else {}}


def test_check_says_the_backends_saw_different_data_and_skips_the_world_size_pair():
    K = check.RunKey
    runs = {K("native", "ctl", 1): _rec(["x"], (2.0, 1.0)), K("horovod", "ctl", 1): _rec(["x"], (2.0, 1.0)),
            K("native", "ctl", 2): _rec(["a", "b"]), K("horovod", "ctl", 2): _rec(["a", "c"])}
    rows = check.compare(runs)
    assert not any("1 worker x 2b" in r.pair for r in rows)  # an input function's batches depend on the world
    status, line = check.verdict(rows)
    assert status == 1
    assert "native vs horovod, ctl, 2 workers: the two backends saw different data, rank 1" in line
    runs[K("horovod", "ctl", 2)] = _rec(["a", "b"])
    assert check.verdict(check.compare(runs))[0] == 0
    assert check.same_batch_warnings(runs) == []
    runs[K("native", "ctl", 2)] = _rec(["a", "a"])
    (warning,) = check.same_batch_warnings(runs)
    assert "native ctl 2 workers: every rank got the same first batches" in warning


def test_check_exits_1_when_the_backends_saw_different_data_and_warns_on_no_sharding(tmp_path):
    """4 runs (custom loop, each backend at 1 and 2 workers) of a function whose order depends on the launcher:
    horovodrun sets HOROVOD_RANK at 2 workers (one Horovod rank runs without it, so 1 worker agrees)."""
    job = _job(tmp_path, dataset='"ifpkg.fns:per_backend"')
    proc = check_command("--job", str(job), "--modes", "ctl", "--steps", "4", timeout=900)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert "native vs horovod, ctl, 2 workers: the two backends saw different data, rank 0: first batches" \
        in proc.stderr, proc.stderr[-2000:]
    for kind in ("native", "horovod"):
        assert f"[check] warning: {kind} ctl 2 workers: every rank got the same first batches" in proc.stdout


# -- the streamed example through the check: 4 runs (the custom loop; fit: the module's docstring) ----------------
@pytest.fixture(scope="module")
def streamed(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path]:
    root = tmp_path_factory.mktemp("stream")
    shutil.copytree(EXAMPLES, root / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, str(root / "examples" / "streampkg" / "records.py"), str(root / "data")],
                          cwd=REPO, env=base_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = root / "runs"
    args = json.dumps({"data_dir": str(root / "data")})
    return check_command("--job", str(root / "examples" / "stream_job.toml"), "--steps", "12", "--modes", "ctl",
                         "--set", f"dataset_args={args}", "--results", str(out), timeout=1800), out


def _records(out: Path) -> dict[str, dict[str, Any]]:
    return {d.name: only_result(d) for d in sorted(out.iterdir()) if d.is_dir()}


def test_streamed_example_checks_clean(streamed):
    proc, _ = streamed
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    # an input function's batches depend on the world size: that pair is named as not compared, never compared
    assert not [ln for ln in proc.stdout.splitlines() if " vs " in ln and "1 worker x 2b" in ln], proc.stdout
    assert "1 worker x 2b = 2 workers x b: not compared: an input function shards its own data" in proc.stdout
    assert "warning" not in proc.stdout


def test_streamed_example_same_losses_and_data_on_both_backends_at_2_workers(streamed):
    recs = _records(streamed[1])
    assert sorted(recs) == ["horovod-ctl-n1", "horovod-ctl-n2", "native-ctl-n1", "native-ctl-n2"]
    native, horovod = recs["native-ctl-n2"], recs["horovod-ctl-n2"]
    assert native["job_hash"] == horovod["job_hash"]
    assert check.compare_losses(native["step_losses"], horovod["step_losses"])[1] is None
    assert check.fingerprints(native) == check.fingerprints(horovod)
    assert len(set(check.fingerprints(native))) == 2  # sharded: each worker its own batches
    for r in (native, horovod):
        assert [p["files"] for p in r["input"]["pipeline"]["per_rank"]] == [2, 2]
        assert r["input"]["pipeline"]["validation"] and r["evaluations"]
    assert check.compare_evaluations(native["evaluations"], horovod["evaluations"]) == (True, None)

