"""twinbench on a stack it did not install: both backends at 2 ranks inside a centre-like image (Debian 12 minbase,
TensorFlow + tf-keras from PyPI and a Horovod wheel in /opt/stack, no TensorBoard, no twinbench: the checkout is
bound in), run by Charliecloud's ch-run through TWINBENCH_CONTAINER, against the same job on the host; native and
Horovod under mpirun in a copy of the image without /etc/hosts, where no name resolves (the watchdog must not need
one).

The image is built once by ``scripts/stack_image.sh`` (about 2 minutes; cached in ~/.cache/twinbench/images): the
set-up for tests builds it (TWINBENCH_WITH_STACK_IMAGE=1); without it the test skips, or fails under make test."""

from __future__ import annotations

import getpass
import os
import subprocess

import pytest

from common.cluster import container
from common.core import registry
from tests.conftest import (
    PY,
    REPO,
    SMOKE,
    base_env,
    env_with_broken_horovod,
    first_divergence,
    mpirun_command,
    only_result,
    pause_vars,
    run,
    skip_or_fail,
)

pytestmark = pytest.mark.distributed
IMAGE_PYTHON = "/opt/stack/bin/python"  # where scripts/stack_image.sh installs the stack, as a centre's image would


@pytest.fixture(scope="module")
def image() -> str:
    p = subprocess.run(["bash", "scripts/stack_image.sh", "--path"], cwd=REPO, capture_output=True, text=True)
    if p.returncode != 0 or not p.stdout.strip():
        skip_or_fail(f"no stack image ({p.stderr.strip()}): TWINBENCH_WITH_STACK_IMAGE=1 bash scripts/setup.sh "
                     "builds it")
    return p.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def bare_image(image) -> str:
    """The same image without /etc/hosts (a hard-linked copy, cached): ch-run binds none, no name resolves inside."""
    p = subprocess.run(["bash", "scripts/stack_image.sh", "--no-hosts"], cwd=REPO, capture_output=True, text=True)
    if p.returncode != 0 or not p.stdout.strip():
        skip_or_fail(f"no copy of the stack image without /etc/hosts: {p.stderr.strip()}")
    return p.stdout.strip().splitlines()[-1]


def _image_env(image: str, **extra: str) -> dict[str, str]:
    return {**base_env(), "TWINBENCH_CONTAINER": f"charliecloud:{image}", "TWINBENCH_CONTAINER_PYTHON": IMAGE_PYTHON,
            "USER": os.environ.get("USER") or getpass.getuser(), **extra}


def _launch_line(kind: str, out, env: dict[str, str], mpirun: bool = False) -> list[str]:
    """The backend's own launch line inside the image (``python -m backends command``), or Horovod's ranks under
    the image's mpirun, wrapped the same way."""
    args = ["--job", SMOKE, "--results", str(out), "--quiet"]
    if mpirun:
        box = container.parse(env)
        return container.wrap(mpirun_command(2, args, IMAGE_PYTHON), box, container.stack_env(box, env))
    line = subprocess.run([PY, "-m", "backends", "command", kind, "2", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, check=True)
    return line.stdout.splitlines()


def test_both_backends_inside_the_image_compute_what_they_do_on_the_host(runner, image, bare_image, tmp_path,
                                                                         monkeypatch):
    """Each backend's launch line inside the image gives the host's per-step losses. Native and Horovod under
    mpirun run in the copy without /etc/hosts, each step 0.5 s longer (a sleep: the losses are the same), so that
    the ranks run well past the watchdog's first probes: there no name resolves, and a watchdog that probed its
    peers by host name killed both ranks of these healthy runs as lost peers within 3 s of their start. Horovod's
    own launcher runs in the image with /etc/hosts: horovodrun cannot resolve localhost without one, and Gloo's
    ranks end on SIGSEGV there even at 127.0.0.1 (measured), so mpirun is Horovod's launcher in such an image."""
    monkeypatch.setenv("USER", os.environ.get("USER") or getpass.getuser())  # ch-run --version (the mpirun line)
    pause = pause_vars(0.5)
    runs = [("native", bare_image, False), ("horovod", image, False), ("horovod", bare_image, True)]
    inside, host = tmp_path / "inside", {}
    for kind, img, mpirun in runs:
        out = inside / f"{kind}{'-mpirun' if mpirun else ''}"
        env = _image_env(img, **(pause if img == bare_image else {}))
        cmd = _launch_line(kind, out, env, mpirun)
        assert cmd[0] == "ch-run" and IMAGE_PYTHON in cmd, cmd  # every rank runs the image's Python
        proc = run(cmd, env=env)
        # the image has no TensorBoard (TensorFlow 2.21 does not depend on it): one line, and the run completes
        assert "TensorBoard is not installed" in proc.stderr
        rec = only_result(out)
        host[kind] = runner(kind)  # the session's same run on the host's .venv
        problem = first_divergence(rec["step_losses"], host[kind]["step_losses"], 1e-5)
        assert problem is None, f"{kind} inside {os.path.basename(img)} vs on the host: {problem}"
        assert rec["job_hash"] == host[kind]["job_hash"]
        vers = rec["versions"]
        assert vers["container"].startswith("charliecloud 0.") and os.path.basename(img) in vers["container_image"]
        assert vers["container_image"].startswith("manifest-sha256:")
        assert vers["python"] != "" and "container" not in host[kind]["versions"]
        if "horovod" in vers:
            assert vers["horovod_build"] == "found"  # the image's wheel, not this environment's marked build
            assert rec["backend_info"]["controller"] == ("mpi" if mpirun else "gloo")
    # --baseline over the two sets names the image as a stack difference
    rep = subprocess.run([PY, "-m", "common.report", str(inside / registry.names()[0]), "--baseline",
                          str(runner.results_dir(registry.names()[0])), "--out", str(tmp_path / "rep"), "--no-plots"],
                         cwd=REPO, env=base_env(), capture_output=True, text=True)
    text = rep.stdout + rep.stderr + "".join(p.read_text() for p in (tmp_path / "rep").glob("*.md"))
    stack_line = next((ln for ln in text.splitlines() if "Stack differences" in ln), "")
    assert "container not recorded -> charliecloud 0." in stack_line, text[-3000:]
    assert "container_image not recorded -> manifest-sha256:" in stack_line


def test_the_as_is_set_up_installs_beside_the_image_never_into_it_and_the_doctor_passes(image, tmp_path):
    """TWINBENCH_STACK=as-is inside the image: nothing built, the missing nvidia-ml-py goes into a directory of its
    own (from a local wheel: no index inside), the image's /opt/stack unchanged, both backends can run."""
    wheels = tmp_path / "wheels"
    subprocess.run([PY, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), "nvidia-ml-py==13.615.71"],
                   check=True, capture_output=True)
    before = container.manifest_digest(f"{image}/opt/stack")
    env = {**base_env(), "USER": os.environ.get("USER") or getpass.getuser()}
    inner = ["env", "TWINBENCH_STACK=as-is", f"PYTHON={IMAGE_PYTHON}", f"TWINBENCH_STACK_DEPS={tmp_path / 'deps'}",
             "PIP_NO_INDEX=1", f"PIP_FIND_LINKS={wheels}", "bash", "scripts/setup.sh"]
    proc = run(["ch-run", "-b", f"{REPO}:{REPO}", "-c", str(REPO), image, "--", *inner], env=env, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "stack horovod: 0.28.1 with TensorFlow support, found in the stack: ok" in out
    assert "stack backends: native can run, horovod can run" in out
    assert (tmp_path / "deps" / "pynvml.py").exists() or (tmp_path / "deps" / "pynvml").exists()
    assert container.manifest_digest(f"{image}/opt/stack") == before  # never installed over the stack


def test_a_stack_whose_horovod_cannot_import_is_one_line_and_exit_2(tmp_path):
    env = env_with_broken_horovod(tmp_path, "libmpi.so.40: cannot open shared object file")
    proc = run([PY, "-m", "common.doctor", "--stack"], env=env, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    bad = [ln for ln in proc.stdout.splitlines() if "cannot run" in ln]
    assert bad[0] == ("stack horovod: cannot run: horovod.tensorflow does not import (ImportError: libmpi.so.40: "
                      "cannot open shared object file)")
    assert bad[-1] == "stack backends: native can run, horovod cannot run"
