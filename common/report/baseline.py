"""Regression against a baseline (``python -m common.report NEW --baseline OLD [--tolerance 5%]``): per cell (job
hash, backend row, replicas, layout) the change of median throughput NEW / OLD with the bootstrap 95% interval of
that ratio (common.report.stats.ratio_interval: the same resampling as the backend ratio), the change of final loss
and validation numbers, what differs between the two software stacks as the records say them, and a verdict per
cell: faster, same or slower beyond the tolerance.

A cell is *slower* when its median fell by more than the tolerance and, with 6 or more runs on each side, the whole
interval lies below 1 (the fall is not noise); *faster* the other way round; else *same*. With fewer runs the
medians decide, and the cell says so. Mixed versions inside NEW or inside OLD are refused or allowed as in any
report; across NEW and OLD they are what is compared.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from common.cluster.machine import section
from common.core.results import RunRecord
from common.report.base import NA
from common.report.converge import parse_width, percent
from common.report.document import Block, Heading, Para, table
from common.report.load import versions_by_key
from common.report.rows import JobSummary, Row
from common.report.stats import NEEDS_RUNS, ratio_interval

EXIT_SLOWER = 4  # a cell is slower than the baseline beyond the tolerance
SLOWER, SAME, FASTER, ONLY_NEW, ONLY_OLD = "slower", "same", "faster", "only in NEW", "only in OLD"
# What a centre would want to compare but no record holds: listed as missing, never guessed.
NOT_RECORDED = ("twinbench's own version", "the loaded environment modules (module list)",
                "the NCCL runtime TensorFlow loads (only the NCCL Horovod was built with is recorded)",
                "the CUDA runtime and driver of a machine without GPUs")
MACHINE_FACTS = (("cuda", "TF built for CUDA"), ("cudnn", "TF built for cuDNN"), ("nccl", "NCCL (Horovod's build)"),
                 ("mpi", "MPI"))


def parse_tolerance(text: str) -> float:
    """``--tolerance`` as a fraction ("5%" or 0.05; the rule of ``--until``'s widths); ValueError otherwise."""
    try:
        return parse_width(text)
    except ValueError as e:
        raise ValueError(str(e).replace("--until", "--tolerance").replace("width", "tolerance")) from None


@dataclass(frozen=True)
class CellChange:
    """One cell of NEW against the same cell of OLD."""

    job: str  # "name (hash)"
    cell: str  # e.g. "native 2 replicas (1x2)"
    old: Row | None
    new: Row | None
    ratio: float | None  # new median / old median
    ci: tuple[float, float] | None  # bootstrap 95% interval of ``ratio`` (None: a side has < 6 runs)
    verdict: str

    @property
    def change(self) -> str:
        """e.g. "-10.0% [-11.5%, -8.6%]", "+3.1% (needs 6 runs per cell)", n/a."""
        if self.ratio is None:
            return NA
        text = f"{100 * (self.ratio - 1):+.1f}%"
        return text + (f" [{100 * (self.ci[0] - 1):+.1f}%, {100 * (self.ci[1] - 1):+.1f}%]" if self.ci
                       else f" ({NEEDS_RUNS})")


def _key(s: JobSummary, r: Row) -> tuple[str, str, int, str]:
    return s.job_hash, r.identity.label, r.identity.world_size, r.identity.layout


def _cell_name(r: Row) -> str:
    i = r.identity
    return f"{i.label} {i.world_size} replica{'' if i.world_size == 1 else 's'} ({i.layout})"


def judge(ratio: float, ci: tuple[float, float] | None, tolerance: float) -> str:
    """faster / same / slower beyond ``tolerance`` (see the module's rule)."""
    if ratio < 1 - tolerance and (ci is None or ci[1] < 1):
        return SLOWER
    if ratio > 1 + tolerance and (ci is None or ci[0] > 1):
        return FASTER
    return SAME


def compare_cells(new: Sequence[JobSummary], old: Sequence[JobSummary], tolerance: float) -> list[CellChange]:
    """Every cell of NEW and OLD, matched on job hash, row label, replicas and layout (NEW's order, then cells only
    OLD has)."""
    olds = {_key(s, r): (s, r) for s in old for r in s.rows}
    out, seen = [], set()
    for s in new:
        for r in s.rows:
            k = _key(s, r)
            seen.add(k)
            job = f"{s.name} ({s.job_hash})"
            if k not in olds:
                out.append(CellChange(job, _cell_name(r), None, r, None, None, ONLY_NEW))
                continue
            o = olds[k][1]
            ratio = r.throughput.median / o.throughput.median
            ci = ratio_interval(r.throughput.ips, o.throughput.ips)
            out.append(CellChange(job, _cell_name(r), o, r, ratio, ci, judge(ratio, ci, tolerance)))
    for k, (s, o) in olds.items():
        if k not in seen:
            out.append(CellChange(f"{s.name} ({s.job_hash})", _cell_name(o), o, None, None, None, ONLY_OLD))
    return out


def stack_facts(runs: Sequence[RunRecord]) -> dict[str, set[str]]:
    """What a set of runs says of its software stack and hardware: versions (python, tensorflow, tf_keras,
    horovod, its patch, numpy), what TF was built for, NCCL, MPI, GPU driver, CPU and GPU models."""
    out: dict[str, set[str]] = {k: set(v) for k, v in versions_by_key(runs).items()}
    for r in runs:
        m = r.machine if isinstance(r.machine, Mapping) else None
        if m is None:
            continue
        for libs in section(m, "libraries"):
            for key, name in MACHINE_FACTS:
                if isinstance(libs, Mapping) and libs.get(key):
                    out.setdefault(name, set()).add(str(libs[key]).split(",")[0])
        for g in section(m, "gpu"):
            if isinstance(g, Mapping) and g.get("driver"):
                out.setdefault("GPU driver", set()).add(str(g["driver"]))
        out.setdefault("CPU model", set()).update(map(str, m.get("distinct_cpu_models") or ()))
        out.setdefault("GPU model", set()).update(map(str, m.get("distinct_gpu_models") or ["no GPU"]))
    return out


def _values(values: set[str]) -> str:
    return " + ".join(sorted(values)) or "not recorded"


def stack_diff(new: Sequence[RunRecord], old: Sequence[RunRecord]) -> list[str]:
    """"tensorflow 2.18.1 -> 2.21.0" for every stack fact that differs between OLD and NEW ("not recorded" where
    one side lacks it)."""
    a, b = stack_facts(old), stack_facts(new)
    out = []
    for key in dict.fromkeys([*a, *b]):
        va, vb = a.get(key, set()), b.get(key, set())
        if va != vb:
            out.append(f"{key} {_values(va)} -> {_values(vb)}")
    return out


def _value(x: float | None) -> str:
    return NA if x is None else f"{x:.4g}"


def quality(c: CellChange) -> str:
    """Final loss and validation numbers, OLD -> NEW, e.g. "loss 0.512 -> 0.498; val accuracy 0.91 -> 0.90"."""
    if c.old is None or c.new is None:
        return NA
    parts = [f"loss {_value(c.old.facts.final_loss)} -> {_value(c.new.facts.final_loss)}"]
    o, n = c.old.validation.final, c.new.validation.final
    parts += [f"val {k} {_value(o.get(k))} -> {_value(n.get(k))}" for k in dict.fromkeys([*o, *n])]
    return "; ".join(parts)


BASELINE_HEADER = ("job", "cell", "runs (old / new)", "old images/s", "new images/s", "change [bootstrap 95% CI]",
                   "final loss, validation (old -> new)", "verdict")


def baseline_table(changes: Sequence[CellChange]) -> tuple[tuple[str, ...], list[list[str]]]:
    """The per-cell table as header and text cells."""
    def ips(r: Row | None) -> str:
        return NA if r is None else f"{r.throughput.median:.1f}"

    def runs(r: Row | None) -> str:
        return "0" if r is None else str(r.throughput.repeats)

    return BASELINE_HEADER, [[c.job, c.cell, f"{runs(c.old)} / {runs(c.new)}", ips(c.old), ips(c.new), c.change,
                              quality(c), c.verdict] for c in changes]


@dataclass(frozen=True)
class Baseline:
    """NEW against OLD: the cells, the stack differences, what the records do not hold, the tolerance."""

    changes: list[CellChange]
    stack: list[str]
    tolerance: float

    @property
    def slower(self) -> list[CellChange]:
        return [c for c in self.changes if c.verdict == SLOWER]

    def summary_line(self) -> str:
        """The one line that decides the exit status."""
        tol = percent(self.tolerance)
        stack = (f"; the stacks differ in {', '.join(self.stack)}" if self.stack
                 else "; the stacks recorded are identical")
        if self.slower:
            cells = "; ".join(f"{c.job} {c.cell} {c.change}" for c in self.slower)
            return f"slower than the baseline beyond {tol}: {cells}{stack}"
        compared = sum(c.ratio is not None for c in self.changes)
        return f"no cell slower than the baseline beyond {tol} ({compared} cells compared){stack}"

    def lines(self) -> list[str]:
        """What the section says under its table: stack differences, what is not recorded, how cells are judged."""
        return [f"Stack differences (OLD -> NEW): {'; '.join(self.stack) or 'none recorded'}.",
                f"Not in the records, so not compared: {'; '.join(NOT_RECORDED)}.",
                "A cell is slower (faster) when its median images/s fell (rose) by more than "
                f"{percent(self.tolerance)} and, with 6 or more runs on each side, the bootstrap 95% interval of "
                "NEW/OLD lies wholly below (above) 1; with fewer runs the medians decide "
                f"({NEEDS_RUNS} for an interval).",
                self.summary_line()]


def compare(new: Sequence[JobSummary], old: Sequence[JobSummary], tolerance: float) -> Baseline:
    """NEW's jobs against OLD's."""
    return Baseline(compare_cells(new, old, tolerance),
                    stack_diff([r for s in new for r in s.records], [r for s in old for r in s.records]), tolerance)


def baseline_part(b: Baseline, old_sources: Sequence[str]) -> list[Block]:
    """The section against the baseline (after the verdict)."""
    return [Heading("Against the baseline", 2),
            Para(f"NEW = this report's results; OLD = {', '.join(old_sources)}; tolerance {percent(b.tolerance)}."),
            table(*baseline_table(b.changes)), *(Para(x) for x in b.lines())]
