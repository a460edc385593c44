"""How twinbench launches Horovod's ranks by the controller the build has (backends/horovod_launch.py): the launch
lines for Gloo-only, MPI-only and Gloo+MPI builds, a forced controller, bad input (one line, exit 2), and the cheap
reading of what the installed build has. No TensorFlow process, except the one test that checks the reading
against Horovod's own answer (one process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from backends import horovod
from backends import horovod_launch as launch
from tests.conftest import PY, REPO, base_env

BOTH = {"gloo": True, "mpi": True}
MPI_ONLY = {"gloo": False, "mpi": True}  # conda-forge's build (HOROVOD_WITHOUT_GLOO=1)
GLOO_ONLY = {"gloo": True, "mpi": False}
NONE = {"gloo": False, "mpi": False}
ARGS = ["--job", "j.toml", "--quiet"]


@pytest.fixture
def build(monkeypatch):
    """Make the launch lines see a build with the given controllers (the probe replaced), Open MPI's mpirun."""
    monkeypatch.delenv(launch.ENV, raising=False)
    monkeypatch.delenv("TWINBENCH_CONTAINER", raising=False)
    monkeypatch.setattr(launch, "mpi_flavour", lambda mpirun="mpirun": "openmpi")

    def use(controllers: dict[str, bool]) -> None:
        monkeypatch.setattr(launch, "built", lambda probe: dict(controllers))
    return use


@pytest.mark.parametrize("controllers,launcher", [(BOTH, "horovodrun"), (GLOO_ONLY, "horovodrun"),
                                                  (MPI_ONLY, "mpirun")])
def test_two_local_ranks_start_under_the_controller_the_build_has(build, controllers, launcher):
    build(controllers)
    line = horovod.local_command(2, ARGS, python="/x/bin/python")
    assert Path(line[0]).name == launcher
    assert line[line.index("/x/bin/python"):] == ["/x/bin/python", "-m", "backends.horovod", *ARGS]
    assert ("--gloo" in line) == (launcher == "horovodrun")
    # one rank needs no launcher, whatever the build
    assert horovod.local_command(1, ARGS, python="/x/bin/python") == ["/x/bin/python", "-m", "backends.horovod",
                                                                       *ARGS]


def test_the_mpi_line_is_horovodruns_own_flags_for_open_mpi(build):
    build(MPI_ONLY)
    line = horovod.local_command(2, ARGS, python="/x/bin/python")
    # what horovod/runner/mpi_run.py passes to Open MPI (-H, no binding, pml ob1, no openib), plus idle ranks that
    # yield the CPU on a shared machine
    assert line[1:line.index("/x/bin/python")] == [
        "-np", "2", "-H", "localhost:2", "-bind-to", "none", "-map-by", "slot", "-mca", "pml", "ob1", "-mca", "btl",
        "^openib", "--oversubscribe", "-mca", "mpi_yield_when_idle", "1"]


def test_the_tests_mpirun_launcher_is_the_products_line(build):
    from tests.conftest import mpirun_command

    build(BOTH)  # the tests' Horovod runs use MPI on any build that has it
    py = "/x/bin/python"
    assert mpirun_command(2, ARGS, py) == launch.mpirun_command(
        "localhost:2", 2, [py, "-m", "backends.horovod", *ARGS], mpirun=launch.which_mpirun(py))


@pytest.mark.parametrize("forced,controllers,launcher", [("mpi", BOTH, "mpirun"), ("gloo", BOTH, "horovodrun"),
                                                         (" MPI ", BOTH, "mpirun"), ("auto", MPI_ONLY, "mpirun"),
                                                         ("", BOTH, "horovodrun")])
def test_a_forced_controller_is_the_launch(build, monkeypatch, forced, controllers, launcher):
    build(controllers)
    monkeypatch.setenv(launch.ENV, forced)
    assert Path(horovod.local_command(2, ARGS, python="/x/bin/python")[0]).name == launcher


@pytest.mark.parametrize("forced,controllers,message", [
    ("gloo", MPI_ONLY, "TWINBENCH_HOROVOD_CONTROLLER=gloo: this Horovod was built without Gloo (MPI only): use "
                       "TWINBENCH_HOROVOD_CONTROLLER=mpi or auto"),
    ("mpi", GLOO_ONLY, "TWINBENCH_HOROVOD_CONTROLLER=mpi: this Horovod was built without MPI (Gloo only): use "
                       "TWINBENCH_HOROVOD_CONTROLLER=gloo or auto"),
    ("auto", NONE, "Horovod was built without Gloo and without MPI: no controller can run its ranks (rebuild it: "
                   "make setup)"),
    ("nccl", BOTH, "TWINBENCH_HOROVOD_CONTROLLER='nccl': must be one of auto, gloo, mpi"),
])
def test_a_launch_the_build_cannot_run_is_refused_in_one_line(build, monkeypatch, forced, controllers, message):
    build(controllers)
    monkeypatch.setenv(launch.ENV, forced)
    with pytest.raises(launch.LaunchError) as refused:
        horovod.launch_env("/x/bin/python")
    assert str(refused.value) == message


def test_resolving_once_says_the_choice_and_exports_it(build):
    build(MPI_ONLY)
    assert horovod.launch_env("/x/bin/python") == (
        {launch.ENV: "mpi"}, "horovod ranks: mpirun (MPI controller; auto: this Horovod has MPI only)")
    build(BOTH)
    assert horovod.launch_env("/x/bin/python")[1] == \
        "horovod ranks: horovodrun --gloo (Gloo controller; auto: this Horovod has MPI, Gloo)"


def test_multi_host_mpi_lines_for_open_mpi_and_hydra(monkeypatch):
    cmd = ["/p/python", "-m", "backends.horovod"]
    env = {"PATH": "/p", "HOME": "/home/u", "TF_CPP_MIN_LOG_LEVEL": "2", "SECRET_TOKEN": "x", "HOROVOD_FUSION_X": "1"}
    ompi = launch.mpirun_command("node1:2,node2:2", 4, cmd, iface="ib0", flavour="openmpi", environ=env)
    assert ompi[ompi.index("-H") + 1] == "node1:2,node2:2" and "--oversubscribe" not in ompi
    forwarded = [ompi[i + 1] for i, a in enumerate(ompi) if a == "-x"]
    assert forwarded == ["NCCL_SOCKET_IFNAME=ib0", "HOROVOD_FUSION_X", "PATH", "TF_CPP_MIN_LOG_LEVEL"]
    assert ompi[ompi.index("btl_tcp_if_include") + 1] == "ib0" and ompi[-3:] == cmd
    hydra = launch.mpirun_command("node1:2,node2:2", 4, cmd, flavour="hydra")
    assert hydra[1:9] == ["-np", "4", "-hosts", "node1,node2", "-ppn", "2", "-bind-to", "none"]
    with pytest.raises(launch.LaunchError, match="-ppn needs the same number of ranks on every host"):
        launch.mpirun_command("node1:2,node2:1", 3, cmd, flavour="hydra")


def test_mpi_flavour_is_read_as_horovodrun_reads_it(tmp_path):
    def fake(text: str) -> str:
        path = tmp_path / f"mpirun{abs(hash(text))}"
        path.write_text(f"#!/bin/sh\nprintf '{text}\\n'\n")
        path.chmod(0o755)
        return str(path)

    assert launch.mpi_flavour(fake("mpirun (Open MPI) 4.1.4")) == "openmpi"
    assert launch.mpi_flavour(fake("HYDRA build details:")) == "hydra"
    with pytest.raises(launch.LaunchError, match=r"neither Open MPI nor MPICH/Intel MPI \(Some MPI 1.0\)"):
        launch.mpi_flavour(fake("Some MPI 1.0"))
    with pytest.raises(launch.LaunchError, match="needs mpirun, which does not run here"):
        launch.mpi_flavour(str(tmp_path / "no-mpirun"))


def test_the_probe_says_when_it_cannot_read_the_build():
    """A Python without Horovod (here: this one without its site-packages) is one line, not a traceback."""
    probe = tuple(launch.probe_command(PY, lambda cmd: [cmd[0], "-S", *cmd[1:]]))
    with pytest.raises(launch.LaunchError) as refused:
        launch.built(probe)
    assert str(refused.value) == ("cannot tell which controllers Horovod was built with (ImportError: horovod is "
                                  "not installed): run `python -m common.doctor`")


@pytest.mark.distributed
def test_the_probe_reads_what_horovod_itself_says():
    """The probe (no TensorFlow import) against ``horovod.tensorflow``'s own gloo_built/mpi_built: one TensorFlow
    process. On the default build both are true; under `make test-nogloo` Gloo is false."""
    probed = launch.built(tuple(launch.probe_command(PY)))
    own = subprocess.run([PY, "-c", "import json, horovod.tensorflow as h; "
                          "print(json.dumps({'gloo': bool(h.gloo_built()), 'mpi': bool(h.mpi_built())}))"],
                         cwd=REPO, env=base_env(), capture_output=True, text=True, timeout=120, check=True)
    assert probed == json.loads(own.stdout.strip().splitlines()[-1])


def test_backends_launch_env_exports_the_choice_or_refuses_in_one_line():
    env = {**base_env(), launch.ENV: "mpi"}
    ok = subprocess.run([PY, "-m", "backends", "launch-env"], cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=60)
    assert (ok.returncode, ok.stdout) == (0, f"{launch.ENV}=mpi\n")
    assert ok.stderr.strip() == "horovod ranks: mpirun (MPI controller; TWINBENCH_HOROVOD_CONTROLLER=mpi)"
    env[launch.ENV] = "both"
    bad = subprocess.run([PY, "-m", "backends", "command", "horovod", "2", "--job", "j"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert (bad.returncode, bad.stdout) == (2, "")
    assert bad.stderr.splitlines() == ["backends: error: TWINBENCH_HOROVOD_CONTROLLER='both': must be one of auto, "
                                       "gloo, mpi"]


def test_python_m_backends_usage_names_launch_env():
    proc = subprocess.run([sys.executable, "-m", "backends"], cwd=REPO, env=base_env(), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "launch-env" in proc.stderr


def test_a_build_that_cannot_be_read_gets_todays_gloo_line(monkeypatch):
    """A launch line for a Python that does not exist here (or has no Horovod) is today's ``horovodrun --gloo``,
    whose launcher says what is wrong; the commands that start many runs refuse it first (launch_env)."""
    monkeypatch.delenv(launch.ENV, raising=False)
    monkeypatch.delenv("TWINBENCH_CONTAINER", raising=False)
    assert Path(horovod.local_command(2, ARGS, python="/no/such/python")[0]).name == "horovodrun"
    with pytest.raises(launch.LaunchError, match="cannot tell which controllers Horovod was built with"):
        horovod.launch_env("/no/such/python")
