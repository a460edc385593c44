"""The command line: ``python -m common.report RESULTS_DIR [options]`` (argparse, tables on stdout, exit status)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from common.core import registry
from common.report.base import ReportError
from common.report.baseline import EXIT_SLOWER, EXIT_UNCOMPARED, baseline_table, parse_tolerance
from common.report.build import Report, ReportOptions, build_report
from common.report.converge import EXIT_CONVERGED, EXIT_NOT_YET, check, converged, format_checks, parse_width
from common.report.load import load_set, select_jobs
from common.report.render import format_ratio_table, format_table, md_table
from common.report.summary import summarize
from common.report.verdict import verdict_lines


def _parser() -> argparse.ArgumentParser:
    num, den = registry.PAIRS[0]
    p = argparse.ArgumentParser(
        prog="python -m common.report",
        description=f"Scaling report ({den} vs {num} unless --pair) from a directory of twinbench results JSONs. "
                    "Runs are grouped by job hash; different jobs are reported separately and never compared.",
    )
    p.add_argument("results_dir", type=Path, nargs="+", metavar="RESULTS_DIR",
                   help="directory of results *.json (subdirectories one level deep are read too); several "
                        "directories are read as one set")
    p.add_argument("--out", type=Path, metavar="DIR", help="output directory (default: the first RESULTS_DIR/report)")
    sel = p.add_mutually_exclusive_group()
    sel.add_argument("--job-hash", metavar="HASH", help="report only this job (a unique prefix is enough)")
    sel.add_argument("--job", type=Path, metavar="TOML",
                     help="report only the job this job file (plus --set overrides) defines")
    sel.add_argument("--compare", nargs=2, metavar=("HASH1", "HASH2"),
                     help="compare two job hashes; refused (exit 2) unless they are the same job")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="job override, with --job")
    p.add_argument("--allow-mixed-versions", action="store_true",
                   help="compare runs of one job made with different software versions (refused, exit 2, "
                        "without it); the report states the mix")
    p.add_argument("--extrapolate-to", type=int, metavar="N",
                   help="extend the scaling model's extrapolation to N replicas (default: at most 4x the largest "
                        "measured size); a model, never measured")
    p.add_argument("--pair", action="append", type=_pair, metavar="NUM,DEN",
                   help=f"compare backend NUM against DEN (their images/s ratio per world size, the verdict; "
                        f"repeatable, the first heads report.csv's ratio column; default {num},{den}); the "
                        f"migration section stays {' vs '.join(registry.MIGRATION)}")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--until", metavar="WIDTH",
                   help="instead of writing the report: is every cell's 95%% interval of the median within WIDTH "
                        "(e.g. 5%% or 0.05) of its median? Needs 6 runs per cell; exit 0 yes, 1 not yet "
                        "(common.report.converge)")
    p.add_argument("--baseline", type=Path, action="append", default=[], metavar="OLD",
                   help="compare every cell with the same cell of the results in OLD (repeatable: one set): change "
                        "of median throughput with its bootstrap interval, final loss and validation, the software "
                        f"stacks' differences; exit {EXIT_SLOWER} when a cell is slower beyond --tolerance, "
                        f"{EXIT_UNCOMPARED} when a cell could not be compared")
    p.add_argument("--tolerance", metavar="T", help="with --baseline: the change that counts, e.g. 5%% or 0.05 "
                                                    "(default 5%%)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the paths written, not the tables")
    return p


def _pair(text: str) -> registry.Pair:
    """``--pair``'s value (argparse prints the ValueError's line and exits 2)."""
    try:
        return registry.parse_pair(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _print_tables(rep: Report) -> None:
    for s in rep.summaries:
        print(f"## {s.name} ({s.job_hash})\n")
        print(format_table(s) + "\n")
        print(format_ratio_table(s) + "\n")
        for n in s.notes:
            print(f"- note: {n}")
        if s.notes:
            print()


def _until(args: argparse.Namespace, job: dict | None) -> int:
    """``--until WIDTH``: the convergence table of the selected jobs' cells; writes nothing."""
    width = parse_width(args.until)  # checked by main already
    runs = load_set(list(args.results_dir))
    if not runs:
        raise ReportError(f"no training results in {', '.join(repr(str(d)) for d in args.results_dir)}")
    summaries = select_jobs(summarize(runs), job_hash=args.job_hash, compare=args.compare, job=job,
                            where=", ".join(repr(str(d)) for d in args.results_dir))
    checks = check(summaries, width)
    print("\n".join(format_checks(checks, width)), flush=True)
    return EXIT_CONVERGED if converged(checks) else EXIT_NOT_YET


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status (0 ok, 2 bad input or a refused comparison; with --until 0 every
    cell converged, 1 not yet; with --baseline 4 (EXIT_SLOWER) when a cell is slower than OLD beyond the tolerance,
    else 5 (EXIT_UNCOMPARED) when a cell of one side has no counterpart in the other)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.set and args.job is None:
        parser.error("--set only applies with --job")
    if args.extrapolate_to is not None and args.extrapolate_to < 2:
        parser.error("--extrapolate-to must be at least 2")
    if args.tolerance is not None and not args.baseline:
        parser.error("--tolerance only applies with --baseline")
    try:
        if args.until is not None:
            parse_width(args.until)
        tolerance = parse_tolerance(args.tolerance or "5%")
    except ValueError as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    try:
        job = None
        if args.job is not None:
            from common.workload.job import JobError, load_job

            try:
                job = load_job(args.job, args.set).to_dict()
            except JobError as e:
                raise ReportError(str(e)) from None
        if args.until is not None:
            return _until(args, job)
        options = ReportOptions(job_hash=args.job_hash, compare=tuple(args.compare) if args.compare else None,
                                job=job, plots=not args.no_plots, allow_mixed_versions=args.allow_mixed_versions,
                                extrapolate_to=args.extrapolate_to, baseline=tuple(args.baseline),
                                tolerance=tolerance, pairs=tuple(dict.fromkeys(args.pair or registry.PAIRS)))
        rep = build_report(args.results_dir, args.out, options)
    except ReportError as e:
        print(f"report: {e.prefix}{e}", file=sys.stderr)
        return 2
    if not args.quiet:
        _print_tables(rep)
    for p in rep.paths:
        print(f"wrote {p}")
    if not args.quiet and (lines := verdict_lines(rep.summaries)):
        pairs = ", ".join(f"{a} vs {b}" for a, b in rep.summaries[0].pairs)
        print(f"\nVerdict ({pairs}):\n" + "\n".join(lines))
    if rep.baseline is None:
        return 0
    if not args.quiet:
        print("\nAgainst the baseline:\n" + md_table(*baseline_table(rep.baseline.changes)))
        print("\n".join(rep.baseline.lines()[:-1]))
    print(rep.baseline.summary_line())
    return rep.baseline.exit_status
