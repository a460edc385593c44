"""The local set-up and the cluster environment.yml pin the same versions; the doctor tells what is missing."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import REPO, base_env, env_with_broken_horovod


def _requirements() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, ver = line.split("==")
            pins[name.strip()] = ver.strip()
    return pins


def _environment_yml() -> tuple[dict[str, str], str]:
    text = (REPO / "environment.yml").read_text()
    pins = {}
    for m in re.finditer(r"^\s*-\s*([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?\s*(==|=)\s*([0-9][^\s#]*)", text, re.M):
        pins[m.group(1)] = m.group(3)
    return pins, text


def test_environment_yml_matches_requirements():
    req, (env, text) = _requirements(), _environment_yml()
    for name in ("tensorflow", "tf-keras", "mpi4py", "pytest", "matplotlib"):
        assert name in env, f"environment.yml has no pin for {name}"
        assert env[name] == req[name], f"{name}: environment.yml {env[name]} vs requirements.txt {req[name]}"
    assert env["python"] == f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert "tensorflow[and-cuda]==" in text  # the GPU build on clusters


def test_horovod_version_and_flags_agree_with_setup():
    setup = (REPO / "scripts" / "setup.sh").read_text()
    hv = re.search(r"HOROVOD_VERSION=([0-9.]+)", setup).group(1)
    tf = re.search(r"TF_VERSION=([0-9.]+)", setup).group(1)
    env_text = (REPO / "environment.yml").read_text()
    assert f"horovod=={hv}" in env_text
    assert tf == _requirements()["tensorflow"]
    for flag in ("HOROVOD_WITH_TENSORFLOW=1", "HOROVOD_WITH_GLOO=1", "HOROVOD_WITH_MPI=1", "--no-build-isolation",
                 "CMAKE_POLICY_VERSION_MINIMUM=3.5"):
        assert flag in setup, flag
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in env_text


def test_installed_versions_are_the_pinned_ones():
    import importlib.metadata as md

    for name, ver in _requirements().items():
        assert md.version(name) == ver, name
    assert md.version("horovod") == "0.28.1"


def test_doctor_reports_both_backends_ok():
    proc = subprocess.run([sys.executable, "-m", "common.doctor"], cwd=REPO, env=base_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^tensorflow\s+2\.18\.1$", proc.stdout, re.M)
    assert re.search(r"^horovod\s+0\.28\.1$", proc.stdout, re.M)
    assert "'gloo': True" in proc.stdout and "'mpi': True" in proc.stdout


def test_doctor_fails_when_horovod_is_missing(tmp_path):
    env = env_with_broken_horovod(tmp_path, "horovod was not built")
    proc = subprocess.run([sys.executable, "-m", "common.doctor"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1
    assert "MISSING: horovod==0.28.1" in proc.stdout
