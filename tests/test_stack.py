"""A centre's stack as it is: what it may lack (TensorBoard), a rank's own failure said as such (never as a lost
peer), launchers' caches where the run can write. In-process, no TensorFlow."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from common import runner
from common.cluster import container
from common.core.errors import EXIT_PEER_LOST
from common.training import observe
from common.training import reliability as rel
from common.training import train as train_mod


@dataclasses.dataclass(frozen=True)
class _Rec:
    run_id: str = "r1"
    artifacts: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        raise AssertionError("no TensorBoard logs without TensorBoard")


def test_a_stack_without_tensorboard_skips_its_logs_in_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(observe.importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboard" else object())
    out = observe.finish(_Rec(), str(tmp_path), None)
    err = capsys.readouterr().err.strip().splitlines()
    assert out.artifacts == {}
    assert len(err) == 1 and "TensorBoard is not installed" in err[0]
    assert not (tmp_path / observe.TENSORBOARD_DIR).exists()


def _gone_peer() -> rel.Watchdog:
    """A watchdog whose one peer's port is closed: that peer is lost."""
    beat = rel.Heartbeat()
    port = beat.port
    beat.close()
    return rel.Watchdog(0, [{"rank": 1, "host": "h", "address": "127.0.0.1", "port": port, "pid": 7}])


class _OpError(Exception):
    """Stands for tf.errors.OpError: a class of TensorFlow's (its module says so)."""


_OpError.__module__ = "tensorflow.python.framework.errors_impl"


def test_only_a_collectives_failure_can_name_a_lost_peer():
    assert rel.from_collective(_OpError("Socket closed"))
    assert rel.from_collective(ConnectionResetError())
    wrapped = RuntimeError("step failed")
    wrapped.__cause__ = _OpError("Connection reset by peer")
    assert rel.from_collective(wrapped)
    assert not rel.from_collective(ValueError("bad shape in the user's model"))
    assert not rel.from_collective(ImportError("No module named 'tensorboard'"))
    tb = type("TBNotInstalledError", (Exception,), {"__module__": "tensorflow.python.summary.tb_summary"})
    assert not rel.from_collective(tb("TensorBoard is not installed"))


def test_a_rank_failing_on_its_own_is_never_a_lost_peer():
    """The issue's case: the chief fails writing its TensorBoard logs after the last collective while its peer,
    done, has exited; and a Python error of the job while a peer is gone. Both stay the rank's own exception."""
    with pytest.raises(ValueError):
        with train_mod.peer_loss_as_error(_gone_peer()):
            raise ValueError("bad shape")
    stopped = _gone_peer()
    stopped.stop()  # past the last collective
    with pytest.raises(_OpError):
        with train_mod.peer_loss_as_error(stopped):
            raise _OpError("Socket closed")


def test_a_collective_failure_with_the_peer_gone_is_a_lost_peer():
    from common.core.errors import PeerLost

    with pytest.raises(PeerLost, match="lost rank 1"):
        with train_mod.peer_loss_as_error(_gone_peer()):
            raise _OpError("Socket closed")


class _Backend:
    rank = 1
    is_chief = False

    def exit_barrier(self) -> None:
        raise AssertionError("a failed rank skips the exit barrier")


def test_the_runner_names_the_rank_and_its_exception(monkeypatch, capsys):
    def failing_train(*a: Any) -> None:
        raise KeyError("no such output: 'head2'")

    def exit_now(code: int) -> None:
        raise SystemExit(code)

    monkeypatch.setattr(train_mod, "train", failing_train)
    monkeypatch.setattr(runner, "exit_now", exit_now)
    opts = type("Opts", (), {"bench": None, "diagnose": None})()
    with pytest.raises(SystemExit) as ended:
        runner.run_to_exit("backends.native", _Backend(), None, opts)  # type: ignore[arg-type]
    err = capsys.readouterr().err
    assert ended.value.code == runner.EXIT_FAILED != EXIT_PEER_LOST
    assert err.strip().splitlines()[-1] == \
        "[twinbench] error: rank 1 failed: KeyError: \"no such output: 'head2'\""
    assert "Traceback" in err and "lost" not in err


def test_horovodrun_gets_disable_cache_only_where_home_is_read_only(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    assert container.horovodrun_cache_flags(str(home)) == []
    (home / ".horovod").mkdir()
    assert container.horovodrun_cache_flags(str(home)) == []
    if os.geteuid() == 0:
        # root writes anywhere: what a read-only bind or image looks like to it is a missing home
        assert container.horovodrun_cache_flags("/proc/no-such-home") == ["--disable-cache"]
    else:
        home.chmod(stat.S_IRUSR | stat.S_IXUSR)
        (home / ".horovod").chmod(stat.S_IRUSR | stat.S_IXUSR)
        assert container.horovodrun_cache_flags(str(home)) == ["--disable-cache"]
    from backends import horovod

    line = horovod.horovodrun_command("localhost:2", 2, ["--job", "j.toml"], "/x/bin/python")
    assert line[line.index("--gloo") + 1:line.index("/x/bin/python")] == container.horovodrun_cache_flags()
    assert Path(line[0]).name == "horovodrun"


_STACK = {"python": "3.11.2", "tensorflow": "2.21.0", "tf_keras": "2.21.0", "horovod": "0.28.1",
          "horovod_built": {"mpi": True, "gloo": True, "nccl": 0, "cuda": False, "rocm": False},
          "horovod_build": "found in the stack", "mpi": "mpirun (Open MPI) 4.1.4"}


@pytest.mark.parametrize("change,line,native,hvd", [
    ({}, "stack-ok", True, True),
    ({"tensorflow": "2.15.1"}, "tensorflow: 2.15.1 cannot run: outside 2.16-2.21", False, False),
    ({"tf_keras": None}, "tf-keras: not installed; installable beside the stack: tf-keras~=2.21.0", False, False),
    ({"tf_keras": "2.20.1"}, "tf-keras: 2.20.1: cannot run: not TensorFlow 2.21.0's minor", False, False),
    ({"horovod_built": None, "horovod_error": "ImportError: Extension horovod.tensorflow has not been built"},
     "horovod: cannot run: horovod.tensorflow does not import (ImportError: Extension horovod.tensorflow has not "
     "been built)", True, False),
    ({"horovod_built": {"mpi": False, "gloo": False, "nccl": 0, "cuda": False, "rocm": False}},
     "horovod controllers: none: cannot run (built without MPI and Gloo)", True, False),
    ({"horovod_built": {"mpi": True, "gloo": False, "nccl": 21903, "cuda": True, "rocm": False}},
     "horovod GPU operations: NCCL", True, True),
    ({"mpi": None}, "mpi: no mpirun on PATH (Horovod runs under horovodrun --gloo or srun --mpi=pmix)", True, True),
    ({}, "horovod launch, local and multi-host: horovodrun --gloo (Gloo controller; TWINBENCH_HOROVOD_CONTROLLER "
         "auto, the build has MPI, Gloo)", True, True),
    # conda-forge's build (HOROVOD_WITHOUT_GLOO=1): its ranks under mpirun, never horovodrun --gloo
    ({"horovod_built": {"mpi": True, "gloo": False, "nccl": 0, "cuda": False, "rocm": False}},
     "horovod launch, local and multi-host: mpirun (MPI controller; TWINBENCH_HOROVOD_CONTROLLER auto, the build "
     "has MPI only)", True, True),
    ({"horovod_built": {"mpi": True, "gloo": False, "nccl": 0, "cuda": False, "rocm": False}, "mpi": None},
     "horovod launch: cannot run: the MPI controller (TWINBENCH_HOROVOD_CONTROLLER auto, the build has MPI only) "
     "needs mpirun: none on PATH", True, False),
    ({"horovod_built": {"mpi": True, "gloo": False, "nccl": 0, "cuda": False, "rocm": False},
      "horovod_controller_asked": "gloo"},
     "horovod launch: cannot run: TWINBENCH_HOROVOD_CONTROLLER=gloo: this Horovod was built without Gloo (MPI only): "
     "use TWINBENCH_HOROVOD_CONTROLLER=mpi or auto", True, False),
    ({"horovod_controller_asked": "mpi"}, "horovod launch, local and multi-host: mpirun (MPI controller; "
                                          "TWINBENCH_HOROVOD_CONTROLLER=mpi)", True, True),
    ({"horovod_controller_asked": "gloo-please"},
     "horovod launch: cannot run: TWINBENCH_HOROVOD_CONTROLLER='gloo-please': must be one of auto, gloo, mpi", True,
     False),
    ({"horovod_built": {"mpi": False, "gloo": True, "nccl": 0, "cuda": False, "rocm": False}},
     "horovod launch, Slurm job steps: srun --mpi=pmix cannot run (Gloo only: srun gives Gloo no rendezvous; use the "
     "sweep's --hvd-launch horovodrun)", True, True),
])
def test_the_stack_doctor_says_what_can_run_in_one_line_each(change, line, native, hvd):
    from backends import horovod
    from backends import native as native_mod
    from common import doctor

    facts = {**_STACK, **change}  # the shared facts and Horovod's, judged as the doctor and Horovod's spec do
    stacks = {"native": native_mod.stack, "horovod": lambda ok: horovod.judge_stack(facts, ok)}
    lines, can = doctor.judge_stack(facts, stacks)
    assert (can["native"], can["horovod"]) == (native, hvd)
    if line == "stack-ok":
        assert lines[1:5] == ["tensorflow: 2.21.0 (in 2.16-2.21): ok", "tf-keras: 2.21.0 (TensorFlow's minor): ok",
                              "horovod: 0.28.1 with TensorFlow support, found in the stack: ok",
                              "horovod controllers: MPI, Gloo"]
        assert "horovod GPU operations: none (a CPU build)" in lines
    else:
        assert any(ln.startswith(line) for ln in lines), lines
    verdict = f"backends: native {'can' if native else 'cannot'} run, horovod {'can' if hvd else 'cannot'} run"
    assert lines[-1] == verdict
