"""Scaling report: turn a directory of twinbench results JSONs into a native-vs-Horovod comparison.

    python -m common.report RESULTS_DIR [--out DIR] [--job-hash HASH | --job FILE [--set K=V ...] | --compare H1 H2]
                            [--no-plots] [--quiet]

Runs are grouped by ``job_hash`` and runs of different jobs are never compared with each other: a directory
holding several jobs gives one section per job, and asking to compare two different jobs is refused (exit 2)
with the job fields that differ. Writes ``report.md``, ``report.csv`` and two PNGs per job
(``throughput_<hash>.png``, ``efficiency_<hash>.png``) atomically into ``--out`` (default RESULTS_DIR/report).

API: ``load_runs`` -> ``summarize`` -> ``format_table`` / ``format_markdown``; ``write_report`` does it all.
This module never imports TensorFlow (reports run on laptops and login nodes); matplotlib is imported only
to draw the plots, through its Agg canvas (no pyplot, so no global backend is changed).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import re
import shlex
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.results import write_atomic

SCHEMA = 1  # the results-JSON schema this report understands (common.results.SCHEMA)
BACKEND_ORDER = ("native", "horovod")  # table order; the ratio is horovod / native
RATIO_NUM, RATIO_DEN = "horovod", "native"  # numerator and denominator of the throughput ratio
NA = "n/a"  # shown for every value that cannot be computed
NO_INTERVAL = "n=1, no interval"  # shown instead of an interval for a single repeat
INTERVAL_METHOD = (
    "95% interval = Student-t confidence interval of the mean images/s over repeats: "
    "mean ± t(0.975, n−1) · s / √n with s the sample standard deviation (t quantiles tabulated, df > 30 by "
    "Cornish-Fisher expansion); the centre column is the median, and a single repeat has no interval"
)
DEFINITIONS = (
    "speedup = median images/s at N replicas / median images/s at 1 replica of the same backend; "
    "efficiency = throughput(N) / (N × throughput(1)); horovod/native = ratio of the two backends' median "
    "images/s at the same world size; step times (p50, p95 over each run's timed steps) and time to first step "
    "are medians over repeats; final loss = median over repeats of the last step's loss"
)
REQUIRED: dict[str, tuple[type, ...]] = {  # fields a run must have to be placed and scored (others optional)
    "schema": (int,),
    "kind": (str,),
    "backend": (str,),
    "world_size": (int,),
    "num_workers": (int,),
    "job_hash": (str,),
    "job": (dict,),
    "images_per_sec": (int, float),
    "step_time": (dict,),
    "time_to_first_step": (int, float),
}
KEY_JOB_FIELDS = ("model", "dataset", "per_replica_batch_size", "steps", "epochs", "optimizer", "learning_rate",
                  "lr_scaling", "mode", "mixed_precision", "xla", "seed")  # shown in each job's header
_HASH_RE = re.compile(r"[0-9a-f]{16}")
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_COLORS = {"native": "tab:blue", "horovod": "tab:orange"}  # other backends take matplotlib's cycle

# Two-sided 95% Student-t quantiles t(0.975, df) for df = 1..30 (scipy.stats.t.ppf(0.975, df)).
_T975 = (
    12.706204736174694, 4.302652729749462, 3.1824463052837078, 2.7764451051977934, 2.5705818356363146,
    2.4469118511449786, 2.364624251592784, 2.306004135204166, 2.262157162798205, 2.228138851986274,
    2.200985160091639, 2.1788128296672284, 2.1603686564627913, 2.144786687917804, 2.131449545559776,
    2.1199052992212546, 2.1098155778333156, 2.1009220402410382, 2.0930240544083087, 2.085963447265864,
    2.0796138447276795, 2.0738730679040254, 2.0686576104190486, 2.0638985616280245, 2.0595385527532972,
    2.0555294386428735, 2.0518305164802846, 2.0484071417952454, 2.045229642132703, 2.0422724563012378,
)
_Z975 = 1.959963984540054  # standard normal 0.975 quantile


class ReportError(Exception):
    """Bad input or a refused comparison; the message is one line meant for the user (CLI exit status 2)."""


def _warn(msg: str) -> None:
    print(f"report: warning: {msg}", file=sys.stderr)


# ----------------------------------------------------------------------------------------------------------
# statistics
# ----------------------------------------------------------------------------------------------------------
def t_quantile_975(df: int) -> float:
    """t(0.975, df): tabulated for df <= 30, Cornish-Fisher expansion beyond (error < 3e-8)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


def mean_ci95(values: Sequence[float]) -> tuple[float, float] | None:
    """Student-t 95% confidence interval of the mean; None for fewer than two values."""
    n = len(values)
    if n < 2:
        return None
    m = statistics.fmean(values)
    half = t_quantile_975(n - 1) * statistics.stdev(values) / math.sqrt(n)
    return m - half, m + half


def _median(values: Iterable[float | None]) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _num(value: Any) -> float | None:
    """A JSON number as float, else None (bools are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


# ----------------------------------------------------------------------------------------------------------
# loading
# ----------------------------------------------------------------------------------------------------------
def recompute_job_hash(job: Mapping[str, Any]) -> str:
    """The hash ``common.job.Job.job_hash`` gives this ``job`` dict (one definition: common.job's)."""
    from common.job import JobError, job_from_dict

    try:
        return job_from_dict(dict(job)).job_hash
    except (JobError, TypeError):
        return "invalid-job"


def result_files(results_dir: str | os.PathLike[str]) -> list[Path]:
    """``*.json`` in the directory and its direct subdirectories, minus hidden and ``.tmp`` (in-progress) files."""
    root = Path(results_dir)

    def visible(p: Path) -> bool:
        rel = p.relative_to(root).parts
        return not any(part.startswith(".") for part in rel) and not p.name.endswith(".tmp") and p.is_file()

    found = list(root.glob("*.json")) + list(root.glob("*/*.json"))
    return sorted(p for p in found if visible(p))


def _check_run(d: Any) -> str | None:
    """Why this parsed JSON is not a usable training result, or None if it is."""
    if not isinstance(d, dict):
        return f"top level is a JSON {type(d).__name__}, not an object"
    for key, types in REQUIRED.items():
        if key not in d:
            return f"missing field {key!r}"
        v = d[key]
        if isinstance(v, bool) or not isinstance(v, types):
            return f"field {key!r} has the wrong type ({type(v).__name__})"
    if d["schema"] != SCHEMA:
        return f"schema {d['schema']} is not supported (this report reads schema {SCHEMA})"
    if d["kind"] != "train":
        return f"kind {d['kind']!r} is not a training result"
    if not d["backend"]:
        return "empty 'backend'"
    if d["world_size"] < 1 or d["num_workers"] < 1:
        return f"world_size {d['world_size']} / num_workers {d['num_workers']} must be >= 1"
    if not _HASH_RE.fullmatch(d["job_hash"]):
        return f"job_hash {d['job_hash']!r} is not 16 lowercase hex digits"
    ips = float(d["images_per_sec"])
    if not (math.isfinite(ips) and ips > 0):
        return f"images_per_sec {d['images_per_sec']!r} is not a positive number"
    for k in ("median", "p95"):
        v = _num(d["step_time"].get(k))
        if v is None or not math.isfinite(v) or v < 0:
            return f"step_time.{k} {d['step_time'].get(k)!r} is not a non-negative number"
    ttfs = float(d["time_to_first_step"])
    if not math.isfinite(ttfs) or ttfs < 0:
        return f"time_to_first_step {d['time_to_first_step']!r} is not a non-negative number"
    return None


OTHER_KINDS = ("sweep", "allreduce")  # JSONs that live in results dirs but are not training runs


def load_runs(results_dir: str | os.PathLike[str], *, warn: Callable[[str], None] = _warn) -> list[dict[str, Any]]:
    """Parse every complete results JSON under ``results_dir`` (and one level of subdirectories).

    Unreadable, unparsable or incomplete files are skipped with a one-line warning naming the file; a file
    repeating an already loaded ``run_id`` (a copy) is skipped too. Each returned dict is the JSON object plus
    ``_path`` (the file it came from). Raises ReportError if ``results_dir`` is not a directory.
    """
    root = Path(results_dir)
    if not root.exists():
        raise ReportError(f"results directory {str(root)!r} does not exist")
    if not root.is_dir():
        raise ReportError(f"{str(root)!r} is not a directory; pass the directory holding the results JSONs")
    runs: list[dict[str, Any]] = []
    seen: dict[str, Path] = {}
    for path in result_files(root):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as e:
            warn(f"skipping {path}: cannot read it ({e})")
            continue
        except json.JSONDecodeError as e:
            warn(f"skipping {path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})")
            continue
        if isinstance(data, dict) and data.get("kind") in OTHER_KINDS:
            continue  # not a training run: sweep manifests, allreduce benchmarks (reported separately)
        problem = _check_run(data)
        if problem:
            warn(f"skipping {path}: {problem}")
            continue
        run_id = data.get("run_id")
        if isinstance(run_id, str) and run_id:
            if run_id in seen:
                warn(f"skipping {path}: same run_id {run_id!r} as {seen[run_id]} (a copy)")
                continue
            seen[run_id] = path
        expected = recompute_job_hash(data["job"])
        if expected != data["job_hash"]:
            warn(f"{path}: job_hash {data['job_hash']} does not match its job fields (they hash to {expected}); "
                 "grouped by the recorded job_hash")
        data["_path"] = str(path)
        runs.append(data)
    return runs


# ----------------------------------------------------------------------------------------------------------
# summary
# ----------------------------------------------------------------------------------------------------------
@dataclass
class Row:
    """One backend x world size (x worker count) cell of a job's scaling table; None means n/a."""

    backend: str
    world_size: int  # replicas
    num_workers: int  # processes
    repeats: int
    ips: list[float]  # images/s of every repeat
    ips_median: float
    ips_mean: float
    ips_stdev: float | None  # None for n = 1
    ips_ci95: tuple[float, float] | None  # None for n = 1
    global_batch_size: int | None
    step_p50: float | None  # seconds
    step_p95: float | None  # seconds
    step_mean: float | None  # seconds
    time_to_first_step: float | None  # seconds
    timed_wall_time: float | None  # seconds
    final_loss: float | None
    speedup: float | None = None
    efficiency: float | None = None
    ratio: float | None = None  # horovod/native at this world size, on both backends' rows
    files: list[str] = field(default_factory=list)


@dataclass
class RatioRow:
    """horovod/native median throughput at one world size."""

    world_size: int
    den_workers: int | None  # native worker count (None: no native run here)
    num_workers: int | None  # horovod worker count
    den_ips: float | None
    num_ips: float | None
    ratio: float | None


@dataclass
class JobSummary:
    """Everything the report shows about one job (one job_hash); runs of other jobs never enter it."""

    job_hash: str
    name: str
    job: dict[str, Any]
    rows: list[Row]
    ratios: list[RatioRow]
    notes: list[str]
    runs: list[dict[str, Any]]

    @property
    def backends(self) -> list[str]:
        return _order_backends({r.backend for r in self.rows})


def _order_backends(names: Iterable[str]) -> list[str]:
    names = set(names)
    return [b for b in BACKEND_ORDER if b in names] + sorted(names - set(BACKEND_ORDER))


def _final_loss(run: Mapping[str, Any]) -> float | None:
    losses = run.get("step_losses")
    if isinstance(losses, list) and losses:
        return _num(losses[-1])
    return None


def _make_row(backend: str, ws: int, nw: int, runs: list[dict[str, Any]]) -> Row:
    ips = [float(r["images_per_sec"]) for r in runs]
    gbs = Counter(r.get("global_batch_size") for r in runs if isinstance(r.get("global_batch_size"), int))
    return Row(
        backend=backend,
        world_size=ws,
        num_workers=nw,
        repeats=len(runs),
        ips=ips,
        ips_median=statistics.median(ips),
        ips_mean=statistics.fmean(ips),
        ips_stdev=statistics.stdev(ips) if len(ips) > 1 else None,
        ips_ci95=mean_ci95(ips),
        global_batch_size=gbs.most_common(1)[0][0] if gbs else None,
        step_p50=_median(_num(r["step_time"].get("median")) for r in runs),
        step_p95=_median(_num(r["step_time"].get("p95")) for r in runs),
        step_mean=_median(_num(r["step_time"].get("mean")) for r in runs),
        time_to_first_step=_median(_num(r["time_to_first_step"]) for r in runs),
        timed_wall_time=_median(_num(r.get("timed_wall_time")) for r in runs),
        final_loss=_median(_final_loss(r) for r in runs),
        files=[r.get("_path", "?") for r in runs],
    )


def _summarize_job(job_hash: str, runs: list[dict[str, Any]]) -> JobSummary:
    names = Counter(str(r["job"].get("name", "unnamed")) for r in runs)
    name = names.most_common(1)[0][0]
    job = dict(next(r["job"] for r in runs if str(r["job"].get("name", "unnamed")) == name))
    notes: list[str] = []
    if len(names) > 1:
        notes.append(f"runs of this job carry different names ({', '.join(sorted(names))}); the name is a label "
                     "only, the job hash is identical")

    cells: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for r in runs:
        cells.setdefault((r["backend"], r["world_size"], r["num_workers"]), []).append(r)
    order = {b: i for i, b in enumerate(_order_backends(k[0] for k in cells))}
    rows = [_make_row(b, ws, nw, rs) for (b, ws, nw), rs in sorted(cells.items(),
                                                                   key=lambda kv: (order[kv[0][0]], kv[0][1:]))]
    backends = _order_backends(r.backend for r in rows)

    # speedup and efficiency against the same backend's 1-replica median
    for b in backends:
        base = next((r for r in rows if r.backend == b and r.world_size == 1), None)
        if base is None:
            sizes = ", ".join(str(r.world_size) for r in rows if r.backend == b)
            notes.append(f"{b}: no 1-replica run (only world size {sizes}), so its speedup and efficiency are "
                         f"{NA}; run {b} at world size 1 to get the baseline")
            continue
        for r in rows:
            if r.backend == b:
                r.speedup = r.ips_median / base.ips_median
                r.efficiency = r.ips_median / (r.world_size * base.ips_median)

    # horovod/native ratio per world size
    ratios: list[RatioRow] = []
    missing = [b for b in (RATIO_DEN, RATIO_NUM) if b not in backends]
    if missing:
        present = ", ".join(backends) or "none"
        notes.append(f"no {' or '.join(missing)} runs for this job (backends present: {present}), so the "
                     f"{RATIO_NUM}/{RATIO_DEN} ratio is {NA}")
    lone_sizes: dict[str, list[int]] = {}  # backend -> world sizes only it ran (ratio n/a there)
    for ws in sorted({r.world_size for r in rows}):
        den = [r for r in rows if r.backend == RATIO_DEN and r.world_size == ws]
        num = [r for r in rows if r.backend == RATIO_NUM and r.world_size == ws]
        if len(den) <= 1 and len(num) <= 1:
            pairs = [(den[0] if den else None, num[0] if num else None)]
        else:  # several worker counts at one world size: pair equal worker counts only
            pairs = [(next((r for r in den if r.num_workers == nw), None),
                      next((r for r in num if r.num_workers == nw), None))
                     for nw in sorted({r.num_workers for r in den + num})]
        for d, n in pairs:
            if d is None and n is None:  # only other backends ran at this world size
                continue
            ratio = n.ips_median / d.ips_median if d and n else None
            ratios.append(RatioRow(ws, d.num_workers if d else None, n.num_workers if n else None,
                                   d.ips_median if d else None, n.ips_median if n else None, ratio))
            for r in (d, n):
                if r is not None:
                    r.ratio = ratio
            lone = d if n is None else n if d is None else None
            if not missing and lone is not None:
                lone_sizes.setdefault(lone.backend, []).append(ws)
            elif d and n and d.num_workers != n.num_workers:
                notes.append(f"at world size {ws} the backends ran different topologies ({RATIO_DEN}: "
                             f"{d.num_workers} worker(s), {RATIO_NUM}: {n.num_workers} worker(s)); the ratio "
                             "compares them as they ran")

    for b, sizes in lone_sizes.items():
        listed = ", ".join(str(x) for x in dict.fromkeys(sizes))
        notes.append(f"{RATIO_NUM}/{RATIO_DEN} ratio is {NA} at world size {listed}: only {b} ran there")
    if any(r.repeats == 1 for r in rows):
        notes.append(f"rows with a single repeat show \"{NO_INTERVAL}\"; repeat those runs to get an interval")
    per_replica = _num(job.get("per_replica_batch_size"))
    for r in runs:
        gb = r.get("global_batch_size")
        if per_replica and isinstance(gb, int) and gb != per_replica * r["world_size"]:
            where = r.get("_path", r.get("run_id", "?"))
            notes.append(f"{where}: global_batch_size {gb} is not per_replica_batch_size "
                         f"{int(per_replica)} x world_size {r['world_size']}")
    bad_weights = [r for r in runs if r.get("weights_consistent") is False]
    if bad_weights:
        notes.append(f"{len(bad_weights)} run(s) ended with different weights on different ranks "
                     "(weights_consistent = false): their replicas did not train in lockstep")
    differing = [k for k, vals in _versions_by_key(runs).items() if len(vals) > 1]
    if differing:
        notes.append(f"software versions differ across runs ({', '.join(differing)}): see Environment")
    return JobSummary(job_hash, name, job, rows, ratios, notes, runs)


def summarize(runs: Sequence[Mapping[str, Any]]) -> list[JobSummary]:
    """One JobSummary per job_hash (sorted by job name, then hash); runs of different jobs are never mixed."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault(r["job_hash"], []).append(dict(r))
    out = [_summarize_job(h, rs) for h, rs in groups.items()]
    return sorted(out, key=lambda s: (s.name, s.job_hash))


# ----------------------------------------------------------------------------------------------------------
# job selection and the refusal to compare different jobs
# ----------------------------------------------------------------------------------------------------------
_MISSING = object()  # marks a job field absent from one of two job dicts


def _fmt_value(v: Any) -> str:
    if v is _MISSING:
        return "(absent)"
    return v if isinstance(v, str) else json.dumps(v)


def job_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """``"field: a vs b"`` for every hashed job field that differs, in the Job's declared field order."""
    try:
        from common.job import FIELDS  # stdlib-only module: field order for a readable diff

        order = [k for k in FIELDS if k in a or k in b]
    except ImportError:  # report.py copied elsewhere without the rest of twinbench
        order = []
    keys = order + sorted((set(a) | set(b)) - set(order))
    return [f"{k}: {_fmt_value(a.get(k, _MISSING))} vs {_fmt_value(b.get(k, _MISSING))}"
            for k in keys if k != "name" and a.get(k, _MISSING) != b.get(k, _MISSING)]


def different_jobs_message(a: JobSummary, b: JobSummary) -> str:
    """The one-line refusal naming the job fields that differ between two jobs."""
    diff = job_diff(a.job, b.job) or [f"job fields identical but recorded hashes differ "
                                      f"({a.job_hash} vs {b.job_hash}): results written by different "
                                      "twinbench versions?"]
    return (f"runs belong to different jobs ({'; '.join(diff)}); compare one job at a time with "
            f"--job-hash {a.job_hash} or --job-hash {b.job_hash}")


def _jobs_present(summaries: Sequence[JobSummary]) -> str:
    return ", ".join(f"{s.job_hash} ({s.name}, {len(s.runs)} runs)" for s in summaries) or "none"


def _resolve(summaries: Sequence[JobSummary], wanted: str, where: str) -> JobSummary:
    key = wanted.strip().lower()
    exact = [s for s in summaries if s.job_hash == key]
    hits = exact or ([s for s in summaries if s.job_hash.startswith(key)] if key else [])
    if not hits:
        raise ReportError(f"no runs with job hash {wanted!r} in {where}; jobs present: {_jobs_present(summaries)}")
    if len(hits) > 1:
        raise ReportError(f"job hash prefix {wanted!r} matches {len(hits)} jobs in {where}: {_jobs_present(hits)}; "
                          "give more digits")
    return hits[0]


def select_jobs(summaries: Sequence[JobSummary], *, job_hash: str | None = None,
                compare: Sequence[str] | None = None, job: Mapping[str, Any] | None = None,
                where: str = "the results") -> list[JobSummary]:
    """The jobs to report: all of them (default), one by hash (a unique prefix is enough), the job of a
    ``Job.to_dict()``, or ``compare`` = two hashes, which must name the same job. ReportError otherwise."""
    if sum(x is not None for x in (job_hash, compare, job)) > 1:
        raise ReportError("use only one of --job-hash, --job and --compare")
    if job_hash is not None:
        return [_resolve(summaries, job_hash, where)]
    if compare is not None:
        if len(compare) != 2:
            raise ReportError(f"--compare takes two job hashes, got {len(compare)}")
        a, b = (_resolve(summaries, h, where) for h in compare)
        if a.job_hash != b.job_hash:
            raise ReportError(different_jobs_message(a, b))
        return [a]
    if job is not None:
        h = recompute_job_hash(job)
        hit = [s for s in summaries if s.job_hash == h]
        if hit:
            return hit
        label = job.get("name", "unnamed")
        if not summaries:
            raise ReportError(f"no runs of job {label!r} ({h}) in {where}")
        closest = min(summaries, key=lambda s: (len(job_diff(job, s.job)), s.job_hash))
        diff = "; ".join(job_diff(job, closest.job)) or "no field differs"
        raise ReportError(f"no runs of job {label!r} ({h}) in {where}: runs belong to different jobs (closest is "
                          f"{closest.job_hash} '{closest.name}': {diff}); compare one job at a time with "
                          f"--job-hash {closest.job_hash}")
    return list(summaries)


# ----------------------------------------------------------------------------------------------------------
# formatting
# ----------------------------------------------------------------------------------------------------------
def _f(x: float | None, fmt: str, scale: float = 1.0, suffix: str = "") -> str:
    if x is None:
        return NA
    if math.isnan(x):
        return "nan"
    return f"{x * scale:{fmt}}{suffix}"


def _ci_text(row: Row) -> str:
    if row.ips_ci95 is None:
        return NO_INTERVAL
    lo, hi = row.ips_ci95
    return f"[{lo:.1f}, {hi:.1f}]"


def _md_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _md_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_md_escape(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


TABLE_HEADER = ("backend", "replicas", "workers", "repeats", "img/s median", "img/s mean", "95% CI of mean",
                "speedup", "efficiency", "step p50 (ms)", "step p95 (ms)", "first step (s)", "final loss")


def format_table(summary: JobSummary) -> str:
    """The job's scaling table (one row per backend x world size) in Markdown."""
    body = [[r.backend, str(r.world_size), str(r.num_workers), str(r.repeats), _f(r.ips_median, ".1f"),
             _f(r.ips_mean, ".1f"), _ci_text(r), _f(r.speedup, ".2f", suffix="x"),
             _f(r.efficiency, ".1f", 100, "%"), _f(r.step_p50, ".2f", 1e3), _f(r.step_p95, ".2f", 1e3),
             _f(r.time_to_first_step, ".2f"), _f(r.final_loss, ".4f")] for r in summary.rows]
    return _md_table(TABLE_HEADER, body)


def format_ratio_table(summary: JobSummary) -> str:
    """horovod/native median throughput per world size in Markdown."""
    header = ("replicas", f"{RATIO_DEN} img/s", f"{RATIO_NUM} img/s", f"{RATIO_NUM}/{RATIO_DEN}",
              f"workers ({RATIO_DEN} / {RATIO_NUM})")
    body = [[str(q.world_size), _f(q.den_ips, ".1f"), _f(q.num_ips, ".1f"), _f(q.ratio, ".3f"),
             f"{q.den_workers if q.den_workers is not None else NA} / "
             f"{q.num_workers if q.num_workers is not None else NA}"] for q in summary.ratios]
    return _md_table(header, body)


def _versions_by_key(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, set[str]]]:
    """version key -> value -> backends that ran with it."""
    out: dict[str, dict[str, set[str]]] = {}
    for r in runs:
        vers = r.get("versions")
        if isinstance(vers, dict):
            for k, v in vers.items():
                out.setdefault(str(k), {}).setdefault(_fmt_value(v), set()).add(r["backend"])
    return out


def _distinct(values: Iterable[str], limit: int = 12) -> str:
    seen = list(dict.fromkeys(values))
    if not seen:
        return NA
    more = f", … and {len(seen) - limit} more" if len(seen) > limit else ""
    return ", ".join(f"`{v}`" for v in seen[:limit]) + more


def _rank_strings(runs: Sequence[Mapping[str, Any]], key: str) -> list[str]:
    out = []
    for r in runs:
        v = r.get(key)
        if isinstance(v, list):
            out += [str(x) for x in v]
    return out


def format_section(summary: JobSummary, *, level: int = 2, out_dir: Path | None = None,
                   results_dir: Path | None = None, images: Sequence[Path] = ()) -> str:
    """The full Markdown section for one job: header, key fields, tables, notes, plots and environment."""
    s, h = summary, "#" * level
    runs = s.runs
    lines = [f"{h} Job `{_md_escape(s.name)}` — hash `{s.job_hash}`", ""]
    key = [f"{k} = {_fmt_value(s.job[k])}" for k in KEY_JOB_FIELDS if k in s.job]
    if s.job.get("model") == "mlp" and "mlp_hidden" in s.job:
        key.insert(1, f"mlp_hidden = {_fmt_value(s.job['mlp_hidden'])}")
    lines += [f"Key job fields: {', '.join(key)}.", "",
              f"{len(runs)} runs; backends: {', '.join(s.backends)}.", "",
              f"{h}# Scaling", "", format_table(s), "",
              f"{h}# {RATIO_NUM} / {RATIO_DEN} throughput", "", format_ratio_table(s), ""]
    if s.notes:
        lines += [f"{h}# Notes", ""] + [f"- {_md_escape(n)}" for n in s.notes] + [""]
    if images:
        lines += [f"{h}# Plots", ""]
        lines += [f"![{p.stem}]({p.name})" for p in images] + [""]

    lines += [f"{h}# Environment", ""]
    vers = _versions_by_key(runs)
    parts = []
    for k, vals in vers.items():
        if len(vals) == 1:
            parts.append(f"{k} {next(iter(vals))}")
        else:
            parts.append(f"{k} DIFFERS: " + ", ".join(f"{v} ({', '.join(_order_backends(bs))})"
                                                      for v, bs in sorted(vals.items())))
    lines.append(f"- versions: {'; '.join(parts) or NA}")
    lines.append(f"- hosts: {_distinct(_rank_strings(runs, 'hosts'))}")
    lines.append(f"- devices: {_distinct(_rank_strings(runs, 'devices'))}")
    for b in s.backends:
        infos = [json.dumps(r["backend_info"], sort_keys=True) for r in runs
                 if r["backend"] == b and isinstance(r.get("backend_info"), dict)]
        shown = [i if len(i) <= 300 else i[:297] + "..." for i in dict.fromkeys(infos)]
        lines.append(f"- backend_info ({b}): {_distinct(shown, limit=4)}")
    starts = sorted(str(r["started_at"]) for r in runs if r.get("started_at"))
    ends = sorted(str(r["finished_at"]) for r in runs if r.get("finished_at"))
    if starts or ends:
        lines.append(f"- runs from {starts[0] if starts else '?'} to {ends[-1] if ends else '?'}")
    for b in s.backends:
        cmd = next((r["command"] for r in runs if r["backend"] == b and isinstance(r.get("command"), list)), None)
        if cmd:
            lines.append(f"- example command ({b}): `{_md_escape(shlex.join(str(c) for c in cmd))}`")
    lines.append("")

    lines += ["<details><summary>Full job definition</summary>", "", "```json",
              json.dumps(s.job, indent=1, sort_keys=True), "```", "", "</details>", ""]
    files = []
    for r in sorted(runs, key=lambda r: (r["backend"], r["world_size"], str(r.get("_path")))):
        p = Path(str(r.get("_path", "?")))
        if results_dir is not None:
            try:
                p = p.relative_to(results_dir)
            except ValueError:
                pass
        reps = f"{r['world_size']} replica{'' if r['world_size'] == 1 else 's'}"
        files.append(f"- `{p}`: {r['backend']}, {reps}, {float(r['images_per_sec']):.1f} img/s")
    lines += ["<details><summary>Run files</summary>", ""] + files + ["", "</details>", ""]
    return "\n".join(lines)


def format_markdown(summaries: Sequence[JobSummary], *, results_dir: Path | None = None,
                    images: Mapping[str, Sequence[Path]] | None = None) -> str:
    """The whole report.md: method, definitions, then one section per job."""
    n_runs = sum(len(s.runs) for s in summaries)
    lines = ["# twinbench scaling report", ""]
    if results_dir is not None:
        lines += [f"Results: `{results_dir}` — {n_runs} runs of {len(summaries)} job(s). Runs of different jobs "
                  "(different job hash) are never compared with each other.", ""]
    lines += [f"Method: {INTERVAL_METHOD}.", "", f"Definitions: {DEFINITIONS}.", ""]
    for s in summaries:
        lines.append(format_section(s, results_dir=results_dir, images=(images or {}).get(s.job_hash, ())))
    return "\n".join(lines).rstrip("\n") + "\n"


CSV_COLUMNS = (
    "job_hash", "job_name", "backend", "world_size", "num_workers", "repeats", "global_batch_size",
    "images_per_sec_median", "images_per_sec_mean", "images_per_sec_stdev", "images_per_sec_ci95_low",
    "images_per_sec_ci95_high", "images_per_sec_min", "images_per_sec_max", "speedup", "efficiency",
    "horovod_native_ratio", "step_time_p50_s", "step_time_p95_s", "step_time_mean_s", "time_to_first_step_s",
    "timed_wall_time_s", "final_loss",
)


def format_csv(summaries: Sequence[JobSummary]) -> str:
    """report.csv: one row per job x backend x world size; an empty cell means n/a."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)

    def c(x: float | int | None) -> str:
        return "" if x is None else repr(x)

    for s in summaries:
        for r in s.rows:
            lo, hi = r.ips_ci95 if r.ips_ci95 else (None, None)
            w.writerow([s.job_hash, s.name, r.backend, r.world_size, r.num_workers, r.repeats,
                        c(r.global_batch_size), c(r.ips_median), c(r.ips_mean), c(r.ips_stdev), c(lo), c(hi),
                        c(min(r.ips)), c(max(r.ips)), c(r.speedup), c(r.efficiency), c(r.ratio), c(r.step_p50),
                        c(r.step_p95), c(r.step_mean), c(r.time_to_first_step), c(r.timed_wall_time),
                        c(r.final_loss)])
    return buf.getvalue()


# ----------------------------------------------------------------------------------------------------------
# plots
# ----------------------------------------------------------------------------------------------------------
def _new_figure() -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.4), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _png_bytes(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _setup_x(ax: Any, sizes: Sequence[int]) -> None:
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    if sizes and max(sizes) / min(sizes) >= 8:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(sorted(sizes))
    ax.set_xlabel("replicas (world size)")
    ax.grid(True, alpha=0.3)


def plot_job(summary: JobSummary) -> dict[str, bytes]:
    """PNG bytes of the throughput and efficiency plots, keyed by file name (named with the job hash)."""
    s = summary
    sizes = sorted({r.world_size for r in s.rows})
    colors = {b: _COLORS.get(b, f"C{i + 2}") for i, b in enumerate(s.backends)}
    title = f"{s.name} ({s.job_hash})"

    fig = _new_figure()
    ax = fig.add_subplot()
    for b in s.backends:
        rows = [r for r in s.rows if r.backend == b]
        xs = [r.world_size for r in rows]
        ax.plot(xs, [r.ips_median for r in rows], "o-", color=colors[b], label=f"{b} (median)")
        for r in rows:
            if r.ips_ci95 is not None:
                ax.vlines(r.world_size, *r.ips_ci95, color=colors[b], alpha=0.6, linewidth=3)
        base = next((r for r in rows if r.world_size == 1), None)
        if base is not None:
            xi = sorted({1, *xs})
            ax.plot(xi, [base.ips_median * x for x in xi], "--", color=colors[b], alpha=0.7,
                    label=f"{b} ideal (linear from 1 replica)")
    _setup_x(ax, sizes)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("images / s (bars: 95% CI of mean)")
    ax.set_title(f"throughput — {title}", fontsize=10)
    ax.legend(fontsize=8)
    out = {f"throughput_{s.job_hash}.png": _png_bytes(fig)}

    fig = _new_figure()
    ax = fig.add_subplot()
    drawn = False
    for b in s.backends:
        pts = [(r.world_size, 100 * r.efficiency) for r in s.rows if r.backend == b and r.efficiency is not None]
        if pts:
            ax.plot([x for x, _ in pts], [y for _, y in pts], "o-", color=colors[b], label=b)
            drawn = True
    ax.axhline(100, linestyle="--", color="gray", label="ideal (100%)")
    if not drawn:
        ax.set_xlim(min(sizes) / 1.5, max(sizes) * 1.5)
        ax.text(0.5, 0.5, f"no 1-replica baseline: efficiency {NA}", transform=ax.transAxes, ha="center")
    _setup_x(ax, sizes)
    ax.set_ylim(0, max([110.0] + [100 * r.efficiency * 1.05 for r in s.rows if r.efficiency is not None]))
    ax.set_ylabel("scaling efficiency (%)")
    ax.set_title(f"efficiency — {title}", fontsize=10)
    ax.legend(fontsize=8)
    out[f"efficiency_{s.job_hash}.png"] = _png_bytes(fig)
    return out


# ----------------------------------------------------------------------------------------------------------
# allreduce microbenchmark and scaling model
# ----------------------------------------------------------------------------------------------------------
def load_allreduce(results_dir: str | os.PathLike[str], *, warn: Callable[[str], None] = _warn) -> list[dict[str, Any]]:
    """The ``kind: allreduce`` JSONs (common.bench) under ``results_dir``, newest last per backend x size."""
    out = []
    for path in result_files(results_dir):
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue  # load_runs already warned about unreadable files
        if not isinstance(d, dict) or d.get("kind") != "allreduce":
            continue
        if not isinstance(d.get("rows"), list) or not isinstance(d.get("world_size"), int) or not d.get("backend"):
            warn(f"skipping {path}: incomplete allreduce benchmark")
            continue
        d["_path"] = str(path)
        out.append(d)
    return sorted(out, key=lambda d: (d["backend"], d["world_size"], str(d.get("finished_at", ""))))


def format_allreduce(benches: Sequence[Mapping[str, Any]]) -> str:
    """One Markdown table per backend x world size: time, algbw and busbw per message size."""
    lines = ["## Allreduce microbenchmark", "",
             "SUM of float32 tensors; time = median over iterations of the slowest rank; algbw = bytes / time; "
             "busbw = algbw x 2(n-1)/n (nccl-tests' definitions).", ""]
    for b in benches:
        info = b.get("backend_info") or {}
        comm = info.get("communication") or info.get("controller") or NA
        lines += [f"### {b['backend']}, {b['world_size']} ranks ({comm}; hosts "
                  f"{_distinct(str(h) for h in b.get('hosts', []))})", ""]
        body = [[f"{int(r['bytes']):,}", _f(_num(r.get("time_median")), ".1f", 1e6),
                 _f(_num(r.get("time_p95")), ".1f", 1e6), _f(_num(r.get("algbw_GBps")), ".3f"),
                 _f(_num(r.get("busbw_GBps")), ".3f")] for r in b["rows"]]
        lines += [_md_table(("bytes", "time p50 (us)", "time p95 (us)", "algbw (GB/s)", "busbw (GB/s)"), body), ""]
    return "\n".join(lines)


def plot_allreduce(benches: Sequence[Mapping[str, Any]]) -> dict[str, bytes]:
    fig = _new_figure()
    ax = fig.add_subplot()
    for i, b in enumerate(benches):
        rows = [r for r in b["rows"] if _num(r.get("busbw_GBps")) is not None]
        ax.plot([r["bytes"] for r in rows], [r["busbw_GBps"] for r in rows], "o-",
                color=_COLORS.get(b["backend"], f"C{i + 2}"), label=f"{b['backend']}, {b['world_size']} ranks")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title("allreduce bus bandwidth (float32 sum)", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return {"allreduce_busbw.png": _png_bytes(fig)}


def format_model(summary: JobSummary, benches: Sequence[Mapping[str, Any]]) -> str:
    """Predicted vs measured step time and efficiency per backend, and the extrapolation (a model, labelled)."""
    from common import scaling

    lines: list[str] = []
    for backend in summary.backends:
        base = next((r for r in summary.rows if r.backend == backend and r.world_size == 1), None)
        bench = next((b for b in reversed(benches) if b["backend"] == backend and b["world_size"] >= 2), None)
        grad = _median(_num(r.get("gradient_bytes")) for r in summary.runs
                       if r["backend"] == backend and r["world_size"] == 1)
        if base is None or bench is None or grad is None or base.step_p50 is None:
            missing = [w for w, ok in (("a 1-replica run", base is not None and grad is not None),
                                       ("an allreduce benchmark at >= 2 ranks", bench is not None)) if not ok]
            lines.append(f"- {backend}: no model ({' and '.join(missing)} missing)")
            continue
        fit = scaling.fit_alpha_beta(bench["rows"], bench["world_size"])
        if fit is None:
            lines.append(f"- {backend}: no model (the allreduce times do not fit alpha + beta x bytes)")
            continue
        tc = base.step_p50
        comp = next((r.get("backend_info", {}).get("compression") for r in summary.runs if r["backend"] == backend),
                    None)
        lines += [f"### Model: {backend}", "",
                  f"Compute time per step {tc * 1e3:.2f} ms (1-replica median step), gradient bytes S = "
                  f"{int(grad):,}{' (fp16 compression: half of float32)' if comp == 'fp16' else ''}; fitted from "
                  f"the {bench['world_size']}-rank allreduce benchmark: latency {fit.alpha * 1e6:.1f} us "
                  f"({fit.alpha_hop * 1e6:.2f} us per ring hop), bus bandwidth {fit.bus_bandwidth / 1e9:.3f} GB/s. "
                  "Step(N) = compute + 2(N-1) x hop latency + 2(N-1)/N x S / B, no overlap (an upper bound).", ""]
        measured = {r.world_size: r for r in summary.rows if r.backend == backend}
        body = []
        for n in sorted(measured):
            p = scaling.predict(tc, grad, fit, n)
            m = measured[n]
            body.append([str(n), _f(m.step_p50, ".2f", 1e3), _f(p["step_time"], ".2f", 1e3),
                         _f(m.efficiency, ".1f", 100, "%"), _f(p["efficiency"], ".1f", 100, "%")])
        lines += [_md_table(("replicas", "measured step p50 (ms)", "predicted step (ms)", "measured efficiency",
                             "predicted efficiency"), body), ""]
        body = [[str(n), _f(p["step_time"], ".2f", 1e3), _f(p["comm_time"], ".2f", 1e3),
                 _f(p["efficiency"], ".1f", 100, "%")]
                for n in scaling.EXTRAPOLATE for p in [scaling.predict(tc, grad, fit, n)]]
        lines += ["Extrapolation (MODEL, not measured; assumes the benchmarked links at every size):", "",
                  _md_table(("replicas", "predicted step (ms)", "of which allreduce (ms)", "predicted efficiency"),
                            body), ""]
    if not lines:
        return ""
    return "\n".join([f"## Scaling model — {summary.name} (`{summary.job_hash}`)", "", *lines])


# ----------------------------------------------------------------------------------------------------------
# writing (common.results.write_atomic: temp file + fsync + rename)
# ----------------------------------------------------------------------------------------------------------
@dataclass
class Report:
    """What write_report produced: the summaries shown and the files written."""

    summaries: list[JobSummary]
    paths: list[Path]


def build_report(results_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str] | None = None, *,
                 job_hash: str | None = None, compare: Sequence[str] | None = None,
                 job: Mapping[str, Any] | None = None, plots: bool = True,
                 warn: Callable[[str], None] = _warn) -> Report:
    """load_runs -> summarize -> select_jobs -> write report.md, report.csv and the PNGs (see write_report)."""
    root = Path(results_dir)
    runs = load_runs(root, warn=warn)
    if not runs:
        n = len(result_files(root))
        why = f"none of its {n} results JSON file(s) is usable (see warnings)" if n else "no results JSON files"
        raise ReportError(f"no results in {str(root)!r}: {why}")
    summaries = select_jobs(summarize(runs), job_hash=job_hash, compare=compare, job=job, where=repr(str(root)))
    out = Path(out_dir) if out_dir is not None else root / "report"
    if out.exists() and not out.is_dir():
        raise ReportError(f"--out {str(out)!r} exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ReportError(f"cannot create output directory {str(out)!r} ({e.strerror})") from None

    paths: list[Path] = []
    images: dict[str, list[Path]] = {}
    if plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            warn("matplotlib is not installed: plots skipped (pip install matplotlib)")
            plots = False
    if plots:
        for s in summaries:
            for name, png in plot_job(s).items():
                p = write_atomic(out / name, png)
                images.setdefault(s.job_hash, []).append(p)
                paths.append(p)
    benches = load_allreduce(root, warn=warn)
    extra = ""
    if benches:
        extra = "\n" + format_allreduce(benches) + "\n"
        if plots:
            for name, png in plot_allreduce(benches).items():
                paths.append(write_atomic(out / name, png))
                extra += f"\n![{Path(name).stem}]({name})\n"
        extra += "".join("\n" + m + "\n" for m in (format_model(s, benches) for s in summaries) if m)
    md = format_markdown(summaries, results_dir=root, images=images) + extra
    paths.insert(0, write_atomic(out / "report.md", md))
    paths.insert(1, write_atomic(out / "report.csv", format_csv(summaries)))
    return Report(summaries, paths)


def write_report(results_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str] | None = None, *,
                 job_hash: str | None = None, compare: Sequence[str] | None = None,
                 job: Mapping[str, Any] | None = None, plots: bool = True) -> list[Path]:
    """Write report.md, report.csv and per-job PNGs for ``results_dir`` into ``out_dir`` (default
    RESULTS_DIR/report); returns the paths written. Raises ReportError on bad input or a refused comparison."""
    return build_report(results_dir, out_dir, job_hash=job_hash, compare=compare, job=job, plots=plots).paths


# ----------------------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m common.report",
        description="Scaling report (native vs horovod) from a directory of twinbench results JSONs. Runs are "
                    "grouped by job hash; different jobs are reported separately and never compared.",
    )
    p.add_argument("results_dir", type=Path, metavar="RESULTS_DIR",
                   help="directory of results *.json (subdirectories one level deep are read too)")
    p.add_argument("--out", type=Path, metavar="DIR", help="output directory (default: RESULTS_DIR/report)")
    sel = p.add_mutually_exclusive_group()
    sel.add_argument("--job-hash", metavar="HASH", help="report only this job (a unique prefix is enough)")
    sel.add_argument("--job", type=Path, metavar="TOML",
                     help="report only the job this job file (plus --set overrides) defines")
    sel.add_argument("--compare", nargs=2, metavar=("HASH1", "HASH2"),
                     help="compare two job hashes; refused (exit 2) unless they are the same job")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="job override, with --job")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the paths written, not the tables")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status (0 ok, 2 bad input or a refused comparison)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.set and args.job is None:
        parser.error("--set only applies with --job")
    try:
        job = None
        if args.job is not None:
            from common.job import JobError, load_job

            try:
                job = load_job(args.job, args.set).to_dict()
            except JobError as e:
                raise ReportError(str(e)) from None
        rep = build_report(args.results_dir, args.out, job_hash=args.job_hash, compare=args.compare, job=job,
                           plots=not args.no_plots)
    except ReportError as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    if not args.quiet:
        for s in rep.summaries:
            print(f"## {s.name} ({s.job_hash})\n")
            print(format_table(s) + "\n")
            print(format_ratio_table(s) + "\n")
            for n in s.notes:
                print(f"- note: {n}")
            if s.notes:
                print()
    for p in rep.paths:
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

