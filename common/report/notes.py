"""The notes under a job's tables: repeats, batch sizes, weights, versions, variants, collectives and input wait."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from common.core.results import RunRecord
from common.report.base import NO_INTERVAL
from common.report.load import LoadedRun
from common.report.rows import RATIO_DEN, RATIO_NUM, Row, row_label
from common.report.stats import MIN_CI_RUNS, num
from common.report.versions import versions_by_key


def run_notes(job: Mapping[str, Any], runs: Sequence[LoadedRun], rows: list[Row], notes: list[str]) -> None:
    """Notes on single repeats, inconsistent batch sizes or weights, and differing software versions."""
    if any(r.throughput.repeats == 1 for r in rows):
        notes.append(f"rows with a single repeat show \"{NO_INTERVAL}\"; repeat those runs to get an interval")
    if any(1 < r.throughput.repeats < MIN_CI_RUNS for r in rows):
        notes.append(f"rows with 2-{MIN_CI_RUNS - 1} repeats show their range (min-max), not a confidence interval: "
                     f"a 95% interval of the median needs at least {MIN_CI_RUNS} repeats")
    per_replica = num(job.get("per_replica_batch_size"))
    for run in runs:
        r, gb = run.record, run.record.global_batch_size
        if per_replica and isinstance(gb, int) and gb != per_replica * r.world_size:
            where = run.path or r.run_id or "?"
            notes.append(f"{where}: global_batch_size {gb} is not per_replica_batch_size "
                         f"{int(per_replica)} x world_size {r.world_size}")
    records = [run.record for run in runs]
    bad_weights = [r for r in records if r.weights_consistent is False]
    if bad_weights:
        notes.append(f"{len(bad_weights)} run(s) ended with different weights on different ranks "
                     "(weights_consistent = false): their replicas did not train in lockstep")
    differing = [k for k, vals in versions_by_key(records).items() if len(vals) > 1]
    if differing:
        notes.append(f"software versions differ across runs ({', '.join(differing)}): see Environment")
    _variant_notes(records, notes)
    for row in rows:
        if row.facts.collective and "," in row.facts.collective:
            notes.append(f"{row.identity.label} at {row.identity.world_size} replicas: its repeats used different "
                         f"collectives ({row.facts.collective}); pin one (native --comm) to compare like with like")
    _input_notes(records, notes)


def _variant_notes(records: Sequence[RunRecord], notes: list[str]) -> None:
    """Why asynchronous runs, other strategies and other tuning knobs have rows of their own."""
    for label in dict.fromkeys(row_label(r) for r in records if r.asynchronous is True):
        notes.append(f"{label}: asynchronous training (workers update the parameter servers without waiting for "
                     "each other), so its per-step losses are not those of the synchronous runs: it is in no parity "
                     f"claim and not in the {RATIO_NUM}/{RATIO_DEN} ratio; compare its throughput and final loss "
                     "only (its speedup is against its own 1-worker run)")
    for label in dict.fromkeys(row_label(r) for r in records if r.asynchronous is not True and r.strategy):
        notes.append(f"{label}: rows of their own (a variant of the backend that changes the math or the schedule, "
                     f"e.g. another tf.distribute strategy); not in the {RATIO_NUM}/{RATIO_DEN} ratio, speedup "
                     "against its own 1-replica run")
    for label in dict.fromkeys(row_label(r) for r in records if r.asynchronous is not True
                               and not r.strategy and r.tuning_variant):
        notes.append(f"{label}: rows of their own (tuning knobs not at their defaults, see each run's tuning); "
                     f"not in the {RATIO_NUM}/{RATIO_DEN} ratio of the defaults (see Best vs best), speedup against "
                     "its own 1-replica run")


def _inputs(records: Sequence[RunRecord]) -> list[tuple[RunRecord, Mapping[str, Any]]]:
    """(record, its ``input`` block) of the records that have one."""
    return [(r, r.input) for r in records if isinstance(r.input, Mapping)]


def _input_notes(records: Sequence[RunRecord], notes: list[str]) -> None:
    """What the input-wait column measures (once), and why some rows have none."""
    inputs = [i for _, i in _inputs(records)]
    methods = {i.get("method") for i in inputs} - {None}
    if methods:
        threshold = next((num(i.get("threshold")) for i in inputs if num(i.get("threshold")) is not None), None)
        line = f"below {100 * threshold:g}% kept up; " if threshold is not None else ""
        notes.append("input wait: the share of its timed wall time the slowest rank spent waiting for the next "
                     "batch, median over repeats, timed on the device during the run; " + line + "from 20% highly "
                     "input-bound (TensorFlow Profiler's lines)"
                     + ("; custom-loop rows time the fetch itself" if "fetch" in methods else "")
                     + ("; fit rows show \"input + between steps\": Keras fetches the batch out of reach, so theirs "
                        "is the time from the end of one step to the next batch being available, Keras' host work "
                        "between steps included (an upper bound of the input wait, so never called input-bound)"
                        if "gap" in methods else ""))
    for reason, labels in _not_measured(records).items():
        notes.append(f"{', '.join(labels)}: input wait not measured ({reason})")
    _input_path_note(records, notes)


def _input_path_note(records: Sequence[RunRecord], notes: list[str]) -> None:
    """One line when the backends were fed through different input paths (RunRecord.input.path)."""
    paths: dict[str, set[str]] = {}
    for r, i in _inputs(records):
        if isinstance(i.get("path"), str):
            paths.setdefault(row_label(r), set()).add(i["path"])
    if len(set().union(*paths.values()) if paths else set()) > 1:
        fed = "; ".join(f"{label}: {', '.join(sorted(p))}" for label, p in paths.items())
        notes.append(f"the backends were fed differently ({fed}): \"per-worker\" = each process's own tf.data "
                     "iterator into the step, \"distributed\" = tf.distribute's distributed input (a "
                     "MultiDeviceIterator), which cost native about half its CPU throughput on a real CNN "
                     "(docs/findings.md)")


def _not_measured(records: Sequence[RunRecord]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r, i in _inputs(records):
        if not i.get("method") and i.get("reason"):
            labels = out.setdefault(str(i["reason"]), [])
            if row_label(r) not in labels:
                labels.append(row_label(r))
    return out
