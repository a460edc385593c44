"""``python -m common.check --job FILE.toml``: does YOUR job compute the same math on every backend and world size?

Runs the job for a few steps (``--steps``, default 20) on each backend at 1 and 2 local workers (CPU), in Keras
``fit`` and in the custom loop: 8 runs by default, one at a time, each through its backend's own local launcher
(``registry.load(kind).local_command``). The 2-worker runs use the job's per-replica batch b, the 1-worker runs 2b
(``--set per_replica_batch_size=2b``, and with ``lr_scaling = "linear"`` the LR that 2 workers get): the same global
batch and LR, so the same math. A job with ``warmup_epochs`` ramps its LR from LR / workers (Horovod's rule): 1 and 2
workers cannot agree, so that pair is left out with a note. Then it compares, pair by pair:

- each backend against the first one (registry order) at the same workers and mode;
- 1 worker x 2b against 2 workers x b, per backend and mode;
- fit against the custom loop, per backend and workers;

on the per-step losses (largest relative difference; they must agree to ``RTOL``), the final trainable weights
(``RunRecord.trainable_weights_fingerprint``: per variable sum and sum of squares, within ``RTOL`` of the
variable's L2 norm) and, when the job evaluates, the validation numbers of every evaluation (within ``RTOL``).
An input function's runs (the record's ``input.pipeline``) also compare each rank's fingerprint of its first batches
at equal workers ("saw different data"), warn when every rank of a run got the same ones (no sharding), and skip
1 worker x 2b against 2 workers x b: the function shards its own data, so the world size changes the batches. Every
pair left out is listed ("not compared: ..." and why).

Exit 0 when every pair agrees; 1 naming the first pair and step that differ (both values), or a run that failed
(with its stderr's tail); 5 (``EXIT_UNSHARDED``, named in its line) when the pairs agree but an input function gave
every rank of a run the same first batches: every worker trained on the same data, not a clean pass; 2, one line,
for bad input (a job key, an argument the user's function has no parameter for, a missing path:
common.workload.argcheck), before any run. This is how a user finds out that a model
does something rank-dependent (a per-rank seed, a data order that depends on the rank, a layer that reads the
rank) before publishing a comparison. ``--results DIR`` keeps the runs (default: a temporary directory, removed).
No TensorFlow in this process.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from common import launches
from common.cluster import container
from common.core import registry
from common.core.errors import UsageError, fail
from common.core.privacy import public
from common.core.results import EVALUATION_META, now_iso, write_atomic
from common.core.text import text_table
from common.report.migrate import CHECK_FILE, check_summary
from common.workload import argcheck
from common.workload.job import MODES, JobError, load_job

PROG = "common.check"
REPO = Path(__file__).resolve().parent.parent
RTOL = 1e-5  # the parity tests' tolerance (float32 reductions in another order); in practice bit for bit
DEFAULT_STEPS = 20
RUN_TIMEOUT = 900.0  # seconds for one run
TAIL_LINES = 25  # lines of a failed run's stderr shown
EXIT_UNSHARDED = 5  # every pair agrees, but an input function gave every rank of a run the same first batches


class RunKey(NamedTuple):
    backend: str
    mode: str
    workers: int

    def text(self) -> str:
        return f"{self.backend} {self.mode} {self.workers} worker{'s' if self.workers != 1 else ''}"


@dataclass(frozen=True)
class Row:
    """One compared pair: what differs first (None: nothing), and the largest per-step loss difference."""

    pair: str
    a: RunKey
    b: RunKey
    steps: int
    max_rel: float | None  # largest relative per-step loss difference (None: the step counts differ)
    loss_diff: str | None  # the first differing step, "step N: x vs y"
    weights: bool | None  # final trainable weights agree (None: not recorded)
    weights_diff: str | None
    validation: bool | None  # every evaluation agrees (None: neither run evaluated)
    validation_diff: str | None
    data_diff: str | None = None  # an input function's first batches differ between the two runs' ranks

    @property
    def ok(self) -> bool:
        return self.loss_diff is None and self.weights is not False and self.validation is not False \
            and self.data_diff is None

    def first_problem(self) -> str | None:
        if self.data_diff:  # first: it explains every other difference
            who = "the two backends" if self.a.backend != self.b.backend else "the two runs"
            return f"{self.pair}: {who} saw different data, {self.data_diff}"
        for what, diff in (("loss", self.loss_diff), ("final weights", self.weights_diff),
                           ("validation", self.validation_diff)):
            if diff:
                return f"{self.pair}: {what} differs, {diff}"
        return None


# -- the comparison (pure: records in, rows out) -------------------------------------------------------------------
def rel_diff(x: float, y: float) -> float:
    return abs(x - y) / max(abs(x), abs(y), 1e-12)


def compare_losses(a: Sequence[float], b: Sequence[float], rtol: float = RTOL) -> tuple[float | None, str | None]:
    """(largest relative difference, the first step beyond ``rtol`` as "step N: a vs b" or None)."""
    if len(a) != len(b):
        return None, f"{len(a)} vs {len(b)} steps"
    diffs = [rel_diff(x, y) for x, y in zip(a, b)]
    first = next((i for i, d in enumerate(diffs) if not d <= rtol), None)  # a NaN differs
    msg = None if first is None else f"step {first + 1}: {a[first]!r} vs {b[first]!r}"
    return (max(diffs) if diffs else 0.0), msg


def compare_weights(a: Any, b: Any, rtol: float = RTOL) -> tuple[bool | None, str | None]:
    """Fingerprints ([sum, sum of squares] per variable): a sum within ``rtol`` x the variable's L2 norm (a sum of
    many values may cancel to about 0), a sum of squares within ``rtol`` relative."""
    if not isinstance(a, list) or not isinstance(b, list):
        return None, None
    if len(a) != len(b):
        return False, f"{len(a)} vs {len(b)} trainable variables"
    for i, ((sa, qa), (sb, qb)) in enumerate(zip(a, b)):
        norm = math.sqrt(max(qa, qb, 0.0))
        if not abs(sa - sb) <= rtol * max(abs(sa), abs(sb), norm, 1e-12):
            return False, f"variable {i} sum {sa!r} vs {sb!r}"
        if not rel_diff(qa, qb) <= rtol:
            return False, f"variable {i} sum of squares {qa!r} vs {qb!r}"
    return True, None


def compare_evaluations(a: Any, b: Any, rtol: float = RTOL) -> tuple[bool | None, str | None]:
    """Every evaluation's step and numbers (loss, metrics) within ``rtol``; None when neither run evaluated."""
    a, b = a or [], b or []
    if not a and not b:
        return None, None
    if len(a) != len(b):
        return False, f"{len(a)} vs {len(b)} evaluations"
    for ea, eb in zip(a, b):
        if ea.get("step") != eb.get("step"):
            return False, f"evaluated after step {ea.get('step')} vs {eb.get('step')}"
        for k in sorted(set(ea) | set(eb)):
            if k in EVALUATION_META:  # times differ; the step is compared on its own
                continue
            va, vb = ea.get(k), eb.get(k)
            if not isinstance(va, int | float) or not isinstance(vb, int | float) or not rel_diff(va, vb) <= rtol:
                return False, f"step {ea.get('step')} {k}: {va!r} vs {vb!r}"
    return True, None


def fingerprints(record: Mapping[str, Any]) -> list[str] | None:
    """Each rank's fingerprint of its first batches (an input function's runs: ``input.pipeline``), else None."""
    pipeline = (record.get("input") or {}).get("pipeline")
    return [r["fingerprint"] for r in pipeline["per_rank"]] if pipeline else None


def compare_data(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    """The first rank whose first batches differ between two runs at equal workers ("rank R: x vs y"), or None."""
    fa, fb = fingerprints(a), fingerprints(b)
    if fa is None or fb is None:
        return None
    return next((f"rank {r}: first batches {x} vs {y}" for r, (x, y) in enumerate(zip(fa, fb)) if x != y), None)


def same_batch_warnings(records: Mapping[RunKey, Mapping[str, Any]]) -> list[str]:
    """A warning per run whose ranks all got the same first batches: an input function that does not shard."""
    return [f"[check] warning: {key.text()}: every rank got the same first batches: does the input function shard "
            "by input_context.input_pipeline_id?" for key in unsharded(records)]


def pairs(keys: Sequence[RunKey]) -> list[tuple[str, RunKey, RunKey]]:
    """(label, a, b) of every comparison the runs in ``keys`` allow, in the order the table shows them."""
    have = set(keys)
    kinds = list(dict.fromkeys(k.backend for k in keys))
    modes = list(dict.fromkeys(k.mode for k in keys))
    workers = sorted({k.workers for k in keys})
    out = []
    for m in modes:
        for w in workers:
            for other in kinds[1:]:
                a, b = RunKey(kinds[0], m, w), RunKey(other, m, w)
                if a in have and b in have:
                    out.append((f"{kinds[0]} vs {other}, {m}, {w} worker{'s' if w != 1 else ''}", a, b))
    for kind in kinds:
        for m in modes:
            a, b = RunKey(kind, m, 1), RunKey(kind, m, 2)
            if a in have and b in have:
                out.append((f"{kind} {m}: 1 worker x 2b vs 2 workers x b", a, b))
    for kind in kinds:
        for w in workers:
            a, b = RunKey(kind, "fit", w), RunKey(kind, "ctl", w)
            if a in have and b in have:
                out.append((f"{kind} {w} worker{'s' if w != 1 else ''}: fit vs ctl", a, b))
    return out


def skip_reason(ka: RunKey, kb: RunKey, records: Mapping[RunKey, Mapping[str, Any]], across_sizes: bool = True,
                note: str = "") -> str | None:
    """Why the pair (ka, kb) is not compared, or None: an input function's runs at two world sizes (it shards its
    own data: another world size, other batches; docs/jobs.md), or ``across_sizes`` False (``note`` says why)."""
    if ka.workers == kb.workers:
        return None
    if fingerprints(records[ka]) or fingerprints(records[kb]):
        return "an input function shards its own data, so 2 workers read other batches than 1"
    return None if across_sizes else note or "left out"


def skipped(records: Mapping[RunKey, Mapping[str, Any]], *, across_sizes: bool = True, note: str = "") -> list[str]:
    """A line per pair the runs allow that ``compare`` leaves out, naming it and why."""
    return [f"[check] not compared: {ka.backend} {ka.mode}, 1 worker vs 2 workers: {why}"
            for _, ka, kb in pairs(list(records)) if (why := skip_reason(ka, kb, records, across_sizes, note))]


def unsharded(records: Mapping[RunKey, Mapping[str, Any]]) -> list[RunKey]:
    """The runs whose ranks all got the same first batches: an input function that does not shard."""
    return [k for k, r in records.items() if (f := fingerprints(r)) and len(f) > 1 and len(set(f)) == 1]


def compare(records: Mapping[RunKey, Mapping[str, Any]], rtol: float = RTOL, *,
            across_sizes: bool = True) -> list[Row]:
    """One Row per pair the records allow (``pairs``) but those ``skip_reason`` leaves out; ``across_sizes``
    False leaves out 1 worker vs 2 workers."""
    rows = []
    for label, ka, kb in pairs(list(records)):
        a, b = records[ka], records[kb]
        if skip_reason(ka, kb, records, across_sizes):
            continue
        max_rel, loss_diff = compare_losses(a.get("step_losses") or [], b.get("step_losses") or [], rtol)
        weights, weights_diff = compare_weights(a.get("trainable_weights_fingerprint"),
                                                b.get("trainable_weights_fingerprint"), rtol)
        val, val_diff = compare_evaluations(a.get("evaluations"), b.get("evaluations"), rtol)
        rows.append(Row(label, ka, kb, len(a.get("step_losses") or []), max_rel, loss_diff, weights, weights_diff,
                        val, val_diff, compare_data(a, b) if ka.workers == kb.workers else None))
    return rows


def format_table(rows: Sequence[Row]) -> str:
    """The table the command prints (plain text, one pair a line)."""
    def yes(v: bool | None) -> str:
        return "n/a" if v is None else "agree" if v else "DIFFER"

    header = ("pair", "steps", "max rel loss diff", "final weights", "validation", "verdict")
    body = [(r.pair, str(r.steps), "n/a" if r.max_rel is None else f"{r.max_rel:.1e}", yes(r.weights),
             yes(r.validation), "ok" if r.ok else "DIFFERS") for r in rows]
    return "\n".join(text_table([header, *body], rule=True))


def verdict(rows: Sequence[Row], same_data: Sequence[RunKey] = (), not_compared: int = 0) -> tuple[int, str]:
    """(exit status, the line that says it): 1 on the first pair that differs; else EXIT_UNSHARDED when runs in
    ``same_data`` gave every rank the same first batches (each worker trained on the same data: not a data-parallel
    job, whatever the pairs say); else 0, saying how many pairs were ``not_compared``."""
    for r in rows:
        problem = r.first_problem()
        if problem:
            return 1, f"DIFFERS: {problem} (tolerance {RTOL:g})"
    if same_data:
        return EXIT_UNSHARDED, (f"NOT CLEAN (exit {EXIT_UNSHARDED}): every rank got the same first batches in "
                                f"{', '.join(k.text() for k in same_data)}: the input function does not shard by "
                                "input_context.input_pipeline_id, so every worker trained on the same data (the "
                                f"{len(rows)} pairs agree, but not as a data-parallel job)")
    left = f"; {not_compared} not compared (listed above)" if not_compared else ""
    agree = f"all {len(rows)} pairs agree" if len(rows) != 1 else "the 1 pair agrees"
    return 0, f"{agree} to {RTOL:g}{left}"


# -- the runs -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    job: str  # absolute path of the job file
    sets: tuple[str, ...]  # the user's --set overrides, then steps
    batch: int  # the job's per-replica batch b (2 workers); 1 worker runs 2b
    keys: tuple[RunKey, ...]
    # lr_scaling = "linear" gives 2 workers twice the job's LR: the 1-worker runs are given it explicitly (None: as is)
    one_worker_lr: float | None = None
    # why 1 worker x 2b cannot equal 2 workers x b for this job (the pair is not compared), or ""
    world_size_note: str = ""


def _csv(text: str, allowed: Sequence[str], what: str) -> list[str]:
    items = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in items if s not in allowed]
    if bad or not items:
        fail(PROG, f"--{what} {text!r}: use a comma-separated list of {', '.join(allowed)}")
    return list(dict.fromkeys(items))


def parser() -> argparse.ArgumentParser:
    from common.cli import OneLineParser

    p = OneLineParser(prog=PROG, description="Run a job on every backend at 1 and 2 local workers (CPU), fit and "
                                             "custom loop, and check that they compute the same math.")
    p.add_argument("--job", required=True, help="the job TOML file to check")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a job key in every run (repeatable)")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help=f"steps per run (default {DEFAULT_STEPS})")
    p.add_argument("--modes", default=None, help="fit,ctl (default both; ctl alone for a keras = 3 job)")
    p.add_argument("--backends", default=",".join(registry.names()),
                   help=f"which backends (default all: {','.join(registry.names())})")
    p.add_argument("--results", default=None, metavar="DIR",
                   help="keep the runs' results in DIR (default: a temporary directory, removed at the end)")
    p.add_argument("--timeout", type=float, default=RUN_TIMEOUT, help=f"seconds per run (default {RUN_TIMEOUT:g})")
    return p


def make_plan(args: argparse.Namespace) -> Plan:
    """Everything checked before any run: bad input is one line and exit 2 (as common.cli.prepare)."""
    from common.workload import data as data_mod

    if args.steps < 1:
        fail(PROG, f"--steps must be >= 1, got {args.steps}")
    if not args.timeout > 0:
        fail(PROG, f"--timeout must be > 0 seconds, got {args.timeout}")
    kinds = _csv(args.backends, registry.names(), "backends")
    sets = (*args.sets, f"steps={args.steps}")
    try:
        job = load_job(args.job, sets)
        argcheck.refuse(job, REPO)  # every run starts in the repository
        # Keras 3 runs the custom loop only (common.workload.job): its check compares what can run
        modes = _csv(args.modes or ("ctl" if job.keras == 3 else ",".join(MODES)), MODES, "modes")
        if job.keras == 3 and "fit" in modes:
            raise JobError(f"--modes {args.modes}: a keras = 3 job runs the custom loop only: use --modes ctl")
        if not data_mod.streams(job):  # an input function is called only in the ranks
            n, _, _ = data_mod.dataset_info(job)
            job.resolve_steps(n, 2)  # the 2-worker runs' global batch must fit in the data
        if job.steps_per_execution > 1 and "ctl" in modes:
            raise JobError(f"steps_per_execution = {job.steps_per_execution} applies to fit only: check with "
                           "--modes fit, or set steps_per_execution = 1")
        if args.results:
            from common.core import results as res

            res.check_results_dir(args.results)
    except (JobError, data_mod.DataError, OSError) as e:
        fail(PROG, str(e))
    keys = tuple(RunKey(k, m, w) for m in modes for w in (1, 2) for k in kinds)
    # Horovod's warm-up rule (common/training/objective.py) ramps from lr / workers: 1 worker starts at the full LR
    note = f"warmup_epochs = {job.warmup_epochs} ramps the LR from its value / workers, so 1 worker starts at " \
           "another LR than 2" if job.warmup_epochs else ""
    return Plan(str(Path(args.job).resolve()), sets, job.per_replica_batch_size, keys,
                job.scaled_learning_rate(2) if job.lr_scaling == "linear" else None, note)


def run_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)  # the local launchers make their own
    env["TF_USE_LEGACY_KERAS"] = "1"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def run_one(plan: Plan, key: RunKey, out: Path, timeout: float) -> tuple[dict[str, Any] | None, str]:
    """Run one configuration into ``out``; (its record, "") or (None, why it failed with the stderr's tail)."""
    batch = plan.batch * 2 if key.workers == 1 else plan.batch
    overrides = [*plan.sets, f"mode={key.mode}", f"per_replica_batch_size={batch}"]
    if key.workers == 1 and plan.one_worker_lr is not None:
        overrides.append(f"learning_rate={plan.one_worker_lr!r}")  # what lr_scaling = "linear" gives 2 workers
    sets = [a for s in overrides for a in ("--set", s)]
    args = ["--job", plan.job, "--results", str(out), "--quiet", *sets]
    box = container.parse()  # checked by main before any run (bad input: exit 2)
    cmd = registry.load(key.backend).local_command(key.workers, args, python=box.python if box else sys.executable)
    cmd = container.wrap(cmd, box) if box else cmd
    before = set(out.glob("*.json")) if out.is_dir() else set()
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=run_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"{key.text()} did not finish in {timeout:g} s: {' '.join(cmd)}"
    new = sorted(set(out.glob("*.json")) - before, key=lambda p: p.stat().st_mtime)
    if proc.returncode != 0 or not new:
        tail = "\n".join((proc.stderr or proc.stdout).splitlines()[-TAIL_LINES:])
        return None, f"{key.text()} failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}"
    return json.loads(new[-1].read_text()), ""


def run_all(plan: Plan, root: Path, timeout: float) -> dict[RunKey, dict[str, Any]]:
    """Every run, one at a time; exits 1 at the first that fails."""
    records = {}
    for i, key in enumerate(plan.keys, 1):
        t = time.monotonic()
        print(f"[check] run {i}/{len(plan.keys)}: {key.text()} ...", end=" ", flush=True)
        rec, why = run_one(plan, key, root / f"{key.backend}-{key.mode}-n{key.workers}", timeout)
        if rec is None:
            print("FAILED", flush=True)
            print(f"{PROG}: {why}", file=sys.stderr)
            raise SystemExit(1)
        print(f"{time.monotonic() - t:.1f} s", flush=True)
        records[key] = rec
    return records


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    plan = make_plan(args)
    try:
        box = container.parse()  # the site's container (TWINBENCH_CONTAINER): every run of the check inside its image
        env, said = launches.resolve(sorted({k.backend for k in plan.keys}), box.python if box else sys.executable)
    except (container.ContainerError, UsageError) as e:
        fail(PROG, str(e))
    print("\n".join(f"[check] {line}" for line in said), flush=True)
    root = Path(args.results) if args.results else Path(tempfile.mkdtemp(prefix="twinbench-check-"))
    try:
        with launches.exported(env):
            records = run_all(plan, root, args.timeout)
    finally:
        if not args.results:
            shutil.rmtree(root, ignore_errors=True)
    across = not plan.world_size_note
    rows = compare(records, across_sizes=across)
    left_out = skipped(records, across_sizes=across, note=plan.world_size_note)
    print("\n".join([*same_batch_warnings(records), *left_out, format_table(rows)]))
    status, line = verdict(rows, unsharded(records), len(left_out))
    print(line, file=sys.stderr if status else sys.stdout)
    if args.results:
        write_summary(plan, root, status, line)
        print(f"[check] runs kept in {root}, the verdict in {root / CHECK_FILE}")
    return status


def write_summary(plan: Plan, root: Path, status: int, line: str) -> Path:
    """``ROOT/check.json``: the job as the user gave it (their --set, not the check's own steps), its hash and the
    verdict, which the report's "leave Horovod" section reads (common/report/migrate.py): a check kept in a
    subdirectory of a results directory is found there, while its runs, a level deeper, are not taken as benchmarks."""
    job = load_job(plan.job, list(plan.sets[:-1]))
    summary = check_summary(public(job.to_dict()), job.job_hash, status, line, RTOL, now_iso())
    return write_atomic(root / CHECK_FILE, json.dumps(summary, indent=1))


if __name__ == "__main__":
    sys.exit(main())
