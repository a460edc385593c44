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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from common.cluster.machine import section
from common.core import registry
from common.core.results import RunRecord
from common.report.base import NA, fmt_value
from common.report.converge import parse_width, percent
from common.report.document import Block, Heading, Para, table
from common.report.load import versions_by_key
from common.report.stats import NEEDS_RUNS, ratio_interval
from common.report.summary import JobSummary, Row

EXIT_SLOWER = 4  # a cell is slower than the baseline beyond the tolerance
EXIT_UNCOMPARED = 5  # no cell is slower, but a cell of NEW or OLD has no counterpart: not a pass
SLOWER, SAME, FASTER, ONLY_NEW, ONLY_OLD = "slower", "same", "faster", "only in NEW", "only in OLD"
# What a centre would want to compare but no record holds: listed as missing, never guessed.
NOT_RECORDED = ("twinbench's own version", "the loaded environment modules (module list)",
                "the NCCL runtime TensorFlow loads (only the NCCL Horovod was built with is recorded)",
                "the CUDA runtime and driver of a machine without GPUs")
# The ``versions`` keys that hold a fact of NOT_RECORDED once a record keeps it (then a difference is a stack change).
RECORDED_AS = {"twinbench's own version": "twinbench", "the loaded environment modules (module list)": "modules"}
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
    """What a cell is matched on: job, backend (with its strategy and machine, without its tuning), size, layout."""
    return s.job_hash, r.identity.family, r.identity.world_size, r.identity.layout


def _cell_name(r: Row, other: Row | None = None) -> str:
    """The cell, e.g. "native 2 replicas (1x2)"; "horovod (cycle 10 ms) [OLD horovod] 2 replicas (2x1)" when the two
    sides' tuning labels differ."""
    i = r.identity
    label = i.label if other is None or other.identity.label == i.label else f"{i.label} [OLD {other.identity.label}]"
    return f"{label} {i.world_size} replica{'' if i.world_size == 1 else 's'} ({i.layout})"


def _match(new: list[Row], old: list[Row]) -> tuple[list[tuple[Row, Row]], list[Row], list[Row]]:
    """The pairs of one cell key (whatever their tuning labels: one row a side is a pair), and the rows left."""
    if len(new) == 1 and len(old) == 1:
        return [(new[0], old[0])], [], []
    pairs = [(n, o) for n in new for o in old if n.identity.label == o.identity.label]
    left_new = [n for n in new if all(n is not p[0] for p in pairs)]
    left_old = [o for o in old if all(o is not p[1] for p in pairs)]
    if len(left_new) == 1 and len(left_old) == 1:
        return [*pairs, (left_new[0], left_old[0])], [], []
    return pairs, left_new, left_old


def judge(ratio: float, ci: tuple[float, float] | None, tolerance: float) -> str:
    """faster / same / slower beyond ``tolerance`` (see the module's rule)."""
    if ratio < 1 - tolerance and (ci is None or ci[1] < 1):
        return SLOWER
    if ratio > 1 + tolerance and (ci is None or ci[0] > 1):
        return FASTER
    return SAME


def compare_cells(new: Sequence[JobSummary], old: Sequence[JobSummary], tolerance: float) -> list[CellChange]:
    """Every cell of NEW and OLD, matched on job hash, backend, replicas and layout whatever their tuning labels
    (a tuning change is what a stack update brings; the knobs it changed are in the stacks' differences); NEW's order,
    then cells only OLD has."""
    groups: dict[tuple[str, str, int, str], tuple[list[Row], list[Row]]] = {}
    names: dict[tuple[str, str, int, str], str] = {}
    for side, summaries in ((0, new), (1, old)):
        for s in summaries:
            for r in s.rows:
                k = _key(s, r)
                groups.setdefault(k, ([], []))[side].append(r)
                names.setdefault(k, f"{s.name} ({s.job_hash})")
    out = []
    for k, (n_rows, o_rows) in groups.items():
        pairs, only_new, only_old = _match(n_rows, o_rows)
        for r, o in pairs:
            ratio = r.throughput.median / o.throughput.median
            ci = ratio_interval(r.throughput.ips, o.throughput.ips)
            out.append(CellChange(names[k], _cell_name(r, o), o, r, ratio, ci, judge(ratio, ci, tolerance)))
        out += [CellChange(names[k], _cell_name(r), None, r, None, None, ONLY_NEW) for r in only_new]
        out += [CellChange(names[k], _cell_name(o), o, None, None, None, ONLY_OLD) for o in only_old]
    return out


def stack_facts(runs: Sequence[RunRecord], env_names: Iterable[str] = ()) -> dict[str, set[str]]:
    """What a set of runs says of its software stack, tuning and hardware: every ``versions`` key (python,
    tensorflow, tf_keras, horovod, its patch, numpy, and whatever else the record keeps there), each backend's tuning
    knobs and the tuning environment the ranks saw (``tuning``: ``env_names`` a run did not see are "unset"; a
    variable named for another backend, ``env_owner``, is left out of a run's facts), what
    TF was built for, NCCL, MPI, GPU driver, CPU and GPU models."""
    out: dict[str, set[str]] = {k: set(v) for k, v in versions_by_key(runs).items()}
    for r in runs:
        t = r.tuning if isinstance(r.tuning, Mapping) else None
        if t is not None:
            for knob, value in (t.get("knobs") or {}).items():
                out.setdefault(f"{r.backend} {knob}", set()).add(fmt_value(value))
            env = t.get("env") or {}
            for name in (n for n in env_names if env_owner(n) in (None, r.backend)):
                out.setdefault(f"{r.backend} environment {name}", set()).add(str(env.get(name, "unset")))
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


def env_owner(name: str) -> str | None:
    """The backend an environment variable tunes when its name says so (``HOROVOD_*``: the backend named horovod),
    else None (NCCL_*, TF_*...: any backend may read it). Another backend's variable is not a stack fact of a run:
    its ranks may see it (an exported sweep environment) but never read it."""
    return next((b for b in registry.names() if name.startswith(f"{b.upper()}_")), None)


def _env_names(runs: Sequence[RunRecord]) -> set[str]:
    return {str(k) for r in runs if isinstance(r.tuning, Mapping) for k in (r.tuning.get("env") or {})}


def _values(values: set[str]) -> str:
    return " + ".join(sorted(values)) or "not recorded"


def stack_diff(new: Sequence[RunRecord], old: Sequence[RunRecord]) -> list[str]:
    """"tensorflow 2.18.1 -> 2.21.0" for every stack fact that differs between OLD and NEW ("not recorded" where
    one side lacks it)."""
    names = _env_names([*new, *old])
    a, b = stack_facts(old, names), stack_facts(new, names)
    out = []
    for key in dict.fromkeys([*a, *b]):
        va, vb = a.get(key, set()), b.get(key, set())
        if va != vb:
            out.append(f"{key} {_values(va)} -> {_values(vb)}")
    return out


def not_recorded(runs: Sequence[RunRecord]) -> list[str]:
    """What a centre would compare that no run records (``NOT_RECORDED``: listed, never guessed); a fact some run
    keeps under its ``versions`` key (``RECORDED_AS``) is compared with the other versions instead."""
    keys = set(versions_by_key(runs))
    return [what for what in NOT_RECORDED if RECORDED_AS.get(what) not in keys]


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
    unrecorded: list[str] = field(default_factory=list)  # NOT_RECORDED facts no run keeps

    @property
    def slower(self) -> list[CellChange]:
        return [c for c in self.changes if c.verdict == SLOWER]

    @property
    def uncompared(self) -> list[CellChange]:
        """Cells of one side without a counterpart on the other: the check cannot say they did not regress."""
        return [c for c in self.changes if c.ratio is None]

    @property
    def exit_status(self) -> int:
        return EXIT_SLOWER if self.slower else EXIT_UNCOMPARED if self.uncompared else 0

    def summary_line(self) -> str:
        """The one line that decides the exit status."""
        tol = percent(self.tolerance)
        stack = (f"; the stacks differ in {', '.join(self.stack)}" if self.stack
                 else "; the stacks recorded are identical")
        missing = (f"; {len(self.uncompared)} cell(s) could not be compared: "
                   + "; ".join(f"{c.job} {c.cell} {c.verdict}" for c in self.uncompared)) if self.uncompared else ""
        if self.slower:
            cells = "; ".join(f"{c.job} {c.cell} {c.change}" for c in self.slower)
            return f"slower than the baseline beyond {tol}: {cells}{missing}{stack}"
        compared = len(self.changes) - len(self.uncompared)
        if self.uncompared:
            return f"not every cell compared (none slower beyond {tol} of {compared} compared){missing}{stack}"
        return f"no cell slower than the baseline beyond {tol} ({compared} cells compared){stack}"

    def lines(self) -> list[str]:
        """What the section says under its table: stack differences, what is not recorded, how cells are judged."""
        return [f"Stack differences (OLD -> NEW): {'; '.join(self.stack) or 'none recorded'}.",
                *([f"Not in the records, so not compared: {'; '.join(self.unrecorded)}."] if self.unrecorded else []),
                "Cells are matched on job, backend, replicas and layout, whatever their tuning labels (a changed knob "
                "is a stack difference). A cell is slower (faster) when its median images/s fell (rose) by more "
                f"than {percent(self.tolerance)} and, with 6 or more runs on each side, the bootstrap 95% interval "
                "of NEW/OLD lies wholly below (above) 1; with fewer runs the medians decide "
                f"({NEEDS_RUNS} for an interval). A cell only in NEW or only in OLD fails the check (exit "
                f"{EXIT_UNCOMPARED} when no cell is slower).",
                self.summary_line()]


def compare(new: Sequence[JobSummary], old: Sequence[JobSummary], tolerance: float) -> Baseline:
    """NEW's jobs against OLD's."""
    runs_new, runs_old = [r for s in new for r in s.records], [r for s in old for r in s.records]
    return Baseline(compare_cells(new, old, tolerance), stack_diff(runs_new, runs_old), tolerance,
                    not_recorded([*runs_new, *runs_old]))


def baseline_part(b: Baseline, old_sources: Sequence[str]) -> list[Block]:
    """The section against the baseline (after the verdict)."""
    return [Heading("Against the baseline", 2),
            Para(f"NEW = this report's results; OLD = {', '.join(old_sources)}; tolerance {percent(b.tolerance)}."),
            table(*baseline_table(b.changes)), *(Para(x) for x in b.lines())]
