"""Your model, your data, your loss on both backends: the example job (examples/my_job.toml: a user MLP, a user
numpy dataset, a user label-smoothed cross-entropy) computes the same per-step losses under native --nproc 2 and
horovodrun -np 2, in Keras fit and in the custom loop; the regression example (float targets, loss = "mse") runs on
both backends to the same losses.

Six 2-worker runs, each once per module (about 10 s each here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from common.workload.job import job_from_dict
from tests.conftest import REPO, backend_cmd, first_divergence, only_result, run, same_losses

pytestmark = pytest.mark.distributed
MY_JOB = str(REPO / "examples" / "my_job.toml")
MY_REGRESSION = str(REPO / "examples" / "my_regression.toml")
RUNS = {  # name -> (backend, job, mode)
    "native-fit": ("native", MY_JOB, "fit"), "horovod-fit": ("horovod", MY_JOB, "fit"),
    "native-ctl": ("native", MY_JOB, "ctl"), "horovod-ctl": ("horovod", MY_JOB, "ctl"),
    "native-regression": ("native", MY_REGRESSION, "fit"), "horovod-regression": ("horovod", MY_REGRESSION, "fit"),
}


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Each run once (serially: 2 cores)."""
    out: dict[str, dict[str, Any]] = {}
    for name, (kind, job, mode) in RUNS.items():
        results: Path = tmp_path_factory.mktemp(name)
        run(backend_cmd(kind, results, "--set", f"mode={mode}", job=job))
        out[name] = only_result(results)
    return out


@pytest.mark.parametrize("mode", ["fit", "ctl"])
def test_example_same_losses_on_both_backends(records, mode):
    nat, hvd = records[f"native-{mode}"], records[f"horovod-{mode}"]
    assert nat["world_size"] == hvd["world_size"] == 2 and nat["mode"] == hvd["mode"] == mode
    assert nat["job"]["loss"] == "mypkg.losses:label_smoothed_ce" and nat["job"]["code_digest"]
    msg = same_losses({f"native {mode}": nat, f"horovod {mode}": hvd})
    assert msg is None, msg
    assert len(nat["step_losses"]) == nat["steps"] == 40
    assert nat["step_losses"][-1] < nat["step_losses"][0]  # it trained
    assert nat["weights_consistent"] and hvd["weights_consistent"]
    assert nat["trainable_weights_digest"] == hvd["trainable_weights_digest"]


def test_example_fit_and_custom_loop_compute_the_same_thing(records):
    msg = first_divergence(records["native-fit"]["step_losses"], records["native-ctl"]["step_losses"], 1e-5)
    assert msg is None, msg


def test_regression_example_same_losses_on_both_backends(records):
    nat, hvd = records["native-regression"], records["horovod-regression"]
    assert nat["job"]["loss"] == "mse" and nat["job"]["num_classes"] == 0
    msg = same_losses({"native regression": nat, "horovod regression": hvd})
    assert msg is None, msg
    assert nat["step_losses"][-1] < nat["step_losses"][0] / 4  # a linear target: mse falls fast


def test_records_round_trip_to_their_hash(records):
    """The report recomputes every record's hash from its job dict alone (no user code imported)."""
    for name, r in records.items():
        assert job_from_dict(r["job"]).job_hash == r["job_hash"], name
