"""A record is published: the environment it keeps tunes the libraries, holds no secret and no home directory."""

from __future__ import annotations

from common.core.privacy import REDACTED, is_tuning, public, public_env, without_home

ENV = {
    "TF_VAR_db_password": "hunter2",  # Terraform: a secret
    "TF_CLI_CONFIG_FILE": "/home/alice/.terraformrc",  # Terraform: a home path
    "TF_CONFIG": '{"cluster": {}}',  # the cluster: recorded apart, not a tuning variable
    "NCCL_SOCKET_IFNAME": "ib0",
    "NCCL_IB_HCA": "mlx5_0",
    "HOROVOD_FUSION_THRESHOLD": "33554432",
    "HOROVOD_GLOO_IFACE_AUTH_TOKEN": "abc",  # tuning prefix, secret-looking name
    "UCX_TLS": "rc,sm",
    "OMPI_MCA_btl": "^openib",
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "TF_USE_LEGACY_KERAS": "1",
    "TF_XLA_FLAGS": "--tf_xla_cpu_global_jit --dump=/home/alice/xla",
    "XLA_FLAGS": "--xla_dump_to=/root/dumps",
    "HOME": "/root",
    "AWS_SECRET_ACCESS_KEY": "xyz",
}


def test_only_tuning_variables_are_kept_secrets_redacted_and_homes_hidden():
    env = public_env(ENV, home="/root")
    assert sorted(env) == ["HOROVOD_FUSION_THRESHOLD", "HOROVOD_GLOO_IFACE_AUTH_TOKEN", "NCCL_IB_HCA",
                           "NCCL_SOCKET_IFNAME", "OMPI_MCA_btl", "TF_CPP_MIN_LOG_LEVEL", "TF_USE_LEGACY_KERAS",
                           "TF_XLA_FLAGS", "UCX_TLS", "XLA_FLAGS"]
    assert env["HOROVOD_GLOO_IFACE_AUTH_TOKEN"] == REDACTED
    assert env["TF_XLA_FLAGS"] == "--tf_xla_cpu_global_jit --dump=~/xla"
    assert env["XLA_FLAGS"] == "--xla_dump_to=~/dumps"
    assert env["NCCL_SOCKET_IFNAME"] == "ib0"
    assert not is_tuning("TF_VAR_anything") and not is_tuning("TF_CLI_CONFIG_FILE") and not is_tuning("TF_CONFIG")


def test_home_directories_become_tilde_but_other_paths_stay():
    assert without_home("/root/x/y.toml", home="/root") == "~/x/y.toml"
    assert without_home("/root", home="/root") == "~"
    assert without_home("/rootfs/data", home="/root") == "/rootfs/data"  # a prefix of a name is not the home
    assert without_home("/scratch/job/home/a", home="/root") == "/scratch/job/home/a"
    assert without_home("/home/bob/runs and /Users/carol/x", home="/root") == "~/runs and ~/x"
    nested = {"job": "/home/bob/j.toml", "dirs": ["/root/r", "/work/r"], "/home/bob/k": 1, "n": 3}
    assert public(nested, home="/root") == {"job": "~/j.toml", "dirs": ["~/r", "/work/r"], "~/k": 1, "n": 3}


def test_a_job_hashes_as_published_so_a_reader_gets_the_same_hash(monkeypatch):
    """The record writes home directories as ~: the hash is of that form, so recomputing it from the record's job
    gives the record's hash, whoever reads it (common.report recomputes it); another path is another job."""
    from common.report.load import recompute_job_hash
    from common.workload.job import Job

    monkeypatch.setenv("HOME", "/gpfs/home/alice")
    mine = Job(model="pkg.mod:build", model_args={"weights": "/gpfs/home/alice/w.npz"})
    published = public(mine.to_dict())
    assert published["model_args"] == {"weights": "~/w.npz"}
    assert recompute_job_hash(published) == mine.job_hash == Job(model="pkg.mod:build",
                                                                 model_args={"weights": "~/w.npz"}).job_hash
    assert Job(model="pkg.mod:build", model_args={"weights": "/scratch/w.npz"}).job_hash != mine.job_hash


def test_a_run_started_from_a_home_directory_publishes_no_home_path(tmp_path):
    """The example job copied into a home directory (its pythonpath, the --job and --results paths on the command
    line all under it): the record names none of them but as ~, and its hash is the one a reader recomputes."""
    import json
    import shutil

    from common.report.load import recompute_job_hash
    from tests.conftest import PY, REPO, base_env, only_result, run

    home = tmp_path / "alice"
    proj = home / "proj"
    shutil.copytree(REPO / "examples" / "mypkg", proj / "mypkg")
    shutil.copy(REPO / "examples" / "my_job.toml", proj / "job.toml")
    run([PY, "-m", "backends.native", "--job", str(proj / "job.toml"), "--results", str(home / "res"), "--quiet",
         "--set", "steps=2"], env={**base_env(), "HOME": str(home)})
    text = next((home / "res").glob("*.json")).read_text()
    assert str(home) not in text and str(tmp_path) not in text
    rec = only_result(home / "res")
    assert rec["job"]["pythonpath"] == ["~/proj"] and "~/proj/job.toml" in rec["command"], rec["command"]
    assert recompute_job_hash(rec["job"]) == rec["job_hash"]
    assert json.loads(text)["job_hash"] == rec["job_hash"]
