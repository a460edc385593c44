"""Shared helpers: run the real entry points as processes (CPU, loopback) and read their results JSON."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from common.core import registry

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (requirements.txt installs tomli there)
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
BIN = Path(PY).parent
SMOKE = str(REPO / "jobs" / "smoke.toml")
RUN_TIMEOUT = 300  # seconds for one multi-process run; a hang fails the test instead of eating CI's budget
# `make test` runs the suite on two pytest-xdist workers (--dist loadgroup), each session fixture in one of them so
# that it is made once: the "own" worker takes the files that start a Slurm or an emulated cluster (the Slurm
# cluster fixture) and, to even out the two workers' time, files whose TensorFlow runs are their own; the "shared"
# worker takes the rest, among them every file using the runner fixture's shared runs (tests/test_structure.py
# checks both rules). Tests marked `timing` (wall-clock figures) run afterwards, alone.
CLUSTER_FILES = {"test_cluster.py", "test_cluster_runs.py", "test_slurm.py", "test_slurm_stack.py",
                 "test_reframe.py", "test_sweep_allocation.py"}
OWN_WORKER_FILES = CLUSTER_FILES | {"test_demo.py", "test_usercode_parity.py", "test_tfrecord.py", "test_cli.py",
                                    "test_netif.py", "test_observe.py", "test_usercode.py", "test_inputfn.py",
                                    "test_multioutput.py", "test_tfdata.py", "test_bench.py", "test_bench_ab.py",
                                    "test_port.py", "test_port_mwms.py"}
REQUIRE_CLUSTERS = "TWINBENCH_REQUIRE_CLUSTERS"  # "1" (make test): a cluster that cannot start fails, never skips
# the session fixture ``emu``, the emulated 2-node cluster, one per suite (a plugin: that module imports this one)
pytest_plugins = ["tests.cluster.emulated"]


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.xdist_group("own" if item.path.name in OWN_WORKER_FILES else "shared"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):  # noqa: ANN201 (a hook wrapper's generator)
    """Every test marked ``timing``: how much of the machine OTHER processes took while it ran (tests/aids/busy.py).
    A failure while they took more than ``busy.BUSY_SHARE`` fails with that figure first, then the test's own
    message. It fails rather than skips: a skip is green in `make test` and CI, so a real regression that happens to
    meet a busy machine would pass unseen; a red line saying "the machine was busy ... rerun alone" tells the reader
    what to do and hides nothing. A pass stays a pass (the figures held despite the load)."""
    if item.get_closest_marker("timing") is None:
        return (yield)
    from tests.aids import busy

    emu = getattr(item, "funcargs", {}).get("emu")  # the emulated cluster's nodes: their processes are the test's
    inodes = sorted(Path(emu.dir, "ns").glob("*.inode")) if emu is not None else []
    watch = busy.Watch(namespaces=frozenset(int(p.read_text()) for p in inodes)).start()
    try:
        result = yield
    except Exception as e:  # an assertion or a timeout; pytest's skip and fail outcomes are BaseExceptions
        other = watch.stop()
        item.user_properties.append(("other_cpu_share", round(other, 3)))
        if other > busy.BUSY_SHARE:
            pytest.fail(f"{busy.busy_message(other)}\nthe test's own failure: {type(e).__name__}: {e}")
        raise
    other = watch.stop()
    item.user_properties.append(("other_cpu_share", round(other, 3)))
    return result


def pytest_sessionfinish(session: pytest.Session) -> None:
    """With ``TWINBENCH_TEST_PROC_LOG`` (bench/suite_processes.py), this pytest process's own CPU too: what the
    in-process tests cost beside the processes they start."""
    from tests.aids import proclog

    if os.environ.get(proclog.ENV):
        proclog.write(os.environ[proclog.ENV], f"(pytest {os.environ.get('PYTEST_XDIST_WORKER', 'main')})")


def skip_or_fail(reason: str) -> None:
    """Skip (a machine without Slurm, root or namespaces), or fail where the clusters are required."""
    if os.environ.get(REQUIRE_CLUSTERS) == "1":
        pytest.fail(f"{reason} ({REQUIRE_CLUSTERS}=1: required here)")
    pytest.skip(reason)


def base_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "TF_USE_LEGACY_KERAS": "1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        # tests/aids: the test aids every started process loads (sitecustomize.py; inert unless asked for)
        "PYTHONPATH": f"{REPO}:{REPO / 'tests' / 'aids'}",
        "PATH": f"{BIN}:{env.get('PATH', '')}",
    })
    env.pop("TF_CONFIG", None)
    for k in [k for k in env if k.startswith(("SLURM_", "OMPI_COMM_WORLD", "PMIX_", "HOROVOD_"))]:
        env.pop(k)
    return env


def signal_env(step: int) -> dict[str, str]:
    """``base_env`` for a run whose chief gets SIGTERM after global step ``step`` (tests/aids/signal_aid.py)."""
    from tests.aids.signal_aid import ENV

    return {**base_env(), ENV: str(step)}


def pause_vars(seconds: float) -> dict[str, str]:
    """The variable that makes a run's host sleep ``seconds`` after every step (tests/aids/pause_aid.py)."""
    from tests.aids.pause_aid import ENV

    return {ENV: str(seconds)}


def slow_input_vars(seconds: float) -> dict[str, str]:
    """The variable that makes every batch of a run's training input ``seconds`` late (tests/aids/slow_input_aid.py)."""
    from tests.aids.slow_input_aid import ENV

    return {ENV: str(seconds)}


def run(cmd: list[str], *, timeout: int = RUN_TIMEOUT, env: dict[str, str] | None = None,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=REPO, env=env or base_env(), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n"
                             f"--- stderr\n{proc.stderr[-6000:]}")
    return proc


def mpirun_command(n: int, args: list[str], python: str = PY) -> list[str]:
    """``n`` local Horovod ranks under mpirun (Horovod's MPI controller): the product's MPI launch line
    (backends/horovod_launch.py: unbound as under horovodrun, idle ranks yielding the CPU)."""
    from backends import horovod

    return horovod.launch_command(f"localhost:{n}", n, args, python, controller="mpi")


def backend_cmd(kind: str, results: Path, *extra: str, workers: int = 2, job: str = SMOKE,
                own_launcher: bool = False) -> list[str]:
    """``workers`` local ranks of backend ``kind`` on ``job``: native by --nproc; Horovod's ranks by mpirun, the
    tests' launcher (about 1.5 s less per run than horovodrun's start-up; the same math under either controller:
    tests/test_backends.py::test_horovod_under_mpirun_matches_gloo), or with ``own_launcher`` by the backend's own
    (by the controller the build has: horovodrun --gloo on the default build), for the tests of that launcher."""
    args = ["--job", job, "--results", str(results), "--quiet", *extra]
    if kind == "horovod" and workers > 1 and not own_launcher:
        return mpirun_command(workers, args)
    return registry.load(kind).local_command(workers, args, python=PY)


def only_result(results: Path) -> dict[str, Any]:
    files = sorted(p for p in results.glob("*.json") if not p.name.startswith("."))
    assert len(files) == 1, f"expected one results JSON in {results}, found {[f.name for f in files]}"
    return json.loads(files[0].read_text())


def first_divergence(a: list[float], b: list[float], rtol: float) -> str | None:
    """None when equal within rtol, else a message naming the first diverging step."""
    if len(a) != len(b):
        return f"different step counts: {len(a)} vs {len(b)}"
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if abs(x - y) > rtol * max(abs(x), abs(y), 1e-12):
            return f"first diverging step {i + 1}: {x!r} vs {y!r} (rel diff {abs(x - y) / max(abs(x), abs(y)):.2e})"
    return None


def same_losses(records: dict[str, dict[str, Any]], rtol: float = 1e-5) -> str | None:
    """None when every named run trained the same job from the same weights to the same per-step losses (within
    rtol) as the first one, else a message naming the first run and step that differ."""
    (ref_name, ref), *others = records.items()
    for name, r in others:
        for key in ("job_hash", "initial_weights_digest"):
            if r[key] != ref[key]:
                return f"{name} vs {ref_name}: different {key} ({r[key]} vs {ref[key]})"
        msg = first_divergence(ref["step_losses"], r["step_losses"], rtol)
        if msg:
            return f"{name} vs {ref_name}: {msg}"
    return None


@pytest.fixture(autouse=True)
def _restore_environ():
    """In-process code may export variables (``cli.prepare`` exports the --iface settings for the launchers'
    libraries): each test starts from the environment the previous one started from, not from what it left."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def _smoke_defaults() -> dict[str, str]:
    """jobs/smoke.toml's scalar values as ``--set`` would spell them (``mode`` -> ``fit``)."""
    with open(SMOKE, "rb") as f:
        table = tomllib.load(f)
    return {k: str(v) for k, v in table.items() if isinstance(v, str | int | float) and not isinstance(v, bool)}


def without_default_sets(extra: tuple[str, ...]) -> tuple[str, ...]:
    """``extra`` without the ``--set KEY=VALUE`` pairs that repeat smoke.toml's own value: ``runner("native")`` and
    ``runner("native", "--set", "mode=fit")`` are the same job (same values, same job_hash), so one run."""
    defaults = _smoke_defaults()
    out: list[str] = []
    i = 0
    while i < len(extra):
        if extra[i] == "--set" and i + 1 < len(extra):
            key, _, value = extra[i + 1].partition("=")
            if defaults.get(key) == value:
                i += 2
                continue
        out.append(extra[i])
        i += 1
    return tuple(out)


@pytest.fixture(scope="session")
def runner(tmp_path_factory: pytest.TempPathFactory):
    """Runs each distinct command once per session and returns its results record (runs are serial: 2 cores);
    Horovod's two ranks by mpirun (``backend_cmd``: the tests of horovodrun itself start their own runs).
    The smoke job is the only job here, and a ``--set`` of one of its own values is dropped first (one run for
    one job). The records and directories are shared: a test must not modify them (copy first).
    ``runner.results_dir(kind, *extra, workers=2)``: the results directory of that same run. ``env``: variables
    added to the processes' environment (a test aid's, e.g. ``pause_vars``), part of what makes a run distinct.
    Every run gets its own empty $TMPDIR; ``runner.tmp_leftovers()`` maps each run so far to what its processes
    left there (they should leave nothing: TensorFlow's autograph files are removed at exit, common.core.errors)."""
    cache: dict[tuple[str, ...], tuple[dict[str, Any], Path]] = {}
    leftovers: dict[tuple[str, ...], list[str]] = {}

    def once(kind: str, extra: tuple[str, ...], workers: int,
             env: dict[str, str] | None) -> tuple[dict[str, Any], Path]:
        extra = without_default_sets(extra)
        key = (kind, str(workers), *extra, *(f"{k}={v}" for k, v in sorted((env or {}).items())))
        if key not in cache:
            out = tmp_path_factory.mktemp(f"{kind}{workers}")
            tmp = tmp_path_factory.mktemp(f"{kind}{workers}-tmp")
            run(backend_cmd(kind, out, *extra, workers=workers), env={**base_env(), **(env or {}), "TMPDIR": str(tmp)})
            cache[key] = (only_result(out), out)
            leftovers[key] = sorted(p.name for p in tmp.iterdir())
        return cache[key]

    def go(kind: str, *extra: str, workers: int = 2, env: dict[str, str] | None = None) -> dict[str, Any]:
        return once(kind, extra, workers, env)[0]

    def results_dir(kind: str, *extra: str, workers: int = 2, env: dict[str, str] | None = None) -> Path:
        return once(kind, extra, workers, env)[1]

    go.results_dir = results_dir  # type: ignore[attr-defined]
    go.tmp_leftovers = lambda: dict(leftovers)  # type: ignore[attr-defined]
    return go


def env_with_broken_horovod(tmp_path: Path, why: str) -> dict[str, str]:
    """An environment where `import horovod` raises ImportError(why) (a shadowing package first on the path)."""
    fake = tmp_path / "horovod"
    fake.mkdir()
    (fake / "__init__.py").write_text(f"raise ImportError({why!r})\n")
    env = base_env()
    env["PYTHONPATH"] = f"{tmp_path}:{REPO}"
    return env


# -- the test Slurm cluster (tests/slurm/start_cluster.sh), one per session: tests/test_slurm.py, tests/test_reframe.py
SLURM_DIR = REPO / "tests" / "slurm"
JOB_TIMEOUT = 180  # seconds for one Slurm job to finish; then it is cancelled and the test fails


class Cluster:
    def __init__(self, directory: Path, conf: str) -> None:
        self.dir = directory
        self.conf = conf
        self.node = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
        self.cache: dict[str, Any] = {}

    def env(self, **extra: str) -> dict[str, str]:
        env = base_env()
        env["SLURM_CONF"] = self.conf
        env.update(extra)
        return env

    def run(self, cmd: list[str], **extra_env: str) -> subprocess.CompletedProcess[str]:
        return run(cmd, env=self.env(**extra_env))

    def job_state(self, job_id: str) -> dict[str, str]:
        out = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=self.env(), capture_output=True,
                             text=True, timeout=30).stdout
        return dict(f.split("=", 1) for f in out.split() if "=" in f)

    def wait(self, job_id: str, log: Path | None = None) -> dict[str, str]:
        """Poll `scontrol show job` until the job ends (sbatch --wait is slow); cancel it after JOB_TIMEOUT."""
        deadline = time.monotonic() + JOB_TIMEOUT
        while True:
            info = self.job_state(job_id)
            if info.get("JobState") not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", None):
                return info
            if time.monotonic() > deadline:
                subprocess.run(["scancel", job_id], env=self.env(), timeout=30)
                tail = log.read_text()[-3000:] if log and log.exists() else ""
                raise AssertionError(f"job {job_id} still {info.get('JobState')} after {JOB_TIMEOUT} s "
                                     f"({info.get('Reason')}); cancelled\n{tail}")
            time.sleep(0.5)

    def sbatch(self, args: list[str], log: Path, **extra_env: str) -> dict[str, str]:
        proc = self.run(["sbatch", "--parsable", f"--output={log}", *args], **extra_env)
        job_id = proc.stdout.strip().split(";")[0]
        info = self.wait(job_id, log)
        info["log"] = log.read_text() if log.exists() else ""
        info["JobId"] = job_id
        return info

    def once(self, key: str, make: Any) -> Any:
        """Each distinct run once per session (TF processes are slow to start on 2 cores)."""
        if key not in self.cache:
            self.cache[key] = make()
        return self.cache[key]


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    missing = [b for b in ("slurmctld", "slurmd", "srun", "sbatch", "munged") if shutil.which(b) is None]
    if missing:
        skip_or_fail(f"Slurm is not installed (missing {', '.join(missing)}): TWINBENCH_WITH_SLURM=1 make setup")
    if os.geteuid() != 0:
        skip_or_fail("the test Slurm runs its daemons as root (SlurmUser=root); run the tests as root")
    directory = tmp_path_factory.mktemp("slurm")
    proc = subprocess.run(["bash", str(SLURM_DIR / "start_cluster.sh"), str(directory)], capture_output=True,
                          text=True, timeout=120, env={**base_env(), "TWINBENCH_SLURM_INSTALL": "0"})
    if proc.returncode != 0:
        subprocess.run(["bash", str(SLURM_DIR / "stop_cluster.sh"), str(directory)], capture_output=True,
                       timeout=60)
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        skip_or_fail(f"could not start the test Slurm cluster: {last}")
    conf = str(directory / "etc" / "slurm.conf")
    assert f"export SLURM_CONF={conf}" in proc.stdout
    try:
        yield Cluster(directory, conf)
    finally:
        keep = ["--keep"] if os.environ.get("TWINBENCH_KEEP_SLURM") == "1" else []
        subprocess.run(["bash", str(SLURM_DIR / "stop_cluster.sh"), *keep, str(directory)], timeout=120)


@pytest.fixture
def restore_sys_path() -> Any:
    """load_job puts the job's pythonpath first on sys.path: a test using this starts from the path it found."""
    saved = list(sys.path)
    yield
    sys.path[:] = saved


def user_job(tmp: Path, package: str, source: str, values: dict[str, str], name: str = "job.toml") -> Path:
    """A package ``package`` under ``tmp`` whose module ``fns`` is ``source``, and beside it the job file ``name``
    with ``values`` (key -> TOML text; an empty text leaves the key out)."""
    (tmp / package).mkdir(exist_ok=True)
    (tmp / package / "__init__.py").write_text("")
    (tmp / package / "fns.py").write_text(source)
    job = tmp / name
    job.write_text("".join(f"{k} = {v}\n" for k, v in values.items() if v))
    return job
