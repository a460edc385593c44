"""Keras 3 (job key ``keras = 3``): the job key and its hash, the builtin models in Keras 3, the refusals (one line,
exit 2), and the custom loop's parity: per-step losses native = horovod at 2 workers, 1 worker x 2b = 2 workers x b
on each backend, a BatchNorm model with weight decay and a warm-up on both backends, resume after preemption, and
``python -m common.check`` on a Keras 3 job.

The runs go through the shared runner fixture (tests/conftest.py): the smoke job with ``--set keras=3 --set
mode=ctl``, each distinct command once per session.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tf.keras = tf_keras before TensorFlow loads, as in every run

import shutil
import subprocess
from pathlib import Path

import pytest

from common.core.errors import EXIT_PREEMPTED
from common.workload.job import Job, JobError, load_job
from tests.aids.refusals import batch, refuse_jobs
from tests.conftest import PY, REPO, SMOKE, backend_cmd, base_env, first_divergence, only_result, run, signal_env
from tests.test_check import _check as check_command

K3 = ("--set", "keras=3", "--set", "mode=ctl")
KERAS3_JOB = str(REPO / "examples" / "keras3_job.toml")
RTOL = 1e-5
TF_LOG_PREFIXES = ("I0000", "W0000", "E0000", "WARNING: All log messages")  # TensorFlow's own start-up lines


# -- the job key: hash, validation ----------------------------------------------------------------------------
def test_keras_key_is_hashed_only_when_3():
    assert Job(keras=2).job_hash == Job().job_hash  # the default leaves every existing hash as it was
    assert Job(keras=3, mode="ctl").job_hash != Job(mode="ctl").job_hash  # never one report row with tf_keras
    assert load_job(SMOKE, ["keras=3", "mode=ctl"]).to_dict()["keras"] == 3


@pytest.mark.parametrize("kw, fragment", [
    ({"keras": 4}, "keras must be 2 (tf_keras) or 3 (Keras 3), got 4"),
    ({"keras": 3}, "keras = 3 runs the custom loop only: set mode = \"ctl\""),
    ({"keras": 3, "mode": "ctl", "mixed_precision": True}, "mixed_precision is not supported with keras = 3"),
    ({"keras": 3, "mode": "ctl", "xla": True}, "xla is not supported with keras = 3"),
])
def test_unsupported_keras3_jobs_are_one_line_job_errors(kw, fragment):
    with pytest.raises(JobError) as e:
        Job(**kw)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def _one_error_line(rc: int, stderr: str) -> str:
    ours = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith(TF_LOG_PREFIXES)]
    assert rc == 2 and len(ours) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return ours[0]


REFUSED = [
    (("--set", "keras=3"), "keras = 3 runs the custom loop only"),
    ((*K3, "--strategy", "parameter_server", "--ps", "1", "--nproc", "2"), "keras = 3 is not supported with"),
    ((*K3, "--strategy", "mirrored"), "keras = 3 runs with --strategy mwms or one_device"),
]


@pytest.fixture(scope="module")
def refused() -> list[dict[str, object]]:
    """The refusals above in one process (tests/aids/refusals.py: each ``backends.native``'s ``__main__`` with its
    own arguments, checked for TensorFlow after it exits)."""
    cases = [{"module": "backends.native", "argv": ["--job", SMOKE, "--quiet", *extra], "env": base_env()}
             for extra, _ in REFUSED]
    return batch(cases, base_env())


@pytest.mark.parametrize("index", range(len(REFUSED)))
def test_refusals_before_tensorflow_starts(index, refused):
    got, fragment = refused[index], REFUSED[index][1]
    lines = got["stderr"].strip().splitlines()
    assert got["rc"] == 2 and len(lines) == 1 and "Traceback" not in got["stderr"], got["stderr"][-3000:]
    assert not got["tensorflow"], "TensorFlow was imported before the input was checked"
    assert lines[0].startswith("backends.native: error: ") and fragment in lines[0], lines[0]


K2_MODEL = ("def build(input_shape, num_classes):\n    import tensorflow as tf\n"
            "    return tf.keras.Sequential([tf.keras.Input(input_shape), tf.keras.layers.Flatten(),"
            " tf.keras.layers.Dense(num_classes)])\n")
MODULE_LEVEL_MODEL = """
import keras

inputs = keras.Input((28, 28, 1))
PREBUILT = keras.Model(inputs, keras.layers.Dense(10)(keras.layers.Flatten()(inputs)))  # at import: no scope


def build(input_shape, num_classes):
    return PREBUILT
"""


def _user_job(tmp: Path, package: str, source: str, lines: str) -> Path:
    """A package ``package`` (module ``m``, or ``code`` for the optimizer cases) beside a job file with ``lines``."""
    (tmp / package).mkdir()
    (tmp / package / "__init__.py").write_text("")
    (tmp / package / ("code.py" if package == "upkg" else "m.py")).write_text(source)
    job = tmp / "job.toml"
    job.write_text(f'pythonpath = ["."]\n{lines}\n')
    return job


@pytest.fixture(scope="module")
def wrong_code(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict[str, object], Path]]:
    """The refusals of user code below in one process (tests/aids/refusals.py; each case its own package, dropped
    after it; they fail after TensorFlow started), with each case's results directory. Keras 3 and tf_keras live in
    one process (common/training/keras3.py), so one batch serves both families."""
    jobs = {"other family": _user_job(tmp_path_factory.mktemp("other-family"), "k2pkg", K2_MODEL,
                                      'model = "k2pkg.m:build"\nkeras = 3\nmode = "ctl"\nsteps = 2')}
    for lines, _ in WRONG_KIND:
        jobs[lines] = _user_job(tmp_path_factory.mktemp("wrong-kind"), "upkg", USER_CODE, f"steps = 2\n{lines}")
    return refuse_jobs(jobs, base_env())


def test_a_model_of_the_other_keras_family_names_the_key(wrong_code):
    got, results = wrong_code["other family"]
    line = _one_error_line(got["rc"], got["stderr"])
    assert "returned a tf_keras (Keras 2) model" in line and "keras = 3" in line, line
    assert not results.exists() or not any(results.iterdir())


@pytest.mark.parametrize("kind", ["native", "horovod"])
def test_a_model_made_at_import_outside_the_scope_is_one_line(tmp_path, kind):
    """A model whose variables are made when its module is imported (outside the strategy's scope, and before
    twinbench configured TensorFlow) is one line and exit 2 on both backends, with nothing written. A process of its
    own (not the batch above): the refusal is TensorFlow refusing to be configured once the user's module started it,
    which only a process where nothing started TensorFlow before can show (and no case after it could configure)."""
    job = _user_job(tmp_path, "opkg", MODULE_LEVEL_MODEL, 'model = "opkg.m:build"\nkeras = 3\nmode = "ctl"\nsteps = 2')
    proc = subprocess.run([PY, "-m", f"backends.{kind}", "--job", str(job), "--results", str(tmp_path / "r"),
                           "--quiet"], cwd=REPO, env=base_env(), capture_output=True, text=True, timeout=120)
    line = _one_error_line(proc.returncode, proc.stderr)
    assert line.startswith(f"backends.{kind}: error: TensorFlow started before twinbench could configure it") \
        and "outside the strategy's scope" in line, line
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())


# -- the builtin models in Keras 3 -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["mlp", "small_cnn", "resnet20"])
def test_builtin_models_build_in_keras3_with_the_same_architecture(name):
    import keras
    import tensorflow as tf

    from common.workload.models import build_model

    k2 = build_model(Job(model=name, weight_decay=1e-4), (28, 28, 1), 10)
    k3 = build_model(Job(model=name, weight_decay=1e-4, keras=3, mode="ctl"), (28, 28, 1), 10)
    assert isinstance(k2, tf.keras.Model) and not isinstance(k2, keras.Model)
    assert isinstance(k3, keras.Model)
    assert [tuple(v.shape) for v in k3.trainable_variables] == [tuple(v.shape) for v in k2.trainable_variables]
    assert tuple(k3.output_shape) == tuple(k2.output_shape) == (None, 10)
    assert len(k3.losses) == len(k2.losses) > 0  # weight decay on every kernel, in both families


def test_applications_build_in_keras3_with_the_same_architecture_and_weight_decay():
    """keras.applications names are built from Keras 3's own applications, weight decay on every kernel (Keras 3's
    DepthwiseConv2D calls its depthwise kernel "kernel"), the same variables as the tf_keras build."""
    import keras

    from common.workload.models import ModelError, build_model

    k2 = build_model(Job(model="MobileNetV2", weight_decay=1e-4), (32, 32, 3), 5)
    k3 = build_model(Job(model="MobileNetV2", weight_decay=1e-4, keras=3, mode="ctl"), (32, 32, 3), 5)
    assert isinstance(k3, keras.Model)
    assert [tuple(v.shape) for v in k3.trainable_variables] == [tuple(v.shape) for v in k2.trainable_variables]
    assert len(k3.losses) == len(k2.losses) > 50 and tuple(k3.output_shape) == (None, 5)
    with pytest.raises(ModelError, match="did you mean .*ResNet50") as e:
        build_model(Job(model="ResNet5", keras=3, mode="ctl"), (32, 32, 3), 5)
    assert "\n" not in str(e.value)


# -- parity ------------------------------------------------------------------------------------------------------
def assert_same_losses(a: dict, b: dict, what: str) -> None:
    la, lb = a["step_losses"], b["step_losses"]
    assert len(la) == a["steps"] > 0
    msg = first_divergence(la, lb, RTOL)
    assert msg is None, f"{what}: {msg}\n{la}\n{lb}"


@pytest.mark.distributed
def test_keras3_native_vs_horovod_two_workers(runner):
    nat, hvd = runner("native", *K3), runner("horovod", *K3)
    assert nat["world_size"] == hvd["world_size"] == 2 and nat["mode"] == hvd["mode"] == "ctl"
    assert nat["job"]["keras"] == hvd["job"]["keras"] == 3 and nat["job_hash"] == hvd["job_hash"]
    assert nat["job_hash"] != runner("native", "--set", "mode=ctl")["job_hash"]  # never a row with tf_keras runs
    import keras

    assert nat["versions"]["keras"] == hvd["versions"]["keras"] == keras.__version__  # which Keras ran
    assert nat["initial_weights_digest"] == hvd["initial_weights_digest"]  # Horovod broadcast rank 0's
    assert_same_losses(nat, hvd, "keras 3 ctl: native --nproc 2 vs horovodrun -np 2")
    assert nat["step_losses"][-1] < nat["step_losses"][0]  # it trained
    # the gradients were reduced: every rank ends with the same weights, on both backends alike
    assert nat["weights_consistent"] and hvd["weights_consistent"]
    assert nat["weights_digest"] == hvd["weights_digest"]


@pytest.mark.distributed
@pytest.mark.parametrize("kind", ["native", "horovod"])
def test_keras3_two_workers_equal_one_worker_double_batch(runner, kind):
    two = runner(kind, *K3)
    one = runner(kind, *K3, "--set", "per_replica_batch_size=32", workers=1)
    assert two["global_batch_size"] == one["global_batch_size"] == 32 and one["world_size"] == 1
    assert_same_losses(two, one, f"keras 3 {kind}: 2 workers x 16 vs 1 worker x 32")


@pytest.mark.distributed
def test_keras3_batchnorm_weight_decay_and_warmup_on_both_backends(runner):
    """ResNet-20 in Keras 3 with L2 weight decay and a linear warm-up of a linearly scaled LR: the regularisation
    counted once, the LR set from the host on Keras 3's variable, the BatchNorm statistics averaged by Horovod
    as MWMS reads them: the same losses and the very same saved model on both backends."""
    extra = (*K3, "--set", "model=resnet20", "--set", "steps=6", "--set", "weight_decay=0.001",
             "--set", "lr_scaling=linear", "--set", "warmup_epochs=1", "--set", "steps_per_epoch=4")
    nat, hvd = runner("native", *extra), runner("horovod", *extra)
    assert nat["learning_rate"] == hvd["learning_rate"] == pytest.approx(0.1)
    assert_same_losses(nat, hvd, "keras 3 resnet20: native vs horovod")
    assert nat["trainable_weights_digest"] == hvd["trainable_weights_digest"]
    assert nat["all_weights_consistent"] and hvd["all_weights_consistent"]
    assert nat["weights_digest"] == hvd["weights_digest"], "BatchNorm moving statistics differ between backends"


@pytest.mark.distributed
@pytest.mark.parametrize("kind", ["native", "horovod"])
def test_keras3_preempt_and_resume_gives_identical_weights(runner, tmp_path, kind):
    """The checkpoint holds Keras 3's variables and optimizer state (momentum, iterations): resumed at step 5, the
    run ends on the very weights and losses of a run never stopped. Horovod's ranks by mpirun (``backend_cmd``);
    preemption under horovodrun is tests/test_reliability.py's."""
    extra = (*K3, "--preempt-check-steps", "1")
    first = run(backend_cmd(kind, tmp_path, *extra), check=False, env=signal_env(5))
    assert first.returncode == EXIT_PREEMPTED, first.stderr[-3000:]  # mpirun passes the ranks' status on
    run(backend_cmd(kind, tmp_path, *extra))
    resumed = only_result(tmp_path)
    straight = runner(kind, *K3)
    assert resumed["resumed_from_step"] == 5
    assert resumed["weights_digest"] == straight["weights_digest"]
    assert first_divergence(resumed["step_losses"], straight["step_losses"], 0.0) is None


@pytest.mark.distributed
def test_check_passes_on_the_keras3_example():
    """``python -m common.check`` on examples/keras3_job.toml (a Keras 3 model with a custom layer, the user's AdamW and
    cosine schedule with its own warm-up, validation): the custom loop only (Keras 3 runs no fit), on native, 1 worker
    x 2b = 2 workers x b. Native = Horovod on this example at 2 workers, the same 16 steps, losses and validation
    numbers: tests/test_slurm.py::test_srun_runs_the_users_own_job_on_both_backends[keras3_job]; Horovod's 1 worker x
    2b = 2 workers x b in Keras 3: test_keras3_two_workers_equal_one_worker_double_batch above."""
    proc = check_command("--job", KERAS3_JOB, "--steps", "16", "--backends", "native", timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    ran = [ln for ln in proc.stdout.splitlines() if ln.startswith("[check] run ")]
    assert len(ran) == 2 and not [ln for ln in ran if " fit " in ln], proc.stdout
    assert "the 1 pair agrees to 1e-05" in proc.stdout
    pairs = [line for line in proc.stdout.splitlines() if " vs " in line]
    assert len(pairs) == 1 and pairs[0].split()[-3:] == ["agree", "agree", "ok"], proc.stdout
    bad = check_command("--job", KERAS3_JOB, "--modes", "fit,ctl")
    assert bad.returncode == 2 and "runs the custom loop only" in bad.stderr and bad.stdout == ""


# A Keras 3 model that reads its rank as each launcher exports it and scales its logits by it (a per-rank seed or a
# layer reading the rank does the same): 1 worker at 2b and 2 workers at b compute different gradients.
RANK_DEPENDENT_KERAS3 = '''
import json, os


def build(input_shape, num_classes, width=32, blocks=2):
    import keras
    from keras import ops
    task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task", {})
    rank = int(os.environ.get("HOROVOD_RANK") or task.get("index") or 0)
    inputs = keras.Input(shape=input_shape, name="features")
    x = keras.layers.Dense(width, activation="relu")(keras.layers.Flatten()(inputs))
    logits = keras.layers.Dense(num_classes)(x)
    return keras.Model(inputs, ops.multiply(logits, 1.0 + 0.5 * rank))
'''


@pytest.mark.distributed
def test_check_exits_6_on_a_rank_dependent_keras3_model(tmp_path):
    """The Keras 3 example with its model replaced by a rank-dependent one: ``common.check`` names the first pair that
    differs (1 worker x 2b vs 2 workers x b on native) and exits 6: the job does not scale exactly."""
    for pkg in ("keras3pkg", "mypkg"):
        shutil.copytree(REPO / "examples" / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "keras3pkg" / "model.py").write_text(RANK_DEPENDENT_KERAS3)
    job = tmp_path / "job.toml"
    job.write_text(Path(KERAS3_JOB).read_text())
    proc = check_command("--job", str(job), "--backends", "native", "--steps", "12", timeout=900)  # > warm-up
    assert proc.returncode == 6, proc.stdout + proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    # a job property (1 worker vs 2 workers), not a backend's: exit 6, its line naming the pair and step
    assert line.startswith("SCALES INEXACTLY (exit 6)") and "1 worker x 2b vs 2 workers x b" in line, line
    assert "step 1" in line and "likely cause: the model reads the rank: " in proc.stdout, proc.stdout[-2000:]


# -- optimizers and schedules -------------------------------------------------------------------------------------
def test_new_optimizer_and_schedule_keys_hashed_only_when_set():
    base = Job()
    assert Job(optimizer_args={}, lr_schedule="constant", lr_schedule_args={}).job_hash == base.job_hash
    for kw in ({"lr_schedule": "cosine"}, {"optimizer_args": {"nesterov": True}},
               {"keras": 3, "mode": "ctl", "optimizer": "adamw"}):
        assert Job(**kw).job_hash != base.job_hash, kw


def test_adamw_validates_with_tf_keras_too():
    """keras = 2 builds twinbench's legacy AdamW (common/training/legacy_adamw.py, tests/test_legacy_adamw.py)."""
    job = Job(optimizer="adamw", optimizer_args={"weight_decay": 0.01})
    assert job.keras == 2 and job.mode == "fit" and load_job(SMOKE, ["optimizer=adamw"]).optimizer == "adamw"
    assert len({job.job_hash, Job(optimizer="adam", optimizer_args={"weight_decay": 0.01}).job_hash,
                Job(keras=3, mode="ctl", optimizer="adamw", optimizer_args={"weight_decay": 0.01}).job_hash}) == 3


@pytest.mark.parametrize("kw, fragment", [
    ({"optimizer": "lamb"}, "unknown optimizer 'lamb'"),
    ({"lr_schedule": "step"}, "unknown lr_schedule 'step'"),
    ({"lr_schedule": "cosine", "steps_per_execution": 2}, "use steps_per_execution = 1"),
    ({"lr_schedule_args": {"alpha": 0.1}}, "lr_schedule_args applies to a user lr_schedule"),
    ({"optimizer_args": {"bad key": 1}}, "optimizer_args must be a table of keyword arguments"),
])
def test_bad_optimizer_and_schedule_keys_are_one_line_job_errors(kw, fragment):
    with pytest.raises(JobError) as e:
        Job(**kw)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_cosine_decays_to_zero_after_horovods_warmup():
    from common.training.objective import lr_at_step, lr_schedule

    job = Job(lr_schedule="cosine", warmup_epochs=1)
    at = lr_schedule(job, 0.1, 4, 20, 2)
    assert [at(s) for s in range(4)] == [lr_at_step(s, 0.1, 4, 2, 1) for s in range(4)]
    assert at(4) == pytest.approx(0.1) and at(12) == pytest.approx(0.05) and 0 < at(19) < 0.001
    assert all(at(s) > at(s + 1) for s in range(4, 19))
    assert lr_schedule(Job(warmup_epochs=1), 0.1, 4, 20, 2)(4) is None  # constant: left where the warm-up left it


USER_CODE = """
def keras3_sgd(learning_rate, **kw):
    import keras
    return keras.optimizers.SGD(learning_rate=learning_rate, **kw)

def legacy_sgd(learning_rate):
    import tensorflow as tf
    return tf.keras.optimizers.legacy.SGD(learning_rate=learning_rate)

def scheduled_sgd(learning_rate):
    import keras
    return keras.optimizers.SGD(keras.optimizers.schedules.CosineDecay(learning_rate, 10))

def not_a_schedule(learning_rate, decay_steps):
    return learning_rate

def keras3_cosine(learning_rate, decay_steps):
    import keras
    return keras.optimizers.schedules.CosineDecay(learning_rate, decay_steps)
"""


WRONG_KIND = [
    ('optimizer = "upkg.code:keras3_sgd"', "(a Keras 3 optimizer: set keras = 3 to use it)"),
    ('keras = 3\nmode = "ctl"\noptimizer = "upkg.code:legacy_sgd"', "not a Keras 3 optimizer (keras.optimizers), "
     "but the job has keras = 3"),
    ('keras = 3\nmode = "ctl"\noptimizer = "upkg.code:keras3_sgd"\noptimizer_args = { clipnorm = 1.0 }',
     "sets clipnorm: Keras 3 applies it to each replica's gradients before their all-reduce"),
    ('keras = 3\nmode = "ctl"\noptimizer = "upkg.code:scheduled_sgd"\nlr_schedule = "cosine"',
     "has a learning-rate schedule of its own: give it as lr_schedule instead"),
    ('optimizer = "adam"\noptimizer_args = { nosuch = 1 }', "optimizer_args = {'nosuch': 1} for optimizer = 'adam'"),
    ('lr_schedule = "upkg.code:not_a_schedule"', "returned a builtins.float, not a LearningRateSchedule"),
    ('lr_schedule = "upkg.code:keras3_cosine"', "of tf.keras.optimizers.schedules (tf_keras), the family of keras = 2"),
]


@pytest.mark.parametrize("lines, fragment", WRONG_KIND)
def test_an_optimizer_or_schedule_of_the_wrong_kind_is_one_line_naming_the_key(wrong_code, lines, fragment):
    got, results = wrong_code[lines]
    line = _one_error_line(got["rc"], got["stderr"])
    assert line.startswith("backends.native: error: ") and fragment in line, line
    assert ("optimizer" in line) or ("lr_schedule" in line)
    assert not results.exists() or not any(results.iterdir())


@pytest.mark.distributed
def test_keras3_adamw_and_cosine_after_warmup_on_both_backends(runner):
    extra = (*K3, "--set", "optimizer=adamw", "--set", 'optimizer_args={"weight_decay": 0.05}',
             "--set", "lr_schedule=cosine", "--set", "warmup_epochs=1", "--set", "steps_per_epoch=4")
    nat, hvd = runner("native", *extra), runner("horovod", *extra)
    assert nat["job"]["optimizer"] == "adamw" and nat["job"]["lr_schedule"] == "cosine"
    assert_same_losses(nat, hvd, "keras 3 adamw + cosine: native vs horovod")
    assert nat["weights_digest"] == hvd["weights_digest"]
    assert first_divergence(nat["step_losses"], runner("native", *K3)["step_losses"], RTOL) is not None


@pytest.mark.distributed
def test_tf_keras_fit_with_a_cosine_schedule_on_both_backends(runner):
    """keras = 2, fit: the warm-up and the cosine set by twinbench's callback on both backends (Horovod's own warm-up
    callback is not offered with a schedule after it)."""
    extra = ("--set", "lr_schedule=cosine", "--set", "warmup_epochs=1", "--set", "steps_per_epoch=4")
    nat, hvd = runner("native", *extra), runner("horovod", *extra)
    assert_same_losses(nat, hvd, "tf_keras fit, cosine after warm-up: native vs horovod")
    assert first_divergence(nat["step_losses"], runner("native")["step_losses"], RTOL) is not None
