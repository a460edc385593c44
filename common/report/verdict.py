"""The verdict: per job and layout (nodes x ranks per node), in one line of plain words, which backend is faster and
by how much, with the bootstrap 95% interval of the throughput ratio (common.report.stats.ratio_interval), the
caveats that apply, and beside speed what else was measured: peak memory per rank, GPU energy per image, time to
target; and best vs best, when a job has tuning variants (``RunRecord.tuning.variant``): each backend's fastest
variant per world size next to its default, and the backend ratio of the fastest variants beside the ratio of the
defaults. Only rows of a backend's default way of training take part (``Row.comparable``: default strategy,
synchronous); the fastest is the highest median images/s, a pick that favours a lucky variant when repeats are few.

The rule: with 6 or more runs per cell, an interval containing 1 is "no significant difference", otherwise the
faster backend and its lead with the interval; with fewer runs the line says it needs 6 runs per cell and gives the
medians' lead as what it is, not a verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from common.cluster import nccl
from common.report.base import in_unit, md_escape, plain
from common.report.machines import binding_mix
from common.report.rows import RATIO_DEN, RATIO_NUM, JobSummary, RatioRow, Row, memory_text, order_backends
from common.report.stats import MIN_CI_RUNS, NEEDS_RUNS

INPUT_BOUND = ("moderately input-bound", "highly input-bound")


@dataclass(frozen=True)
class Verdict:
    """One layout's verdict line and the job it belongs to."""

    job_hash: str
    layout: str  # e.g. "2 nodes x 4 ranks"
    text: str  # the whole line, layout first


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def layout_words(row: Row) -> str:
    """"2 nodes x 4 ranks" (ranks per node), "2 nodes, uneven ranks per node (3+1)", "unknown layout"."""
    nodes, per = row.layout_counts
    if nodes is None:
        return "unknown layout"
    if per is None:
        return f"{plural(nodes, 'node')}, uneven ranks per node {row.identity.layout.split('x', 1)[1]}"
    return f"{plural(nodes, 'node')} x {plural(per, 'rank')}"


def lead(x: float) -> str:
    """A ratio above 1 as the percentage it leads by: 1.123 -> "12%", 1.034 -> "3.4%"."""
    p = 100 * (x - 1)
    return f"{p:.0f}%" if abs(p) >= 10 else f"{p:.1f}%"


def _runs(d: Row, n: Row, q: RatioRow | None = None) -> str:
    a, b = d.throughput.repeats, n.throughput.repeats
    if q is not None and q.paired:
        return f"{a} runs each, paired: every round on the same nodes"
    return f"{a} runs each" if a == b else f"{a} {RATIO_DEN} and {b} {RATIO_NUM} runs"


def speed(q: RatioRow, d: Row, n: Row) -> str:
    """Which backend is faster and by how much, with the interval, or why it cannot say."""
    r = q.ratio
    assert r is not None  # both rows exist
    fast, slow, by = (RATIO_NUM, RATIO_DEN, r) if r >= 1 else (RATIO_DEN, RATIO_NUM, 1 / r)
    if q.ratio_ci is None:
        return (f"{NEEDS_RUNS} to say ({_runs(d, n, q)}; by the medians alone {fast} is {lead(by)} faster than "
                f"{slow}, not a verdict)")
    lo, hi = q.ratio_ci
    if lo <= 1 <= hi:
        return (f"no significant difference ({RATIO_NUM}/{RATIO_DEN} {r:.3f} [{lo:.3f}, {hi:.3f}]) "
                f"({_runs(d, n, q)})")
    low, high = (lo, hi) if r >= 1 else (1 / hi, 1 / lo)
    return f"{fast} is {lead(by)} faster than {slow} [{lead(low)}, {lead(high)}] ({_runs(d, n, q)})"


def _mj(joules: float | None) -> str:
    if joules is None:
        return "n/a"
    return f"{joules:.3g} J" if joules >= 1 else f"{joules * 1e3:.3g} mJ"


def _secs(seconds: float | None) -> str:
    return "not reached" if seconds is None else f"{seconds:.1f} s"


def beside(d: Row, n: Row) -> list[str]:
    """Peak memory per rank, GPU energy per image and time to target, where the rows have them."""
    out = []
    md, mn = memory_text(d.resources), memory_text(n.resources)
    if md or mn:
        out.append(f"peak memory per rank {RATIO_DEN} {md or 'n/a'}, {RATIO_NUM} {mn or 'n/a'}")
    ed, en = d.resources.energy_per_image_j, n.resources.energy_per_image_j
    if ed is not None or en is not None:
        out.append(f"GPU energy per image (GPU only) {RATIO_DEN} {_mj(ed)}, {RATIO_NUM} {_mj(en)}")
    td, tn = d.validation.ttt, n.validation.ttt
    if d.validation.targeted or n.validation.targeted:
        out.append(f"time to target {RATIO_DEN} {_secs(td)}, {RATIO_NUM} {_secs(tn)}")
    return out


def caveats(s: JobSummary, q: RatioRow, d: Row, n: Row) -> list[str]:
    """What makes this pair's comparison less than like for like."""
    out = []
    if q.caveat:
        out.append(f"collectives not like for like ({q.caveat})")
    for r in (d, n):
        if r.input.verdict in INPUT_BOUND:
            out.append(f"{r.identity.backend} {r.input.verdict}")
    for r in (d, n):
        if r.facts.same_batches:
            out.append(f"{r.identity.backend}'s ranks all got the same first batches in {r.facts.same_batches} of "
                       f"{r.throughput.repeats} run(s): its input function does not shard, every worker trained on "
                       "the same data")
    network = nccl.mismatch(n.facts.nccl, d.facts.nccl, (RATIO_NUM, RATIO_DEN))  # IB on one side, sockets on the other
    if network:
        out.append(network)
    if d.identity.layout != n.identity.layout or d.identity.num_workers != n.identity.num_workers:
        out.append(f"different layouts ({RATIO_DEN} {d.identity.layout} with {d.identity.num_workers} workers, "
                   f"{RATIO_NUM} {n.identity.layout} with {n.identity.num_workers})")
    if s.version_mix:
        out.append(f"mixed software versions ({'; '.join(s.version_mix)})")
    if binding_mix(s.records):
        out.append("CPU binding differs between runs")
    best = next((b for b in best_ratios(best_rows(s)) if (b.world_size, b.layout) == (q.world_size, q.layout)), None)
    if best is not None and best.best_ratio is not None and (best.den_best, best.num_best) != ("default", "default"):
        out.append(f"tuned variants ran: best vs best {RATIO_NUM}/{RATIO_DEN} {best.best_ratio:.3f} "
                   f"({RATIO_DEN} {best.den_best}, {RATIO_NUM} {best.num_best})")
    return out


def job_verdicts(s: JobSummary) -> list[Verdict]:
    """One verdict per layout (and machine) of the job's backend pairs, in the ratio table's order."""
    out = []
    for q in s.ratios:
        d, n = q.den_row, q.num_row
        if d is None and n is None:
            continue
        where = layout_words(d or n) + (f" on {q.machine}" if q.machine else "")
        if d is None or n is None:
            only = (d or n).identity.backend
            out.append(Verdict(s.job_hash, where, f"{where}: only {only} ran, no comparison"))
            continue
        parts = [speed(q, d, n), *beside(d, n)]
        cav = caveats(s, q, d, n)
        text = f"{where}: " + "; ".join(parts) + (f". Caveats: {'; '.join(cav)}" if cav else "")
        out.append(Verdict(s.job_hash, where, text))
    return out


def verdict_title(s: JobSummary) -> str:
    """The line introducing a job's verdicts (inline markup: the name and hash as code)."""
    return f"`{md_escape(s.name)}` (`{s.job_hash}`), {RATIO_NUM} vs {RATIO_DEN}:"


def verdict_lines(summaries: Sequence[JobSummary]) -> list[str]:
    """Every job's verdict lines, each job introduced by its title (plain text)."""
    out = []
    for s in summaries:
        vs = job_verdicts(s)
        if vs:
            out.append(plain(verdict_title(s)))
            out += [f"  {in_unit(v.text, s.unit)}" for v in vs]
    return out


VERDICT_NOTE = (f"Faster = higher median images/s; the interval is the bootstrap 95% interval of the "
                f"{RATIO_NUM}/{RATIO_DEN} ratio of medians (both cells resampled), shown as each side's lead; an "
                "interval containing 1 is no significant difference; fewer than "
                f"{MIN_CI_RUNS} runs in a cell give no interval, so no verdict. Peak memory per rank: the largest "
                "rank's, GPU (TensorFlow allocator peak) when recorded, else host RSS; median over repeats.")


# -- best vs best --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BestRow:
    """One backend at one world size and layout: its default-knob row and its fastest row (the default itself,
    possibly)."""

    backend: str
    world_size: int
    layout: str  # nodes x ranks per node: best vs best never compares two layouts
    default: Row | None  # None: only variants ran at this size and layout
    best: Row

    @property
    def best_name(self) -> str:
        return self.best.identity.variant or "default"


@dataclass(frozen=True)
class BestRatio:
    """``registry.RATIO`` at one world size and layout, of the defaults and of the fastest variants (None: a side is
    missing)."""

    world_size: int
    layout: str
    default_ratio: float | None
    best_ratio: float | None
    den_best: str  # the denominator's fastest variant ("default" or its label)
    num_best: str


def _fastest(rows: list[Row]) -> Row | None:
    return max(rows, key=lambda r: r.throughput.median) if rows else None


def best_rows(s: JobSummary) -> list[BestRow]:
    """Per backend (registry order), world size and layout, the default and the fastest row; empty without
    variants."""
    rows = [r for r in s.rows if r.identity.comparable]
    if not any(r.identity.variant for r in rows):
        return []
    out = []
    for b in order_backends(r.identity.backend for r in rows):
        mine = [r for r in rows if r.identity.backend == b]
        for ws, layout in sorted(dict.fromkeys((r.identity.world_size, r.identity.layout) for r in mine)):
            cell = [r for r in mine if (r.identity.world_size, r.identity.layout) == (ws, layout)]
            best = _fastest(cell)
            assert best is not None  # the cell holds at least the row that put (ws, layout) in the set
            out.append(BestRow(b, ws, layout, _fastest([r for r in cell if r.identity.variant is None]), best))
    return out


def best_ratios(cells: list[BestRow]) -> list[BestRatio]:
    """The backend ratio at every world size and layout where both backends have rows (never across layouts)."""
    out = []
    for ws, layout in sorted(dict.fromkeys((c.world_size, c.layout) for c in cells)):
        by = {c.backend: c for c in cells if (c.world_size, c.layout) == (ws, layout)}
        den, num = by.get(RATIO_DEN), by.get(RATIO_NUM)
        if den is None or num is None:
            continue
        default = num.default.throughput.median / den.default.throughput.median if num.default and den.default \
            else None
        out.append(BestRatio(ws, layout, default, num.best.throughput.median / den.best.throughput.median,
                             den.best_name, num.best_name))
    return out
