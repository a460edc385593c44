"""The verdict: per job and layout (nodes x ranks per node), in one line of plain words, which backend is faster and
by how much, with the 95% interval of the throughput ratio (paired rounds: common.report.stats.paired_t_interval;
else the bootstrap of the ratio of medians, common.report.stats.ratio_interval), the
caveats that apply, and beside speed what else was measured: peak memory per rank, GPU energy per image, time to
target; and best vs best, when a job has tuning variants (``RunRecord.tuning.variant``): each backend's fastest
variant per world size next to its default, and the backend ratio of the fastest variants beside the ratio of the
defaults. Only rows of a backend's default way of training take part (``Row.comparable``: default strategy,
synchronous); the fastest is the highest median images/s, a pick that favours a lucky variant when repeats are few.

The rule: with an interval (3 paired rounds, or 6 runs per cell unpaired), an interval containing 1 is "no
significant difference", otherwise the faster backend and its lead with the interval; with fewer runs the line says
what it needs and gives the medians' lead as what it is, not a verdict. The line ends with the design behind it (the
runs or rounds and which interval).

What a line cannot tell is said with it: a backend slower at this size than at the next smaller one (beyond the
interval) makes the comparison one of contention, not scaling; Keras fit's input figure is an upper bound (or absent);
and, in a line of its own before the layouts', runs on CPUs only do not carry to GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from common.cluster import nccl
from common.report.base import NA, in_unit, md_escape, plain
from common.report.machines import binding_mix
from common.report.stats import MIN_CI_RUNS, MIN_PAIRED_ROUNDS, NEEDS_RUNS, ratio_interval
from common.report.summary import (
    JobSummary,
    RatioRow,
    Row,
    cpu_run,
    gpu_run,
    memory_text,
    order_backends,
)
from common.training.inputwait import KEPT_UP_FRACTION

INPUT_BOUND = ("moderately input-bound", "highly input-bound")
NOT_MEASURED = "input wait not measured"  # input_caveat's answer for a fit row whose records hold no input wait


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
    """The design behind the line: how many runs, and which interval."""
    a, b = d.throughput.repeats, n.throughput.repeats
    if q is not None and q.paired:
        left = a + b - 2 * q.pairs  # runs of a round the other backend has not (a failed run)
        out = (f"{plural(q.pairs, 'round')}, paired: every round on the same nodes, t interval of the per-round "
               "ratios")
        return out + (f"; {plural(left, 'run')} without its pair left out" if left else "")
    runs = f"{a} runs each" if a == b else f"{a} {d.identity.plain} and {b} {n.identity.plain} runs"
    return runs + ", bootstrap interval of the ratio of medians" if q is not None and q.ratio_ci else runs


def speed(q: RatioRow, d: Row, n: Row) -> str:
    """Which backend is faster and by how much, with the interval, or why it cannot say."""
    r = q.ratio
    assert r is not None  # both rows exist
    fast, slow, by = (q.num, q.den, r) if r >= 1 else (q.den, q.num, 1 / r)
    if q.ratio_ci is None:
        needs = f"needs {MIN_PAIRED_ROUNDS} paired rounds" if q.paired else NEEDS_RUNS
        return (f"{needs} to say ({_runs(d, n, q)}; by the medians alone {fast} is {lead(by)} faster than "
                f"{slow}, not a verdict)")
    lo, hi = q.ratio_ci
    if lo <= 1 <= hi:
        return (f"no significant difference ({q.num}/{q.den} {r:.3f} [{lo:.3f}, {hi:.3f}]) "
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
    den, num = d.identity.plain, n.identity.plain
    out = []
    md, mn = memory_text(d.resources), memory_text(n.resources)
    if md or mn:
        out.append(f"peak memory per rank {den} {md or 'n/a'}, {num} {mn or 'n/a'}")
    ed, en = d.resources.energy_per_image_j, n.resources.energy_per_image_j
    if ed is not None or en is not None:
        out.append(f"GPU energy per image (GPU only) {den} {_mj(ed)}, {num} {_mj(en)}")
    td, tn = d.validation.ttt, n.validation.ttt
    if d.validation.targeted or n.validation.targeted:
        out.append(f"time to target {den} {_secs(td)}, {num} {_secs(tn)}")
    return out


def _share(x: float) -> str:
    p = 100 * x
    return f"{p:.0f}%" if p >= 10 else f"{p:.1f}%"


def input_caveat(s: JobSummary, r: Row) -> str | None:
    """The row's input caveat: input-bound (the custom loop's fetch, a measure of the wait itself); for Keras fit,
    whose figure holds the host's work between steps too (common.training.inputwait, "gap"), only its upper bound,
    labelled so, when it is not below the kept-up line; for fit rows that recorded none, that it was not measured."""
    b, i = r.identity.backend, r.input
    if i.verdict in INPUT_BOUND:
        return f"{b} {i.verdict}"
    if i.method == "gap" and i.fraction is not None and i.fraction >= KEPT_UP_FRACTION:
        return f"{b} input wait <= {_share(i.fraction)} (upper bound, fit)"
    if i.method is None and s.job.get("mode") == "fit":
        return NOT_MEASURED
    return None


def _smaller(s: JobSummary, row: Row) -> Row | None:
    """The row of the same series (backend label and hardware) at the next smaller world size (on the same node
    count when there is one), or None."""
    below = [r for r in s.rows if r.identity.series == row.identity.series
             and r.identity.world_size < row.identity.world_size]
    if not below:
        return None
    ws = max(r.identity.world_size for r in below)
    at = [r for r in below if r.identity.world_size == ws]
    return next((r for r in at if r.layout_counts[0] == row.layout_counts[0]), at[0])


def collectives_by_size(s: JobSummary, row: Row) -> str | None:
    """"mpi at 1 replica, gloo at 2" when the row's series used different collectives at different sizes, else None."""
    sizes: dict[int, str] = {}
    for r in sorted(s.rows, key=lambda r: r.identity.world_size):
        if r.identity.series == row.identity.series and r.facts.collective:
            sizes.setdefault(r.identity.world_size, r.facts.collective)
    if len(set(sizes.values())) < 2:
        return None
    parts = [f"{c} at {ws}" for ws, c in sizes.items()]
    return parts[0] + (" replica" if next(iter(sizes)) == 1 else " replicas") + ", " + ", ".join(parts[1:])


def slowdown(s: JobSummary, row: Row) -> str | None:
    """"0.51x [0.45, 0.58] of 1 replica" when the row's throughput is below that of its series' next smaller size
    beyond the interval: the bootstrap 95% interval of the ratio with 6 runs a cell, else the two cells' ranges
    apart; None otherwise (no smaller size, not slower, or a cell of one run)."""
    prev = _smaller(s, row)
    if prev is None:
        return None
    ratio = row.throughput.median / prev.throughput.median
    ci = ratio_interval(row.throughput.ips, prev.throughput.ips)
    a, b = row.throughput.interval, prev.throughput.interval
    if ci is not None:
        slower, how = ci[1] < 1, f" [{ci[0]:.2f}, {ci[1]:.2f}]"
    else:
        slower, how = a is not None and b is not None and a.high < b.low, " (ranges apart)"
    ws = prev.identity.world_size
    return f"{ratio:.2f}x{how} of {ws} replica{'' if ws == 1 else 's'}" if slower else None


def contention(s: JobSummary, d: Row, n: Row) -> str | None:
    """When a backend's throughput fell from the smaller size to this one: the comparison here measures how the
    ranks contend for the machine (cores, memory, links), not how the backends scale."""
    slow = [(r, x) for r in (d, n) if (x := slowdown(s, r))]
    if not slow:
        return None
    parts = []
    for r, x in slow:
        by = collectives_by_size(s, r)
        parts.append(f"{r.identity.backend} {x}" + (f", its collective {by}" if by else ""))
    who = "both backends" if len(slow) == 2 else slow[0][0].identity.backend
    return (f"{who} slower with more workers ({'; '.join(parts)}): at this size the comparison measures contention, "
            "not scaling")


def scope_lines(s: JobSummary) -> list[str]:
    """What the job's verdict cannot tell, in lines of their own before the layouts': runs on CPUs only (every
    record's ``devices``) do not carry to GPUs with NCCL."""
    recs = s.records
    compared = any(q.den_row and q.num_row for q in s.ratios)
    if not compared or not all(cpu_run(r) for r in recs) or any(gpu_run(r) for r in recs):
        return []
    used = [f"{r.identity.backend} {r.facts.collective}" for r in s.rows if r.facts.collective]
    what = f"; collectives {', '.join(dict.fromkeys(used))}" if used else ""
    return [f"CPUs only (every run's devices: cpu{what}): this says which backend was faster on this machine's cores; "
            "it does not carry to GPUs, where both backends all-reduce with NCCL by default"]


def caveats(s: JobSummary, q: RatioRow, d: Row, n: Row) -> list[str]:
    """What makes this pair's comparison less than like for like."""
    out = []
    if q.caveat:
        out.append(f"collectives not like for like ({q.caveat})")
    if (busy := contention(s, d, n)) is not None:
        out.append(busy)
    found = [(r.identity.backend, c) for r in (d, n) if (c := input_caveat(s, r)) is not None]
    unmeasured = [b for b, c in found if c == NOT_MEASURED]
    out += [c for _, c in found if c != NOT_MEASURED]
    if unmeasured:
        out.append(f"input wait not measured ({' and '.join(unmeasured)}, fit): whether the input kept up is unknown")
    for r in (d, n):
        if r.facts.same_batches:
            out.append(f"{r.identity.backend}'s ranks all got the same first batches in {r.facts.same_batches} of "
                       f"{r.throughput.repeats} run(s): its input function does not shard, every worker trained on "
                       "the same data")
    network = nccl.mismatch(n.facts.nccl, d.facts.nccl, (q.num, q.den))  # IB on one side, sockets on the other
    if network:
        out.append(network)
    if d.identity.layout != n.identity.layout or d.identity.num_workers != n.identity.num_workers:
        out.append(f"different layouts ({q.den} {d.identity.layout} with {d.identity.num_workers} workers, "
                   f"{q.num} {n.identity.layout} with {n.identity.num_workers})")
    if s.version_mix:
        out.append(f"mixed software versions ({'; '.join(s.version_mix)})")
    if binding_mix(s.records):
        out.append("CPU binding differs between runs")
    best = next((b for b in best_ratios(best_rows(s), (q.num, q.den))
                 if (b.world_size, b.layout) == (q.world_size, q.layout)), None)
    if best is not None and best.best_ratio is not None and (best.den_best, best.num_best) != ("default", "default"):
        out.append(f"tuned variants ran: best vs best {q.num}/{q.den} {best.best_ratio:.3f} "
                   f"({q.den} {best.den_best}, {q.num} {best.num_best})")
    return out


def job_verdicts(s: JobSummary) -> list[Verdict]:
    """One verdict per compared pair and layout (and machine), in the ratio tables' order; with several pairs each
    line names its pair."""
    out = []
    for q in s.ratios:
        d, n = q.den_row, q.num_row
        if d is None and n is None:
            continue
        where = (f"{q.num} vs {q.den}, " if len(s.pairs) > 1 else "") + layout_words(d or n) \
            + (f" on {q.machine}" if q.machine else "")
        if d is None or n is None:
            only = (d or n).identity.backend
            out.append(Verdict(s.job_hash, where, f"{where}: only {only} ran, no comparison"))
            continue
        parts = [speed(q, d, n), *beside(d, n)]
        cav = caveats(s, q, d, n)
        text = f"{where}: " + "; ".join(parts) + (f". Caveats: {'; '.join(cav)}" if cav else "")
        out.append(Verdict(s.job_hash, where, text))
    return out


def verdict_texts(s: JobSummary) -> list[str]:
    """The job's verdict lines: what they cannot tell (``scope_lines``), then one per layout (so that the layouts'
    lines end the printed output)."""
    vs = job_verdicts(s)
    return [*scope_lines(s), *(v.text for v in vs)] if vs else []


def like_for_like(s: JobSummary, q: RatioRow) -> str:
    """The ratio table's cell: "no: <why>", "yes", or "yes (horovod collective mpi at 1 replica, gloo at 2)" when a
    side's collective changes with the size (its speedup then compares two collectives too); n/a when unknown."""
    if q.caveat or q.ratio is None or not (q.den_collective and q.num_collective):
        return f"no: {q.caveat}" if q.caveat else NA
    by = [f"{r.identity.backend} collective {c}" for r in (q.den_row, q.num_row)
          if r and (c := collectives_by_size(s, r))]
    return f"yes ({'; '.join(by)})" if by else "yes"


def verdict_title(s: JobSummary) -> str:
    """The line introducing a job's verdicts (inline markup: the name and hash as code)."""
    return f"`{md_escape(s.name)}` (`{s.job_hash}`), {', '.join(f'{a} vs {b}' for a, b in s.pairs)}:"


def verdict_lines(summaries: Sequence[JobSummary]) -> list[str]:
    """Every job's verdict lines, each job introduced by its title (plain text)."""
    out = []
    for s in summaries:
        vs = job_verdicts(s)
        if vs:
            out.append(plain(verdict_title(s)))
            out += [f"  {in_unit(t, s.unit)}" for t in verdict_texts(s)]
    return out


VERDICT_NOTE = (f"Faster = higher images/s. When both backends ran in rounds on the same nodes (the demo's rounds, a "
                f"sweep's with one allocation), the interval is paired: the 95% t interval of the geometric mean of "
                f"the per-round numerator/denominator ratios, from {MIN_PAIRED_ROUNDS} rounds; otherwise the "
                f"bootstrap 95% interval of the ratio of medians (both cells resampled), from {MIN_CI_RUNS} runs a "
                "cell. Shown as each side's lead; an interval containing 1 is no significant difference; fewer runs "
                "give no interval, so no verdict. Peak memory per rank: the largest "
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
    """A compared pair's ratio at one world size and layout, of the defaults and of the fastest variants (None: a
    side is missing)."""

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


def best_ratios(cells: list[BestRow], pair: tuple[str, str]) -> list[BestRatio]:
    """``pair``'s ratio (numerator, denominator) at every world size and layout where both backends have rows
    (never across layouts)."""
    out = []
    for ws, layout in sorted(dict.fromkeys((c.world_size, c.layout) for c in cells)):
        by = {c.backend: c for c in cells if (c.world_size, c.layout) == (ws, layout)}
        den, num = by.get(pair[1]), by.get(pair[0])
        if den is None or num is None:
            continue
        default = num.default.throughput.median / den.default.throughput.median if num.default and den.default \
            else None
        out.append(BestRatio(ws, layout, default, num.best.throughput.median / den.best.throughput.median,
                             den.best_name, num.best_name))
    return out
