"""The job config: validation, --set typing, and a hash that ignores the backend and the label."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.workload.datasets import DATASETS
from common.workload.job import FIELDS, OPTIONAL_KEYS, Job, JobError, job_from_dict, load_job
from common.workload.models import MODELS, ModelSpec

REPO = Path(__file__).resolve().parent.parent
JOB_FILES = sorted((REPO / "jobs").glob("*.toml"))


@pytest.mark.parametrize("path", JOB_FILES, ids=[p.name for p in JOB_FILES])
def test_shipped_jobs_load(path):
    job = load_job(path)
    assert job.name == path.stem
    assert len(job.job_hash) == 16


def test_smoke_job_is_small_and_deterministic():
    job = load_job(REPO / "jobs" / "smoke.toml")
    assert (job.model, job.dataset, job.steps) == ("mlp", "synthetic", 12)
    assert job.steps > job.timing_warmup_steps


def test_set_overrides_are_typed():
    job = load_job(None, ["per_replica_batch_size=8", "learning_rate=0.5", "xla=true", "mlp_hidden=[4,5]",
                          "mode=ctl"])
    assert job.per_replica_batch_size == 8 and isinstance(job.per_replica_batch_size, int)
    assert job.learning_rate == 0.5 and job.xla is True and job.mlp_hidden == (4, 5) and job.mode == "ctl"


@pytest.mark.parametrize("sets, fragment", [
    (["per_replica_batch_size=abc"], "expected an integer"),
    (["per_replica_batch_size=0"], "per_replica_batch_size must be >= 1"),
    (["steps=-1"], "steps must be >= 0"),
    (["learning_rate=-0.1"], "learning_rate must be > 0"),
    (["learning_rat=0.1"], "did you mean 'learning_rate'"),
    (["model=resnet57"], "unknown model"),
    (["dataset=imagenet"], "unknown dataset"),
    (["optimizer=lamb"], "unknown optimizer"),
    (["mode=train"], "unknown mode"),
    (["xla=maybe"], "expected true/false"),
    (["lr_scaling=sqrt"], "unknown lr_scaling"),
    (["dataset=cifar10"], "needs data_dir"),
    (["noequals"], "expected key=value"),
    (["image_shape=[28,28]"], "image_shape must be"),
])
def test_bad_overrides_are_one_line_errors(sets, fragment):
    with pytest.raises(JobError) as e:
        load_job(None, sets)
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)


def test_bad_toml_files(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("model = \n")
    with pytest.raises(JobError, match="not valid TOML"):
        load_job(bad)
    bad.write_text('per_replica_batch_size = "16"\n')
    with pytest.raises(JobError, match="expected an integer"):
        load_job(bad)
    bad.write_text("stepz = 3\n")
    with pytest.raises(JobError, match="did you mean 'steps'"):
        load_job(bad)
    with pytest.raises(JobError, match="not found"):
        load_job(tmp_path / "missing.toml")


def test_hash_ignores_name_but_not_math():
    a = Job(name="a")
    assert Job(name="b").job_hash == a.job_hash
    for key, value in [("per_replica_batch_size", 64), ("seed", 1), ("mode", "ctl"), ("learning_rate", 0.02)]:
        assert Job(**{key: value}).job_hash != a.job_hash, key


def test_no_backend_or_world_size_in_the_job():
    assert not {"backend", "world_size", "nproc", "num_workers"} & set(FIELDS)


def test_round_trip_through_results_json():
    job = load_job(REPO / "jobs" / "smoke.toml", ["mode=ctl"])
    again = job_from_dict(job.to_dict())
    assert again == job and again.job_hash == job.job_hash


def test_derived_quantities():
    job = Job(per_replica_batch_size=16, learning_rate=0.1, lr_scaling="linear", synthetic_samples=100)
    assert job.global_batch_size(4) == 64
    assert job.scaled_learning_rate(4) == pytest.approx(0.4)
    assert job.resolve_steps(100, 4) == (1, 1)
    assert Job(lr_scaling="none", learning_rate=0.1).scaled_learning_rate(8) == pytest.approx(0.1)
    with pytest.raises(JobError, match="fewer than one global batch"):
        job.resolve_steps(100, 8)


def test_hash_ignores_unused_keys():
    base = Job(dataset="cifar10", data_dir="d", model="resnet56", optimizer="adam")
    assert Job(dataset="cifar10", data_dir="d", model="resnet56", optimizer="adam", num_classes=5,
               mlp_hidden=(3,), momentum=0.5, synthetic_samples=7).job_hash == base.job_hash
    assert Job(momentum=0.5, optimizer="momentum").job_hash != Job(optimizer="momentum").job_hash


def test_later_keys_are_hashed_only_when_changed():
    """Keys added after results were first hashed keep every older hash when left at their default."""
    base = Job()
    assert Job(sync_every_steps=25, steps_per_execution=1).job_hash == base.job_hash
    assert Job(sync_every_steps=1).job_hash != base.job_hash
    assert Job(steps_per_execution=2, steps=4, sync_every_steps=2).job_hash != base.job_hash


@pytest.mark.parametrize("kw, message", [
    ({"sync_every_steps": 0}, "sync_every_steps must be >= 1"),
    ({"steps_per_execution": 0}, "steps_per_execution must be >= 1"),
    ({"steps_per_execution": 2, "mode": "ctl"}, 'applies to mode = "fit" only'),
    ({"steps_per_execution": 4, "steps": 10}, "steps = 10 must be a multiple of steps_per_execution = 4"),
    ({"steps_per_execution": 4, "steps_per_epoch": 6}, "steps_per_epoch = 6 must be a multiple"),
])
def test_execution_keys_are_validated(kw, message):
    with pytest.raises(JobError, match=message):
        Job(**kw)


def test_syncs_and_warmup_round_up_to_whole_executions():
    job = Job(steps_per_execution=4, steps=40)
    assert (job.sync_interval, job.warmup_interval) == (28, 4)  # 25 and 2 rounded up to multiples of 4
    assert (Job().sync_interval, Job().warmup_interval) == (25, 2)


def test_docs_document_every_job_key():
    """docs/jobs.md's generated key table (scripts/job_reference.py, checked in tests/test_docs.py) has every key."""
    table = (REPO / "docs" / "jobs.md").read_text()
    for key in FIELDS:
        assert f"| `{key}` |" in table, f"docs/jobs.md's job key table misses {key}"


# Hashes of jobs built by the code before the model / dataset registries: results JSONs already on disk carry
# these, so job_hash must never change for them.
@pytest.mark.parametrize("kw, expected", [
    ({}, "3f1795dc262cef52"),
    ({"model": "resnet56", "dataset": "cifar10", "data_dir": "x", "optimizer": "momentum"}, "2798b12e72cbf8e2"),
    ({"model": "small_cnn", "dataset": "image_folder", "data_dir": "x"}, "bccac037c0e035fe"),
    ({"model": "ResNet50", "dataset": "fashion_mnist", "data_dir": "x"}, "28233c3b517e5fa7"),
])
def test_hash_is_stable(kw, expected):
    assert Job(**kw).job_hash == expected


# The registries are the only list of models and datasets: each entry must make a valid job on its own.
@pytest.mark.parametrize("name", list(MODELS))
def test_every_registered_model_is_valid_in_a_job(name):
    job = Job(model=name)
    assert job.model == name and len(job.job_hash) == 16


@pytest.mark.parametrize("name", list(DATASETS))
def test_every_registered_dataset_is_valid_in_a_job(name):
    job = Job(dataset=name, data_dir="some/dir")
    assert job.dataset == name and len(job.job_hash) == 16
    if DATASETS[name].needs_data_dir:
        with pytest.raises(JobError, match=f"dataset {name!r} needs data_dir"):
            Job(dataset=name)
    else:
        assert Job(dataset=name).data_dir == ""


def test_unknown_names_list_the_registries():
    with pytest.raises(JobError) as e:
        Job(model="nosuchmodel")
    assert f"use one of {', '.join(MODELS)} or a tf.keras.applications name" in str(e.value)
    with pytest.raises(JobError) as e:
        Job(dataset="nosuchdata")
    assert str(e.value).endswith(f"use one of {', '.join(DATASETS)}")


def test_registry_job_fields_are_job_keys_and_hashed_only_when_read():
    specs = [*MODELS.values(), *DATASETS.values()]
    assert all(spec.description and "\n" not in spec.description for spec in specs)
    declared = {key for spec in specs for key in spec.job_fields}
    assert declared <= set(FIELDS)
    assert set(OPTIONAL_KEYS) <= declared  # an optional key nobody reads would never be hashed
    other_values = {"mlp_hidden": (3,), "image_shape": (8, 8, 3), "num_classes": 5, "synthetic_samples": 7,
                    "tfrecord_sharding": "files", "tfrecord_label_offset": 0}
    default = Job()
    for spec in specs:
        if isinstance(spec, ModelSpec):  # with the default dataset, which reads some keys too
            kw, other = {"model": spec.name}, DATASETS[default.dataset]
        else:
            kw, other = {"dataset": spec.name, "data_dir": "d"}, MODELS[default.model]
        for key in OPTIONAL_KEYS:
            changed = Job(**kw, **{key: other_values[key]}).job_hash != Job(**kw).job_hash
            assert changed == (key in spec.job_fields or key in other.job_fields), (spec.name, key)


def test_evaluation_keys_are_hashed_only_when_set_and_validated(tmp_path):
    base = Job()
    assert Job(metrics=(), eval_every_epochs=1, target_metric="", target_value=0.0).job_hash == base.job_hash
    assert Job(metrics=("accuracy",)).job_hash != base.job_hash
    assert Job(eval_every_epochs=2).job_hash != base.job_hash
    f = tmp_path / "j.toml"
    f.write_text('metrics = ["accuracy", "sparse_top_k_categorical_accuracy"]\ntarget_metric = "accuracy"\n'
                 "target_value = 0.9\n")
    job = load_job(f, ["eval_every_epochs=3"])
    assert job.metrics == ("accuracy", "sparse_top_k_categorical_accuracy") and job.eval_every_epochs == 3
    assert load_job(None, ["metrics=accuracy,acc"]).metrics == ("accuracy", "acc")
    for sets, message in ((["metrics=top-5"], "metrics must be Keras metric names"),
                          (["eval_every_epochs=0"], "eval_every_epochs"),
                          (["target_metric=accuracy"], "use \"loss\" or one of metrics"),
                          (["metrics=acc,acc"], "twice")):
        with pytest.raises(JobError, match=message):
            load_job(None, sets)
    f.write_text("metrics = [1, 2]\n")
    with pytest.raises(JobError, match="a list of strings"):
        load_job(f)
