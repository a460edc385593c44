"""Your model, your data, your loss on both backends, checked the way a user checks it: ``python -m common.check`` on
the example job (examples/my_job.toml: a user MLP, a user numpy dataset with a validation split, a user
label-smoothed cross-entropy, a time-to-accuracy target) runs both backends at 1 and 2 local workers (native
--nproc, horovodrun --gloo) in Keras fit and in the custom loop, and every pair agrees: per-step losses, final
weights and validation numbers; 1 worker at 2b equals 2 workers at b. The tests below read its kept runs. The
regression example (float targets, loss = "mse") runs on both backends to the same losses, and a model that reads
its rank makes the check exit 1, naming the pair and step.

One check of 8 runs, 2 regression runs and a 2-run check of the rank-dependent model, each once per module.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from common.core import registry
from common.workload.job import job_from_dict, load_job
from tests.conftest import REPO, backend_cmd, first_divergence, only_result, run, same_losses
from tests.test_check import _check as check_command

pytestmark = pytest.mark.distributed
MY_JOB = str(REPO / "examples" / "my_job.toml")
MY_REGRESSION = str(REPO / "examples" / "my_regression.toml")
STEPS = 40  # the example's own steps: two evaluations (end of epoch 1 at step 32, and the last step)
# Reads its rank as each launcher exports it and scales its logits by it: 1 worker at 2b and 2 workers at b then
# compute different gradients (the kind of thing common.check exists to catch).
RANK_DEPENDENT = '''
import json, os

def build(input_shape, num_classes, hidden=(32,)):
    import tensorflow as tf
    task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task", {})
    rank = int(os.environ.get("HOROVOD_RANK") or task.get("index") or 0)
    inputs = tf.keras.Input(shape=input_shape)
    x = tf.keras.layers.Dense(hidden[0], activation="relu")(inputs)
    logits = tf.keras.layers.Dense(num_classes)(x)
    return tf.keras.Model(inputs, logits * (1.0 + 0.5 * rank))
'''


def _check(*args: str) -> subprocess.CompletedProcess[str]:
    return check_command(*args, timeout=1800)


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("check-example")
    return _check("--job", MY_JOB, "--steps", str(STEPS), "--results", str(out)), out


@pytest.fixture(scope="module")
def records(checked) -> dict[str, dict[str, Any]]:
    """The check's kept runs by "<backend>-<mode>-n<workers>"."""
    proc, out = checked
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    return {d.name: only_result(d) for d in sorted(out.iterdir()) if d.is_dir()}


def test_check_passes_on_the_example_for_every_pair(checked):
    proc, _ = checked
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    kinds = registry.names()
    assert proc.stdout.count("[check] run ") == 2 * 2 * len(kinds)  # backends x (1, 2 workers) x (fit, ctl)
    for mode in ("fit", "ctl"):
        assert f"{kinds[0]} vs {kinds[1]}, {mode}, 2 workers" in proc.stdout
    assert "max rel loss diff" in proc.stdout and "pairs agree to 1e-05" in proc.stdout
    pairs = [line for line in proc.stdout.splitlines() if " vs " in line]
    assert len(pairs) >= 12 and all(line.split()[-2:] == ["agree", "ok"] for line in pairs), proc.stdout


@pytest.mark.parametrize("mode", ["fit", "ctl"])
def test_example_same_losses_on_both_backends(records, mode):
    nat, hvd = records[f"native-{mode}-n2"], records[f"horovod-{mode}-n2"]
    assert nat["world_size"] == hvd["world_size"] == 2 and nat["mode"] == hvd["mode"] == mode
    assert nat["job"]["loss"] == "mypkg.losses:label_smoothed_ce" and nat["job"]["code_digest"]
    msg = same_losses({f"native {mode}": nat, f"horovod {mode}": hvd})
    assert msg is None, msg
    assert len(nat["step_losses"]) == nat["steps"] == STEPS
    assert nat["step_losses"][-1] < nat["step_losses"][0]  # it trained
    assert nat["weights_consistent"] and hvd["weights_consistent"]
    assert nat["trainable_weights_digest"] == hvd["trainable_weights_digest"]


@pytest.mark.parametrize("kind", ["native", "horovod"])
def test_example_one_worker_at_2b_equals_two_workers_at_b(records, kind):
    one, two = records[f"{kind}-ctl-n1"], records[f"{kind}-ctl-n2"]
    assert one["global_batch_size"] == two["global_batch_size"] and one["world_size"] == 1
    msg = first_divergence(one["step_losses"], two["step_losses"], 1e-5)
    assert msg is None, msg


def test_example_fit_and_custom_loop_compute_the_same_thing(records):
    msg = first_divergence(records["native-fit-n2"]["step_losses"], records["native-ctl-n2"]["step_losses"], 1e-5)
    assert msg is None, msg


def test_validation_and_time_to_target_recorded_alike_on_both_backends(records):
    job = load_job(MY_JOB)
    assert job.target_metric == "accuracy" and job.target_value > 0
    nat, hvd = records["native-fit-n2"], records["horovod-fit-n2"]
    steps = [e["step"] for e in nat["evaluations"]]
    assert steps == [e["step"] for e in hvd["evaluations"]] == [32, STEPS]  # end of epoch 1, then the last step
    for a, b in zip(nat["evaluations"], hvd["evaluations"], strict=True):
        for key in ("loss", "accuracy"):
            assert abs(a[key] - b[key]) <= 1e-5 * max(abs(a[key]), 1e-12), (key, a, b)
    for r in (nat, hvd):
        reached = [e for e in r["evaluations"] if e["accuracy"] >= job.target_value]
        assert reached, r["evaluations"]  # the example's target is reachable in its steps
        assert r["time_to_target_s"] == reached[0]["wall_time"] > 0


def test_regression_example_same_losses_on_both_backends(tmp_path_factory):
    got = {}
    for kind in ("native", "horovod"):
        out = tmp_path_factory.mktemp(f"regression-{kind}")
        run(backend_cmd(kind, out, job=MY_REGRESSION))
        got[f"{kind} regression"] = only_result(out)
    nat = got["native regression"]
    assert nat["job"]["loss"] == "mse" and nat["job"]["num_classes"] == 0
    msg = same_losses(got)
    assert msg is None, msg
    assert nat["step_losses"][-1] < nat["step_losses"][0] / 4  # a linear target: mse falls fast


def test_records_round_trip_to_their_hash(records):
    """The report recomputes every record's hash from its job dict alone (no user code imported)."""
    for name, r in records.items():
        assert job_from_dict(r["job"]).job_hash == r["job_hash"], name


def test_check_exits_6_on_a_rank_dependent_model(tmp_path):
    pkg = tmp_path / "mypkg"
    shutil.copytree(REPO / "examples" / "mypkg", pkg)
    (pkg / "model.py").write_text(RANK_DEPENDENT)
    job = tmp_path / "job.toml"
    job.write_text((REPO / "examples" / "my_job.toml").read_text())
    proc = _check("--job", str(job), "--modes", "ctl", "--backends", "native", "--steps", "4")
    assert proc.returncode == 6, proc.stdout + proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    # a job property (1 worker vs 2 workers), not a backend's: exit 6, its line naming the pair and step
    assert line.startswith("SCALES INEXACTLY (exit 6)") and "1 worker x 2b vs 2 workers x b" in line, line
    assert "step 1" in line and "likely cause: the model reads the rank: " in proc.stdout, proc.stdout[-2000:]
