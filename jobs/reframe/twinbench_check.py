"""twinbench as a ReFrame regression test: every registered backend at 1 and 2 tasks, one GPU each.

    reframe -C jobs/reframe/settings.py -c jobs/reframe/twinbench_check.py -r --performance-report
    reframe -C SITE_SETTINGS.py -c jobs/reframe/twinbench_check.py -S job_file=jobs/resnet50_cifar10.toml -r

Each test runs the sbatch scripts' logic: the job script sources jobs/slurm/env.sh (the same environment for both
backends: modules, conda or the repository's .venv, TF_USE_LEGACY_KERAS, no proxies, --cpus-per-task passed on to
srun, one failed task ends the step) and launches ``srun python -m backends.native`` or ``srun --mpi=pmix python
-m backends.horovod`` on the job file, with ``--results`` in the stage directory.

Performance variables, from the summary lines twinbench prints at the end of every run in Horovod's benchmark
format (``Img/sec per GPU: X +-Y`` and ``Total img/sec on N GPU(s): X +-Y``, common/training/observe.py):

    total_img_s              Total img/sec (all ranks, wall clock of the slowest)
    total_img_s_lo95/_hi95   X - Y and X + Y: Y is 1.96 x the standard deviation of the per-window throughputs
                             (Horovod's "+-"), so these bound where 95% of the timed windows' rates fall; they are
                             not a confidence interval of the mean
    img_s_per_gpu            Img/sec per device (= total / ranks), with img_s_per_gpu_lo95/_hi95 likewise

(On a node without GPUs twinbench says "CPU" instead of "GPU"; the variables keep their names.)

Sanity: twinbench's exit status is 0, it printed its summary lines, and the job hash it printed and the one in its
results JSON both equal the hash computed from the job file at set-up (``load_job(job_file).job_hash``), and the
``job_hash`` variable when a centre pins it (``-S job_hash=...``): every test then measured the identical job.

References: a centre adds its figures to REFERENCES below, per ``system:partition`` and per (backend, tasks).
Unset (the placeholders, and the CI test cluster) means recorded, not checked.
"""

from __future__ import annotations

import os
import sys

import reframe as rfm
import reframe.utility.sanity as sn
from reframe.core.builtins import parameter, performance_function, run_after, run_before, sanity_function, variable

UNIT = "img/s"
PERF_VARS = ("total_img_s", "total_img_s_lo95", "total_img_s_hi95",
             "img_s_per_gpu", "img_s_per_gpu_lo95", "img_s_per_gpu_hi95")

# What a centre fills in, per system:partition of its ReFrame settings and per (backend, tasks):
#   {"total_img_s": (REFERENCE, LOWER, UPPER), ...}  LOWER/UPPER are fractions of REFERENCE (-0.1 = 10 % below
#   fails; None = no bound), ReFrame's reference convention. Example (made-up figures, ResNet-50 on 4 A100s):
#     "daint:gpu": {("native", 1): {"total_img_s": (2800.0, -0.10, None)},
#                   ("horovod", 1): {"total_img_s": (2800.0, -0.10, None), "img_s_per_gpu": (700.0, -0.1, None)}},
# A variable without an entry gets the placeholder (0, None, None): recorded in the perflog, never failing.
REFERENCES: dict[str, dict[tuple[str, int], dict[str, tuple[float | None, float | None, float | None]]]] = {
    "twinbench-local:debug": {},  # the CI test cluster (tests/slurm/start_cluster.sh): figures recorded only
}

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
from common.core import registry  # noqa: E402  (the only list of backends; imports no TensorFlow)

_NUM = r"([0-9]+(?:\.[0-9]+)?)"
_PER = rf"^Img/sec per \w+: {_NUM} \+-{_NUM}"
_TOTAL = rf"^Total img/sec on \d+ \w+\(s\): {_NUM} \+-{_NUM}"


@rfm.simple_test
class TwinbenchCheck(rfm.RunOnlyRegressionTest):
    """One twinbench run: ``backend`` at ``tasks`` ranks (one per GPU, one node), on ``job_file``."""

    backend = parameter(list(registry.names()))
    tasks = parameter([1, 2])

    #: the job file, relative to the repository root (or absolute)
    job_file = variable(str, value="jobs/smoke.toml")
    #: the repository root (default: two directories above this file)
    repo = variable(str, value=REPO)
    #: when set, every test must also have run the job with this hash (pin it across systems)
    job_hash = variable(str, value="")
    #: srun --mpi of the Horovod launch (as TWINBENCH_SRUN_MPI of the sbatch scripts)
    srun_mpi = variable(str, value="pmix")
    #: srun --hint of both launches (as TWINBENCH_HINT; empty: none)
    srun_hint = variable(str, value="nomultithread")
    #: CPUs per task (the sbatch scripts' default)
    cpus_per_task = variable(int, value=4)
    #: extra backend flags, e.g. ['--set', 'steps=100']
    backend_args = variable(list, value=[])

    valid_systems = ["*"]
    valid_prog_environs = ["*"]
    time_limit = "30m"
    tags = {"twinbench"}
    maintainers = ["twinbench"]
    executable = "python"

    @run_after("init")
    def set_resources(self):
        self.descr = f"twinbench {self.backend}, {self.tasks} task(s) on {self.job_file}"
        self.num_tasks = self.num_tasks_per_node = self.tasks
        self.num_gpus_per_node = self.tasks
        self.num_cpus_per_task = self.cpus_per_task

    @run_before("run")
    def set_launch(self):
        results = os.path.join(self.stagedir, "results")
        job = self.job_file if os.path.isabs(self.job_file) else os.path.join(self.repo, self.job_file)
        entry = registry.entry(self.backend)
        port = ["--port-base", "$TB_PORT_BASE"] if entry.port_base else []
        self.executable_opts = ["-m", f"backends.{self.backend}", *port, "--job", job, "--results", results,
                                *self.backend_args]
        opts = [f"--hint={self.srun_hint}"] if self.srun_hint else []
        if entry.srun_mpi:
            opts.insert(0, f"--mpi={self.srun_mpi}")
        self.job.launcher.options = opts
        self.env_vars["TWINBENCH_REPO"] = self.repo
        hash_py = f"from common.workload.job import load_job; print(load_job({job!r}).job_hash)"
        self.prerun_cmds = [
            'source "$TWINBENCH_REPO/jobs/slurm/env.sh"',  # cd's to the repository root
            "set +u",
            f'echo "[reframe] expected job_hash $(python -c "{hash_py}")"',
        ]
        rec_py = ("import glob, json; f = sorted(glob.glob('" + results + "/*.json')); "
                  "print(json.load(open(f[-1]))['job_hash'] if f else 'none')")
        self.postrun_cmds = [
            "tb_rc=$?",
            'echo "[reframe] twinbench exit status $tb_rc"',
            f'echo "[reframe] recorded job_hash $(python -c "{rec_py}")"',
        ]

    @run_before("performance")
    def set_references(self):
        part = self.current_partition.fullname
        mine = REFERENCES.get(part, {}).get((self.backend, self.tasks), {})
        self.reference = {part: {v: (*mine.get(v, (0, None, None)), UNIT) for v in PERF_VARS}}

    @sanity_function
    def assert_twinbench_ran(self):
        expected = sn.extractsingle(r"^\[reframe\] expected job_hash (\w+)", self.stdout, 1)
        printed = sn.extractsingle(r"^\[twinbench\] job .* hash (\w+) \|", self.stdout, 1)
        recorded = sn.extractsingle(r"^\[reframe\] recorded job_hash (\w+)", self.stdout, 1)
        checks = [
            sn.assert_found(r"^\[reframe\] twinbench exit status 0$", self.stdout,
                            msg="twinbench did not exit 0"),
            sn.assert_found(_TOTAL, self.stdout, msg="no 'Total img/sec' line"),
            sn.assert_found(_PER, self.stdout, msg="no 'Img/sec per' line"),
            sn.assert_eq(printed, expected, msg="printed job hash {0} != job file's {1}"),
            sn.assert_eq(recorded, expected, msg="recorded job hash {0} != job file's {1}"),
        ]
        if self.job_hash:
            checks.append(sn.assert_eq(expected, self.job_hash, msg="job hash {0} != pinned {1}"))
        return sn.all(checks)

    def _figure(self, pattern: str, group: int):
        return sn.extractsingle(pattern, self.stdout, group, float)

    @performance_function(UNIT)
    def total_img_s(self):
        return self._figure(_TOTAL, 1)

    @performance_function(UNIT)
    def total_img_s_lo95(self):
        return self._figure(_TOTAL, 1) - self._figure(_TOTAL, 2)

    @performance_function(UNIT)
    def total_img_s_hi95(self):
        return self._figure(_TOTAL, 1) + self._figure(_TOTAL, 2)

    @performance_function(UNIT)
    def img_s_per_gpu(self):
        return self._figure(_PER, 1)

    @performance_function(UNIT)
    def img_s_per_gpu_lo95(self):
        return self._figure(_PER, 1) - self._figure(_PER, 2)

    @performance_function(UNIT)
    def img_s_per_gpu_hi95(self):
        return self._figure(_PER, 1) + self._figure(_PER, 2)
