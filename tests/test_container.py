"""The container launch lines of both backends, pinned against the runtimes' documented command lines with fake
runtimes first on PATH that record their argv (Apptainer, Pyxis' srun options, podman-hpc: none is installed
here), and bad container settings: one line, exit 2, nothing started. No TensorFlow, about a second each."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from common.cluster import container
from common.core import registry
from tests.conftest import PY, REPO, SMOKE, base_env

# A runtime that answers --version as the real one does and otherwise records its argv (one JSON list a line)
FAKE = """#!/bin/bash
if [ "$1" = --version ]; then echo "{version}"; exit 0; fi
python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@" >> "$FAKE_LOG"
"""
VERSIONS = {"apptainer": "apptainer version 1.3.4", "podman-hpc": "podman-hpc version 1.1.0",
            "srun": "slurm 22.05.8", "module": ""}
IMAGE_PY = "/usr/bin/python3"  # the image's Python (NGC's TensorFlow images have it there)


def _env(tmp_path: Path, setting: str, **extra: str) -> tuple[dict[str, str], Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, version in VERSIONS.items():
        (bin_dir / name).write_text(FAKE.format(version=version))
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "argv.log"
    env = {**base_env(), "PATH": f"{bin_dir}:{base_env()['PATH']}", "FAKE_LOG": str(log), "TMPDIR": str(tmp_path),
           "TWINBENCH_REPO": str(REPO), container.SETTING: setting, container.PYTHON_SETTING: IMAGE_PY,
           container.BINDS_SETTING: f"{tmp_path}:/data", **extra}
    for k in ("TWINBENCH_HINT", "TWINBENCH_SRUN_MPI", "HVD_LAUNCH", "TWINBENCH_CONDA_ENV", "TWINBENCH_IFACE"):
        env.pop(k, None)
    return env, log


def _calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _image(tmp_path: Path) -> str:
    sif = tmp_path / "tf-24.03.sif"
    sif.write_bytes(b"SIF magic and a few bytes")
    return str(sif)


def _stack_env(words: list[str], start: int) -> tuple[dict[str, str], int]:
    """The ``env NAME=VALUE ...`` words at ``start``: the variables and where the command begins."""
    assert words[start] == "env", words
    out, i = {}, start + 1
    while "=" in words[i] and not words[i].startswith("/"):
        k, v = words[i].split("=", 1)
        out[k] = v
        i += 1
    return out, i


@pytest.mark.parametrize("kind", registry.names())
def test_apptainer_local_line_runs_the_launcher_and_every_rank_in_the_image(tmp_path, kind):
    sif = _image(tmp_path)
    env, log = _env(tmp_path, f"apptainer:{sif}")
    printed = subprocess.run([PY, "-m", "backends", "command", kind, "2", "--job", SMOKE], cwd=REPO, env=env,
                             capture_output=True, text=True, check=True).stdout.splitlines()
    subprocess.run(printed, cwd=REPO, env=env, check=True)
    [argv] = _calls(log)
    # `apptainer exec --nv --bind SRC:DST,... --pwd DIR IMAGE CMD` (Apptainer's documented exec form)
    assert argv[:7] == ["exec", "--nv", "--bind", f"{REPO}:{REPO},{tmp_path}:/data", "--pwd", str(REPO), sif]
    stack, i = _stack_env(argv, 7)
    assert stack["TWINBENCH_STACK_RUNTIME"] == "apptainer 1.3.4"
    assert stack["TWINBENCH_STACK_IMAGE_ID"] == container.file_digest(sif)
    assert stack["PYTHONPATH"].split(":")[0] == str(REPO)
    inner = registry.load(kind).local_command(2, ["--job", SMOKE], python=IMAGE_PY)
    if Path(inner[0]).name == "horovodrun":  # horovodrun inside: the image's, without its cache in the image's home
        inner = [inner[0], "--disable-cache", *inner[1:]]
    assert argv[i:] == inner
    assert IMAGE_PY in argv[i:] and PY not in argv


@pytest.mark.parametrize("kind", registry.names())
def test_podman_hpc_local_line(tmp_path, kind):
    env, log = _env(tmp_path, "podman-hpc:nvcr.io/nvidia/tensorflow:24.03-tf2-py3")
    printed = subprocess.run([PY, "-m", "backends", "command", kind, "2", "--job", SMOKE], cwd=REPO, env=env,
                             capture_output=True, text=True, check=True).stdout.splitlines()
    subprocess.run(printed, cwd=REPO, env=env, check=True)
    [argv] = _calls(log)
    # `podman-hpc run --rm --gpu ... -v SRC:DST -w DIR IMAGE CMD` (podman run's form, podman-hpc's --gpu)
    assert argv[:15] == ["run", "--rm", "--gpu", "--env-host", "--net", "host", "--ipc", "host",
                         "-v", f"{REPO}:{REPO}", "-v", f"{tmp_path}:/data", "-w", str(REPO),
                         "nvcr.io/nvidia/tensorflow:24.03-tf2-py3"]
    stack, i = _stack_env(argv, 15)
    assert stack["TWINBENCH_STACK_IMAGE_ID"] == "nvcr.io/nvidia/tensorflow:24.03-tf2-py3"  # a reference: as given
    assert argv[i] in (IMAGE_PY, str(Path(IMAGE_PY).parent / "horovodrun"))  # horovodrun: beside the Python


def test_pyxis_has_no_local_line(tmp_path):
    env, log = _env(tmp_path, "pyxis:nvcr.io#nvidia/tensorflow:24.03-tf2-py3")
    p = subprocess.run([PY, "-m", "backends", "command", registry.names()[0], "2"], cwd=REPO, env=env,
                       capture_output=True, text=True)
    assert p.returncode == 2 and "only through srun" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def _sbatch(tmp_path: Path, script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(REPO / "jobs" / "slurm" / script), SMOKE, str(tmp_path / "res"), "--quiet"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("script,backend", [("native.sbatch", "backends.native"),
                                            ("horovod.sbatch", "backends.horovod")])
def test_pyxis_sbatch_lines_put_each_task_in_the_image(tmp_path, script, backend):
    image = "nvcr.io#nvidia/tensorflow:24.03-tf2-py3"
    env, log = _env(tmp_path, f"pyxis:{image}")
    proc = _sbatch(tmp_path, script, env)
    assert proc.returncode == 0, proc.stderr
    [argv] = [c for c in _calls(log) if "-m" in c]
    # srun --container-image=IMAGE --container-mounts=SRC:DST,... --container-workdir=DIR (pyxis' srun options)
    opts = [f"--container-image={image}", f"--container-mounts={REPO}:{REPO},{tmp_path}:/data",
            f"--container-workdir={REPO}"]
    at = argv.index(opts[0])
    assert argv[at:at + 3] == opts
    stack, i = _stack_env(argv, at + 3)
    assert stack["TWINBENCH_STACK_RUNTIME"].startswith("pyxis 22.05.8") and stack["TWINBENCH_STACK_IMAGE"] == image
    assert argv[i:i + 3] == [IMAGE_PY, "-m", backend]
    assert f"[twinbench] container: pyxis {image}" in proc.stdout


def test_apptainer_sbatch_horovod_line_is_srun_outside_one_container_per_task(tmp_path):
    sif = _image(tmp_path)
    env, log = _env(tmp_path, f"apptainer:{sif}", TWINBENCH_SRUN_MPI="pmix")
    proc = _sbatch(tmp_path, "horovod.sbatch", env)
    assert proc.returncode == 0, proc.stderr
    [argv] = [c for c in _calls(log) if "-m" in c]
    assert argv[:2] == ["--mpi=pmix", "--hint=nomultithread"]
    assert argv[2:9] == ["apptainer", "exec", "--nv", "--bind", f"{REPO}:{REPO},{tmp_path}:/data", "--pwd", str(REPO)]
    assert argv[9] == sif
    stack, i = _stack_env(argv, 10)
    assert stack["TWINBENCH_STACK_IMAGE_ID"] == container.file_digest(sif)
    assert argv[i:i + 3] == [IMAGE_PY, "-m", "backends.horovod"]


@pytest.mark.parametrize("setting,binds,message", [
    ("docker:/x", "", "unknown runtime 'docker'"),
    ("apptainer", "", "must be RUNTIME:IMAGE"),
    ("singularity:/x.sif", "", "singularity is not on PATH"),
    ("apptainer:{tmp}/missing.sif", "", "no such image"),
    ("apptainer:{sif}", "{tmp}/no-such-data", "bind source"),
])
def test_a_bad_container_setting_is_one_line_and_exit_2_before_anything_starts(tmp_path, setting, binds, message):
    sif = _image(tmp_path)
    env, log = _env(tmp_path, setting.format(tmp=tmp_path, sif=sif))
    env[container.BINDS_SETTING] = binds.format(tmp=tmp_path)
    local = subprocess.run([PY, "-m", "backends", "command", registry.names()[0], "2"], cwd=REPO, env=env,
                           capture_output=True, text=True)
    batch = _sbatch(tmp_path, "native.sbatch", env)
    for p in (local, batch):
        assert p.returncode == 2 and message in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert _calls(log) == []  # no srun, no runtime started
    assert not (tmp_path / "res").exists()


def test_image_identity_is_a_files_sha256_and_a_directorys_manifest(tmp_path):
    img = tmp_path / "img"
    (img / "opt" / "stack").mkdir(parents=True)
    (img / "opt" / "stack" / "python").write_text("#!")
    (img / "usr-lib").symlink_to("opt")
    first = container.manifest_digest(img)
    (img / "work" / "checkout").mkdir(parents=True)  # a mount point for a bind: not part of what the image is
    assert container.manifest_digest(img) == first and first.startswith(container.MANIFEST_PREFIX)
    (img / "opt" / "stack" / "python").write_text("#!/bin/sh")  # another size: another image
    assert container.manifest_digest(img) != first
    (img / "usr-lib").unlink()
    (img / "usr-lib").symlink_to("usr")
    second = container.manifest_digest(img)
    (img / "usr-lib").unlink()
    (img / "usr-lib").symlink_to("opt")
    assert second != container.manifest_digest(img)
    sif = tmp_path / "x.sif"
    sif.write_bytes(b"abc")
    cache = tmp_path / "cache"
    expected = "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"  # sha256("abc")
    assert container.file_digest(sif, cache) == expected
    assert json.loads((cache / "image-ids.json").read_text()) == {
        f"{sif}|3|{sif.stat().st_mtime_ns}": expected}  # remembered per path, size and mtime
