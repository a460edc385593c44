"""The local set-up and the cluster environment.yml pin the same versions; the doctor tells what is missing.

requirements.txt is the default (TensorFlow 2.21, patched Horovod sdist), requirements-tf2.18.txt the fallback
(TWINBENCH_TF=2.18, unpatched sdist); scripts/setup.sh reads its pins from them and environment.yml repeats the
default's. The installed-version tests check whichever of the two the running environment was set up from.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from common.core import buildinfo
from tests.conftest import REPO, base_env, env_with_broken_horovod

SETUP = REPO / "scripts" / "setup.sh"
CPU_PATCH = REPO / "scripts" / "patches" / "horovod-0.28.1-tf2.19plus.patch"
GPU_PATCH = REPO / "scripts" / "patches" / "horovod-0.28.1-tf2.21-gpu.patch"
FALLBACK = REPO / "requirements-tf2.18.txt"


def _requirements(name: str = "requirements.txt") -> dict[str, str]:
    return buildinfo.read_pins(REPO / name)


def _environment_yml() -> tuple[dict[str, str], str]:
    text = (REPO / "environment.yml").read_text()
    pins = {}
    for m in re.finditer(r"^\s*-\s*([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?\s*(==|=)\s*([0-9][^\s#]*)", text, re.M):
        pins[m.group(1)] = m.group(3)
    return pins, text


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _installed_pins() -> dict[str, str]:
    """The requirements file this environment was set up from (by its TensorFlow's major.minor)."""
    import importlib.metadata as md

    return buildinfo.pins_for(md.version("tensorflow"))


def test_environment_yml_matches_requirements():
    req, (env, text) = _requirements(), _environment_yml()
    for name in ("tensorflow", "tf-keras", "mpi4py", "pytest", "pytest-xdist", "matplotlib"):
        assert name in env, f"environment.yml has no pin for {name}"
        assert env[name] == req[name], f"{name}: environment.yml {env[name]} vs requirements.txt {req[name]}"
    assert env["python"] == f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert "tensorflow[and-cuda]==" in text  # the GPU build on clusters


def _requirement_specs(text: str) -> dict[str, str]:
    """name -> its specifier and marker as written (``==2.21.0``, ``~=2.21.0``, ``==2.2.1 ; python_version...``),
    for the lines of a requirements file or of environment.yml's pip section."""
    specs = {}
    for line in text.splitlines():
        line = line.split("#")[0].strip().removeprefix("- ").strip()
        m = re.match(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?\s*((?:==|~=)[^\s;]+)\s*(;.*)?$", line)
        if m:
            specs[m.group(1)] = m.group(2) + (f" {m.group(3).strip()}" if m.group(3) else "")
    return specs


def test_environment_yml_pip_section_pins_what_requirements_pins():
    """Every requirement of requirements.txt, with the same version (and marker), in environment.yml: in its pip
    section, but mpi4py, which conda builds against conda's Open MPI (same version)."""
    text = (REPO / "environment.yml").read_text()
    pip_section = text.split("  - pip:\n", 1)[1]
    conda_section = text.split("  - pip:\n", 1)[0]
    req = _requirement_specs((REPO / "requirements.txt").read_text())
    pip = _requirement_specs(pip_section)
    assert req and "tensorflow" in req and "tomli" in req, req
    for name, spec in req.items():
        if name == "mpi4py":
            assert re.search(rf"^\s*- mpi4py={re.escape(spec[2:])}$", conda_section, re.M), spec
            assert name not in pip
            continue
        assert pip.get(name) == spec, f"{name}: environment.yml {pip.get(name)!r} vs requirements.txt {spec!r}"
    assert set(pip) == set(req) - {"mpi4py"}, set(pip) ^ (set(req) - {"mpi4py"})


def test_environment_yml_says_it_was_never_solved():
    """No conda channel is reachable from the development machine: the file and the README say so."""
    assert "never been solved" in (REPO / "environment.yml").read_text()
    readme = (REPO / "README.md").read_text()
    cluster = readme.split("## Running on a cluster", 1)[1]
    assert "conda env create" in cluster and "never been solved" in cluster


def test_default_and_fallback_pins():
    default, fallback = _requirements(), _requirements(FALLBACK.name)
    assert _minor(default["tensorflow"]) == "2.21" and _minor(fallback["tensorflow"]) == "2.18"
    for pins in (default, fallback):  # tf-keras follows TensorFlow's minor version (legacy Keras 2)
        assert _minor(pins["tf-keras"]) == _minor(pins["tensorflow"]), pins
    rest = {k: v for k, v in default.items() if k not in ("tensorflow", "tf-keras")}
    assert rest == {k: v for k, v in fallback.items() if k not in ("tensorflow", "tf-keras")}
    assert buildinfo.pins_for("2.18.1") == fallback and buildinfo.pins_for("2.21.0") == default
    assert buildinfo.pins_for(None) == default


def test_horovod_version_and_flags_agree_with_setup():
    setup = SETUP.read_text()
    hv = re.search(r"^HOROVOD_VERSION=([0-9.]+)", setup, re.M).group(1)
    assert hv == buildinfo.HOROVOD_VERSION
    env_text = (REPO / "environment.yml").read_text()
    assert f"horovod=={hv}" in env_text
    for flag in ("HOROVOD_WITH_TENSORFLOW=1", "HOROVOD_WITH_GLOO=1", "HOROVOD_WITH_MPI=1", "--no-build-isolation",
                 "CMAKE_POLICY_VERSION_MINIMUM=3.5"):
        assert flag in setup, flag
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in env_text and "scripts/setup.sh --horovod-only" in env_text
    # setup.sh selects the requirements file and the patches; the patch files it names exist
    assert re.search(r"2\.21\)\s*REQUIREMENTS=requirements\.txt", setup)
    assert re.search(rf"2\.18\)\s*REQUIREMENTS={re.escape(FALLBACK.name)}\s*PATCHES=\(\)", setup)
    for patch in (CPU_PATCH, GPU_PATCH):
        assert patch.is_file() and str(patch.relative_to(REPO)) in setup, patch


def test_patches_apply_to_the_sdist(tmp_path):
    """The CPU patch, then the GPU patch, apply cleanly to PyPI's sdist (the one setup.sh cached)."""
    import os
    import tarfile

    cache = Path(os.environ.get("TWINBENCH_CACHE", Path.home() / ".cache" / "twinbench"))
    sdist = cache / "sdist" / f"horovod-{buildinfo.HOROVOD_VERSION}.tar.gz"
    if not sdist.is_file():
        pytest.skip(f"no cached sdist at {sdist} (scripts/setup.sh with TWINBENCH_TF=2.21 puts it there)")
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path, filter="data")
    src = tmp_path / f"horovod-{buildinfo.HOROVOD_VERSION}"
    for patch in (CPU_PATCH, GPU_PATCH):
        proc = subprocess.run(["patch", "-p1", "--batch", "--forward"], cwd=src, stdin=patch.open("rb"),
                              capture_output=True, timeout=60)
        assert proc.returncode == 0, (patch.name, proc.stdout, proc.stderr)
    xla = (src / "horovod" / "tensorflow" / "xla_mpi_ops.cc").read_text()
    assert "#if TENSORFLOW_VERSION >= 2006000000 && HAVE_GPU" in xla and "xla::StatusOr" not in xla
    assert "AsGpuStreamValue(device_context" not in (src / "horovod" / "tensorflow" / "mpi_ops.cc").read_text()


def test_installed_versions_are_the_pinned_ones():
    import importlib.metadata as md

    pins = _installed_pins()
    for name, ver in pins.items():
        assert md.version(name) == ver, name
    assert md.version("horovod") == buildinfo.HOROVOD_VERSION


def test_build_marker_describes_installed_horovod():
    """scripts/setup.sh left a marker for the Horovod it installed, naming the patches of the selected TF."""
    import importlib.metadata as md

    marker = buildinfo.read_marker()
    assert marker is not None, f"no valid {buildinfo.marker_path()}: run scripts/setup.sh"
    assert marker["tensorflow"] == md.version("tensorflow") and marker["horovod"] == md.version("horovod")
    assert marker["tf_keras"] == md.version("tf-keras")
    patched = _minor(md.version("tensorflow")) != "2.18"
    assert [p["file"] for p in marker["patches"]][:1] == ([CPU_PATCH.name] if patched else [])
    for p in marker["patches"]:
        assert p["sha256"] == buildinfo.sha256_file(REPO / "scripts" / "patches" / p["file"]), p
    assert marker["build_flags"]["HOROVOD_WITH_GLOO"] == "1" and marker["build_flags"]["HOROVOD_WITH_MPI"] == "1"


def test_versions_report_the_horovod_patch(monkeypatch):
    from common.core import results

    vers = results.versions()
    if "horovod" not in sys.modules:
        assert "horovod_patch" not in vers  # native runs do not load Horovod
        monkeypatch.setitem(sys.modules, "horovod", types.SimpleNamespace(__version__=buildinfo.HOROVOD_VERSION))
        vers = results.versions()
    assert vers["horovod_patch"] == buildinfo.horovod_patch()
    marker = buildinfo.read_marker()
    expected = "unknown" if marker is None else (marker["patch_id"] or "none")
    assert vers["horovod_patch"] == expected


def test_marker_of_another_horovod_is_not_trusted(tmp_path, monkeypatch):
    (tmp_path / buildinfo.MARKER_NAME).write_text(json.dumps({
        "patches": [{"file": CPU_PATCH.name, "sha256": "0" * 64}], "patch_id": "000000000000",
        "horovod_lib": {"path": "horovod/tensorflow/mpi_lib.so", "hash": "sha256=not-the-installed-one"}}))
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    buildinfo.read_marker.cache_clear()
    try:
        assert buildinfo.read_marker() is None
        assert buildinfo.horovod_patch() == "unknown"
        assert buildinfo.horovod_patch_description().startswith("unknown (")
        (tmp_path / buildinfo.MARKER_NAME).unlink()
        buildinfo.read_marker.cache_clear()
        assert buildinfo.horovod_patch_description() == buildinfo.NO_MARKER
    finally:
        buildinfo.read_marker.cache_clear()


def test_doctor_reports_both_backends_ok():
    proc = subprocess.run([sys.executable, "-m", "common.doctor"], cwd=REPO, env=base_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pins = _installed_pins()
    assert re.search(rf"^tensorflow\s+{re.escape(pins['tensorflow'])}$", proc.stdout, re.M), proc.stdout
    assert re.search(rf"^horovod\s+{re.escape(buildinfo.HOROVOD_VERSION)}$", proc.stdout, re.M)
    assert "'gloo': True" in proc.stdout and "'mpi': True" in proc.stdout
    patch_line = re.search(r"^horovod_patch\s+(.*)$", proc.stdout, re.M)
    assert patch_line, proc.stdout
    if _minor(pins["tensorflow"]) == "2.18":
        assert patch_line.group(1) == buildinfo.UNPATCHED
    else:
        assert patch_line.group(1).startswith(f"{CPU_PATCH.name} (sha256 {buildinfo.sha256_file(CPU_PATCH)[:12]})")


def test_doctor_fails_when_horovod_is_missing(tmp_path):
    env = env_with_broken_horovod(tmp_path, "horovod was not built")
    proc = subprocess.run([sys.executable, "-m", "common.doctor"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1
    assert f"MISSING: horovod=={buildinfo.HOROVOD_VERSION} built with TensorFlow {_installed_pins()['tensorflow']}" \
        in proc.stdout
