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
GCC_PATCH = REPO / "scripts" / "patches" / "horovod-0.28.1-gcc13plus.patch"
FALLBACK = REPO / "requirements-tf2.18.txt"


def _requirements(name: str = "requirements.txt") -> dict[str, str]:
    return buildinfo.read_pins(REPO / name)


PREBUILT = REPO / "environment.yml"  # conda-forge's tensorflow + horovod, nothing compiled
BUILD = REPO / "environment-build.yml"  # PyPI's TensorFlow + the patched Horovod sdist
CONDA_ENV = REPO / "scripts" / "conda_env.py"


def _environment_yml(path: Path = BUILD) -> tuple[dict[str, str], str]:
    """name -> version of every `- name=version` / `- name==version` line (a conda build string dropped)."""
    text = path.read_text()
    pins = {}
    for m in re.finditer(r"^\s*-\s*([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?\s*(==|=)\s*([0-9][^\s#=]*)", text, re.M):
        pins[m.group(1)] = m.group(3)
    return pins, text


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _installed_pins() -> dict[str, str]:
    """The requirements file this environment was set up from (by its TensorFlow's major.minor)."""
    import importlib.metadata as md

    return buildinfo.pins_for(md.version("tensorflow"))


@pytest.mark.parametrize("path", [PREBUILT, BUILD], ids=lambda p: p.name)
def test_environment_files_match_requirements(path):
    req, (env, _) = _requirements(), _environment_yml(path)
    for name in ("tensorflow", "tf-keras", "mpi4py", "pytest", "pytest-xdist", "matplotlib"):
        assert name in env, f"{path.name} has no pin for {name}"
        assert env[name] == req[name], f"{name}: {path.name} {env[name]} vs requirements.txt {req[name]}"
    # a Python the stack has builds for; never the interpreter running the tests (make test runs on 3.10-3.13)
    allowed = ("3.10", "3.11", "3.12") if path == PREBUILT else ("3.11", "3.12", "3.13")
    assert env["python"] in allowed, env["python"]


def test_environment_yml_is_conda_forges_prebuilt_stack():
    """environment.yml compiles nothing: conda-forge's tensorflow and horovod of one variant it builds (CUDA kind
    and MPI the same in both), no compiler, no pip TensorFlow; the compile road is environment-build.yml."""
    env, text = _environment_yml(PREBUILT)
    deps = text.split("  - pip:\n", 1)[0]
    tf = re.search(r"^\s*- tensorflow=2\.21\.0=(cuda(\d+)|cpu_)\*$", deps, re.M)
    hvd = re.search(rf"^\s*- horovod\[version='{re.escape(buildinfo.HOROVOD_VERSION)}',build='(cuda|cpu)_mpi_"
                    r"(openmpi|mpich)_\*',build_number='>=21'\]$", deps, re.M)
    assert tf and hvd, deps
    assert (tf.group(1) == "cpu_") == (hvd.group(1) == "cpu")
    if tf.group(2):
        assert env["cuda-version"].replace(".", "") == tf.group(2)
    assert re.search(rf"^\s*- {hvd.group(2)}=\d+$", deps, re.M), deps
    for absent in ("cxx-compiler", "cmake", "tensorflow[and-cuda]", "horovod==", "--horovod-only"):
        assert absent not in text.split("name: twinbench", 1)[1], absent
    _, build_text = _environment_yml(BUILD)
    assert "tensorflow[and-cuda]==" in build_text and "cxx-compiler" in build_text  # the GPU wheel, compiled Horovod


def _requirement_specs(text: str) -> dict[str, str]:
    """name -> its specifier and marker as written (``==2.21.0``, ``~=2.21.0``, ``==2.2.1 ; python_version...``),
    for the lines of a requirements file or of environment.yml's pip section."""
    specs = {}
    for line in text.splitlines():
        line = line.split("#")[0].strip().removeprefix("- ").strip()
        m = re.match(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?\s*((?:==|~=)[^\s;]+)\s*(;.*)?$", line)
        if m:  # a package pinned per Python version (scipy) has a line per marker: all of them, in order
            spec = m.group(2) + (f" {m.group(3).strip()}" if m.group(3) else "")
            specs[m.group(1)] = f"{specs[m.group(1)]} | {spec}" if m.group(1) in specs else spec
    return specs


@pytest.mark.parametrize("path", [PREBUILT, BUILD], ids=lambda p: p.name)
def test_environment_pip_sections_pin_what_requirements_pins(path):
    """Every requirement of requirements.txt, with the same version (and marker), in each environment file: in its
    pip section, but what conda installs at the same version (mpi4py, built against conda's MPI; TensorFlow in the
    prebuilt stack)."""
    text = path.read_text()
    pip_section = text.split("  - pip:\n", 1)[1]
    conda_section = text.split("  - pip:\n", 1)[0]
    req = _requirement_specs((REPO / "requirements.txt").read_text())
    pip = _requirement_specs(pip_section)
    assert req and "tensorflow" in req and "tomli" in req, req
    from_conda = {"mpi4py", "tensorflow"} if path == PREBUILT else {"mpi4py"}
    for name, spec in req.items():
        if name in from_conda:
            assert re.search(rf"^\s*- {name}={re.escape(spec[2:])}(=\S+)?$", conda_section, re.M), (name, spec)
            assert name not in pip
            continue
        assert pip.get(name) == spec, f"{name}: {path.name} {pip.get(name)!r} vs requirements.txt {spec!r}"
    assert set(pip) == set(req) - from_conda, set(pip) ^ (set(req) - from_conda)


def test_environment_files_say_they_were_never_solved():
    """No conda channel is reachable from the development machine: the files and the README say so, and the user's
    command stays `conda env create -f environment.yml`."""
    for path in (PREBUILT, BUILD):
        assert "never been solved" in path.read_text(), path.name
    readme = (REPO / "README.md").read_text()
    cluster = readme.split("## Running on a cluster", 1)[1]
    assert re.search(r"^conda env create -f environment\.yml\s", cluster, re.M) and "never been solved" in cluster


@pytest.mark.parametrize("cuda", ["12.9", "13.0", "cpu"])
@pytest.mark.parametrize("mpi", ["openmpi", "mpich"])
def test_conda_env_writes_each_variant_conda_forge_builds(cuda, mpi):
    proc = subprocess.run([sys.executable, str(CONDA_ENV), "--cuda", cuda, "--mpi", mpi, "--python", "3.11"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    deps = proc.stdout.split("  - pip:\n", 1)[0]
    kind = "cpu" if cuda == "cpu" else "cuda"
    tf_build = "cpu_*" if cuda == "cpu" else f"cuda{cuda.replace('.', '')}*"
    assert f"  - tensorflow=2.21.0={tf_build}\n" in deps
    assert f"  - horovod[version='0.28.1',build='{kind}_mpi_{mpi}_*',build_number='>=21']\n" in deps
    assert ("cuda-version=" in deps) == (cuda != "cpu")
    assert cuda == "cpu" or f"  - cuda-version={cuda}\n" in deps
    other = "mpich" if mpi == "openmpi" else "openmpi"
    assert f"  - {mpi}=5\n" in deps and f"  - {other}=" not in deps
    assert "  - python=3.11" in deps
    assert proc.stdout.split("  - pip:\n", 1)[1] == PREBUILT.read_text().split("  - pip:\n", 1)[1]


def test_conda_env_default_is_environment_yml():
    proc = subprocess.run([sys.executable, str(CONDA_ENV)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and proc.stdout.split("\n", 1)[1] == PREBUILT.read_text()


@pytest.mark.parametrize("args", [["--cuda", "12.4"], ["--mpi", "mvapich"], ["--python", "3.13"]])
def test_conda_env_refuses_a_variant_conda_forge_does_not_build(args):
    proc = subprocess.run([sys.executable, str(CONDA_ENV), *args], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert args[1] in proc.stderr


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
    env_text = BUILD.read_text()
    assert f"horovod=={hv}" in env_text and f"- horovod[version='{hv}'," in PREBUILT.read_text()
    for flag in ("HOROVOD_WITH_TENSORFLOW=1", "HOROVOD_WITH_GLOO=1", "HOROVOD_WITH_MPI=1", "--no-build-isolation",
                 "CMAKE_POLICY_VERSION_MINIMUM=3.5"):
        assert flag in setup, flag
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in env_text and "scripts/setup.sh --horovod-only" in env_text
    # setup.sh selects the requirements file and the patches; the patch files it names exist
    assert re.search(r"2\.21\)\s*REQUIREMENTS=requirements\.txt", setup)
    assert re.search(rf"2\.18\)\s*REQUIREMENTS={re.escape(FALLBACK.name)}\s*PATCHES=\(\)", setup)
    for patch in (CPU_PATCH, GPU_PATCH, GCC_PATCH):
        assert patch.is_file() and str(patch.relative_to(REPO)) in setup, patch
    # every build carries the GCC 13+ patch: appended after the TWINBENCH_TF case and the site detection
    gcc_line = setup.index(f"PATCHES+=({GCC_PATCH.relative_to(REPO)})")
    assert gcc_line > setup.index('eval "$site_vars"') and gcc_line < setup.index("patch_ids=()")


def test_patches_apply_to_the_sdist(tmp_path):
    """The CPU patch, the GPU patch, then the GCC 13+ patch apply cleanly to PyPI's sdist (the one setup.sh cached)."""
    import os
    import tarfile

    cache = Path(os.environ.get("TWINBENCH_CACHE", Path.home() / ".cache" / "twinbench"))
    sdist = cache / "sdist" / f"horovod-{buildinfo.HOROVOD_VERSION}.tar.gz"
    if not sdist.is_file():
        pytest.skip(f"no cached sdist at {sdist} (scripts/setup.sh with TWINBENCH_TF=2.21 puts it there)")
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path, filter="data")
    src = tmp_path / f"horovod-{buildinfo.HOROVOD_VERSION}"
    for patch in (CPU_PATCH, GPU_PATCH, GCC_PATCH):
        proc = subprocess.run(["patch", "-p1", "--batch", "--forward"], cwd=src, stdin=patch.open("rb"),
                              capture_output=True, timeout=60)
        assert proc.returncode == 0, (patch.name, proc.stdout, proc.stderr)
    xla = (src / "horovod" / "tensorflow" / "xla_mpi_ops.cc").read_text()
    assert "#if TENSORFLOW_VERSION >= 2006000000 && HAVE_GPU" in xla and "xla::StatusOr" not in xla
    assert "AsGpuStreamValue(device_context" not in (src / "horovod" / "tensorflow" / "mpi_ops.cc").read_text()
    assert "#include <stdexcept>" in (src / "horovod" / "common" / "common.h").read_text()


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
    patched = _minor(md.version("tensorflow")) not in ("2.17", "2.18")
    files = [p["file"] for p in marker["patches"]]
    assert files[:1] == ([CPU_PATCH.name] if patched else [GCC_PATCH.name]) and files[-1] == GCC_PATCH.name, files
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
    if _minor(pins["tensorflow"]) in ("2.17", "2.18"):  # the TensorFlow patches start at 2.19; GCC's is on every build
        assert patch_line.group(1).startswith(f"{GCC_PATCH.name} (sha256 {buildinfo.sha256_file(GCC_PATCH)[:12]})")
    else:
        assert patch_line.group(1).startswith(f"{CPU_PATCH.name} (sha256 {buildinfo.sha256_file(CPU_PATCH)[:12]})")


def test_doctor_fails_when_horovod_is_missing(tmp_path):
    env = env_with_broken_horovod(tmp_path, "horovod was not built")
    proc = subprocess.run([sys.executable, "-m", "common.doctor"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1
    assert f"MISSING: horovod=={buildinfo.HOROVOD_VERSION} built with TensorFlow {_installed_pins()['tensorflow']}" \
        in proc.stdout


def _fake_bin(tmp_path: Path, python_version: str, ensurepip: bool = True) -> Path:
    """A bin directory whose python3 answers setup.sh's version and ensurepip probes, and whose apt-get records its
    arguments and fails (so that nothing is installed)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(
        "#!/bin/sh\n"
        f'case "$2" in *ensurepip*) exit {0 if ensurepip else 1} ;; *version_info*) echo {python_version} ;; esac\n'
        "exit 0\n")
    (bin_dir / "apt-get").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/apt.log\nexit 100\n')
    (bin_dir / "sudo").write_text('#!/bin/sh\nexec "$@"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return bin_dir


def _setup_with(tmp_path: Path, bin_dir: Path, **env: str) -> subprocess.CompletedProcess:
    import os

    base = base_env()
    base.pop("PYTHON", None)
    run_env = {**base, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TWINBENCH_VENV": str(tmp_path / "venv"),
               "TWINBENCH_CACHE": str(tmp_path / "cache"), "TWINBENCH_TF": "2.21", "TWINBENCH_STACK": "",
               "TWINBENCH_WITH_SLURM": "0", "TWINBENCH_WITH_STACK_IMAGE": "0", **env}
    return subprocess.run(["bash", str(SETUP)], cwd=REPO, env=run_env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("version", ["3.9", "3.14"])
def test_setup_refuses_a_python_outside_310_313_before_installing(tmp_path, version):
    """TensorFlow 2.21 has wheels for CPython 3.10-3.13 only: another Python stops setup.sh with one line and exit 2,
    before apt-get, venv or pip."""
    proc = _setup_with(tmp_path, _fake_bin(tmp_path, version, ensurepip=False))
    out = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and proc.stdout == "" and len(out) == 1, proc.stdout + proc.stderr
    assert f"Python {version}" in out[0] and "3.10-3.13" in out[0], out
    assert not (tmp_path / "apt.log").exists() and not (tmp_path / "venv").exists()


def test_setup_refuses_a_missing_python(tmp_path):
    proc = _setup_with(tmp_path, _fake_bin(tmp_path, "3.13"), PYTHON="/nonexistent/python3")
    out = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and proc.stdout == "" and len(out) == 1 and "3.10-3.13" in out[0], out


def test_setup_installs_the_venv_package_a_stock_debian_lacks(tmp_path):
    """Debian's and Ubuntu's python3 has no ensurepip until python3.X-venv is installed: setup.sh asks apt-get for the
    one of the running Python's version (here a fake 3.13 without ensurepip; the fake apt-get installs nothing)."""
    proc = _setup_with(tmp_path, _fake_bin(tmp_path, "3.13", ensurepip=False))
    apt = (tmp_path / "apt.log").read_text() if (tmp_path / "apt.log").exists() else ""
    assert proc.returncode != 0 and "apt-get failed" in proc.stdout, proc.stdout + proc.stderr
    assert "update" in apt, apt  # the install line follows a successful update; the fake update fails first
    assert "python3.13-venv" in proc.stdout, proc.stdout
