"""The notes under a job's tables, as prose: what the runs' records say that the figures do not (batch sizes that
are not per-replica x replicas, weights that differ across ranks, software versions, variants with rows of their own
and why they are outside the backend ratios, what the input-wait column measures and why some rows have none, input
paths that differ, and whether a backend's layouts computed the same losses). ``JobSummary.notes`` holds them after
the notes the figures give (common.report.summary: repeats, speedups, ratios); the document lists them.

A run's row label is handed in (``label``: common.report.summary.row_label), as common.report.machines takes it, so
the notes read records only."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from common.core.results import RunRecord
from common.report.load import LoadedRun, versions_by_key
from common.report.stats import num

Label = Callable[[RunRecord], str]  # a run's row label (common.report.summary.row_label)


def run_notes(job: Mapping[str, Any], runs: Sequence[LoadedRun], label: Label) -> list[str]:
    """Notes on inconsistent batch sizes or weights, differing software versions, variants, the input wait and the
    layouts, from the runs' records."""
    notes: list[str] = []
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
    _variant_notes(records, label, notes)
    _input_notes(records, label, notes)
    _layout_notes(runs, notes)
    return notes


def _variant_notes(records: Sequence[RunRecord], row_label: Label, notes: list[str]) -> None:
    """Why asynchronous runs, other strategies and other tuning knobs have rows of their own."""
    for label in dict.fromkeys(row_label(r) for r in records if r.asynchronous is True):
        notes.append(f"{label}: asynchronous training (workers update the parameter servers without waiting for "
                     "each other), so its per-step losses are not those of the synchronous runs: it is in no parity "
                     "claim and not in the backend ratios; compare its throughput and final loss "
                     "only (its speedup is against its own 1-worker run)")
    for label in dict.fromkeys(row_label(r) for r in records if r.asynchronous is not True and r.strategy):
        notes.append(f"{label}: rows of their own (a variant of the backend that changes the math or the schedule, "
                     "e.g. another tf.distribute strategy); not in the backend ratios, speedup "
                     "against its own 1-replica run")
    for label in dict.fromkeys(row_label(r) for r in records if r.asynchronous is not True
                               and not r.strategy and r.tuning_variant):
        notes.append(f"{label}: rows of their own (tuning knobs not at their defaults, see each run's tuning); "
                     "not in the backend ratios of the defaults (see Best vs best), speedup against "
                     "its own 1-replica run")


def _inputs(records: Sequence[RunRecord]) -> list[tuple[RunRecord, Mapping[str, Any]]]:
    """(record, its ``input`` block) of the records that have one."""
    return [(r, r.input) for r in records if isinstance(r.input, Mapping)]


def _input_notes(records: Sequence[RunRecord], row_label: Label, notes: list[str]) -> None:
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
    for reason, labels in _not_measured(records, row_label).items():
        notes.append(f"{', '.join(labels)}: input wait not measured ({reason})")
    _input_path_note(records, row_label, notes)


def _input_path_note(records: Sequence[RunRecord], row_label: Label, notes: list[str]) -> None:
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


def _not_measured(records: Sequence[RunRecord], row_label: Label) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r, i in _inputs(records):
        if not i.get("method") and i.get("reason"):
            labels = out.setdefault(str(i["reason"]), [])
            if row_label(r) not in labels:
                labels.append(row_label(r))
    return out


def _layout_notes(runs: Sequence[LoadedRun], notes: list[str]) -> None:
    """Per backend and world size run in several layouts (1x2 and 2x1): did the layouts compute the same losses, and
    if not, from which step, by how much, and whether their ranks' intra-op thread counts differ (TensorFlow splits
    a reduction over its threads, so another count rounds differently: the usual cause)."""
    by: dict[tuple[str, int], dict[str, RunRecord]] = {}
    for run in runs:
        r = run.record
        if r.step_losses:
            by.setdefault((str(r.backend), r.world_size), {}).setdefault(run.layout.text, r)
    for (backend, ws), layouts in sorted(by.items()):
        if len(layouts) < 2:
            continue
        (first, a), *others = sorted(layouts.items())
        for name, b in others:
            pair = f"{backend} at {ws} replicas: layouts {first} and {name}"
            la, lb = list(a.step_losses or []), list(b.step_losses or [])
            step = next((i for i, (x, y) in enumerate(zip(la, lb)) if x != y), None)
            if step is None and len(la) == len(lb):
                notes.append(f"{pair} computed the same losses, bit for bit ({len(la)} steps)")
                continue
            if step is None:
                notes.append(f"{pair} ran different numbers of steps ({len(la)}, {len(lb)}): losses not compared")
                continue
            ta, tb = (x.backend_info.get("threads_per_process") if isinstance(x.backend_info, Mapping) else None
                      for x in (a, b))
            why = (f"; their ranks ran {ta} and {tb} intra-op threads (from the cores per rank on a host): a sum split "
                   "over another number of threads rounds differently, and `--threads N` on both computes the same "
                   "math (docs/parity.md)") if ta != tb else \
                "; with the same thread count the cause is elsewhere (an op's placement or algorithm per layout)"
            notes.append(f"{pair} computed different losses from step {step} ({la[step]:.8g} vs {lb[step]:.8g}; final "
                         f"{la[-1]:.4g} vs {lb[-1]:.4g}){why}")
