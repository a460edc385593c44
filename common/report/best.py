"""Best vs best: when a job has tuning variants (``RunRecord.tuning.variant``), each backend's fastest variant per
world size next to its default, and the backend ratio of the fastest variants beside the ratio of the defaults.

Only rows of a backend's default way of training take part (``Row.comparable``: default strategy, synchronous); the
fastest is the highest median images/s, a pick that favours a lucky variant when repeats are few.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.report.rows import RATIO_DEN, RATIO_NUM, JobSummary, Row, order_backends


@dataclass(frozen=True)
class BestRow:
    """One backend at one world size: its default-knob row and its fastest row (the default itself, possibly)."""

    backend: str
    world_size: int
    default: Row | None  # None: only variants ran at this size
    best: Row

    @property
    def best_name(self) -> str:
        return self.best.identity.variant or "default"


@dataclass(frozen=True)
class BestRatio:
    """``registry.RATIO`` at one world size, of the defaults and of the fastest variants (None: a side is missing)."""

    world_size: int
    default_ratio: float | None
    best_ratio: float | None
    den_best: str  # the denominator's fastest variant ("default" or its label)
    num_best: str


def _fastest(rows: list[Row]) -> Row | None:
    return max(rows, key=lambda r: r.throughput.median) if rows else None


def best_rows(s: JobSummary) -> list[BestRow]:
    """Per backend (registry order) and world size, the default and the fastest row; empty without variants."""
    rows = [r for r in s.rows if r.identity.comparable]
    if not any(r.identity.variant for r in rows):
        return []
    out = []
    for b in order_backends(r.identity.backend for r in rows):
        for ws in sorted({r.identity.world_size for r in rows if r.identity.backend == b}):
            cell = [r for r in rows if r.identity.backend == b and r.identity.world_size == ws]
            best = _fastest(cell)
            assert best is not None  # the cell holds at least the row that put ws in the set
            out.append(BestRow(b, ws, _fastest([r for r in cell if r.identity.variant is None]), best))
    return out


def best_ratios(cells: list[BestRow]) -> list[BestRatio]:
    """The backend ratio at every world size where both backends have rows."""
    out = []
    for ws in sorted({c.world_size for c in cells}):
        by = {c.backend: c for c in cells if c.world_size == ws}
        den, num = by.get(RATIO_DEN), by.get(RATIO_NUM)
        if den is None or num is None:
            continue
        default = num.default.throughput.median / den.default.throughput.median if num.default and den.default \
            else None
        out.append(BestRatio(ws, default, num.best.throughput.median / den.best.throughput.median, den.best_name,
                             num.best_name))
    return out
