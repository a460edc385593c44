"""Validation in the report: time to target (MLPerf's time-to-train idea) beside throughput, and the final
validation numbers, per row; from ``RunRecord.evaluations`` and ``time_to_target_s`` (common.training.evaluate).
Runs without evaluations contribute nothing and change no other column."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from common.core.results import EVALUATION_META, RunRecord
from common.report.rows import Validation
from common.report.stats import median, num

# What the section says about its numbers (rendered once, under the table).
TTT_METHOD = (
    "time to target = wall time from the first training step to the end of the first evaluation at which the job's "
    "target_metric reached target_value (>= for a metric, <= for the loss), evaluations included (they are excluded "
    "from img/s and the step times); median over the repeats that reached it, \"reached\" counts them; final "
    "validation = median over repeats of the last evaluation's numbers (the loss is the data loss, without "
    "regularisation)"
)


def evaluations(run: RunRecord) -> list[Mapping[str, object]]:
    """The run's evaluations ([] for a run without any)."""
    return [e for e in run.evaluations if isinstance(e, Mapping)] if isinstance(run.evaluations, list) else []


def target_of(run: RunRecord) -> tuple[str, float] | None:
    """(target_metric, target_value) the run's job set, or None."""
    metric, value = run.job.get("target_metric"), num(run.job.get("target_value"))
    return (metric, value) if isinstance(metric, str) and metric and value is not None else None


def row_validation(runs: Sequence[RunRecord]) -> Validation:
    """The Row's evaluation figures: ``ttt`` (median over the repeats that reached the target), ``reached`` (how
    many did), ``targeted`` (repeats with a target), ``final`` (name -> median of the last evaluation's value over
    the repeats that evaluated)."""
    targeted = [r for r in runs if target_of(r)]
    times = [t for r in targeted if (t := num(r.time_to_target_s)) is not None]
    finals: dict[str, list[float]] = {}
    for r in runs:
        ev = evaluations(r)
        if ev:
            for k, v in ev[-1].items():
                if k not in EVALUATION_META and num(v) is not None:
                    finals.setdefault(k, []).append(float(v))
    return Validation(median(times), len(times), len(targeted), {k: median(v) for k, v in finals.items()})


def validation_names(runs: Sequence[RunRecord]) -> list[str]:
    """The names the runs' last evaluations carry, loss first."""
    names: dict[str, None] = {}
    for r in runs:
        ev = evaluations(r)
        if ev:
            names.update(dict.fromkeys(k for k in ev[-1] if k not in EVALUATION_META))
    return sorted(names, key=lambda k: (k != "loss", k))
