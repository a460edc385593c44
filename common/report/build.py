"""Producing the report: load, summarize, select, check versions, describe (common.report.document), then write
report.md, report.html, report.csv, migration.csv (common.report.migrate) and the PNGs atomically
(common.core.results.write_atomic: temp file + fsync + rename)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from common.core import registry
from common.core.results import AllreduceRecord, BreakdownRecord, write_atomic
from common.report import render
from common.report.base import ReportError, warn
from common.report.baseline import Baseline, baseline_part, compare
from common.report.document import Block, report
from common.report.load import (
    LoadedRun,
    PathArg,
    check_versions,
    load_allreduce,
    load_breakdowns,
    load_set,
    result_files,
    roots,
    select_jobs,
    sort_allreduce,
)
from common.report.migrate import MIGRATION_CSV, load_checks, migration_part
from common.report.model import allreduce_part, breakdown_cells, breakdown_part, format_model
from common.report.render import plot_allreduce, plot_breakdown, plot_job
from common.report.summary import JobSummary, summarize

__all__ = ["Report", "ReportOptions", "build_report", "load_set"]  # load_set: the sweep's status reads it here


@dataclass(frozen=True)
class ReportOptions:
    """What to report and how (the command line's flags)."""

    job_hash: str | None = None  # only this job (a unique prefix is enough)
    compare: tuple[str, str] | None = None  # two job hashes, which must name the same job
    job: Mapping[str, Any] | None = None  # only the job of this ``Job.to_dict()``
    plots: bool = True  # draw the PNGs (matplotlib)
    allow_mixed_versions: bool = False  # compare runs of one job made with different software versions
    extrapolate_to: int | None = None  # the scaling model's extrapolation up to N replicas (None: its default)
    baseline: tuple[Path, ...] = ()  # directories of OLD results to compare every cell with
    tolerance: float = 0.05  # with ``baseline``: the change of median throughput that counts
    pairs: tuple[registry.Pair, ...] = registry.PAIRS  # the backend pairs compared (numerator, denominator)

    @property
    def selects(self) -> bool:
        """A selection of jobs was asked for (not every job found)."""
        return self.job_hash is not None or self.compare is not None or self.job is not None


@dataclass
class Report:
    """What build_report produced: the summaries shown and the files written."""

    summaries: list[JobSummary]
    paths: list[Path]
    baseline: Baseline | None = None  # NEW against OLD (``--baseline``)
    blocks: list[Block] = field(default_factory=list)  # what report.md and report.html say


def _out_dir(root: Path, out_dir: PathArg | None) -> Path:
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


def _diagnostics(summaries: Sequence[JobSummary], runs: Sequence[LoadedRun], benches: Sequence[AllreduceRecord],
                 breakdowns: Sequence[BreakdownRecord], opts: ReportOptions, out: Path,
                 paths: list[Path]) -> list[Block]:
    """The sections after the jobs: allreduce tables (and plot), scaling models, breakdowns (and their plots)."""
    blocks: list[Block] = []
    if benches:
        image = None
        if opts.plots:
            for name, png in plot_allreduce(benches).items():
                paths.append(write_atomic(out / name, png))
                image = name
        blocks += allreduce_part(benches, image)
        blocks += [m for m in (format_model(s, benches, opts.extrapolate_to) for s in summaries) if m]
    for h, cells in breakdown_cells(breakdowns, runs, benches).items():
        image = None
        if opts.plots:
            bars = [(f"{c.rec.backend}\n{c.rec.world_size} repl.", c.rec.phases, c.bench_step) for c in cells]
            image = f"breakdown_{h}.png"
            title = f"{cells[0].rec.job.get('name', '?')} ({h})"
            paths.append(write_atomic(out / image, plot_breakdown(title, bars)))
        blocks += breakdown_part(cells, image, opts.pairs)
    return blocks


def build_report(results_dir: PathArg | Sequence[PathArg], out_dir: PathArg | None = None,
                 options: ReportOptions | None = None, *, warn: Callable[[str], None] = warn) -> Report:
    """load (one or several directories, one set) -> summarize -> select_jobs -> check_versions -> describe ->
    write report.md, report.html, report.csv and the PNGs (default output: the first directory's ``report``); with
    ``options.baseline`` (directories of OLD results) the cells against OLD's too (common.report.baseline)."""
    opts, dirs = options or ReportOptions(), roots(results_dir)
    runs = load_set(dirs, warn)
    breakdowns = sorted((b for d in dirs for b in load_breakdowns(d, warn=warn)),
                        key=lambda r: str(r.finished_at or ""))
    where = ", ".join(repr(str(r)) for r in dirs)
    if not runs and not breakdowns:
        n = sum(len(result_files(r)) for r in dirs)
        why = f"none of its {n} results JSON file(s) is usable (see warnings)" if n else "no results JSON files"
        raise ReportError(f"no results in {where}: {why}")
    summaries = select_jobs(summarize(runs, opts.pairs), job_hash=opts.job_hash, compare=opts.compare, job=opts.job,
                            where=where)
    check_versions(summaries, allow_mixed=opts.allow_mixed_versions, warn=warn)
    against = _baseline(opts, summaries, warn) if opts.baseline else None
    out = _out_dir(dirs[0], out_dir)
    paths: list[Path] = []
    opts = replace(opts, plots=_can_plot(opts.plots, warn))
    images = _write_job_plots(summaries, out, paths) if opts.plots else {}
    benches = sort_allreduce(b for d in dirs for b in load_allreduce(d, warn=warn))
    if opts.selects:  # a selection: its jobs' breakdowns only
        breakdowns = [b for b in breakdowns if b.job_hash in {s.job_hash for s in summaries}]
    after = _diagnostics(summaries, runs, benches, breakdowns, opts, out, paths)
    base = dirs[0] if len(dirs) == 1 else Path(os.path.commonpath([r.absolute() for r in dirs]))
    old_where = [str(p) for p in roots(opts.baseline)] if opts.baseline else []
    migration = migration_part(summaries, load_checks(dirs, warn))
    blocks = report(summaries, results_dir=base, images=images, sources=dirs, after_jobs=after,
                    after_verdict=[*(baseline_part(against, old_where) if against else ()), *migration])
    paths.insert(0, write_atomic(out / "report.md", render.markdown(blocks)))
    paths.insert(1, write_atomic(out / "report.html", render.page(blocks, out)))
    paths.insert(2, write_atomic(out / "report.csv", render.format_csv(summaries)))
    if migration:
        paths.insert(3, write_atomic(out / MIGRATION_CSV, render.tables_csv(blocks, MIGRATION_CSV)))
    return Report(summaries, paths, against, blocks)


def _baseline(opts: ReportOptions, new: Sequence[JobSummary], warn: Callable[[str], None]) -> Baseline:
    """NEW's jobs against the runs of the baseline directories (read as one set; its versions checked as NEW's
    are: a mix inside OLD is refused unless allowed, across NEW and OLD it is the point)."""
    dirs = roots(opts.baseline)
    for r in dirs:
        if not r.is_dir():
            raise ReportError(f"--baseline {str(r)!r} is not a directory of results")
    old = summarize(load_set(dirs, warn), opts.pairs)
    if not old:
        raise ReportError(f"no training results in the baseline {', '.join(repr(str(r)) for r in dirs)}")
    hashes = {s.job_hash for s in new}
    old = [s for s in old if s.job_hash in hashes]
    if not old:
        raise ReportError("the baseline holds no run of the job(s) reported (different job hashes): nothing to "
                          "compare")
    check_versions(old, allow_mixed=opts.allow_mixed_versions, warn=warn)
    return compare(new, old, opts.tolerance)
