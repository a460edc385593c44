"""The sbatch scripts with TWINBENCH_CONTAINER under the test Slurm (tests/slurm/start_cluster.sh): both backends in
the Charliecloud image of tests/test_stack_image.py, against the host's srun runs of tests/test_slurm.py (shared:
the same session runs, made once)."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import REPO, SMOKE, first_divergence, only_result, skip_or_fail
from tests.test_slurm import RTOL, _srun_two_tasks


@pytest.mark.distributed
def test_sbatch_scripts_in_a_centres_image_compute_what_the_host_does(cluster, tmp_path, tmp_path_factory):
    """Both sbatch scripts with TWINBENCH_CONTAINER (Charliecloud, the image of tests/test_stack_image.py): srun
    outside starts one container per task (Horovod's MPI controller through srun --mpi=pmix into the image's Open
    MPI); the per-step losses are the host's srun runs', and the records name the image."""
    p = subprocess.run(["bash", "scripts/stack_image.sh", "--path"], cwd=REPO, capture_output=True, text=True)
    if p.returncode != 0:
        skip_or_fail(f"no stack image: TWINBENCH_WITH_STACK_IMAGE=1 bash scripts/setup.sh builds it ({p.stderr})")
    image = p.stdout.strip().splitlines()[-1]
    env = {"TWINBENCH_REPO": str(REPO), "TWINBENCH_CONTAINER": f"charliecloud:{image}", "USER": "root",
           "TWINBENCH_CONTAINER_PYTHON": "/opt/stack/bin/python"}
    # the very runs of tests/test_slurm.py's srun_native and srun_horovod fixtures (cluster.once: made once)
    srun_native = _srun_two_tasks(cluster, tmp_path_factory, "srun_native", [], "native", "--port-base", "12600")
    srun_horovod = _srun_two_tasks(cluster, tmp_path_factory, "srun_horovod", ["--mpi=pmix"], "horovod")
    for script, host in (("native.sbatch", srun_native), ("horovod.sbatch", srun_horovod)):
        out = tmp_path / script
        info = cluster.sbatch(["--ntasks-per-node=2", "--gres=gpu:2", "--gpus-per-task=1", "--cpus-per-task=2",
                               str(REPO / "jobs" / "slurm" / script), SMOKE, str(out / "res"), "--quiet"],
                              tmp_path / f"{script}.out", **env)
        assert info["JobState"] == "COMPLETED", info["log"][-3000:]
        assert "[twinbench] container: charliecloud" in info["log"] and " ch-run -b " in info["log"]
        r = only_result(out / "res")
        assert r["world_size"] == 2 and r["versions"]["container"].startswith("charliecloud 0.")
        assert r["versions"]["container_image"].startswith("manifest-sha256:")
        problem = first_divergence(r["step_losses"], host["step_losses"], RTOL)
        assert problem is None, f"{script} in the image vs srun on the host: {problem}"
