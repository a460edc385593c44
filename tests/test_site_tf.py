"""`TWINBENCH_TF=site` (scripts/setup.sh + scripts/site_tf.py): the version check and the decisions, with fake
TensorFlow versions; setup.sh itself up to the point where it would build (never building Horovod here)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import site_tf
from tests.conftest import REPO, base_env

CPU, GPU = site_tf.CPU_PATCH, site_tf.GPU_PATCH


@pytest.mark.parametrize(("tf", "gpu", "patches"), [
    ("2.16.2", False, []), ("2.17.1", True, []), ("2.18.1", True, []),  # the unpatched sdist builds against them
    ("2.19.0", False, [CPU]), ("2.20.0", False, [CPU]), ("2.21.0", False, [CPU]),
    ("2.19.1", True, [CPU, GPU]), ("2.21.0", True, [CPU, GPU]),
    ("2.17.0+nv24.08", False, []), ("2.21.0rc1", False, [CPU]),  # vendor and pre-release suffixes
])
def test_patches_only_from_219(tf, gpu, patches):
    d = site_tf.decide(tf, f"{'.'.join(tf.split('.')[:2])}.0", gpu)
    assert d.patches == patches and d.install_tf_keras is None and d.tf_version == tf
    for p in d.patches:
        assert (REPO / p).is_file(), p


@pytest.mark.parametrize("tf", ["2.15.1", "2.22.0", "1.15.5", "3.0.0"])
def test_unsupported_tensorflow_is_one_line(tf):
    with pytest.raises(site_tf.SiteError, match=rf"^TensorFlow {tf} is not supported: TWINBENCH_TF=site needs "
                                                 r"2\.16-2\.21"):
        site_tf.decide(tf, None, False)


def test_tf_keras_installed_when_missing_refused_when_another_minor():
    assert site_tf.decide("2.20.1", None, False).install_tf_keras == "tf-keras~=2.20.0"
    assert site_tf.decide("2.16.1", "2.16.0", False).install_tf_keras is None
    with pytest.raises(site_tf.SiteError, match=r"^tf-keras 2\.21\.0 does not match TensorFlow 2\.20\.1: install "
                                                r"tf-keras~=2\.20\.0"):
        site_tf.decide("2.20.1", "2.21.0", False)
    with pytest.raises(site_tf.SiteError, match="cannot read the version"):
        site_tf.decide("nightly", None, False)


def test_shell_assignments_round_trip_through_bash():
    d = site_tf.decide("2.19.0", None, True)
    text = site_tf.shell_assignments(d, "/opt/site tf/tensorflow", "abc")
    script = text + '\nprintf "%s|" "$TF_VERSION" "$TF_KERAS_INSTALL" "$TF_LOCATION" "${#PATCHES[@]}" "${PATCHES[@]}"'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.split("|")[:-1] == ["2.19.0", "tf-keras~=2.19.0", "/opt/site tf/tensorflow", "2", CPU, GPU]
    assert shlex.quote("/opt/site tf/tensorflow") in text


def test_site_requirements_drop_the_tensorflow_pins():
    text = (REPO / "requirements.txt").read_text()
    out = site_tf.site_requirements(text, "2.17.0", have_tensorboard=False)
    names = [re.split(r"[ =~]", ln)[0] for ln in out.splitlines() if ln and not ln.startswith("#")]
    assert "tensorflow" not in names and "tf-keras" not in names
    assert names.count("tensorboard") == 1 and "tensorboard~=2.17.0" in out.splitlines()
    assert "mpi4py==4.1.1" in out and 'tomli==2.2.1 ; python_version < "3.11"' in out
    kept = site_tf.site_requirements(text, "2.17.0", have_tensorboard=True).splitlines()
    assert not [ln for ln in kept if ln.startswith("tensorboard")]


def _fake_tensorflow(root: Path, version: str) -> dict[str, str]:
    """An environment whose python imports a fake tensorflow of ``version`` (no tf-keras metadata change)."""
    pkg = root / "tensorflow"
    (pkg / "sysconfig").mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"__version__ = {version!r}\nfrom tensorflow import sysconfig\n")
    (pkg / "sysconfig" / "__init__.py").write_text(
        "def get_compile_flags():\n    return ['-I/fake']\n\ndef get_link_flags():\n    return ['-L/fake']\n")
    env = base_env()
    env["PYTHONPATH"] = f"{root}:{env['PYTHONPATH']}"
    env["PYTHON"] = sys.executable
    return env


def _setup(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(REPO / "scripts" / "setup.sh"), "--horovod-only"], cwd=REPO,
                          env={**env, "TWINBENCH_TF": "site", "TWINBENCH_CACHE": "/nonexistent"},
                          capture_output=True, text=True, timeout=120)


def test_detect_imports_the_site_tensorflow(tmp_path):
    env = _fake_tensorflow(tmp_path, "2.21.0")  # with the venv's tf-keras 2.21
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "site_tf.py"), "detect"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert "TF_VERSION=2.21.0" in out and "TF_KERAS_INSTALL=''" in out and f"PATCHES=({CPU})" in out
    assert f"TF_LOCATION={tmp_path / 'tensorflow'}" in out


@pytest.mark.parametrize(("version", "message"), [
    ("2.15.0", "[setup] TensorFlow 2.15.0 is not supported: TWINBENCH_TF=site needs 2.16-2.21"),
    ("2.18.0", "[setup] tf-keras 2.21.0 does not match TensorFlow 2.18.0: install tf-keras~=2.18.0"),
])
def test_setup_refuses_in_one_line_with_status_2(tmp_path, version, message):
    proc = _setup(_fake_tensorflow(tmp_path, version))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [message + " (tf-keras X.Y belongs to TensorFlow X.Y)"
                                                if "tf-keras" in message else
                                                message + " (or use the pinned TWINBENCH_TF=2.21 / 2.18)"]
    assert "building horovod" not in proc.stdout


def test_setup_without_tensorflow_says_so(tmp_path):
    env = base_env()
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text("raise ImportError('no TensorFlow here')\n")
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    env["PYTHON"] = sys.executable
    proc = _setup(env)
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("[setup] ") and "cannot import tensorflow (ImportError: no TensorFlow here)" in line


def test_unknown_tf_mode_is_exit_2():
    proc = subprocess.run(["bash", str(REPO / "scripts" / "setup.sh")], cwd=REPO,
                          env={**base_env(), "TWINBENCH_TF": "2.99"}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ('[setup] TWINBENCH_TF must be 2.21 (default), 2.18 (fallback), 2.17 (the NGC 25.02 '
                                   'stand-in) or site, not "2.99"')


def test_build_marker_records_the_site_tensorflow(tmp_path, monkeypatch):
    """What setup.sh passes after a site build lands in the marker (written under a fake prefix, nothing built)."""
    import json

    from common.core import buildinfo

    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    assert buildinfo.main(["write", "--build-id", "horovod-x-site0123456789", "--tf-source", "site",
                           "--tf-version", "2.20.0", "--tf-location", "/opt/site/tensorflow"]) == 0
    marker = json.loads((tmp_path / buildinfo.MARKER_NAME).read_text())
    assert marker["tensorflow_source"] == "site" and marker["tensorflow_location"] == "/opt/site/tensorflow"
    assert marker["build_id"].endswith("-site0123456789") and marker["tensorflow"]  # the installed one's version
    assert buildinfo.main(["write", "--build-id", "b"]) == 0
    marker = json.loads((tmp_path / buildinfo.MARKER_NAME).read_text())
    assert marker["tensorflow_source"] == "requirements:requirements.txt" and marker["tensorflow_location"] is None


def test_setup_passes_the_source_to_the_marker():
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert '--tf-source "$TF_SOURCE"' in setup and '--tf-location "$TF_LOCATION"' in setup
    assert 'build_id+="-site$TF_SITE_ID"' in setup and "--system-site-packages" in setup
