"""Validation in the report: time to target (MLPerf's time-to-train idea) beside throughput, and the final
validation numbers, per row; from ``RunRecord.evaluations`` and ``time_to_target_s`` (common.training.evaluate).
Runs without evaluations contribute nothing and change no other column."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from common.core.results import EVALUATION_META
from common.report.stats import median, num

# What the section says about its numbers (rendered once, under the table).
TTT_METHOD = (
    "time to target = wall time from the first training step to the end of the first evaluation at which the job's "
    "target_metric reached target_value (>= for a metric, <= for the loss), evaluations included (they are excluded "
    "from img/s and the step times); median over the repeats that reached it, \"reached\" counts them; final "
    "validation = median over repeats of the last evaluation's numbers (the loss is the data loss, without "
    "regularisation)"
)


def evaluations(run: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The run's evaluations ([] for a run, or an older file, without any)."""
    ev = run.get("evaluations")
    return [e for e in ev if isinstance(e, Mapping)] if isinstance(ev, list) else []


def target_of(run: Mapping[str, Any]) -> tuple[str, float] | None:
    """(target_metric, target_value) the run's job set, or None."""
    job = run.get("job")
    metric = job.get("target_metric") if isinstance(job, Mapping) else None
    value = num(job.get("target_value")) if isinstance(job, Mapping) else None
    return (metric, value) if isinstance(metric, str) and metric and value is not None else None


def row_fields(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The Row's evaluation fields: ``ttt`` (median over the repeats that reached the target), ``ttt_reached``
    (how many did), ``targeted`` (repeats with a target), ``final_validation`` (name -> median of the last
    evaluation's value over the repeats that evaluated)."""
    targeted = [r for r in runs if target_of(r)]
    times = [t for r in targeted if (t := num(r.get("time_to_target_s"))) is not None]
    finals: dict[str, list[float]] = {}
    for r in runs:
        ev = evaluations(r)
        if ev:
            for k, v in ev[-1].items():
                if k not in EVALUATION_META and num(v) is not None:
                    finals.setdefault(k, []).append(float(v))
    return {"ttt": median(times), "ttt_reached": len(times), "targeted": len(targeted),
            "final_validation": {k: median(v) for k, v in finals.items()}}


def validation_names(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The names the runs' last evaluations carry, loss first."""
    names: dict[str, None] = {}
    for r in runs:
        ev = evaluations(r)
        if ev:
            names.update(dict.fromkeys(k for k in ev[-1] if k not in EVALUATION_META))
    return sorted(names, key=lambda k: (k != "loss", k))
