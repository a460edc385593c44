"""Summarizing runs: one JobSummary per job hash, with its rows (backend x world size), their speedups, the backend
ratios and the notes under the tables (repeats, batch sizes, weights, versions, variants, collectives, input wait);
the types are common.report.rows'."""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from common.core.results import RunRecord
from common.report.base import NA, NO_INTERVAL
from common.report.load import version_mix, versions_by_key
from common.report.machines import MachineKey, machine_keys, nodes_text, stack_of
from common.report.rows import (
    RATIO_DEN,
    RATIO_NUM,
    Identity,
    InputWait,
    JobSummary,
    LoadedRun,
    Machine,
    RatioRow,
    Row,
    RunFacts,
    StepTimes,
    Throughput,
    gpu_run,
    order_backends,
    row_label,
    row_resources,
    row_validation,
    same_first_batches,
)
from common.report.stats import MIN_CI_RUNS, median, median_interval, num, paired_ratio_interval, ratio_interval


def _final_loss(run: RunRecord) -> float | None:
    return num(run.step_losses[-1]) if isinstance(run.step_losses, list) and run.step_losses else None


def _step_times(runs: list[RunRecord]) -> StepTimes:
    return StepTimes(p50=median(num(r.step_time.get("median")) for r in runs),
                     p95=median(num(r.step_time.get("p95")) for r in runs))


def _make_row(label: str, key: MachineKey, runs: list[LoadedRun]) -> Row:
    """The row of ``runs`` (one label, machine, world size, layout and worker count)."""
    recs = [r.record for r in runs]
    first = recs[0]
    gpu = any(gpu_run(r) for r in recs)
    ips = [float(r.images_per_sec) for r in recs]
    used = sorted({c for r in recs if (c := r.collective_used)})
    gbs = Counter(r.global_batch_size for r in recs if isinstance(r.global_batch_size, int))
    hw = key.hardware
    identity = Identity(
        label=f"{label} [{key.suffix()}]" if key.suffix() else label, backend=str(first.backend),
        world_size=first.world_size, num_workers=first.num_workers, layout=runs[0].layout.text, plain=label,
        series=f"{label} [{hw}]" if hw else label, variant=first.tuning_variant,  # one label, one variant
        comparable=first.strategy is None and first.asynchronous is not True,
        family=" ".join(p for p in (row_label(first, tuning=False), f"[{key.suffix()}]" if key.suffix() else "") if p))
    return Row(
        identity=identity,
        machine=Machine(key.suffix(), hw, key.nodes, gpu),
        throughput=Throughput(ips, statistics.median(ips), median_interval(ips)),
        steps=_step_times(recs),
        facts=RunFacts(gbs.most_common(1)[0][0] if gbs else None, median(_final_loss(r) for r in recs),
                       ", ".join(used) if used else None, [r.path or "?" for r in runs],
                       sum(same_first_batches(r) for r in recs), [r.nccl_transport for r in recs],
                       [(_round_of(r.path), r.record.nodelist) for r in runs]),
        input=_input_wait(recs),
        validation=row_validation(recs),
        resources=row_resources(recs, gpu),
        runs=recs,
    )


def _input_wait(runs: list[RunRecord]) -> InputWait:
    """The row's input wait (``RunRecord.input``): method, median share over repeats, and the verdict all repeats
    support (the worst one: a row is "kept up" only if every repeat kept up)."""
    measured = [i for r in runs if isinstance(i := r.input, Mapping) and i.get("method")]
    if not measured:
        return InputWait()
    methods = {str(i["method"]) for i in measured}
    kept = [i.get("kept_up") for i in measured]
    verdict = None
    if all(k is True for k in kept) and len(measured) == len(runs):
        verdict = "kept up"
    elif False in kept:
        verdict = "highly input-bound" if any(i.get("input_bound") == "highly" for i in measured) \
            else "moderately input-bound"
    return InputWait(methods.pop() if len(methods) == 1 else "mixed",
                     median(num(i.get("wait_fraction")) for i in measured), verdict)


def collectives_caveat(den: Row, num: Row) -> str | None:
    """Why a ratio of these rows does not compare like for like, or None: on GPUs, NCCL on one side only (e.g.
    native ring, whose gRPC collectives go through host memory, against Horovod's NCCL)."""
    dc, nc = den.facts.collective, num.facts.collective
    if not (den.machine.gpu or num.machine.gpu) or dc is None or nc is None:
        return None
    if (dc == "nccl") == (nc == "nccl"):
        return None
    return f"{RATIO_DEN} {dc} vs {RATIO_NUM} {nc} on GPUs"


def _rows(runs: list[LoadedRun]) -> list[Row]:
    """One row per backend (row label) x machine (common.report.machines) x world size x worker count, in table
    order: runs on different CPU or GPU models, or on different node counts, never share a row."""
    cells: dict[tuple[str, str, int, bool, int, str, int], list[LoadedRun]] = {}
    for run, m in zip(runs, machine_keys([r.record for r in runs], row_label)):
        r = run.record
        nodes = -1 if m.nodes is None else m.nodes
        cells.setdefault((row_label(r), m.hardware, nodes, m.show_nodes, r.world_size, run.layout.text,
                          r.num_workers), []).append(run)
    order = {b: i for i, b in enumerate(order_backends(k[0] for k in cells))}
    rows = []
    for (label, hw, nodes, show, _, _, _), rs in sorted(cells.items(), key=lambda kv: (order[kv[0][0]], kv[0][1:])):
        rows.append(_make_row(label, MachineKey(hw, None if nodes < 0 else nodes, show), rs))
    return rows


def _speedups(rows: list[Row], notes: list[str]) -> None:
    """Speedup and efficiency against the 1-replica median of the same series (backend label and hardware; a note
    where there is none)."""
    for b in dict.fromkeys(r.identity.series for r in rows):
        series = [r for r in rows if r.identity.series == b]
        base = next((r for r in series if r.identity.world_size == 1), None)
        if base is None:
            sizes = ", ".join(str(r.identity.world_size) for r in series)
            notes.append(f"{b}: no 1-replica run (only world size {sizes}), so its speedup and efficiency are "
                         f"{NA}; run {b} at world size 1 to get the baseline")
            continue
        for r in series:
            r.scaling = replace(r.scaling, speedup=r.throughput.median / base.throughput.median,
                                efficiency=r.throughput.median / (r.identity.world_size * base.throughput.median))


def _pairs(rows: list[Row], ws: int) -> list[tuple[Row | None, Row | None]]:
    """(denominator row, numerator row) at one world size, never across hardware; several rows (worker counts,
    node counts) pair equal ones only."""
    den = [r for r in rows if r.identity.plain == RATIO_DEN and r.identity.world_size == ws]
    nom = [r for r in rows if r.identity.plain == RATIO_NUM and r.identity.world_size == ws]
    if len(den) <= 1 and len(nom) <= 1 and (not den or not nom or den[0].machine.hardware == nom[0].machine.hardware):
        return [(den[0] if den else None, nom[0] if nom else None)]
    return [(next((r for r in den if r.pair_key == k), None), next((r for r in nom if r.pair_key == k), None))
            for k in sorted({r.pair_key for r in den + nom})]


def _pair_machine(d: Row | None, n: Row | None, several: bool) -> str:
    """The ratio row's machine text when the job ran on several machines ("" otherwise)."""
    r = d or n
    if not several or r is None:
        return ""
    m = r.machine
    return ", ".join(p for p in (m.hardware, nodes_text(m.nodes) if m.nodes is not None else "") if p)


def _round_of(path: str | None) -> str | None:
    """A sweep run's round, from its run directory (``<variant>-<layout>-r<k>``, common.sweep); None elsewhere."""
    m = re.search(r"-r(\d+)$", Path(path).parent.name) if path else None
    return m.group(1) if m else None


def _pairing(d: Row, n: Row) -> tuple[str | None, list[tuple[float, float]]]:
    """Whether both rows' runs of each round ran on the same nodes ("every round", "some rounds", "no"; None when no
    run recorded its nodes), and the (numerator, denominator) throughput of every round that did."""
    def by_round(r: Row) -> dict[str, tuple[float, str | None]]:
        return {k: (ips, nodes) for ips, (k, nodes) in zip(r.throughput.ips, r.facts.rounds) if k is not None}

    if not any(nodes for _, nodes in d.facts.rounds + n.facts.rounds):
        return None, []
    den, num = by_round(d), by_round(n)
    pairs = [(num[k][0], den[k][0]) for k in sorted(den.keys() & num.keys(), key=int)
             if den[k][1] and den[k][1] == num[k][1]]
    rounds = len(d.throughput.ips) == len(n.throughput.ips) == len(den) == len(num) == len(pairs)
    return ("every round" if rounds and pairs else "some rounds" if pairs else "no"), pairs


def _ratio_row(ws: int, d: Row | None, n: Row | None, several: bool) -> RatioRow:
    """The ratio at one world size of a pair of rows, set on both rows too. Runs in rounds on the same nodes give
    the paired interval (every round paired, at least 6), others the two cells' independent resamples."""
    ratio = n.throughput.median / d.throughput.median if d and n else None
    same, pairs = _pairing(d, n) if d and n else (None, [])
    paired = same == "every round"  # the interval needs 6 rounds, as the unpaired one needs 6 runs a cell
    if paired:
        ci = paired_ratio_interval([a for a, _ in pairs], [b for _, b in pairs])
    else:
        ci = ratio_interval(n.throughput.ips, d.throughput.ips) if d and n else None
    for r in (d, n):
        if r is not None:
            r.scaling = replace(r.scaling, ratio=ratio, ratio_ci=ci)
    return RatioRow(ws, d.identity.num_workers if d else None, n.identity.num_workers if n else None,
                    d.throughput.median if d else None, n.throughput.median if n else None, ratio,
                    machine=_pair_machine(d, n, several), ratio_ci=ci,
                    layout=" / ".join(dict.fromkeys(r.identity.layout for r in (d, n) if r is not None)),
                    den_collective=d.facts.collective if d else None, num_collective=n.facts.collective if n else None,
                    caveat=collectives_caveat(d, n) if d and n else None, same_nodes=same, paired=paired,
                    den_row=d, num_row=n)


def _pair_note(ws: int, d: Row, n: Row) -> str | None:
    """Why a pair's ratio compares different topologies, node counts or layouts, or None."""
    di, ni = d.identity, n.identity
    if di.num_workers != ni.num_workers:
        return (f"at world size {ws} the backends ran different topologies ({RATIO_DEN}: {di.num_workers} "
                f"worker(s), {RATIO_NUM}: {ni.num_workers} worker(s)); the ratio compares them as they ran")
    if d.machine.nodes != n.machine.nodes and None not in (d.machine.nodes, n.machine.nodes):
        return (f"at world size {ws} the backends ran on different node counts ({RATIO_DEN}: {d.machine.nodes}, "
                f"{RATIO_NUM}: {n.machine.nodes}); the ratio compares them as they ran")
    if di.layout != ni.layout:
        return (f"at world size {ws} the backends ran different layouts (nodes x ranks per node; {RATIO_DEN}: "
                f"{di.layout}, {RATIO_NUM}: {ni.layout}); the ratio compares them as they ran")
    return None


def _ratios(rows: list[Row], notes: list[str]) -> list[RatioRow]:
    """The registry.RATIO throughput ratio per world size, set on both rows too; notes on what is missing."""
    names = order_backends(r.identity.plain for r in rows)
    several = any(r.machine.label for r in rows)
    ratios: list[RatioRow] = []
    missing = [b for b in (RATIO_DEN, RATIO_NUM) if b not in names]
    if missing:
        present = ", ".join(names) or "none"
        notes.append(f"no {' or '.join(missing)} runs for this job (backends present: {present}), so the "
                     f"{RATIO_NUM}/{RATIO_DEN} ratio is {NA}")
    lone_sizes: dict[str, list[int]] = {}  # backend -> world sizes only it ran (ratio n/a there)
    for ws in sorted({r.identity.world_size for r in rows}):
        for d, n in _pairs(rows, ws):
            if d is None and n is None:  # only other backends ran at this world size
                continue
            q = _ratio_row(ws, d, n, several)
            ratios.append(q)
            if q.caveat:
                notes.append(f"at world size {ws} the {RATIO_NUM}/{RATIO_DEN} ratio is not like for like "
                             f"({q.caveat}): it compares the collectives as much as the backends")
            lone = d if n is None else n if d is None else None
            if not missing and lone is not None:
                lone_sizes.setdefault(lone.identity.label, []).append(ws)
            elif d and n and (note := _pair_note(ws, d, n)):
                notes.append(note)
    for b, sizes in lone_sizes.items():
        listed = ", ".join(str(x) for x in dict.fromkeys(sizes))
        notes.append(f"{RATIO_NUM}/{RATIO_DEN} ratio is {NA} at world size {listed}: only {b} ran there")
    return ratios


def _summarize_job(job_hash: str, runs: list[LoadedRun]) -> JobSummary:
    recs = [r.record for r in runs]
    names = Counter(str(r.job.get("name", "unnamed")) for r in recs)
    name = names.most_common(1)[0][0]
    job = dict(next(r.job for r in recs if str(r.job.get("name", "unnamed")) == name))
    notes: list[str] = []
    if len(names) > 1:
        notes.append(f"runs of this job carry different names ({', '.join(sorted(names))}); the name is a label "
                     "only, the job hash is identical")
    rows = _rows(runs)
    _speedups(rows, notes)
    ratios = _ratios(rows, notes)
    run_notes(job, runs, rows, notes)
    windows = sorted({int(w) for r in recs if isinstance(w := r.step_time.get("window_steps"), int) and w > 1})
    if windows:
        notes.append(f"step p50 / p95 are per-window: the host read the device every {' or '.join(map(str, windows))}"
                     " steps (job key sync_every_steps), so each value is the mean step time of such a window; "
                     "sync_every_steps = 1 gives per-step times at the price of a host sync per step")
    return JobSummary(job_hash, name, job, rows, ratios, notes, runs, _version_mix_per_stack(recs))


def _version_mix_per_stack(recs: Sequence[RunRecord]) -> list[str]:
    """A mix of versions inside one stack (one container image, or the host): runs of two images are two stacks,
    kept in rows of their own, so their versions may differ without being a mix."""
    stacks: dict[str, list[RunRecord]] = {}
    for r in recs:
        stacks.setdefault(stack_of(r), []).append(r)
    return list(dict.fromkeys(m for group in stacks.values() for m in version_mix(group)))


def summarize(runs: Iterable[LoadedRun | RunRecord | Mapping[str, Any]]) -> list[JobSummary]:
    """One JobSummary per job_hash (sorted by job name, then hash); runs of different jobs are never mixed. A run
    may be loaded (load_runs), a record, or a parsed results JSON (read as a record, older schemas upgraded)."""
    groups: dict[str, list[LoadedRun]] = {}
    for r in runs:
        run = LoadedRun.of(r)
        groups.setdefault(run.record.job_hash, []).append(run)
    out = [_summarize_job(h, rs) for h, rs in groups.items()]
    return sorted(out, key=lambda s: (s.name, s.job_hash))


# -- the notes under a job's tables --------------------------------------------------------------------------------
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
    _layout_notes(runs, notes)
    for row in rows:
        if row.facts.same_batches:
            notes.append(f"{row.identity.label} at {row.identity.world_size} replicas: in {row.facts.same_batches} "
                         f"of {row.throughput.repeats} repeat(s) every rank got the same first batches (the input "
                         "function's fingerprints, input.pipeline): it does not shard by "
                         "input_context.input_pipeline_id, so the workers trained on the same data")


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
