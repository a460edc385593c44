"""Same math on both backends: per-step global losses compared across real multi-process runs (CPU, loopback).

Like AlgoPerf's test_traindiffs: the product's claim is that a comparison compares backends, not two different
computations. Tolerance 1e-5 relative (float32 reductions in a different order).
"""

from __future__ import annotations

import pytest

from tests import bn_model
from tests.conftest import first_divergence

pytestmark = pytest.mark.distributed
RTOL = 1e-5


def assert_same_losses(a: dict, b: dict, what: str) -> None:
    assert a["job_hash"] == b["job_hash"] or what.startswith("batch"), "parity must compare one job"
    la, lb = a["step_losses"], b["step_losses"]
    assert len(la) == a["steps"] > 0
    msg = first_divergence(la, lb, RTOL)
    assert msg is None, f"{what}: {msg}\n{la}\n{lb}"


@pytest.mark.parametrize("mode", ["fit", "ctl"])
def test_native_vs_horovod_two_workers(runner, mode):
    nat = runner("native", "--set", f"mode={mode}")
    hvd = runner("horovod", "--set", f"mode={mode}")
    assert nat["backend"] == "native" and hvd["backend"] == "horovod"
    assert nat["world_size"] == hvd["world_size"] == 2
    assert nat["mode"] == hvd["mode"] == mode
    # Identical starting point, then identical updates.
    assert nat["initial_weights_digest"] == hvd["initial_weights_digest"]
    assert_same_losses(nat, hvd, f"{mode}: native --nproc 2 vs horovodrun -np 2")
    # Training happened: the loss moved (a frozen model would pass the comparison above trivially).
    assert nat["step_losses"][-1] < nat["step_losses"][0]
    # Gradients were really averaged: every rank ends with the same weights.
    assert nat["weights_consistent"] and hvd["weights_consistent"]


@pytest.mark.parametrize("kind", ["native", "horovod"])
@pytest.mark.parametrize("mode", ["fit", "ctl"])
def test_two_workers_equal_one_worker_double_batch(runner, kind, mode):
    two = runner(kind, "--set", f"mode={mode}")
    one = runner(kind, "--set", f"mode={mode}", "--set", "per_replica_batch_size=32", workers=1)
    assert two["global_batch_size"] == one["global_batch_size"] == 32
    assert one["world_size"] == 1
    assert_same_losses(two, one, f"batch: {kind} {mode} 2 workers x 16 vs 1 worker x 32")


def test_fit_and_ctl_compute_the_same_thing(runner):
    """The custom loop and Keras fit are two implementations of one job: same losses, same final weights."""
    fit = runner("native", "--set", "mode=fit")
    ctl = runner("native", "--set", "mode=ctl")
    msg = first_divergence(fit["step_losses"], ctl["step_losses"], RTOL)
    assert msg is None, msg


def test_warmup_and_linear_scaling_parity(runner):
    """Horovod's own LearningRateWarmupCallback against the native re-implementation, LR scaled linearly."""
    extra = ("--set", "lr_scaling=linear", "--set", "warmup_epochs=2", "--set", "steps_per_epoch=4",
             "--set", "steps=10", "--set", "learning_rate=0.02")
    nat = runner("native", *extra)
    hvd = runner("horovod", *extra)
    assert nat["learning_rate"] == hvd["learning_rate"] == pytest.approx(0.04)
    assert_same_losses(nat, hvd, "fit with warm-up: native vs horovod")
    # The warm-up must change the trajectory, or this test would not be checking it.
    plain = runner("native", "--set", "lr_scaling=linear", "--set", "steps_per_epoch=4", "--set", "steps=10",
                   "--set", "learning_rate=0.02")
    assert first_divergence(nat["step_losses"], plain["step_losses"], RTOL) is not None


@pytest.mark.parametrize("mode", ["fit", "ctl"])
def test_regularisation_counted_once_on_both_backends(runner, mode):
    """L2 weight decay: Keras scales it per replica under a strategy, the custom loop divides by the replica
    count, Horovod ranks each add it whole and then average; all must give the same objective."""
    nat = runner("native", "--set", f"mode={mode}", "--set", "weight_decay=0.01")
    hvd = runner("horovod", "--set", f"mode={mode}", "--set", "weight_decay=0.01")
    assert_same_losses(nat, hvd, f"{mode} with weight decay: native vs horovod")
    plain = runner("native", "--set", f"mode={mode}")
    # the regularisation term is really in the recorded loss (larger than without it)
    assert all(w > p for w, p in zip(nat["step_losses"], plain["step_losses"]))


@pytest.mark.parametrize("mode", ["fit", "ctl"])
def test_batchnorm_model_ends_with_the_same_weights_on_both_backends(runner, mode):
    """A BatchNorm model (tests/bn_model.py): every replica updates its BatchNorm moving statistics from its own
    batches. MWMS saves their mean over replicas; Horovod ranks hold their own until the backend averages them, and
    Horovod's broadcast callback would overwrite them after step 1. Both must save the very same model."""
    extra = ("--set", f"mode={mode}", *bn_model.JOB)  # fit's runs serve tests/test_reliability.py's BatchNorm test
    nat = runner("native", *extra)
    hvd = runner("horovod", *extra)
    assert_same_losses(nat, hvd, f"{mode} BatchNorm model: native vs horovod")
    assert nat["trainable_weights_digest"] == hvd["trainable_weights_digest"]
    assert nat["all_weights_consistent"] and hvd["all_weights_consistent"]
    assert nat["weights_digest"] == hvd["weights_digest"], "BatchNorm moving statistics differ between backends"
    # The statistics are part of the digest (else the last check would repeat the trainable one).
    assert nat["weights_digest"] != nat["trainable_weights_digest"]


@pytest.mark.parametrize("mode", ["fit", "ctl"])
@pytest.mark.parametrize("option", ["mixed_precision", "xla"])
def test_gpu_options_same_math_on_both_backends(runner, mode, option):
    """Mixed precision (loss scaling) and XLA at 2 workers. XLA compiles the collective-free part only: a whole
    compiled step (Keras' jit_compile) aborts MWMS on CPU and needs Horovod's optional XLA ops."""
    extra = ("--set", f"mode={mode}", "--set", f"{option}=true")
    nat = runner("native", *extra)
    hvd = runner("horovod", *extra)
    assert nat["job"][option] is True and nat["job_hash"] == hvd["job_hash"]
    assert_same_losses(nat, hvd, f"{mode} {option}: native vs horovod")
    assert nat["trainable_weights_digest"] == hvd["trainable_weights_digest"]
    assert nat["step_losses"][-1] < nat["step_losses"][0]
    # The option changed the computation (else this would repeat the plain parity test).
    plain = runner("native", "--set", f"mode={mode}")
    assert first_divergence(nat["step_losses"], plain["step_losses"], 0.0) is not None


def test_steps_per_execution_same_math_on_both_backends(runner):
    """Keras fit with 2 steps per tf.function call: per-step losses still recorded (on the device), identical on
    both backends and to one step per call (constant LR: the execution size does not change the math)."""
    extra = ("--set", "steps_per_execution=2", "--set", "sync_every_steps=4")
    nat = runner("native", *extra)
    hvd = runner("horovod", *extra)
    assert nat["job"]["steps_per_execution"] == 2 and nat["job_hash"] == hvd["job_hash"]
    assert_same_losses(nat, hvd, "fit, steps_per_execution=2: native vs horovod")
    one = runner("native")
    assert first_divergence(nat["step_losses"], one["step_losses"], RTOL) is None
    # the host saw the device only between executions: after the first one (= the warm-up), then every 4 steps
    assert [m[0] for m in nat["per_rank_sync_marks"][0]] == [0, 2, 4, 8, 12]
