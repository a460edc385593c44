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
