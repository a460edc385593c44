"""The sbatch scripts' launch line as centres write it: srun gets --hint (TWINBENCH_HINT) and Horovod's srun its
--mpi type (TWINBENCH_SRUN_MPI), ``module purge`` runs before ``module load`` when asked, and the launch line is in
the log. The scripts run outside Slurm with a fake ``srun`` (and ``module``) first on PATH that record their
arguments: no Slurm, no TensorFlow, a second each."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, SMOKE, base_env

FAKE = """#!/bin/bash
printf '%s\\n' "$(basename "$0") $*" >> "$FAKE_LOG"
"""


def _run(tmp_path: Path, script: str, **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("srun", "module"):
        (bin_dir / name).write_text(FAKE)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "calls.log"
    log.unlink(missing_ok=True)
    e = base_env()
    e.update({"PATH": f"{bin_dir}:{e['PATH']}", "FAKE_LOG": str(log), "TWINBENCH_REPO": str(REPO),
              "TMPDIR": str(tmp_path)})
    for k in ("TWINBENCH_HINT", "TWINBENCH_SRUN_MPI", "TWINBENCH_MODULE_PURGE", "TWINBENCH_MODULES", "HVD_LAUNCH",
              "TWINBENCH_CONDA_ENV", "TWINBENCH_IFACE"):
        e.pop(k, None)
    e.update(env)
    proc = subprocess.run(["bash", str(REPO / "jobs" / "slurm" / script), SMOKE, str(tmp_path / "res"), "--quiet"],
                          cwd=REPO, env=e, capture_output=True, text=True, timeout=60)
    return proc, (log.read_text().splitlines() if log.exists() else [])


def test_native_srun_gets_the_default_hint_and_the_log_shows_it(tmp_path):
    proc, calls = _run(tmp_path, "native.sbatch")
    assert proc.returncode == 0, proc.stderr
    [srun] = [c for c in calls if c.startswith("srun ")]
    assert srun.startswith("srun --hint=nomultithread python -m backends.native --port-base 12000 --job")
    assert "--mpi" not in srun
    assert "[twinbench] launch: srun --hint=nomultithread python -m backends.native" in proc.stdout
    assert "TWINBENCH_HINT=nomultithread" in proc.stdout  # the knobs block


@pytest.mark.parametrize("mpi", ["pmi2", "pmix", "pmix_v4", "none"])
def test_horovod_srun_gets_the_mpi_type_and_the_hint(tmp_path, mpi):
    proc, calls = _run(tmp_path, "horovod.sbatch", TWINBENCH_SRUN_MPI=mpi, TWINBENCH_HINT="compute_bound")
    assert proc.returncode == 0, proc.stderr
    [srun] = [c for c in calls if c.startswith("srun ")]
    assert srun.startswith(f"srun --mpi={mpi} --hint=compute_bound python -m backends.horovod --job")
    assert f"[twinbench] launch: srun --mpi={mpi} --hint=compute_bound python -m backends.horovod" in proc.stdout


def test_empty_hint_means_no_hint_and_default_mpi_is_pmix(tmp_path):
    proc, calls = _run(tmp_path, "horovod.sbatch", TWINBENCH_HINT="")
    assert proc.returncode == 0, proc.stderr
    [srun] = [c for c in calls if c.startswith("srun ")]
    assert srun.startswith("srun --mpi=pmix python -m backends.horovod") and "--hint" not in srun


def test_bad_mpi_type_stops_before_the_launch(tmp_path):
    proc, calls = _run(tmp_path, "horovod.sbatch", TWINBENCH_SRUN_MPI="openmpi")
    assert proc.returncode == 2 and "TWINBENCH_SRUN_MPI must be" in proc.stderr
    assert not [c for c in calls if c.startswith("srun ")]


def test_module_purge_runs_before_module_load_only_when_asked(tmp_path):
    proc, calls = _run(tmp_path, "native.sbatch", TWINBENCH_MODULE_PURGE="1", TWINBENCH_MODULES="cuda/12.2 nccl")
    assert proc.returncode == 0, proc.stderr
    assert [c for c in calls if c.startswith("module ")] == ["module purge", "module load cuda/12.2 nccl"]
    proc, calls = _run(tmp_path, "native.sbatch", TWINBENCH_MODULES="cuda/12.2")
    assert [c for c in calls if c.startswith("module ")] == ["module load cuda/12.2"]
