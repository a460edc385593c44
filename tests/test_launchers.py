"""What a backend declares of starting its ranks and of the stack (``BackendSpec.LAUNCH``, ``BackendSpec.stack``),
and the code that reads it from the registry instead of naming a backend: ``python -m common.doctor --stack``,
``common.launches.resolve``, ``python -m backends command|launchers``, the sweep's Slurm launcher flag and the
sbatch scripts' choices. A third backend (tests/toy_backend.py) shows up in each by its module and one registry
line. Pure Python: no TensorFlow, no rank started."""

from __future__ import annotations

import os
import re

import pytest

from backends import __main__ as backends_main
from backends import horovod, native, native_cluster
from backends import horovod_launch as hvd_launch
from common import doctor, launches
from common.core import registry
from common.core.contract import Launch, Launcher
from common.core.registry import BackendEntry
from common.sweep import allocation as sa
from common.sweep import cli as sweep_cli
from common.sweep import order as so
from common.sweep import plan, slurm
from common.sweep.layout import SweepError
from tests import toy_backend
from tests.conftest import REPO, SMOKE

SHARED = {"python": "3.11.2", "tensorflow": "2.21.0", "tf_keras": "2.21.0"}  # what the doctor reads itself
HOROVOD = {"horovod": "0.28.1", "horovod_built": {"mpi": True, "gloo": True, "nccl": 0, "cuda": False, "rocm": False},
           "horovod_build": "found in the stack", "mpi": "mpirun (Open MPI) 4.1.4"}  # what Horovod's spec reads


@pytest.fixture
def toy(monkeypatch):
    """tests/toy_backend.py with its one registry line, as a maintainer adding it writes them; a stack with
    TensorFlow and Horovod read as ``SHARED`` and ``HOROVOD`` say (nothing imported), Horovod's build with both
    controllers (no probe)."""
    monkeypatch.setitem(registry.REGISTRY, "toy", BackendEntry(
        "toy", "tests.toy_backend", "one process, no communication", "tab:green", "jobs/slurm/native.sbatch"))
    monkeypatch.setattr(doctor, "stack_facts", lambda: dict(SHARED))
    monkeypatch.setattr(horovod, "stack_facts", lambda: dict(HOROVOD))
    monkeypatch.setattr(hvd_launch, "built", lambda probe: {"gloo": True, "mpi": True})
    monkeypatch.delenv(hvd_launch.ENV, raising=False)
    monkeypatch.delenv("TWINBENCH_CONTAINER", raising=False)
    return toy_backend


def test_a_third_backend_shows_up_in_the_stack_doctor(toy, capsys, monkeypatch):
    assert doctor.main(["--stack"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "stack toy: nothing beyond TensorFlow" in out and "stack horovod controllers: MPI, Gloo" in out
    assert out[-1] == "stack backends: native can run, horovod can run, toy can run"
    # a shared stack that cannot run: every backend, the toy too, cannot; exit 2
    monkeypatch.setattr(doctor, "stack_facts", lambda: {**SHARED, "tensorflow": "2.15.1"})
    assert doctor.main(["--stack"]) == 2
    assert capsys.readouterr().out.splitlines()[-1] == \
        "stack backends: native cannot run, horovod cannot run, toy cannot run"


def test_a_third_backend_shows_up_in_the_launch_resolution(toy, capsys):
    env, said = launches.resolve(registry.names(), "/x/bin/python")
    assert env == {hvd_launch.ENV: "gloo"} and len(said) == 1  # the toy's launch has nothing to resolve (default)
    assert backends_main.main(["command", "toy", "1", "--job", "j.toml"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == ["-m", "tests.toy_backend", "--job", "j.toml"]
    assert backends_main.main(["launchers"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "toy python local rank: -: python -m tests.toy_backend: one process" in lines
    assert [ln.split()[1] for ln in lines if ln.startswith("horovod ")] == ["srun", "horovodrun", "mpirun"]


def test_a_slurm_launcher_is_one_declaration(toy, monkeypatch, tmp_path):
    """A backend that declares a choice of Slurm launchers gets the sweep's flag, its check with --one-allocation
    and its export to the sbatch script, from the declaration alone."""
    monkeypatch.setattr(toy, "LAUNCH", Launch((
        Launcher("step", ("slurm",), "srun", rank=("SLURM_PROCID",), job_step=True),
        Launcher("inside", ("local", "slurm"), "its own launcher in the batch step", rank=("TOY_RANK",)),
    ), slurm_variable="TOY_LAUNCH"))
    args = ["submit", "--job", SMOKE, "--results", str(tmp_path / "sw")]
    a = sweep_cli.parser().parse_args(args)
    assert (a.toy_launch, a.horovod_launch) == ("step", "srun")  # the first Slurm launcher by default
    a = sweep_cli.parser().parse_args([*args, "--toy-launch", "inside", "--hvd-launch", "horovodrun"])
    assert so.launch_env(a) == {"HVD_LAUNCH": "horovodrun", "TOY_LAUNCH": "inside",
                                     "TWINBENCH_SRUN_MPI": a.srun_mpi, "TWINBENCH_HINT": a.hint}
    a = sweep_cli.parser().parse_args([*args, "--toy-launch", "inside", "--one-allocation"])
    with pytest.raises(SweepError, match="--toy-launch inside is not supported with it"):
        sa.check_options(a)
    with pytest.raises(SystemExit):
        sweep_cli.parser().parse_args([*args, "--toy-launch", "ssh"])


def test_a_third_backend_is_planned_and_submitted_by_the_sweep(toy, tmp_path):
    """The sweep reads each backend's sbatch script from the registry when it plans and submits, so a backend
    registered after the sweep's modules were imported (the toy here) is swept like the others."""
    a = sweep_cli.parser().parse_args(["submit", "--job", SMOKE, "--results", str(tmp_path / "sw"),
                                       "--backends", "toy", "--sizes", "1,2"])
    runs, header = plan.plan(a)
    assert [(r["backend"], r["size"]) for r in runs] == [("toy", 1), ("toy", 2)]
    cmd = slurm.sbatch_command(runs[0], header, tmp_path / "sw", None)
    assert cmd[cmd.index(str(REPO / "jobs/slurm/native.sbatch")) + 1] == str(REPO / "jobs/smoke.toml")
    assert not (tmp_path / "sw").exists()  # planned, nothing submitted or written


def test_ranks_are_read_from_the_launchers_variables_a_nested_launcher_first():
    launch = horovod.LAUNCH
    assert launch.rank_variables() == ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK",
                                       "SLURM_PROCID")
    # horovodrun or mpirun in a Slurm batch step: every rank also sees the batch step's SLURM_PROCID=0
    assert launch.rank({"HOROVOD_RANK": "1", "SLURM_PROCID": "0"}) == 1
    assert launch.rank({"OMPI_COMM_WORLD_RANK": "3", "SLURM_PROCID": "0"}) == 3
    assert launch.rank({"SLURM_PROCID": "2"}) == 2 and launch.rank({}) is None
    assert launch.local_place({"SLURM_LOCALID": "1", "SLURM_STEP_TASKS_PER_NODE": "2(x2)"}) == (1, 2)
    assert launch.local_place({"OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
                               "SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "1"}) == (0, 4)
    assert launch.local_place({}) is None
    with pytest.raises(ValueError, match="unknown slurm launcher 'ssh': use one of srun, horovodrun"):
        launch.named("ssh", "slurm")
    with pytest.raises(ValueError, match="scopes"):
        Launcher("x", ("cloud",), "")


@pytest.mark.parametrize("env, place", [
    ({}, (0, 1)),  # one worker started by hand
    ({"SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2"}, (1, 2)),  # a one-task srun step of a 2-per-node job
    ({"SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "3(x2)", "SLURM_NTASKS_PER_NODE": "4"}, (0, 3)),
    # mpirun inside a Slurm batch step: the batch step's SLURM_LOCALID=0 is not this rank's place
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "SLURM_LOCALID": "0"}, (1, 2)),
    ({"SLURM_LOCALID": "2"}, (2, 1)),  # a size nobody exported: 1
])
def test_native_workers_find_their_place_from_the_declared_launchers(monkeypatch, env, place):
    """Where neither TF_CONFIG nor a multi-task Slurm step gives the layout, a native worker's place on its host is
    what native's declared launchers export (``LAUNCH.local_place``), a nested launcher's first."""
    for v in [v for v in os.environ if v.startswith(("SLURM_", "OMPI_", "TWINBENCH_LOCAL", "TF_CONFIG"))]:
        monkeypatch.delenv(v)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert native.LAUNCH is native_cluster.LAUNCH
    assert native_cluster.local_place() == place


@pytest.mark.parametrize("name", registry.names())
def test_each_backend_declares_a_local_and_a_slurm_launcher(name):
    """Every registered backend has an sbatch script (its registry line) and a local command: launchers of both."""
    launch = registry.load(name).LAUNCH
    assert isinstance(launch, Launch) and launch.at("local") and launch.at("slurm")
    assert len({x.name for x in launch.launchers}) == len(launch.launchers)


@pytest.mark.parametrize("name", [n for n in registry.names() if registry.load(n).LAUNCH.slurm_variable])
def test_the_sbatch_scripts_choices_are_the_declared_slurm_launchers(name):
    """The script's ``case ${VARIABLE:-default} in`` arms are the backend's Slurm launchers, its default the first."""
    launch = registry.load(name).LAUNCH
    text = (REPO / registry.entry(name).slurm_script).read_text().split("# -- launch", 1)[1]
    m = re.search(r"case \$\{(\w+):-(\w+)\} in", text)
    assert m and m.groups() == (launch.slurm_variable, launch.at("slurm")[0].name), text
    arms = re.findall(r"^  ([\w-]+)\)", text, re.M)
    assert arms == [x.name for x in launch.at("slurm")]
    assert f"{launch.slurm_variable} must be {' or '.join(arms)}" in text
