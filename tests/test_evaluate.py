"""Validation during training (common.training.evaluate) in ONE process: the numbers against numpy, the schedule,
the time-to-target rule, and the exclusion of evaluation time from the training clock (StepHooks), the last in pure
Python with a fake clock."""

from __future__ import annotations

import math
import os
import types

import numpy as np
import pytest

from common.core import results as res
from common.training import evaluate, hostsync
from common.training.hostsync import StepHooks, Validation
from common.training.runconfig import RunOptions
from common.workload.job import Job
from tests.test_clock import run_context

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # legacy Keras 2 before TensorFlow loads (as both backends)


# -- numbers against numpy ----------------------------------------------------------------------------------------
def _model_and_data(tf, n: int = 37):
    tf.keras.utils.set_random_seed(5)
    model = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(8, activation="relu"),
                                 tf.keras.layers.Dense(7)])
    rng = np.random.default_rng(1)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    y = rng.integers(0, 7, n).astype(np.int32)
    return model, x, y


def test_loss_and_metrics_equal_a_numpy_computation():
    tf = pytest.importorskip("tensorflow")
    model, x, y = _model_and_data(tf)
    job = Job(metrics=("accuracy", "sparse_top_k_categorical_accuracy"))
    got = evaluate.evaluate_arrays(job, model, x, y, batch=8)  # 37 = 4 x 8 + 5: a partial last batch counts
    logits = model(x).numpy().astype(np.float64)
    ce = [math.log(np.exp(r - r.max()).sum()) + r.max() - r[c] for r, c in zip(logits, y)]
    top5 = [c in np.argsort(-r)[:5] for r, c in zip(logits, y)]
    assert got["loss"] == pytest.approx(np.mean(ce), rel=1e-6)
    assert got["accuracy"] == pytest.approx(np.mean(logits.argmax(1) == y), abs=1e-12)
    assert got["sparse_top_k_categorical_accuracy"] == pytest.approx(np.mean(top5), abs=1e-12)
    assert set(got) == {"loss", "accuracy", "sparse_top_k_categorical_accuracy"}
    # the rule is a Keras one: "accuracy" and "acc" are sparse categorical accuracy for integer labels and logits
    acc = tf.keras.metrics.SparseCategoricalAccuracy()
    acc.update_state(y, logits)
    assert got["accuracy"] == pytest.approx(float(acc.result()), abs=1e-7)
    # the batch size changes no number beyond float32 rounding of the forward pass
    other = evaluate.evaluate_arrays(job, model, x, y, batch=5)
    assert other["loss"] == pytest.approx(got["loss"], rel=1e-6) and other["accuracy"] == got["accuracy"]


def test_metric_names_follow_keras_compile_rules_for_other_outputs():
    """One output per example (a regression or binary model of part A's user code): labels reshaped, not broadcast."""
    tf = pytest.importorskip("tensorflow")
    from common.core.errors import UsageError

    rng = np.random.default_rng(4)
    out = rng.normal(size=(11, 1)).astype(np.float32)
    y = rng.normal(size=(11,)).astype(np.float32)  # labels of rank 1
    mae = evaluate.metric_fn("mae")(tf.constant(y), tf.constant(out)).numpy()
    assert mae.shape == (11,) and np.allclose(mae, np.abs(out[:, 0] - y), rtol=1e-6)
    yb = (y > 0).astype(np.float32)
    acc = evaluate.metric_fn("accuracy")(tf.constant(yb), tf.constant(out)).numpy()  # binary accuracy: one output
    assert np.array_equal(np.reshape(acc, -1), ((out[:, 0] > 0.5) == (yb == 1.0)).astype(np.float32))
    for name in ("AUC", "no_such_metric"):
        with pytest.raises(UsageError, match=f"metrics: '{name}' is not a tf.keras.metrics function"):
            evaluate.metric_fn(name)


def test_evaluator_frames_the_evaluation_with_the_backend_collectives():
    tf = pytest.importorskip("tensorflow")
    model, x, y = _model_and_data(tf)
    calls = []
    backend = types.SimpleNamespace(sync_model_state=lambda m: calls.append("sync_model_state"),
                                    barrier=lambda: calls.append("barrier"))
    job = Job(metrics=("acc",), eval_every_epochs=2)
    ev = evaluate.Evaluator(job, model, backend, (x.astype(np.float64), y), steps_per_epoch=5, total_steps=23)
    assert [s for s in range(1, 24) if ev.due(s)] == [10, 20, 23]
    pings = []
    out = ev.run(10, ping=lambda: pings.append(1))
    assert calls == ["sync_model_state", "barrier"] and len(pings) == math.ceil(37 / evaluate.EVAL_BATCH)
    assert out["step"] == 10 and out["epoch"] == 2.0 and set(out) == {"epoch", "step", "loss", "acc"}
    assert out["loss"] == pytest.approx(evaluate.evaluate_arrays(job, model, x, y)["loss"], rel=1e-7)
    assert not ev.due(10)  # never twice at one step


# -- the schedule and the target (no TensorFlow) ------------------------------------------------------------------
def test_schedule_every_n_epochs_and_after_the_last_step():
    assert [s for s in range(0, 31) if evaluate.due(s, 4, 1, 30)] == [4, 8, 12, 16, 20, 24, 28, 30]
    assert [s for s in range(0, 31) if evaluate.due(s, 4, 3, 30)] == [12, 24, 30]
    assert [s for s in range(0, 13) if evaluate.due(s, 4, 1, 12)] == [4, 8, 12]  # last step = epoch end: once
    assert [s for s in range(0, 7) if evaluate.due(s, 32, 1, 6)] == [6]  # a partial epoch: at the end only


def test_time_to_target_is_the_first_evaluation_reaching_it():
    evs = [{"wall_time": 1.0, "loss": 2.0, "accuracy": 0.5}, {"wall_time": 2.5, "loss": 1.0, "accuracy": 0.9},
           {"wall_time": 4.0, "loss": 0.5, "accuracy": 0.95, "step": 12, "epoch": 3.0}]
    assert evaluate.time_to_target(evs, "accuracy", 0.9) == 2.5  # >= for a metric
    assert evaluate.time_to_target(evs, "accuracy", 0.96) is None
    assert evaluate.time_to_target(evs, "loss", 1.0) == 2.5  # <= for the loss
    assert evaluate.time_to_target(evs, "loss", 2.0) == 1.0
    assert evaluate.time_to_target(evs, "", 0.0) is None  # no target
    assert evaluate.time_to_target([{"wall_time": 1.0, "loss": float("nan")}], "loss", 5.0) is None
    job = Job(metrics=("accuracy",), target_metric="accuracy", target_value=0.9)
    line = evaluate.summary_line(evs, job, 2.5)
    assert line is not None and "loss 0.5000, accuracy 0.9500" in line and "accuracy >= 0.9 reached at 2.50 s" in line
    assert evaluate.summary_line([], job, None) is None


# -- the training clock without the evaluations (pure Python, fake clock) -----------------------------------------
class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class FakeEvaluator:
    """Evaluates after steps 4 and 8 (and the last, 10), taking 5 s of the fake clock each time."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock, self.done = clock, set()

    def due(self, step: int) -> bool:
        return step in (4, 8, 10) and step not in self.done

    def run(self, step: int, ping=None) -> dict:
        self.done.add(step)
        self.clock.t += 5.0
        return {"epoch": step / 4, "step": step, "loss": 1.0 / step}


def test_evaluation_time_is_excluded_from_the_marks_exactly(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(hostsync.time, "perf_counter", clock)
    backend = types.SimpleNamespace(is_chief=True, num_workers=1, allsum=lambda v: v)
    opts = RunOptions(t_process_start=0.0, command=(), verbose=False, preempt_check_steps=1000)
    hooks = StepHooks(run_context(backend, opts, steps=10, sync_every=3, warm=1), start_step=0,
                      preemption=types.SimpleNamespace(signalled=None),  # type: ignore[arg-type]
                      parts=(Validation(FakeEvaluator(clock)),))
    hooks.start_clock()
    synced_at = []
    for _ in range(10):  # every step takes 1 s of the fake clock
        clock.t += 1.0
        hooks.dispatched += 1
        if hooks.sync_due():
            synced_at.append(hooks.dispatched)
            hooks.sync([0.5] * (hooks.dispatched - hooks.synced))
    assert 4 in synced_at and 8 in synced_at  # a sync is forced where an evaluation is due
    assert [e["step"] for e in hooks.measured()["evaluations"]] == [4, 8, 10]
    # the marks are training time only: step k ends at k seconds, whatever ran between steps
    assert hooks.clock_marks() == [[d, float(d)] for d in [0, *synced_at]]
    # wall time counts everything: step 4 ends at 4 s, its evaluation at 9 s; step 8 at 8 + 5 (eval 1) + 5 (eval 2)
    assert [e["wall_time"] for e in hooks.measured()["evaluations"]] == [9.0, 18.0, 25.0]
    assert [e["seconds"] for e in hooks.measured()["evaluations"]] == [5.0, 5.0, 5.0]
    stats = res.throughput_stats([hooks.clock_marks()], global_batch=10, warm=1, window_steps=3)
    assert stats["timed_wall_time"] == 9.0  # steps 2..10, one second each, no evaluation in it
    assert stats["images_per_sec"] == pytest.approx(10 * 9 / 9.0)
    assert stats["step_time"]["median"] == 1.0


# -- metrics without validation data --------------------------------------------------------------------------------
@pytest.mark.parametrize("chief", [True, False])
def test_metrics_without_validation_data_are_said_once_by_the_chief(capsys, chief):
    """No TensorFlow: a builtin dataset has no validation split, so make_evaluator returns before any model use."""
    backend = types.SimpleNamespace(is_chief=chief)
    assert evaluate.make_evaluator(Job(metrics=["accuracy"]), None, backend, 4, 8) is None
    err = capsys.readouterr().err
    if chief:
        assert err.count("\n") == 1 and err.startswith("[twinbench] warning: metrics = ['accuracy'] but dataset = "
                                                       "'synthetic' gives no validation data: no evaluation will run")
        assert '"validation"' in err
    else:
        assert err == ""
    assert evaluate.make_evaluator(Job(), None, backend, 4, 8) is None  # nothing asked: nothing said
    assert capsys.readouterr().err == ""
