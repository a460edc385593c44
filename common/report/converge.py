"""Have the repeats converged? (``--until 5%`` on the demo, the report and the sweep's status.)

A cell is a row of the report's scaling table (backend or variant, machine, world size, layout: ``summary.Row``).
It is *within X% of its median* when its interval of the median is, on both sides:

    max(median - low, high - median) <= X * median

with the report's own interval (``stats.median_interval``), and only when that interval is the 95% confidence
interval from order statistics, i.e. the cell has at least ``MIN_CI_RUNS`` (6) repeats. Below 6 repeats the report
shows the range min-max, which is no confidence interval at all (two runs that happen to agree say nothing about a
third), so such a cell is never converged: a loop adding repeats ``--until X%`` never stops before 6 repeats. The
width shown is the half-width relative to the median, ``max(median - low, high - median) / median``.

No TensorFlow here; scipy only through ``stats``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from common.core.text import text_table
from common.report.stats import MIN_CI_RUNS, Interval
from common.report.summary import JobSummary, Row

EXIT_CONVERGED, EXIT_NOT_YET = 0, 1  # the report's exit status with --until (2: bad input, as always)


def parse_width(text: str) -> float:
    """``--until``'s relative width as a fraction: "5%" -> 0.05, "2.5%" -> 0.025, "0.05" -> 0.05. A bare number
    of 1 or more ("5": five percent or five hundred?), zero, 100% or more, or anything else: ValueError."""
    t = text.strip()
    m = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)(%?)", t)
    if not m:
        raise ValueError(f"--until: {text!r} is not a relative width (expected e.g. 5% or 0.05)")
    value = float(m.group(1)) / (100 if m.group(2) else 1)
    if not m.group(2) and value >= 1:
        raise ValueError(f"--until: {text!r} is ambiguous: write {t}% for percent (or a fraction below 1, e.g. 0.05)")
    if not 0 < value < 1:
        raise ValueError(f"--until: the width must be above 0% and below 100%, got {text!r}")
    return value


def percent(width: float) -> str:
    """0.05 -> "5%", 0.025 -> "2.5%"."""
    return f"{100 * width:g}%"


@dataclass(frozen=True)
class CellCheck:
    """One cell's verdict: its median, interval, relative half-width and whether it is within the width."""

    cell: str  # e.g. "native 2 replicas (1x2)", with the job's name first when several jobs are checked
    repeats: int
    median: float
    interval: Interval | None  # None for a single repeat
    width: float | None  # max(median - low, high - median) / median; None without an interval
    converged: bool
    unit: str = "images/s"  # the median's unit (JobSummary.unit)

    def why(self) -> str:
        """What keeps the cell from converging ("" when it is converged), e.g. "8.1% wide", "5 of 6 runs"."""
        if self.converged:
            return ""
        if self.repeats < MIN_CI_RUNS:
            return f"{self.repeats} of {MIN_CI_RUNS} runs"
        return f"{100 * (self.width or 0):.1f}% wide"


def relative_half_width(median: float, iv: Interval | None) -> float | None:
    """max(median - low, high - median) / median; None without an interval or for a median <= 0."""
    if iv is None or median <= 0:
        return None
    return max(median - iv.low, iv.high - median) / median


def cell_name(row: Row) -> str:
    """"native 1 replica (1x1)", "horovod (fusion 32 MiB) 4 replicas (2x2)": the row's label, size and layout."""
    i = row.identity
    return f"{i.label} {i.world_size} replica{'s' if i.world_size != 1 else ''} ({i.layout})"


def check_row(row: Row, width: float) -> CellCheck:
    """The rule of this module for one row of the table."""
    t = row.throughput
    w = relative_half_width(t.median, t.interval)
    ok = t.repeats >= MIN_CI_RUNS and w is not None and w <= width
    return CellCheck(cell_name(row), t.repeats, t.median, t.interval, w, ok)


def check(summaries: Sequence[JobSummary], width: float) -> list[CellCheck]:
    """Every cell of every job, in table order (cells named with their job's name when there are several jobs)."""
    out = []
    for s in summaries:
        for row in s.rows:
            c = replace(check_row(row, width), unit=s.unit)
            out.append(c if len(summaries) == 1 else replace(c, cell=f"{s.name}: {c.cell}"))
    return out


def converged(checks: Sequence[CellCheck]) -> bool:
    return bool(checks) and all(c.converged for c in checks)


def verdict(checks: Sequence[CellCheck], width: float) -> str:
    """One line: "every cell within 5% of its median (4 cells)" or "not yet within 5%: native 2 replicas (1x2)
    8.1% wide, horovod 1 replica (1x1) 5 of 6 runs"."""
    if converged(checks):
        return f"every cell within {percent(width)} of its median ({len(checks)} cell{'s' if len(checks) > 1 else ''})"
    return f"not yet within {percent(width)}: " + ", ".join(f"{c.cell} {c.why()}" for c in checks if not c.converged)


def format_checks(checks: Sequence[CellCheck], width: float) -> list[str]:
    """A table (cell, runs, median, interval, width, converged / not yet) and the verdict line last."""
    units = {c.unit for c in checks}
    head = ("cell", "runs", f"{units.pop() if len(units) == 1 else 'throughput'} median", "interval", "width",
            f"within {percent(width)}")
    rows = [(c.cell, str(c.repeats), f"{c.median:.1f}", c.interval.text() if c.interval else "no interval",
             f"{100 * c.width:.1f}%" if c.width is not None else "-",
             "converged" if c.converged else f"not yet ({c.why()})") for c in checks]
    return [*text_table([head, *rows]), verdict(checks, width)]
