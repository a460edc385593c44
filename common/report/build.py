"""Producing the report: load, summarize, select, check versions, then write report.md, report.csv and the
PNGs atomically (common.results.write_atomic: temp file + fsync + rename)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.report.base import MixedVersionsError, ReportError, warn
from common.report.load import load_allreduce, load_runs, result_files
from common.report.model import format_allreduce, format_model
from common.report.plots import plot_allreduce, plot_job
from common.report.render import format_csv, format_markdown
from common.report.selection import select_jobs
from common.report.summary import JobSummary, summarize
from common.report.versions import mix_message
from common.results import write_atomic


@dataclass
class Report:
    """What write_report produced: the summaries shown and the files written."""

    summaries: list[JobSummary]
    paths: list[Path]


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


def _allreduce_part(benches: Sequence[Mapping[str, Any]], summaries: Sequence[JobSummary], out: Path,
                    plots: bool, paths: list[Path]) -> str:
    """The Markdown appended after the jobs: allreduce tables (and plot) and each job's scaling model."""
    if not benches:
        return ""
    extra = "\n" + format_allreduce(benches) + "\n"
    if plots:
        for name, png in plot_allreduce(benches).items():
            paths.append(write_atomic(out / name, png))
            extra += f"\n![{Path(name).stem}]({name})\n"
    return extra + "".join("\n" + m + "\n" for m in (format_model(s, benches) for s in summaries) if m)


def build_report(results_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str] | None = None, *,
                 job_hash: str | None = None, compare: Sequence[str] | None = None,
                 job: Mapping[str, Any] | None = None, plots: bool = True, allow_mixed_versions: bool = False,
                 warn: Callable[[str], None] = warn) -> Report:
    """load_runs -> summarize -> select_jobs -> check_versions -> write report.md, report.csv and the PNGs."""
    root = Path(results_dir)
    runs = load_runs(root, warn=warn)
    if not runs:
        n = len(result_files(root))
        why = f"none of its {n} results JSON file(s) is usable (see warnings)" if n else "no results JSON files"
        raise ReportError(f"no results in {str(root)!r}: {why}")
    summaries = select_jobs(summarize(runs), job_hash=job_hash, compare=compare, job=job, where=repr(str(root)))
    check_versions(summaries, allow_mixed=allow_mixed_versions, warn=warn)
    out = _out_dir(root, out_dir)
    paths: list[Path] = []
    plots = _can_plot(plots, warn)
    images = _write_job_plots(summaries, out, paths) if plots else {}
    extra = _allreduce_part(load_allreduce(root, warn=warn), summaries, out, plots, paths)
    md = format_markdown(summaries, results_dir=root, images=images) + extra
    paths.insert(0, write_atomic(out / "report.md", md))
    paths.insert(1, write_atomic(out / "report.csv", format_csv(summaries)))
    return Report(summaries, paths)


def write_report(results_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str] | None = None, *,
                 job_hash: str | None = None, compare: Sequence[str] | None = None,
                 job: Mapping[str, Any] | None = None, plots: bool = True,
                 allow_mixed_versions: bool = False) -> list[Path]:
    """Write report.md, report.csv and per-job PNGs for ``results_dir`` into ``out_dir`` (default
    RESULTS_DIR/report); returns the paths written. Raises ReportError on bad input or a refused comparison."""
    return build_report(results_dir, out_dir, job_hash=job_hash, compare=compare, job=job, plots=plots,
                        allow_mixed_versions=allow_mixed_versions).paths
