"""Backend options beyond the default 2-worker parity runs: mirrored, one_device, comm fallback, MPI launch."""

from __future__ import annotations

import importlib.metadata
import math
import shutil

import pytest

from tests.conftest import PY, SMOKE, backend_cmd, base_env, first_divergence, only_result, pause_vars, run

pytestmark = pytest.mark.distributed
RTOL = 1e-5


def test_mirrored_two_logical_cpus_equals_one_replica_double_batch(runner):
    """One process, two replicas (2 logical CPU devices): same losses as one replica with the double batch."""
    # the run tests/test_strategies.py compares central_storage and parameter_server with (fit: the job's mode)
    mir = runner("native", "--strategy", "mirrored", "--logical-cpus", "2", workers=1)
    assert mir["backend_info"]["strategy"] == "MirroredStrategy"
    assert mir["world_size"] == 2 and mir["num_workers"] == 1 and mir["backend_info"]["replicas_per_worker"] == 2
    assert mir["input"]["path"] == "distributed"  # two local replicas: tf.distribute's input, a batch per replica
    one = runner("native", "--set", "per_replica_batch_size=32", workers=1)
    assert mir["global_batch_size"] == one["global_batch_size"]
    msg = first_divergence(mir["step_losses"], one["step_losses"], RTOL)
    assert msg is None, msg


@pytest.mark.parametrize("mode", ["ctl", "fit"])
def test_one_replica_workers_are_fed_by_their_own_iterator(runner, mode):
    """Native MWMS workers with one replica each take the per-worker tf.data path, as Horovod ranks do: never
    tf.distribute's distributed iterator, which halved native's CPU throughput on a real CNN (docs/findings.md)."""
    for kind in ("native", "horovod"):
        assert runner(kind, "--set", f"mode={mode}")["input"]["path"] == "per-worker", kind


# one_device's baseline run (OneDeviceStrategy, world size 1, it trains): its run of the custom loop in
# tests/test_strategies.py::test_a_run_of_another_strategy_never_resumes_its_checkpoint, which runs it anyway


def test_nccl_without_gpu_warns_and_uses_ring(tmp_path):
    proc = run([PY, "-m", "backends.native", "--comm", "nccl", "--job", SMOKE, "--set", "steps=3",
                "--results", str(tmp_path), "--quiet"])
    assert "--comm nccl needs GPUs" in proc.stderr
    assert only_result(tmp_path)["backend_info"]["communication"] == "ring"


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="OpenMPI not installed (make setup installs it)")
def test_horovod_under_mpirun_matches_gloo(runner, tmp_path):
    """The MPI controller computes what the Gloo controller computes, and Horovod under its own launcher
    (horovodrun --gloo) computes what native computes: the tests' other Horovod runs use mpirun (tests/conftest.py,
    ``backend_cmd``), so this is the parity of native and Horovod as users launch it, and horovodrun's own exit
    leaves nothing in $TMPDIR either (tests/test_parity.py compares native with the mpirun runs)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    run(backend_cmd("horovod", tmp_path / "gloo", own_launcher=True), env={**base_env(), "TMPDIR": str(tmp)})
    gloo = only_result(tmp_path / "gloo")
    assert gloo["backend_info"]["controller"] == "gloo"
    assert not list(tmp.iterdir()), sorted(p.name for p in tmp.iterdir())[:3]
    mpi = runner("horovod")
    assert mpi["backend_info"]["controller"] == "mpi"
    msg = first_divergence(mpi["step_losses"], gloo["step_losses"], RTOL)
    assert msg is None, msg
    nat = runner("native")
    assert gloo["initial_weights_digest"] == nat["initial_weights_digest"] and gloo["job_hash"] == nat["job_hash"]
    msg = first_divergence(nat["step_losses"], gloo["step_losses"], RTOL)
    assert msg is None, f"native --nproc 2 vs horovodrun -np 2: {msg}"
    assert gloo["weights_consistent"]


def test_results_record_is_complete(runner):
    rec = runner("native")
    for key in ("backend", "world_size", "mode", "job_hash", "job", "step_losses", "images_per_sec", "step_time",
                "versions", "hosts", "command", "per_rank_sync_marks", "time_to_first_step", "weights_digest"):
        assert key in rec, key
    assert len(rec["per_rank_sync_marks"]) == len(rec["per_rank_timed_wall"]) == rec["num_workers"] == 2
    assert len(rec["hosts"]) == 2 and all(rec["hosts"])
    # the TensorFlow this environment installed (2.21, or 2.18 in the fallback), and a native run never loads Horovod
    assert rec["versions"]["tensorflow"] == importlib.metadata.version("tensorflow")
    assert "horovod" not in rec["versions"] and "horovod_patch" not in rec["versions"]
    assert rec["command"][1:5] == ["-m", "backends.native", "--nproc", "2"]  # what the user typed
    # Throughput is measured over the timed window of the slowest rank, not rank 0 x N.
    warm = rec["step_time"]["warmup_steps"]
    slowest = max(rec["per_rank_timed_wall"])
    assert rec["images_per_sec"] == pytest.approx(rec["global_batch_size"] * (rec["steps"] - warm) / slowest)
    assert rec["time_to_first_step"] > 0
    # No forced sync per step: the host waited for the device after step 1 (time to first step), at the end of
    # the warm-up, then only every sync_every_steps (25) steps and at the end (12 steps here), on every rank.
    for marks in rec["per_rank_sync_marks"]:
        assert [m[0] for m in marks] == [0, 1, warm, rec["steps"]]
    assert rec["step_time"]["window_steps"] == 25 and rec["step_time"]["windows"] == 1


def test_runs_leave_nothing_in_tmpdir(runner):
    """Ranks end without the interpreter's teardown (common.core.errors.exit_now), which skips the atexit hook that
    deletes TensorFlow's autograph files: exit_now removes them itself, on both backends and their launchers."""
    runner("native"), runner("horovod")  # the 2-worker runs the parity tests share (--nproc, mpirun; horovodrun's:
    # test_horovod_under_mpirun_matches_gloo)
    left = runner.tmp_leftovers()
    assert {k[0] for k in left} >= {"native", "horovod"}
    assert all(not names for names in left.values()), {" ".join(k): names[:3] for k, names in left.items() if names}


@pytest.mark.parametrize("kind", ["native", "horovod"])
@pytest.mark.parametrize("mode", ["fit", "ctl"])
def test_clock_counts_time_between_steps(runner, kind, mode):
    """A host pause after every step (outside the step call, between two syncs) must be in the throughput: a clock
    that times only the step calls would report far more than global batch / pause images/s."""
    # the pause and job of tests/test_input_wait.py's paused runs: native's two runs serve both files
    pause, steps = 0.03, 12
    rec = runner(kind, "--set", f"mode={mode}", workers=1, env=pause_vars(pause))
    timed = rec["step_time"]["timed_steps"]
    assert rec["steps"] == steps and timed == steps - 2
    ceiling = rec["global_batch_size"] / pause  # if the steps themselves took no time at all
    assert rec["images_per_sec"] < ceiling, (rec["images_per_sec"], ceiling)
    assert rec["timed_wall_time"] >= timed * pause
    assert rec["step_time"]["median"] >= pause


@pytest.mark.parametrize("mode", ["fit", "ctl"])
@pytest.mark.parametrize("option", ["mixed_precision", "xla"])
def test_mixed_precision_and_xla_train(runner, mode, option):
    """The GPU-oriented options run on both training paths and still learn (CPU: correctness, not speed)."""
    # native's runs of tests/test_parity.py::test_gpu_options_same_math_on_both_backends (2 workers, 12 steps)
    rec = runner("native", "--set", f"mode={mode}", "--set", f"{option}=true")
    assert rec["job"][option] is True
    losses = rec["step_losses"]
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]


def test_horovod_fp16_compression_stays_close(runner, tmp_path):
    """fp16 allreduce changes the math a little (recorded), not a lot."""
    run(backend_cmd("horovod", tmp_path, "--fp16-allreduce"))
    fp16 = only_result(tmp_path)
    exact = runner("horovod")
    assert fp16["backend_info"]["compression"] == "fp16"
    assert fp16["gradient_bytes"] == exact["gradient_bytes"] // 2
    assert fp16["step_losses"] != exact["step_losses"]
    assert fp16["step_losses"][-1] == pytest.approx(exact["step_losses"][-1], rel=1e-2)
