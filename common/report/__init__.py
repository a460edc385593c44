"""Scaling report: turn a directory of twinbench results JSONs into a comparison of the backends.

    python -m common.report RESULTS_DIR [RESULTS_DIR ...] [--out DIR]
                            [--job-hash HASH | --job FILE [--set K=V ...] | --compare H1 H2]
                            [--allow-mixed-versions] [--extrapolate-to N] [--no-plots] [--quiet]

Runs are grouped by ``job_hash`` and runs of different jobs are never compared with each other: a directory
holding several jobs gives one section per job, and asking to compare two different jobs is refused (exit 2)
with the job fields that differ; so is a job whose runs mix software versions, unless --allow-mixed-versions.
Several directories are read as one set. Writes ``report.md``, a self-contained ``report.html``, ``report.csv``
and two PNGs per job (``throughput_<hash>.png``, ``efficiency_<hash>.png``)
atomically into ``--out`` (default RESULTS_DIR/report).

API: ``load_runs`` -> ``summarize`` -> ``format_table`` / ``format_markdown``; ``write_report`` does it all.
Modules: base (errors, n/a), stats, load (files -> typed records: ``LoadedRun`` holding a
common.core.results.RunRecord, common.core.records.AllreduceRecord, BreakdownRecord; older schemas upgraded on
reading), rows (the summary's types), summary, notes, selection (which jobs; refusing different jobs), versions,
machines (row keys by machine, the Machine section), render (Markdown, CSV), environment (the Machine and
Environment sections), htmlpage (report.html), plots, model (allreduce and scaling model), build (writing the
files), cli. Backend names,
order, colours and the headline ratio come from the ``backends`` registry. This package never imports TensorFlow
(reports run on laptops and login nodes); matplotlib is imported only to draw the plots.
"""

from __future__ import annotations

from common.core.results import SCHEMA
from common.report.base import NA, NO_INTERVAL, MixedVersionsError, ReportError
from common.report.build import Report, build_report, check_versions, write_report
from common.report.cli import main
from common.report.load import (
    OTHER_KINDS,
    LoadedRun,
    check_run,
    load_allreduce,
    load_runs,
    recompute_job_hash,
    result_files,
)
from common.report.model import format_allreduce, format_model
from common.report.plots import plot_allreduce, plot_job
from common.report.render import (
    CSV_COLUMNS,
    DEFINITIONS,
    INTERVAL_METHOD,
    KEY_JOB_FIELDS,
    TABLE_HEADER,
    format_best_table,
    format_csv,
    format_markdown,
    format_ratio_table,
    format_section,
    format_table,
)
from common.report.rows import JobSummary, RatioRow, Row, order_backends
from common.report.selection import different_jobs_message, job_diff, select_jobs
from common.report.stats import Interval, median, median_interval, ratio_interval
from common.report.summary import summarize
from common.report.versions import version_mix

__all__ = [
    "CSV_COLUMNS", "DEFINITIONS", "INTERVAL_METHOD", "KEY_JOB_FIELDS", "NA", "NO_INTERVAL", "OTHER_KINDS", "SCHEMA",
    "TABLE_HEADER", "JobSummary", "LoadedRun", "MixedVersionsError", "RatioRow", "Report", "ReportError", "Row",
    "build_report", "check_run", "check_versions", "different_jobs_message", "format_allreduce", "format_best_table",
    "format_csv", "format_markdown", "format_model", "format_ratio_table", "format_section", "format_table",
    "job_diff", "load_allreduce", "load_runs", "main", "Interval", "median", "median_interval", "order_backends",
    "plot_allreduce", "plot_job", "recompute_job_hash", "result_files", "select_jobs", "ratio_interval", "summarize",
    "version_mix", "write_report",
]
