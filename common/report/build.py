"""Producing the report: load, summarize, select, check versions, then write report.md, report.csv and the
PNGs atomically (common.core.results.write_atomic: temp file + fsync + rename)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.core import registry
from common.core.records import AllreduceRecord
from common.core.results import BREAKDOWN_PHASES, BreakdownRecord, write_atomic
from common.report.base import MixedVersionsError, ReportError, warn
from common.report.baseline import Baseline, baseline_markdown, compare
from common.report.htmlpage import format_html
from common.report.load import LoadedRun, load_allreduce, load_breakdowns, load_runs, result_files, sort_allreduce
from common.report.model import format_allreduce, format_model
from common.report.plots import plot_allreduce, plot_breakdown, plot_job
from common.report.render import fmt_num, format_csv, format_markdown, md_table
from common.report.rows import JobSummary, order_backends
from common.report.selection import select_jobs
from common.report.stats import median, num
from common.report.summary import summarize
from common.report.versions import mix_message


@dataclass
class Report:
    """What write_report produced: the summaries shown and the files written."""

    summaries: list[JobSummary]
    paths: list[Path]
    baseline: Baseline | None = None  # NEW against OLD (``--baseline``)


def check_versions(summaries: Sequence[JobSummary], *, allow_mixed: bool,
                   warn: Callable[[str], None] = warn) -> None:
    """Refuse (MixedVersionsError, the first such job) a comparison whose runs mix software versions, or, when
    ``allow_mixed``, warn once per such job."""
    for s in summaries:
        if s.version_mix:
            msg = mix_message(s.name, s.job_hash, s.version_mix)
            if not allow_mixed:
                raise MixedVersionsError(f"{msg}; pass --allow-mixed-versions to compare them anyway")
            warn(f"{msg}; compared anyway (--allow-mixed-versions)")


def _out_dir(root: Path, out_dir: str | os.PathLike[str] | None) -> Path:
    out = Path(out_dir) if out_dir is not None else root / "report"
    if out.exists() and not out.is_dir():
        raise ReportError(f"--out {str(out)!r} exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ReportError(f"cannot create output directory {str(out)!r} ({e.strerror})") from None
    return out


def _can_plot(plots: bool, warn: Callable[[str], None]) -> bool:
    if plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            warn("matplotlib is not installed: plots skipped (pip install matplotlib)")
            return False
    return plots


def _write_job_plots(summaries: Sequence[JobSummary], out: Path, paths: list[Path]) -> dict[str, list[Path]]:
    images: dict[str, list[Path]] = {}
    for s in summaries:
        for name, png in plot_job(s).items():
            p = write_atomic(out / name, png)
            images.setdefault(s.job_hash, []).append(p)
            paths.append(p)
    return images


def _allreduce_part(benches: Sequence[AllreduceRecord], out: Path, plots: bool, paths: list[Path]) -> str:
    """The Markdown appended after the jobs: allreduce tables (and plot)."""
    if not benches:
        return ""
    extra = "\n" + format_allreduce(benches) + "\n"
    if plots:
        for name, png in plot_allreduce(benches).items():
            paths.append(write_atomic(out / name, png))
            extra += f"\n![{Path(name).stem}]({name})\n"
    return extra


PathArg = str | os.PathLike[str]


def _roots(results_dir: PathArg | Sequence[PathArg]) -> list[Path]:
    """One results directory, or several read as one set (each named once, in the order given)."""
    dirs = [results_dir] if isinstance(results_dir, str | os.PathLike) else list(results_dir)
    if not dirs:
        raise ReportError("no results directory given")
    return list(dict.fromkeys(Path(d) for d in dirs))


def load_set(roots: Sequence[Path], warn: Callable[[str], None] = warn) -> list[LoadedRun]:
    """The runs of every directory as one set; a run_id already loaded from another directory is a copy (skipped
    with a warning, as a copy within one directory is)."""
    runs: list[LoadedRun] = []
    seen: dict[str, str | None] = {}
    for root in roots:
        for r in load_runs(root, warn=warn):
            rid = r.record.run_id
            if rid is not None and rid in seen:
                warn(f"skipping {r.path}: same run_id {rid!r} as {seen[rid]} (a copy)")
                continue
            if rid:
                seen[rid] = r.path
            runs.append(r)
    return runs


def build_report(results_dir: PathArg | Sequence[PathArg], out_dir: PathArg | None = None, *,
                 job_hash: str | None = None, compare: Sequence[str] | None = None,
                 job: Mapping[str, Any] | None = None, plots: bool = True, allow_mixed_versions: bool = False,
                 extrapolate_to: int | None = None, warn: Callable[[str], None] = warn,
                 baseline: Sequence[PathArg] = (), tolerance: float = 0.05) -> Report:
    """load_runs (of one or several directories, one set) -> summarize -> select_jobs -> check_versions -> write
    report.md, report.html, report.csv and the PNGs (default output: the first directory's ``report``); with
    ``baseline`` (directories of OLD results) the cells against OLD's too (common.report.baseline)."""
    roots = _roots(results_dir)
    runs = load_set(roots, warn)
    breakdowns = sorted((b for root in roots for b in load_breakdowns(root, warn=warn)),
                        key=lambda r: str(r.finished_at or ""))
    where = ", ".join(repr(str(r)) for r in roots)
    if not runs and not breakdowns:
        n = sum(len(result_files(r)) for r in roots)
        why = f"none of its {n} results JSON file(s) is usable (see warnings)" if n else "no results JSON files"
        raise ReportError(f"no results in {where}: {why}")
    summaries = select_jobs(summarize(runs), job_hash=job_hash, compare=compare, job=job, where=where)
    check_versions(summaries, allow_mixed=allow_mixed_versions, warn=warn)
    against = _baseline(baseline, summaries, tolerance, allow_mixed_versions, warn) if baseline else None
    old_where = [str(p) for p in _roots(baseline)] if baseline else []
    out = _out_dir(roots[0], out_dir)
    paths: list[Path] = []
    plots = _can_plot(plots, warn)
    images = _write_job_plots(summaries, out, paths) if plots else {}
    benches = sort_allreduce(b for root in roots for b in load_allreduce(root, warn=warn))
    models = [m for m in (format_model(s, benches, extrapolate_to) for s in summaries) if m] if benches else []
    extra = _allreduce_part(benches, out, plots, paths) + "".join("\n" + m.markdown + "\n" for m in models)
    if job_hash is not None or compare is not None or job is not None:  # a selection: its jobs' breakdowns only
        breakdowns = [b for b in breakdowns if b.job_hash in {s.job_hash for s in summaries}]
    extra += _breakdown_part(breakdowns, runs, benches, out, plots, paths)
    base = roots[0] if len(roots) == 1 else Path(os.path.commonpath([r.absolute() for r in roots]))
    md = format_markdown(summaries, results_dir=base, images=images, sources=roots,
                         after_verdict=baseline_markdown(against, old_where) if against else ()) + extra
    paths.insert(0, write_atomic(out / "report.md", md))
    others = [p for p in paths if p.name.startswith(("allreduce", "breakdown"))]
    html = format_html(summaries, sources=roots, images=images, models=models, other_images=others,
                       baseline=against, baseline_sources=old_where)
    paths.insert(1, write_atomic(out / "report.html", html))
    paths.insert(2, write_atomic(out / "report.csv", format_csv(summaries)))
    return Report(summaries, paths, against)


def _baseline(dirs: Sequence[PathArg], new: Sequence[JobSummary], tolerance: float, allow_mixed: bool,
              warn: Callable[[str], None]) -> Baseline:
    """NEW's jobs against the runs of the baseline directories (read as one set; its versions checked as NEW's
    are: a mix inside OLD is refused unless allowed, across NEW and OLD it is the point)."""
    roots = _roots(dirs)
    for r in roots:
        if not r.is_dir():
            raise ReportError(f"--baseline {str(r)!r} is not a directory of results")
    old = summarize(load_set(roots, warn))
    if not old:
        raise ReportError(f"no training results in the baseline {', '.join(repr(str(r)) for r in roots)}")
    hashes = {s.job_hash for s in new}
    old = [s for s in old if s.job_hash in hashes]
    if not old:
        raise ReportError("the baseline holds no run of the job(s) reported (different job hashes): nothing to "
                          "compare")
    check_versions(old, allow_mixed=allow_mixed, warn=warn)
    return compare(new, old, tolerance)


def write_report(results_dir: PathArg | Sequence[PathArg], out_dir: PathArg | None = None, *,
                 job_hash: str | None = None, compare: Sequence[str] | None = None,
                 job: Mapping[str, Any] | None = None, plots: bool = True,
                 allow_mixed_versions: bool = False) -> list[Path]:
    """Write report.md, report.html, report.csv and per-job PNGs for ``results_dir`` into ``out_dir`` (default
    RESULTS_DIR/report); returns the paths written. Raises ReportError on bad input or a refused comparison."""
    return build_report(results_dir, out_dir, job_hash=job_hash, compare=compare, job=job, plots=plots,
                        allow_mixed_versions=allow_mixed_versions).paths


# -- the --diagnose breakdown section (common.diagnostics.breakdown writes the records) -----------------------
PHASE_WORDS = {"input": "input", "compute": "compute (forward + backward)", "comm": "gradient communication",
               "apply": "the optimizer update", "rest": "the rest (between steps)"}
BREAKDOWN_METHOD = (
    "DIAGNOSTIC runs (`--diagnose breakdown`), not benchmark figures: the custom loop's step, with its phases "
    "serialized inside one tf.function and a device timestamp at each boundary, so the bars show where the time "
    "goes WITHOUT overlap (Horovod normally overlaps the all-reduce with the backward pass). input = next batch; "
    "compute = forward + backward (local gradients); comm = SUM all-reduce of the gradients, including waiting for "
    "the slowest rank (of which waiting: comm minus the least comm of any rank at that step); apply = optimizer "
    "update; rest = between the end of one step's device work and the start of the next (dispatch, host loop, "
    "syncs). Means over the timed steps and over ranks; the parts sum to the device step time, checked against "
    "the host's wall clock (sum / host) and compared with the normal benchmark run of the same job, backend and "
    "world size (diagnostic / benchmark: the cost of the phase barriers and of losing overlap)"
)


@dataclass(frozen=True)
class BreakdownCell:
    """The newest breakdown of one backend x world size, with what it is cross-checked against."""

    rec: BreakdownRecord
    bench_step: float | None  # median over repeats of the normal runs' step_time mean (same job, backend, size)
    bench_repeats: int
    allreduce: float | None  # the allreduce microbenchmark's median time at the record's gradient bytes


def allreduce_time_at(rows: Sequence[Mapping[str, Any]], nbytes: float) -> float | None:
    """The microbenchmark's median time at ``nbytes``: log-log interpolation between the measured sizes around it,
    or None outside them (no extrapolation)."""
    pts = sorted((float(r["bytes"]), t) for r in rows if (t := num(r.get("time_median"))) and num(r.get("bytes")))
    for (b0, t0), (b1, t1) in zip(pts, pts[1:]):
        if b0 <= nbytes <= b1 and b0 > 0 and t0 > 0 and t1 > 0:
            f = 0.0 if b1 == b0 else (math.log(nbytes) - math.log(b0)) / (math.log(b1) - math.log(b0))
            return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
    return next((t for b, t in pts if b == nbytes), None)


def breakdown_cells(records: Sequence[BreakdownRecord], runs: Sequence[LoadedRun],
                    benches: Sequence[AllreduceRecord]) -> dict[str, list[BreakdownCell]]:
    """Job hash -> the newest breakdown per backend x world size (world size, then registry order)."""
    newest: dict[tuple[str, str, int], BreakdownRecord] = {}
    for r in records:  # oldest first: the newest wins
        newest[(r.job_hash, r.backend, r.world_size)] = r
    out: dict[str, list[BreakdownCell]] = {}
    for (h, backend, n), rec in newest.items():
        steps = [num(r.step_time.get("mean")) for r in (x.record for x in runs)
                 if r.job_hash == h and r.backend == backend and r.world_size == n and r.asynchronous is not True]
        bench = next((b for b in reversed(benches) if b.backend == backend and b.world_size == n), None)
        at = allreduce_time_at(bench.rows, rec.gradient_bytes) if bench and rec.gradient_bytes else None
        out.setdefault(h, []).append(BreakdownCell(rec, median(steps), len(steps), at))
    for cells in out.values():
        order = order_backends(c.rec.backend for c in cells)
        cells.sort(key=lambda c: (c.rec.world_size, order.index(c.rec.backend)))
    return out


def difference_sentence(a: BreakdownRecord, b: BreakdownRecord) -> str:
    """The largest per-phase difference between two backends' breakdowns at one world size, in one sentence."""
    diff = {p: a.phases[p] - b.phases[p] for p in BREAKDOWN_PHASES}
    big = max(BREAKDOWN_PHASES, key=lambda p: abs(diff[p]))
    d = diff[big]
    text = (f"at {a.world_size} replica{'s' if a.world_size != 1 else ''} {a.backend} spends {abs(d) * 1e3:.2f} ms "
            f"{'less' if d < 0 else 'more'} per step in {PHASE_WORDS[big]} than {b.backend} "
            f"({a.phases[big] * 1e3:.2f} vs {b.phases[big] * 1e3:.2f} ms)")
    others = [p for p in BREAKDOWN_PHASES if p != big]
    nxt = max(others, key=lambda p: abs(diff[p]))
    same = [PHASE_WORDS[p].split(" (")[0] for p in others
            if abs(diff[p]) <= max(0.05 * max(a.phases[p], b.phases[p]), 1e-5)]  # within 5% (or 10 us)
    tail = f"; {', '.join(same)} {'is' if len(same) == 1 else 'are'} the same (within 5%)" if same else ""
    return (f"{text}; next largest: {PHASE_WORDS[nxt].split(' (')[0]} ({diff[nxt] * 1e3:+.2f} ms){tail}; step "
            f"{a.step_time * 1e3:.2f} vs {b.step_time * 1e3:.2f} ms.")


def format_breakdown(cells: Sequence[BreakdownCell], image: str | None = None) -> str:
    """The Markdown section of one job's breakdowns: method, table, one sentence per world size, the plot."""
    rec0 = cells[0].rec
    lines = [f"## Step-time breakdown — {rec0.job.get('name', '?')} (`{rec0.job_hash}`), DIAGNOSTIC", "",
             BREAKDOWN_METHOD + ".", ""]
    f = fmt_num
    body = []
    for c in cells:
        r, ph = c.rec, c.rec.phases
        body.append([r.backend, str(r.world_size), *(f(ph[p], ".3f", 1e3) for p in ("input", "compute", "comm")),
                     f(r.wait, ".3f", 1e3), f(ph["apply"], ".3f", 1e3), f(ph["rest"], ".3f", 1e3),
                     f(r.step_time, ".3f", 1e3), f(r.host_step_time, ".3f", 1e3),
                     f(r.step_time / r.host_step_time, ".1f", 100, "%"),
                     f(c.bench_step, ".3f", 1e3) + (f" (n={c.bench_repeats})" if c.bench_repeats else ""),
                     f(r.step_time / c.bench_step if c.bench_step else None, ".2f"),
                     f(ph["comm"] / c.allreduce if c.allreduce else None, ".2f")])
    lines += [md_table(("backend", "replicas", "input (ms)", "compute (ms)", "comm (ms)", "of which waiting (ms)",
                        "apply (ms)", "rest (ms)", "sum (ms)", "host clock (ms)", "sum / host",
                        "benchmark step (ms)", "diagnostic / benchmark", "comm / allreduce bench"), body), ""]
    lines += ["comm / allreduce bench: comm against the allreduce microbenchmark's median time for one tensor of the "
              "gradient bytes (log-log interpolated between its sizes; n/a outside them or without a benchmark at "
              "that world size); a step's gradients are several tensors, the benchmark's one.", ""]
    num_b, den_b = registry.RATIO
    by_n: dict[int, dict[str, BreakdownRecord]] = {}
    for c in cells:
        by_n.setdefault(c.rec.world_size, {})[c.rec.backend] = c.rec
    sentences = [difference_sentence(v[num_b], v[den_b]) for _, v in sorted(by_n.items())
                 if num_b in v and den_b in v]
    lines += [f"- {s[0].upper()}{s[1:]}" for s in sentences] + ([""] if sentences else [])
    if image:
        lines += [f"![breakdown]({image})", ""]
    return "\n".join(lines)


def _breakdown_part(records: Sequence[BreakdownRecord], runs: Sequence[LoadedRun],
                    benches: Sequence[AllreduceRecord], out: Path, plots: bool, paths: list[Path]) -> str:
    """The Markdown of every job's breakdown section (and its stacked-bar PNG)."""
    text = ""
    for h, cells in breakdown_cells(records, runs, benches).items():
        image = None
        if plots:
            bars = [(f"{c.rec.backend}\n{c.rec.world_size} repl.", c.rec.phases, c.bench_step) for c in cells]
            image = f"breakdown_{h}.png"
            paths.append(write_atomic(out / image, plot_breakdown(f"{cells[0].rec.job.get('name', '?')} ({h})",
                                                                  bars)))
        text += "\n" + format_breakdown(cells, image) + "\n"
    return text
