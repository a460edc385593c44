"""On a real Horovod built without Gloo (conda-forge's flags, HOROVOD_WITHOUT_GLOO=1: MPI controller only), the
demo and ``common.check`` run, with the Gloo build's per-step losses. `make test-nogloo` builds that Horovod into
.venv-nogloo (scripts/setup_nogloo.sh, the main environment's TensorFlow beneath it) and runs this file there with
TWINBENCH_GLOO_LESS=1; everywhere else it is skipped.

TensorFlow processes: the demo (REPEATS=1 STEPS=20: 6 for its four cells, 4 for the allreduce benchmark, 6 for the
breakdown), ``common.check`` on the smoke job's custom loop (6), one 2-rank run of the Gloo build (2), Horovod's own
answer to what it was built with (1) and the stack doctor (1): 26."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from backends import horovod_launch as launch
from tests.conftest import PY, REPO, SMOKE, base_env, first_divergence, only_result, run

pytestmark = [pytest.mark.distributed,
              pytest.mark.skipif(os.environ.get("TWINBENCH_GLOO_LESS") != "1",
                                 reason="a Gloo-less Horovod's test: make test-nogloo runs it in .venv-nogloo")]
GLOO_BUILD_PY = str(REPO / ".venv" / "bin" / "python")  # the default build (Gloo and MPI), same TensorFlow
RTOL = 1e-5  # the parity tests' tolerance; in practice bit for bit
AUTO_LINE = "horovod ranks: mpirun (MPI controller; auto: this Horovod has MPI only)"


def env_auto() -> dict[str, str]:
    env = base_env()
    env.pop(launch.ENV, None)
    return env


def test_this_horovod_is_built_without_gloo():
    """What the ranks will meet: the probe (no TensorFlow) and Horovod's own answer (one process) agree."""
    probed = launch.built(tuple(launch.probe_command(PY)))
    own = run([PY, "-c", "import json, horovod.tensorflow as h; "
               "print(json.dumps({'gloo': bool(h.gloo_built()), 'mpi': bool(h.mpi_built())}))"], env=env_auto())
    assert probed == json.loads(own.stdout.strip().splitlines()[-1]) == {"gloo": False, "mpi": True}
    forced = subprocess.run([PY, "-m", "backends", "launch-env"], cwd=REPO, env={**env_auto(), launch.ENV: "gloo"},
                            capture_output=True, text=True, timeout=60)
    assert (forced.returncode, forced.stdout) == (2, "")
    assert forced.stderr.strip() == ("backends: error: TWINBENCH_HOROVOD_CONTROLLER=gloo: this Horovod was built "
                                     "without Gloo (MPI only): use TWINBENCH_HOROVOD_CONTROLLER=mpi or auto")


def test_the_stack_doctor_names_the_mpi_launch():
    """What `TWINBENCH_STACK=as-is bash scripts/setup.sh` prints on such a stack: the launch that will run."""
    proc = subprocess.run([PY, "-m", "common.doctor", "--stack"], cwd=REPO, env=env_auto(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert "stack horovod controllers: MPI" in lines
    assert "stack horovod launch, local and multi-host: mpirun (MPI controller; TWINBENCH_HOROVOD_CONTROLLER auto, " \
           "the build has MPI only)" in lines
    assert lines[-1] == "stack backends: native can run, horovod can run"


def test_the_demo_runs_its_horovod_ranks_under_mpirun(tmp_path: Path):
    out = tmp_path / "demo"
    venv = os.path.relpath(Path(PY).parent.parent, REPO)  # demo.sh puts $PWD/$VENV/bin on PATH
    env = {**env_auto(), "VENV": venv, "OUT": str(out), "REPEATS": "1", "STEPS": "20"}
    proc = subprocess.run(["bash", "scripts/demo.sh"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.splitlines()[1] == f"[demo] {AUTO_LINE}"
    assert "[demo] skipped" not in proc.stdout  # every run and diagnostic ran, the Horovod ones under mpirun
    runs = [json.loads(p.read_text()) for p in out.glob("*.json")]
    assert sorted(r.get("kind", "train") for r in runs if r["backend"] == "horovod") == \
        ["allreduce", "breakdown", "breakdown", "train", "train"]
    train = next(r for r in runs if r.get("kind", "train") == "train" and r["backend"] == "horovod"
                 and r["world_size"] == 2)
    assert train["backend_info"]["controller"] == "mpi" and train["backend_info"]["controller_asked"] == "mpi"
    assert train["collective"]["used"] == "mpi"


def test_check_passes_with_the_gloo_builds_losses(tmp_path: Path):
    res = tmp_path / "check"
    proc = subprocess.run([PY, "-m", "common.check", "--job", SMOKE, "--modes", "ctl", "--results", str(res)],
                          cwd=REPO, env=env_auto(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0] == f"[check] {AUTO_LINE}"
    records = [json.loads(p.read_text()) for p in res.glob("*/*.json") if not p.name.startswith(".")]  # the runs
    mpi = next(r for r in records if r["backend"] == "horovod" and r["world_size"] == 2)  # ctl only: one
    assert json.loads((res / "check.json").read_text())["status"] == 0  # and the check's own verdict beside them
    assert mpi["backend_info"]["controller"] == "mpi"
    # the same run on the default build, under its own launch there (horovodrun --gloo)
    printed = subprocess.run([GLOO_BUILD_PY, "-m", "backends", "command", "horovod", "2", "--job", SMOKE,
                              "--set", "steps=20", "--set", "mode=ctl", "--set", "per_replica_batch_size=16",
                              "--results", str(tmp_path / "gloo"), "--quiet"],
                             cwd=REPO, env=env_auto(), capture_output=True, text=True, timeout=60, check=True)
    line = printed.stdout.splitlines()
    assert Path(line[0]).name == "horovodrun" and "--gloo" in line
    gloo_env = {**env_auto(), "PATH": f"{Path(GLOO_BUILD_PY).parent}:{os.environ.get('PATH', '')}"}
    run(line, env=gloo_env)
    gloo = only_result(tmp_path / "gloo")
    assert gloo["backend_info"]["controller"] == "gloo" and gloo["job_hash"] == mpi["job_hash"]
    msg = first_divergence(mpi["step_losses"], gloo["step_losses"], RTOL)
    assert msg is None, f"Gloo-less build (mpirun) vs the Gloo build (horovodrun --gloo): {msg}"
