"""Throughput A/B of two checkouts of twinbench: the demo's runs, interleaved, each checkout running its own code.

``python -m bench.ab_checkouts A B [--job jobs/demo.toml] [--backends NAME,...] [--workers 1,2] [--rounds 3]
[--set key=value ...] [--out DIR]``: A and B are two checkouts (A before a change, B after it). Every round runs
each (backend, workers) configuration once in A and once in B, back to back, one run at a time; which of the two goes
first alternates from one configuration to the next and from one round to the next (A B B A A B ...), and the
configurations' order is reversed every other round, as scripts/demo.sh does, so that a drift of the machine hits
both checkouts alike. Backends default to every one both checkouts register (``python -m backends names``). A and B
may be the same checkout: that A/A comparison shows the spread of B/A when nothing changed.

Each run is launched as scripts/demo.sh launches it, from inside its checkout with that checkout's code: cwd and
PYTHONPATH the checkout, its ``.venv/bin/python`` (else this Python) with its ``bin`` first on PATH, the variables of
its ``python -m backends launch-env``, the line of its ``python -m backends command NAME N``, and the job with the
demo's ``--set steps=200 --set timing_warmup_steps=10`` followed by the ``--set`` given here (a later one wins). Each
run's record is read with common.core.results.RunRecord (every schema the report reads) and must name its
checkout's commit; this process never imports TensorFlow.

Prints, per (backend, workers): A's and B's median images/s and median step time, and the per-round ratio B/A of
images/s (median, min, max); then one summary line over every pair. It measures and never judges: exit 0 when every
run finished, 1 when one failed (its log's tail is shown, the other runs still go), 2 with one line on bad input,
before any run starts. Records and logs stay under --out (default: a new directory under /tmp):
``python -m common.report OUT/A`` reports one side alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from common.core.results import RecordError, RunRecord

PROG = "bench.ab_checkouts"
DEMO_SETS = {"steps": "200", "timing_warmup_steps": "10"}  # scripts/demo.sh's STEPS and warm-up
SIDES = ("A", "B")
RUN_TIMEOUT = 1800  # seconds for one run: a hang stops that run instead of eating the machine
QUICK_TIMEOUT = 120  # seconds for a checkout's own answers (names, job check, launch-env, launch line)
# Run by each checkout's Python, as scripts/demo.sh checks the job before its runs (a run with no timed step would
# still write a record): the job's hash, or its one line.
JOB_CHECK = """import sys
from pathlib import Path
from common.workload import argcheck
from common.workload.job import JobError, load_job
try:
    job = load_job(sys.argv[1], sys.argv[2:])
    argcheck.refuse(job, Path.cwd())
except JobError as e:
    sys.exit(str(e))
if 0 < job.steps <= job.timing_warmup_steps:
    sys.exit(f"steps={job.steps} must exceed the {job.timing_warmup_steps} untimed warm-up steps (timing_warmup_steps)")
print(job.job_hash)
"""


class BadInput(Exception):
    """One line for the user, exit 2, before any run."""


class RunFailed(Exception):
    """A run that did not give a usable record."""


@dataclass(frozen=True)
class Config:
    backend: str
    workers: int

    def __str__(self) -> str:
        return f"{self.backend} x{self.workers}"


@dataclass(frozen=True)
class Checkout:
    label: str  # "A" or "B"
    root: Path
    python: str  # the checkout's .venv/bin/python, else this Python
    commit: str  # HEAD, 12 hex digits as records name it; "" outside git (nothing to match)
    env: dict[str, str] = field(default_factory=dict, compare=False)  # every run's environment (run_env)
    job_hash: str = ""


@dataclass(frozen=True)
class Measure:
    images_per_sec: float
    step_median_s: float
    job_hash: str = ""


Run = Callable[[Checkout, Config, int], Measure]  # (checkout, configuration, round) -> its record's figures
Results = dict[Config, list[dict[str, Measure]]]  # per configuration, per round: side -> figures (a failed run: absent)


def schedule(configs: Sequence[Config], rounds: int) -> list[tuple[int, Config, str]]:
    """(round, configuration, side) in run order: each configuration's A and B back to back, the first of the two
    alternating with the configuration's index and with the round (each configuration goes A-first and B-first in
    turn), the configurations in reverse order every other round."""
    out = []
    for r in range(rounds):
        order = list(enumerate(configs))
        if r % 2:
            order.reverse()
        for j, cfg in order:
            first, second = SIDES if (r + j) % 2 == 0 else SIDES[::-1]
            out += [(r, cfg, first), (r, cfg, second)]
    return out


def execute(checkouts: dict[str, Checkout], configs: Sequence[Config], rounds: int, run: Run,
            say: Callable[[str], None] = print) -> Results:
    """Every run of ``schedule``, one at a time; a failed run is said (and absent from the results), never the end."""
    results: Results = {cfg: [{} for _ in range(rounds)] for cfg in configs}
    for r, cfg, side in schedule(configs, rounds):
        t0 = time.monotonic()
        try:
            m = run(checkouts[side], cfg, r)
        except RunFailed as e:
            say(f"round {r + 1}/{rounds} {cfg} {side}: FAILED: {e}")
            continue
        results[cfg][r][side] = m
        say(f"round {r + 1}/{rounds} {cfg} {side}: {m.images_per_sec:9.1f} img/s, step median "
            f"{1e3 * m.step_median_s:.2f} ms ({time.monotonic() - t0:.0f} s)")
    return results


def ratios(rounds: list[dict[str, Measure]]) -> list[float]:
    """B/A of images/s, per round where both sides finished."""
    return [got["B"].images_per_sec / got["A"].images_per_sec for got in rounds if set(SIDES) <= set(got)]


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(results: Results) -> list[str]:
    """One line per configuration (each side's median images/s and step time, B/A per round: median, min, max),
    then one summary line over every pair."""
    lines, every, medians = [], [], []
    for cfg, rounds in results.items():
        parts = []
        for side in SIDES:
            got = [r[side] for r in rounds if side in r]
            ips = _median([m.images_per_sec for m in got])
            step = _median([m.step_median_s for m in got])
            parts.append(f"{side} {ips:.1f} img/s, step {1e3 * step:.2f} ms" if ips is not None and step is not None
                         else f"{side} no run finished")
        rs = ratios(rounds)
        every += rs
        if rs:
            medians.append(statistics.median(rs))
            parts.append(f"B/A {statistics.median(rs):.3f} (min {min(rs):.3f}, max {max(rs):.3f}, {len(rs)} "
                         f"round{'s' if len(rs) > 1 else ''})")
        else:
            parts.append("B/A: no round with both sides")
        lines.append(f"{cfg}: " + "; ".join(parts))
    if every:
        lines.append(f"summary: B/A of images/s over {len(every)} pairs: median {statistics.median(every):.3f}, "
                     f"min {min(every):.3f}, max {max(every):.3f}; per configuration medians "
                     f"{min(medians):.3f}-{max(medians):.3f}")
    else:
        lines.append("summary: no pair of runs finished")
    return lines


def job_hashes(results: Results) -> dict[str, set[str]]:
    """The job hashes each side's records name (the two checkouts should hash the same job alike)."""
    return {side: {r[side].job_hash for rounds in results.values() for r in rounds if side in r} for side in SIDES}


# -- reading one run --------------------------------------------------------------------------------------------

def read_measure(results_dir: Path, side: Checkout, cfg: Config) -> Measure:
    """The figures of the one record a run wrote in ``results_dir``, checked to be that run's: its backend, its
    workers and its checkout's commit."""
    files = [f for f in results_dir.glob("*.json") if not f.name.startswith(".")]
    if len(files) != 1:
        raise RunFailed(f"expected one results JSON in {results_dir}, found {len(files)}")
    try:
        rec = RunRecord.from_dict(json.loads(files[0].read_text(encoding="utf-8")))
    except (OSError, ValueError, RecordError) as e:
        raise RunFailed(f"{files[0]}: not a usable record ({e})") from None
    if (rec.backend, rec.num_workers) != (cfg.backend, cfg.workers):
        raise RunFailed(f"{files[0]}: a record of {rec.backend} x{rec.num_workers}, not of {cfg}")
    ran = (rec.versions or {}).get("twinbench", "")
    if side.commit and ran and not ran.startswith(side.commit):
        raise RunFailed(f"{files[0]}: ran twinbench {ran}, not checkout {side.label}'s {side.commit}")
    median = rec.step_time.get("median")
    if not isinstance(median, int | float) or not rec.images_per_sec > 0:
        raise RunFailed(f"{files[0]}: no images/s or step time median")
    return Measure(float(rec.images_per_sec), float(median), rec.job_hash)


def launch_line(side: Checkout, cfg: Config, args: Sequence[str]) -> list[str]:
    """The checkout's own command for ``cfg`` (``python -m backends command``), as scripts/demo.sh gets it."""
    proc = _ask(side, ["-m", "backends", "command", cfg.backend, str(cfg.workers), *args])
    if proc.returncode != 0 or not proc.stdout.strip():
        raise BadInput(f"checkout {side.label} ({side.root}): no launch line for {cfg}: {_last_line(proc)}")
    return proc.stdout.splitlines()


def real_run(job_args: Sequence[str], out: Path) -> Run:
    """Runs one configuration in one checkout: results in ``out/<side>/r<round>-<backend>-<workers>/``, its output
    in ``out/logs/``."""
    def run(side: Checkout, cfg: Config, r: int) -> Measure:
        name = f"r{r + 1}-{cfg.backend}-{cfg.workers}"
        results = out / side.label / name
        results.mkdir(parents=True)
        log = out / "logs" / f"{side.label}-{name}.log"
        try:
            cmd = launch_line(side, cfg, [*job_args, "--results", str(results)])
        except BadInput as e:
            raise RunFailed(str(e)) from None
        with log.open("w") as f:
            try:
                rc = subprocess.run(cmd, cwd=side.root, env=side.env, stdout=f, stderr=subprocess.STDOUT,
                                    timeout=RUN_TIMEOUT).returncode
            except subprocess.TimeoutExpired:
                rc = -1
        if rc != 0:
            tail = log.read_text(errors="replace").splitlines()[-20:]
            raise RunFailed(f"exit {rc}, see {log}:\n" + "\n".join(tail))
        return read_measure(results, side, cfg)
    return run


# -- the input, checked before any run --------------------------------------------------------------------------

def _ask(side: Checkout, args: Sequence[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A quick question to the checkout's own code (no TensorFlow): its Python, from inside it."""
    try:
        return subprocess.run([side.python, *args], cwd=side.root, env=env or side.env, capture_output=True,
                              text=True, timeout=QUICK_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BadInput(f"checkout {side.label} ({side.root}): {side.python} {' '.join(args[:3])}: {e}") from None


def _last_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in (proc.stderr + "\n" + proc.stdout).splitlines() if ln.strip()]
    return lines[-1].strip() if lines else f"exit {proc.returncode}"


def run_env(root: Path, python: str, more: dict[str, str] | None = None) -> dict[str, str]:
    """scripts/demo.sh's environment, for this checkout's code: tf_keras, Open MPI as root, the Python's bin first
    on PATH, PYTHONPATH the checkout, no TF_CONFIG, then ``more`` (its launch-env)."""
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PATH=os.pathsep.join([str(Path(python).parent), os.environ.get("PATH", "")]), PYTHONPATH=str(root))
    env.pop("TF_CONFIG", None)
    env.update(more or {})
    return env


def find_checkout(label: str, path: str) -> Checkout:
    root = Path(path).absolute()
    if not root.is_dir():
        raise BadInput(f"checkout {label}: {path} is not a directory")
    if not (root / "backends" / "__main__.py").is_file() or not (root / "common").is_dir():
        raise BadInput(f"checkout {label}: {path} is not a twinbench checkout (no backends/__main__.py or common/)")
    venv = root / ".venv" / "bin" / "python"
    python = str(venv) if venv.exists() else sys.executable
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                          text=True, timeout=QUICK_TIMEOUT)
    commit = head.stdout.strip() if head.returncode == 0 else ""
    return Checkout(label, root, python, commit, run_env(root, python))


def choose_backends(checkouts: dict[str, Checkout], asked: list[str]) -> list[str]:
    """The backends asked for (default: every one both checkouts register, in A's order), each registered in both."""
    names = {}
    for label, side in checkouts.items():
        proc = _ask(side, ["-m", "backends", "names"])
        if proc.returncode != 0:
            raise BadInput(f"checkout {label} ({side.root}): python -m backends names: {_last_line(proc)}")
        names[label] = proc.stdout.split()
    if not asked:
        return [n for n in names["A"] if n in names["B"]]
    for n in asked:
        for label in SIDES:
            if n not in names[label]:
                raise BadInput(f"unknown backend {n!r} in checkout {label}: use one of {', '.join(names[label])}")
    return asked


def check_job(side: Checkout, job: str, sets: Sequence[str]) -> str:
    """The job's hash as the checkout loads it (its own load_job and argument check, as scripts/demo.sh)."""
    proc = _ask(side, ["-c", JOB_CHECK, job, *sets])
    if proc.returncode != 0 or not proc.stdout.strip():
        raise BadInput(f"checkout {side.label} ({side.root}): --job {job}: {_last_line(proc)}")
    return proc.stdout.split()[-1]


def with_launch_env(side: Checkout) -> tuple[Checkout, list[str]]:
    """The checkout with its ``python -m backends launch-env`` variables in its runs' environment, and the lines
    that say its choices."""
    proc = _ask(side, ["-m", "backends", "launch-env"])
    if proc.returncode != 0:
        raise BadInput(f"checkout {side.label} ({side.root}): launch-env: {_last_line(proc)}")
    more = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    said = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    return Checkout(side.label, side.root, side.python, side.commit, run_env(side.root, side.python, more),
                    side.job_hash), said


def merged_sets(given: Sequence[str]) -> list[str]:
    """The demo's overrides, then those given (a later key wins), as ``key=value``."""
    out = dict(DEMO_SETS)
    for s in given:
        key, eq, value = s.partition("=")
        if not eq or not key.strip():
            raise BadInput(f"--set {s!r}: expected key=value")
        out[key.strip()] = value
    return [f"{k}={v}" for k, v in out.items()]


def parse_workers(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise BadInput(f"--workers {text!r}: not a comma-separated list of worker counts") from None
    if not out or min(out) < 1 or len(set(out)) != len(out):
        raise BadInput(f"--workers {text!r}: worker counts must be distinct and >= 1")
    return out


@dataclass(frozen=True)
class Plan:
    checkouts: dict[str, Checkout]
    configs: list[Config]
    rounds: int
    job_args: list[str]
    out: Path
    said: list[str]  # the launch choices, one line each


def prepare(a: argparse.Namespace) -> Plan:
    """Every check before the first run (BadInput: one line); the output directory is created last."""
    if a.rounds < 1:
        raise BadInput(f"--rounds must be >= 1, got {a.rounds}")
    workers = parse_workers(a.workers)
    sets = merged_sets(a.sets)
    out = Path(a.out).absolute() if a.out else None  # the runs start inside the checkouts
    if out is not None and out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BadInput(f"--out {a.out}: exists and is not an empty directory")
    found = {label: find_checkout(label, path) for label, path in zip(SIDES, (a.a, a.b))}
    backends = choose_backends(found, [n for n in a.backends.split(",") if n] if a.backends else [])
    if not backends:
        raise BadInput("no backend registered in both checkouts")
    checkouts, said = {}, []
    for label, side in found.items():
        side = Checkout(side.label, side.root, side.python, side.commit, side.env, check_job(side, a.job, sets))
        checkouts[label], lines = with_launch_env(side)
        said += [f"{label}: {ln}" for ln in lines]
    configs = [Config(b, n) for n in workers for b in backends]  # scripts/demo.sh's order
    job_args = ["--job", a.job, *(x for s in sets for x in ("--set", s))]
    if a.dry_run:
        return Plan(checkouts, configs, a.rounds, job_args, out or Path("(none: --dry-run)"), said)
    if out is None:
        out = Path(tempfile.mkdtemp(prefix="twinbench-ab-"))
    (out / "logs").mkdir(parents=True, exist_ok=True)
    return Plan(checkouts, configs, a.rounds, job_args, out, said)


# -- the command ------------------------------------------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a", metavar="A", help="the first checkout (before the change)")
    p.add_argument("b", metavar="B", help="the second checkout (after the change)")
    p.add_argument("--job", default="jobs/demo.toml", help="job file, relative to each checkout (default: the demo's)")
    p.add_argument("--backends", default="", help="comma-separated (default: every one both checkouts register)")
    p.add_argument("--workers", default="1,2", help="comma-separated worker counts (default 1,2)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of every configuration in A and B (default 3)")
    demo = " ".join(f"{k}={v}" for k, v in DEMO_SETS.items())
    p.add_argument("--set", action="append", default=[], dest="sets",
                   help=f"job override key=value, applied after the demo's {demo}")
    p.add_argument("--out", help="results and logs, an empty or new directory (default: a new one under /tmp)")
    p.add_argument("--dry-run", action="store_true",
                   help="check the input and print the plan and the run order, run nothing")
    return p


def _refuse(message: str) -> NoReturn:
    print(f"{PROG}: {message}", file=sys.stderr)
    sys.exit(2)


def header(plan: Plan) -> list[str]:
    lines = [f"{s.label} = {s.root} (commit {s.commit or 'unknown'}, {s.python}, job hash {s.job_hash})"
             for s in plan.checkouts.values()]
    lines.append(f"job: {' '.join(plan.job_args)}; {', '.join(map(str, plan.configs))}; {plan.rounds} round(s), "
                 f"{2 * len(plan.configs) * plan.rounds} runs one at a time; results and logs in {plan.out}")
    return lines + plan.said


def main(argv: list[str] | None = None, run: Run | None = None) -> int:
    p = parser()
    p.error = _refuse  # type: ignore[method-assign]  # bad input is one line, not usage and a line
    a = p.parse_args(argv)
    try:
        plan = prepare(a)
    except BadInput as e:
        _refuse(str(e))
    t0 = time.monotonic()
    for line in header(plan):
        print(line, flush=True)
    if a.dry_run:
        for r, cfg, side in schedule(plan.configs, plan.rounds):
            print(f"round {r + 1}/{plan.rounds} {cfg} {side}")
        return 0
    results = execute(plan.checkouts, plan.configs, plan.rounds, run or real_run(plan.job_args, plan.out),
                      say=lambda s: print(s, flush=True))
    print()
    for line in summarize(results):
        print(line)
    hashes = job_hashes(results)
    if hashes["A"] != hashes["B"]:
        print(f"note: the records' job hashes differ: A {sorted(hashes['A'])}, B {sorted(hashes['B'])}")
    failed = sum(1 for rounds in results.values() for r in rounds for side in SIDES if side not in r)
    print(f"{2 * len(plan.configs) * plan.rounds - failed} runs finished, {failed} failed, in "
          f"{time.monotonic() - t0:.0f} s; records in {plan.out}/A and {plan.out}/B")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
