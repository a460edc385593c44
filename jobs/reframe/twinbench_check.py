"""twinbench as a ReFrame regression test: every registered backend on the same layout, then a parity test that
compares their final losses and throughputs.

    reframe -C jobs/reframe/settings.py -c jobs/reframe/twinbench_check.py -r --performance-report
    reframe -C SITE_SETTINGS.py -c jobs/reframe/twinbench_check.py -r -S job_file=jobs/resnet50_cifar10.toml \
        -S num_nodes=2 -S num_tasks_per_node=4 -S baseline=PREVIOUS_OUTPUT_DIR

**Layout.** ``num_nodes`` (default 1) and ``num_tasks_per_node`` (ReFrame's own variable; one task per GPU) are
variables. Left unset, ``num_tasks_per_node`` comes from the parameter ``default_tasks`` (1 and 2): the default
session is, as before, 1 node x 1 task and 1 node x 2 tasks, per backend. Set with ``-S num_tasks_per_node=N``, only
the ``default_tasks=1`` variants are loaded (the others would be the same layout again: ReFrame skips them at load)
and they run ``num_nodes`` x N. The report and the perflog record ``num_nodes`` and ``num_tasks_per_node``: read the
layout from those, not from ``default_tasks``.

**TwinbenchCheck** (one per backend and layout) runs the sbatch scripts' logic: the job script sources
jobs/slurm/env.sh (the same environment for both backends: modules, conda or the repository's .venv,
TF_USE_LEGACY_KERAS, no proxies, --cpus-per-task passed on to srun, one failed task ends the step) and launches
``srun python -m backends.native`` or ``srun --mpi=pmix python -m backends.horovod`` on the job file, with
``--results`` in the stage directory (kept in ReFrame's output directory: ``keep_files``).
Sanity: exit status 0, the summary lines printed, and the job hash printed and recorded both equal the job file's
(and ``-S job_hash=...`` when a centre pins it). Performance variables, from the summary lines in Horovod's
benchmark format (``Total img/sec on N GPU(s): X +-Y``, common/training/observe.py): ``total_img_s`` (all ranks,
wall clock of the slowest), ``img_s_per_gpu`` (= total / ranks), and ``*_lo95``/``*_hi95`` = X - Y and X + Y, where
Y is 1.96 standard deviations of the per-window throughputs (Horovod's "+-"): where the windows' rates fell, not a
confidence interval of the mean. (On a node without GPUs twinbench prints "CPU"; the names stay.)

**TwinbenchParity** (one per layout) depends on every backend's TwinbenchCheck of its layout (``depends_on``) and
reads their results JSONs. Sanity: each run wrote one, all for the same job hash and layout, and the final losses
agree with the first backend's (native) to ``rtol`` (1e-5, relative; in practice they are equal bit for bit).
Performance variables: ``<backend>_img_s`` per backend and ``<backend>_<first>_ratio`` (``horovod_native_ratio``).

**References** come from a baseline directory, never from this file: ``-S baseline=DIR`` (the results JSONs of an
earlier run, e.g. its ReFrame output directory, searched recursively). A throughput's reference is the median of
the baseline's runs with the same job hash, backend and layout, failing more than ``reference_tolerance`` (0.10)
below it; the ratio's is the ratio of those medians, failing more than ``reference_tolerance`` off either way
(jobs/reframe/baseline.py). Without a baseline, or without a matching run in it, a variable is recorded and never
fails. (``-S reference=...`` cannot be the option's name: ``reference`` is ReFrame's own variable, the dict.)
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
DEFAULT_TASKS = [1, 2]  # tasks per node of the default layouts (1 node): as the check always ran

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
from common.core import registry  # noqa: E402  (the only list of backends; imports no TensorFlow)
from jobs.reframe import baseline  # noqa: E402  (plain JSON reading: the reference rule, unit-tested)

_NUM = r"([0-9]+(?:\.[0-9]+)?)"
_PER = rf"^Img/sec per \w+: {_NUM} \+-{_NUM}"
_TOTAL = rf"^Total img/sec on \d+ \w+\(s\): {_NUM} \+-{_NUM}"


class TwinbenchLayout(rfm.RegressionTestPlugin):
    """The layout both tests share: ``num_nodes`` x ``num_tasks_per_node``, and the baseline to compare with."""

    default_tasks = parameter(DEFAULT_TASKS)
    #: nodes of the layout
    num_nodes = variable(int, value=1)
    #: results JSONs of an earlier run (searched recursively): the reference figures; empty: none
    baseline = variable(str, value="")
    #: a throughput fails more than this fraction below its reference (the ratio: this far off either way)
    reference_tolerance = variable(float, value=0.10)

    @run_after("init")
    def set_layout(self):
        if self.num_nodes < 1:
            raise ValueError(f"num_nodes must be >= 1, not {self.num_nodes}")
        if self.num_tasks_per_node is None:
            self.num_tasks_per_node = self.default_tasks
        elif self.default_tasks != DEFAULT_TASKS[0]:
            self.skip(f"-S num_tasks_per_node={self.num_tasks_per_node}: one layout, run by default_tasks="
                      f"{DEFAULT_TASKS[0]}")
        if self.num_tasks_per_node < 1:
            raise ValueError(f"num_tasks_per_node must be >= 1, not {self.num_tasks_per_node}")
        self.num_tasks = self.num_nodes * self.num_tasks_per_node

    def layout(self) -> tuple[int, int]:
        return (self.num_nodes, self.num_tasks_per_node)

    def baseline_records(self) -> list[dict]:
        return baseline.baseline_records(self.baseline) if self.baseline else []


def _results_dir(test: rfm.RegressionTest) -> str:
    return os.path.join(test.stagedir, "results")


@rfm.simple_test
class TwinbenchCheck(rfm.RunOnlyRegressionTest, TwinbenchLayout):
    """One twinbench run: ``backend`` on ``num_nodes`` x ``num_tasks_per_node`` ranks (one per GPU), on ``job_file``."""

    backend = parameter(list(registry.names()))

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
    keep_files = ["results"]  # the results JSONs, in the output directory: the next session's baseline

    @run_after("init")
    def set_resources(self):
        self.descr = (f"twinbench {self.backend}, {self.num_nodes} node(s) x {self.num_tasks_per_node} task(s) on "
                      f"{self.job_file}")
        self.num_gpus_per_node = self.num_tasks_per_node
        self.num_cpus_per_task = self.cpus_per_task

    @run_before("run")
    def set_launch(self):
        results = _results_dir(self)
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
        record = baseline.run_record(_results_dir(self))
        median = None
        if record is not None:
            median = baseline.median_throughput(self.baseline_records(), record["job_hash"], self.backend,
                                                self.layout())
        per_gpu = median / self.num_tasks if median else None
        refs = {v: (0, None, None) for v in PERF_VARS}
        refs["total_img_s"] = baseline.throughput_reference(median, self.reference_tolerance)
        refs["img_s_per_gpu"] = baseline.throughput_reference(per_gpu, self.reference_tolerance)
        self.reference = {part: {v: (*ref, UNIT) for v, ref in refs.items()}}

    @sanity_function
    def assert_twinbench_ran(self):
        expected = sn.extractsingle(r"^\[reframe\] expected job_hash (\w+)", self.stdout, 1)
        printed = sn.extractsingle(r"^\[twinbench\] job .* hash (\w+) \|", self.stdout, 1)
        recorded = sn.extractsingle(r"^\[reframe\] recorded job_hash (\w+)", self.stdout, 1)
        record = baseline.run_record(_results_dir(self))
        checks = [
            sn.assert_found(r"^\[reframe\] twinbench exit status 0$", self.stdout,
                            msg="twinbench did not exit 0"),
            sn.assert_found(_TOTAL, self.stdout, msg="no 'Total img/sec' line"),
            sn.assert_found(_PER, self.stdout, msg="no 'Img/sec per' line"),
            sn.assert_eq(printed, expected, msg="printed job hash {0} != job file's {1}"),
            sn.assert_eq(recorded, expected, msg="recorded job hash {0} != job file's {1}"),
            sn.assert_true(record is not None, msg="no results JSON in the stage directory"),
        ]
        if record is not None:
            checks.append(sn.assert_eq(baseline.layout(record), self.layout(),
                                       msg="recorded layout {0} != requested (nodes, tasks per node) {1}"))
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


@rfm.simple_test
class TwinbenchParity(rfm.RunOnlyRegressionTest, TwinbenchLayout):
    """After every backend's TwinbenchCheck of the same layout: their final losses agree, and how they compare."""

    #: relative tolerance of the final losses (twinbench's parity tolerance, docs/parity.md)
    rtol = variable(float, value=1e-5)

    valid_systems = ["*"]
    valid_prog_environs = ["*"]
    local = True  # reads files only: no allocation
    executable = "true"
    tags = {"twinbench"}
    maintainers = ["twinbench"]

    @run_after("init")
    def depend_on_the_runs(self):
        self.descr = f"twinbench parity, {self.num_nodes} node(s) x {self.num_tasks_per_node} task(s)"
        self.run_names = {}
        for name in registry.names():
            [num] = TwinbenchCheck.get_variant_nums(backend=name, default_tasks=self.default_tasks)
            self.run_names[name] = TwinbenchCheck.variant_name(num)
            self.depends_on(self.run_names[name])

    @run_after("setup")
    def read_the_runs(self):
        self.records = {name: baseline.run_record(_results_dir(self.getdep(dep)))
                        for name, dep in self.run_names.items()}

    @sanity_function
    def assert_same_final_loss(self):
        missing = [name for name, r in self.records.items() if r is None]
        if missing:
            return sn.assert_true(False, msg=f"no results JSON from {', '.join(missing)}")
        (first, ref), *others = self.records.items()
        checks = []
        for name, r in others:
            checks += [
                sn.assert_eq(r["job_hash"], ref["job_hash"], msg=f"{name} ran job {{0}}, {first} job {{1}}"),
                sn.assert_eq(baseline.layout(r), baseline.layout(ref), msg=f"{name} layout {{0}}, {first} {{1}}"),
                sn.assert_eq(baseline.layout(r), self.layout(), msg="layout {0} != requested {1}"),
            ]
            a, b = baseline.final_loss(ref), baseline.final_loss(r)
            if a is None or b is None:
                checks.append(sn.assert_true(False, msg=f"no step losses ({first}: {a}, {name}: {b})"))
                continue
            checks.append(sn.assert_le(baseline.relative_difference(a, b), self.rtol,
                                       msg=f"final loss {name} {b!r} vs {first} {a!r}: relative difference {{0}} > "
                                           f"{{1}}"))
        return sn.all(checks)

    @run_before("performance")
    def set_perf_variables(self):
        names = list(self.records)
        first = names[0]
        found = self.baseline_records()
        job_hash = self.records[first]["job_hash"]
        medians = {n: baseline.median_throughput(found, job_hash, n, self.layout()) for n in names}
        refs = {}
        for name in names:
            var = f"{name}_img_s"
            self.perf_variables[var] = sn.make_performance_function(
                lambda n=name: float(self.records[n]["images_per_sec"]), UNIT)
            refs[var] = (*baseline.throughput_reference(medians[name], self.reference_tolerance), UNIT)
        for name in names[1:]:
            var = f"{name}_{first}_ratio"
            self.perf_variables[var] = sn.make_performance_function(
                lambda n=name: float(self.records[n]["images_per_sec"]) / float(self.records[first]["images_per_sec"]),
                "x")
            ratio = medians[name] / medians[first] if medians[name] and medians[first] else None
            refs[var] = (*baseline.ratio_reference(ratio, self.reference_tolerance), "x")
        self.reference = {self.current_partition.fullname: refs}
