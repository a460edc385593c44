"""twinbench as a ReFrame regression test: every registered backend on the same layout, then a parity test that
compares their final losses and throughputs.

    reframe -C jobs/reframe/settings.py -c jobs/reframe/twinbench_check.py -r --performance-report
    reframe -C SITE_SETTINGS.py -c jobs/reframe/twinbench_check.py -r -S job_file=jobs/resnet50_cifar10.toml \
        -S num_nodes=2 -S num_tasks_per_node=4 -S baseline=PREVIOUS_OUTPUT_DIR -S sets=steps=200 -S repeats=3

**Options** (``-S``; bad values are one line and exit 2, not ReFrame's warning and no test): ``sets``, job
overrides each passed as ``--set KEY=VALUE`` (``-S sets=steps=200,per_replica_batch_size=64``: ReFrame splits a
list variable at commas; a value holding a comma goes in a JSON list, ``-S 'sets=["dataset_args={\"a\": 1,
\"b\": 2}"]'``); ``backend_args``, extra backend flags split the same way (``-S backend_args=--set,steps=200``);
``repeats`` (3), runs of the backend one after the other in the test's allocation, whose medians are the figures,
so one disturbed run does not flip pass/fail; ``cpus_per_task``, ``srun_mpi``, ``srun_hint``, ``job_hash``.

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
Sanity: exit status 0 for every repeat, the summary lines printed, and the job hash printed and recorded both equal
the job file's with the overrides (and ``-S job_hash=...`` when a centre pins it). Performance variables (each the
median over the repeats), from the summary lines in Horovod's benchmark format (``Total img/sec on N GPU(s): X
+-Y``, common/training/observe.py): ``total_img_s`` (all ranks, wall clock of the slowest), ``img_s_per_gpu`` (=
total / ranks), and ``*_lo95``/``*_hi95`` = X - Y and X + Y, where Y is 1.96 standard deviations of the per-window
throughputs (Horovod's "+-"): where the windows' rates fell, not a confidence interval of the mean. (On a node
without GPUs twinbench prints "CPU"; the names stay.)

**TwinbenchParity** (one per layout) depends on every backend's TwinbenchCheck of its layout (``depends_on``) and
reads their results JSONs. Sanity: each run wrote one, all for the same job hash and layout, and the final losses
agree with the first backend's (native) to ``rtol`` (1e-5, relative; in practice they are equal bit for bit).
Performance variables: ``<backend>_img_s`` per backend (the median of its repeats) and ``<backend>_<first>_ratio``
(``horovod_native_ratio``).

**References** come from a baseline directory, never from this file: ``-S baseline=DIR`` (the results JSONs of an
earlier run, e.g. its ReFrame output directory or a sweep's, searched recursively). A throughput's reference is the
median of the baseline's runs with the same job hash, backend and layout, failing when the median of this test's
repeats falls below it by more than the tolerance; the ratio's is the ratio of those medians, failing that far off
either way (jobs/reframe/baseline.py). The tolerance is what the baseline's spread supports: how far below its
median the lower end of the median's 95% interval lies (at least 6 runs in the baseline, 1% at least; for the
ratio, both medians' relative widths added), else 0.10; ``-S reference_tolerance=F`` sets it. Without a baseline,
or without a matching run in it, a variable is recorded and never fails. (``-S reference=...`` cannot be the
option's name: ``reference`` is ReFrame's own variable, the dict.)
"""

from __future__ import annotations

import os
import shlex
import statistics
import sys
from pathlib import Path

import reframe as rfm
import reframe.utility.sanity as sn
import reframe.utility.typecheck as typ
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


def job_sets(args: list[str]) -> list[str]:
    """The job overrides among backend flags: each ``--set KEY=VALUE`` (or ``--set=KEY=VALUE``)'s value."""
    out = []
    for i, a in enumerate(args):
        if a == "--set" and i + 1 < len(args):
            out.append(args[i + 1])
        elif a.startswith("--set="):
            out.append(a[len("--set="):])
    return out


def refuse(message: str) -> None:
    """Bad input: one line and exit 2 (ReFrame would turn an exception here into a warning and no test)."""
    print(f"twinbench_check: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


class TwinbenchLayout(rfm.RegressionTestPlugin):
    """The layout both tests share: ``num_nodes`` x ``num_tasks_per_node``, and the baseline to compare with."""

    default_tasks = parameter(DEFAULT_TASKS)
    #: nodes of the layout
    num_nodes = variable(int, value=1)
    #: results JSONs of an earlier run (searched recursively): the reference figures; empty: none
    baseline = variable(str, value="")
    #: a throughput fails more than this fraction below its reference (the ratio: this far off either way);
    #: unset, what the baseline's 95% interval supports (jobs/reframe/baseline.py), 0.10 for a baseline of < 6 runs
    reference_tolerance = variable(float, type(None), value=None)

    @run_after("init")
    def set_layout(self):
        if self.num_nodes < 1:
            refuse(f"-S num_nodes={self.num_nodes}: must be >= 1")
        if self.num_tasks_per_node is None:
            self.num_tasks_per_node = self.default_tasks
        elif self.default_tasks != DEFAULT_TASKS[0]:
            self.skip(f"-S num_tasks_per_node={self.num_tasks_per_node}: one layout, run by default_tasks="
                      f"{DEFAULT_TASKS[0]}")
        if self.num_tasks_per_node < 1:
            refuse(f"-S num_tasks_per_node={self.num_tasks_per_node}: must be >= 1")
        if self.reference_tolerance is not None and not 0 < self.reference_tolerance < 1:
            refuse(f"-S reference_tolerance={self.reference_tolerance}: must be a fraction in (0, 1)")
        self.num_tasks = self.num_nodes * self.num_tasks_per_node

    def tolerance(self, values: list[float], ratio_with: list[float] | None = None) -> float:
        """The tolerance of a reference from the baseline ``values`` (and, for a ratio, its other side's)."""
        if self.reference_tolerance is not None:
            return self.reference_tolerance
        if ratio_with is None:
            tol = baseline.interval_tolerance(values)
        else:
            a, b = baseline.spread(values), baseline.spread(ratio_with)
            tol = a + b if a is not None and b is not None else None
        return tol if tol is not None else baseline.DEFAULT_TOLERANCE

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
    #: job overrides, each passed as --set KEY=VALUE: -S sets=steps=200,per_replica_batch_size=64 (ReFrame splits
    #: a list at commas; a value holding one goes in a JSON list: -S 'sets=["dataset_args={\"a\": 1, \"b\": 2}"]')
    sets = variable(typ.List[str], value=[])
    #: extra backend flags, split at commas as well: -S backend_args=--threads=2,--set,steps=200
    backend_args = variable(typ.List[str], value=[])
    #: runs of the backend in this test, one after the other in its allocation: the figures are their medians,
    #: so one disturbed run does not flip pass/fail
    repeats = variable(int, value=3)

    valid_systems = ["*"]
    valid_prog_environs = ["*"]
    time_limit = "30m"
    tags = {"twinbench"}
    maintainers = ["twinbench"]
    executable = "python"
    keep_files = ["results"]  # the results JSONs, in the output directory: the next session's baseline

    @run_after("init")
    def set_resources(self):
        if self.repeats < 1:
            refuse(f"-S repeats={self.repeats}: must be >= 1")
        if self.cpus_per_task < 1:
            refuse(f"-S cpus_per_task={self.cpus_per_task}: must be >= 1")
        bad = [s for s in self.sets if "=" not in s]
        if bad:
            refuse(f"-S sets: {bad[0]!r} is not KEY=VALUE (e.g. -S sets=steps=200,per_replica_batch_size=64)")
        self.descr = (f"twinbench {self.backend}, {self.num_nodes} node(s) x {self.num_tasks_per_node} task(s) on "
                      f"{self.job_file}, {self.repeats} run(s)")
        self.num_gpus_per_node = self.num_tasks_per_node
        self.num_cpus_per_task = self.cpus_per_task

    @run_before("run")
    def set_launch(self):
        results = _results_dir(self)
        job = self.job_file if os.path.isabs(self.job_file) else os.path.join(self.repo, self.job_file)
        entry = registry.entry(self.backend)
        port = ["--port-base", "$TB_PORT_BASE"] if entry.port_base else []
        overrides = [*(a for s in self.sets for a in ("--set", s)), *self.backend_args]
        self.executable_opts = ["-m", f"backends.{self.backend}", *port, "--job", shlex.quote(job), "--results",
                                shlex.quote(results), *(shlex.quote(a) for a in overrides)]
        opts = [f"--hint={self.srun_hint}"] if self.srun_hint else []
        if entry.srun_mpi:
            opts.insert(0, f"--mpi={self.srun_mpi}")
        self.job.launcher.options = opts
        self.env_vars["TWINBENCH_REPO"] = self.repo
        set_args = " ".join(shlex.quote(a) for a in job_sets(overrides))
        hash_py = (f"import sys; from common.workload.job import load_job; print(load_job({job!r}, "
                   "sys.argv[1:]).job_hash)")
        # the repeats before the last one, each ReFrame's own launch line (after these, it runs the last): the
        # launcher reads the job's CPUs per task, which ReFrame sets just before writing that line
        self.job.num_cpus_per_task = self.num_cpus_per_task
        again = f"{self.job.launcher.run_command(self.job)} {self.executable} {' '.join(self.executable_opts)}"
        self.prerun_cmds = [
            'source "$TWINBENCH_REPO/jobs/slurm/env.sh"',  # cd's to the repository root
            "set +u",
            f'echo "[reframe] expected job_hash $(python -c "{hash_py}" {set_args})"',
            'tb_rcs=""',
            *(f'{again}; tb_rcs="$tb_rcs $?"' for _ in range(self.repeats - 1)),
        ]
        rec_py = ("import glob, json; f = sorted(glob.glob('" + results + "/*.json')); "
                  "print(json.load(open(f[-1]))['job_hash'] if f else 'none')")
        self.postrun_cmds = [
            'tb_rcs="$tb_rcs $?"',
            'for tb_rc in $tb_rcs; do echo "[reframe] twinbench exit status $tb_rc"; done',
            f'echo "[reframe] recorded job_hash $(python -c "{rec_py}")"',
        ]

    @run_before("performance")
    def set_references(self):
        part = self.current_partition.fullname
        record = baseline.run_record(_results_dir(self))
        values = [] if record is None else baseline.throughputs(self.baseline_records(), record["job_hash"],
                                                                 self.backend, self.layout())
        median = statistics.median(values) if values else None
        per_gpu = median / self.num_tasks if median else None
        tol = self.tolerance(values)
        refs = {v: (0, None, None) for v in PERF_VARS}
        refs["total_img_s"] = baseline.throughput_reference(median, tol)
        refs["img_s_per_gpu"] = baseline.throughput_reference(per_gpu, tol)
        self.reference = {part: {v: (*ref, UNIT) for v, ref in refs.items()}}

    @sanity_function
    def assert_twinbench_ran(self):
        expected = sn.extractsingle(r"^\[reframe\] expected job_hash (\w+)", self.stdout, 1)
        printed = sn.extractsingle(r"^\[twinbench\] job .* hash (\w+) \|", self.stdout, 1)
        recorded = sn.extractsingle(r"^\[reframe\] recorded job_hash (\w+)", self.stdout, 1)
        record = baseline.run_record(_results_dir(self))
        statuses = sn.extractall(r"^\[reframe\] twinbench exit status (\d+)$", self.stdout, 1, int)
        checks = [
            sn.assert_eq(statuses, [0] * self.repeats, msg="twinbench's exit statuses {0}, not {1} (one per repeat)"),
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

    def _figure(self, pattern: str, sign: int = 0) -> float:
        """The median over the repeats of X + sign * Y of the summary lines ``X +-Y``."""
        pairs = sn.evaluate(sn.extractall(pattern, self.stdout, (1, 2), float))
        return statistics.median(x + sign * y for x, y in pairs)

    @performance_function(UNIT)
    def total_img_s(self):
        return self._figure(_TOTAL)

    @performance_function(UNIT)
    def total_img_s_lo95(self):
        return self._figure(_TOTAL, -1)

    @performance_function(UNIT)
    def total_img_s_hi95(self):
        return self._figure(_TOTAL, 1)

    @performance_function(UNIT)
    def img_s_per_gpu(self):
        return self._figure(_PER)

    @performance_function(UNIT)
    def img_s_per_gpu_lo95(self):
        return self._figure(_PER, -1)

    @performance_function(UNIT)
    def img_s_per_gpu_hi95(self):
        return self._figure(_PER, 1)


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
        # every repeat's throughput, per backend: the figures are their medians
        self.throughputs = {name: [float(r["images_per_sec"]) for r in baseline.read_records(
            Path(_results_dir(self.getdep(dep))).glob("*.json"))] for name, dep in self.run_names.items()}

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
        base = {n: baseline.throughputs(found, job_hash, n, self.layout()) for n in names}
        medians = {n: statistics.median(v) if v else None for n, v in base.items()}
        mine = {n: statistics.median(v) if v else 0.0 for n, v in self.throughputs.items()}
        refs = {}
        for name in names:
            var = f"{name}_img_s"
            self.perf_variables[var] = sn.make_performance_function(lambda n=name: mine[n], UNIT)
            refs[var] = (*baseline.throughput_reference(medians[name], self.tolerance(base[name])), UNIT)
        for name in names[1:]:
            var = f"{name}_{first}_ratio"
            self.perf_variables[var] = sn.make_performance_function(lambda n=name: mine[n] / mine[first], "x")
            ratio = medians[name] / medians[first] if medians[name] and medians[first] else None
            refs[var] = (*baseline.ratio_reference(ratio, self.tolerance(base[name], base[first])), "x")
        self.reference = {self.current_partition.fullname: refs}
