"""A job's summary, one per job hash: what it holds and how it is made from the job's runs. Its rows (one backend x
machine x world size x layout cell of the scaling table: how a run is labelled, the row it joins) with each row's
figures from its repeats' records: throughput, step times, input wait, validation (time to target, MLPerf's
time-to-train idea, and the final validation numbers, from ``RunRecord.evaluations`` and ``time_to_target_s``) and
what the runs cost besides time (peak memory per rank, GPU energy over the timed steps, ``RunRecord.energy``, and
GPU-hours; energy and GPU-hours only for runs on GPUs: absent, never zero, on a CPU); the speedups, the backend
ratios (each compared pair, ``registry.Pair``: numerator / denominator median throughput per world size; the
registry's ``PAIRS`` unless others are asked for, the first the headline) and the notes the figures give (repeats,
collectives, missing baselines and sides). The notes the records give are common.report.notes'; which summaries are
reported, common.report.load's.

Memory: the TensorFlow allocator's peak on the rank's GPU when a rank recorded one (``machine`` block,
``memory.peak_gpu_bytes``), else the process's peak resident set (``memory.peak_rss_bytes``, host memory)."""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from common.cluster.machine import section
from common.core import registry
from common.core.results import EVALUATION_META, RunRecord
from common.report.base import (
    IMAGES,
    NA,
    NO_INTERVAL,
    SAMPLES,
)
from common.report.load import LoadedRun, version_mix
from common.report.machines import MachineKey, machine_keys, nodes_text, stack_of
from common.report.notes import run_notes
from common.report.stats import (
    MIN_CI_RUNS,
    Interval,
    median,
    median_interval,
    num,
    paired_t_interval,
    ratio_interval,
)


@dataclass(frozen=True)
class Identity:
    """Which cell of the scaling table a row is: what ran, at which size and layout."""

    label: str  # the row label: backend, non-default strategy or tuning, machine, e.g. "native (mirrored) [2 nodes]"
    backend: str  # the runs' backend
    world_size: int  # replicas
    num_workers: int  # processes
    layout: str = "?"  # nodes x ranks per node, from the runs' hosts (load.layout_of), e.g. "2x4"
    plain: str = ""  # the label without its machine part (row_label); "" means the label
    series: str = ""  # the rows sharing a speedup baseline: plain label + hardware, no node count ("": plain)
    variant: str | None = None  # the runs' tuning variant (``RunRecord.tuning_variant``); None: default knobs
    comparable: bool = True  # the backend's default way of training (strategy, synchronous): in best vs best
    family: str = ""  # the label without its tuning variant (machine kept): what --baseline matches on ("": label)

    def __post_init__(self) -> None:
        object.__setattr__(self, "plain", self.plain or self.label)
        object.__setattr__(self, "series", self.series or self.plain)
        object.__setattr__(self, "family", self.family or self.label)


@dataclass(frozen=True)
class Machine:
    """The machine part of a row (common.report.machines)."""

    label: str = ""  # the machine part of the row label ("" when the job ran on one machine: MachineKey)
    hardware: str = ""  # the hardware part of it ("" when the job's runs share one hardware)
    nodes: int | None = None  # the node count of the row's runs (None: not recorded)
    gpu: bool = False  # a repeat ran on GPUs (its devices name one)


@dataclass(frozen=True)
class Throughput:
    """Images/s over the row's repeats."""

    ips: list[float]  # images/s of every repeat
    median: float
    interval: Interval | None  # 95% CI of the median (>= 6 repeats), else min-max; None for n = 1

    @property
    def repeats(self) -> int:
        return len(self.ips)


@dataclass(frozen=True)
class StepTimes:
    """Medians over the row's repeats, in seconds (None: n/a); what the scaling model reads. Figures only a column
    shows are read from the row's runs by that column (document.COLUMNS, ``from_runs``)."""

    p50: float | None
    p95: float | None


@dataclass(frozen=True)
class RunFacts:
    """What the row's runs were and where they came from."""

    global_batch_size: int | None
    final_loss: float | None  # median over repeats of the last step's loss
    collective: str | None  # ``RunRecord.collective_used`` of the repeats ("a, b" if they differ); None: unknown
    files: list[str]  # the repeats' results files
    same_batches: int = 0  # repeats whose ranks all got the same first batches (an input function not sharding)
    nccl: list[Any] = field(default_factory=list)  # the repeats' ``nccl_transport`` lists (GPU runs; else None)
    # per repeat (in ``Throughput.ips`` order): its round (a sweep's run directory -r<k>, the demo's file name -r<k>)
    # and the nodes it ran on (``RunRecord.nodelist`` under Slurm, else its hosts); None where not recorded
    rounds: list[tuple[str | None, str | None]] = field(default_factory=list)


@dataclass(frozen=True)
class InputWait:
    """Did the input pipeline keep up (``RunRecord.input`` of the repeats)."""

    method: str | None = None  # "fetch", "gap", "mixed"; None: not measured
    fraction: float | None = None  # median over repeats of the input wait's share of the timed wall time
    verdict: str | None = None  # "kept up", "moderately input-bound", "highly input-bound" or None (undecided)


@dataclass(frozen=True)
class Validation:
    """Time to target and the final validation numbers (report.evaluation)."""

    ttt: float | None = None  # time to target (s): median over the repeats that reached it
    reached: int = 0  # repeats that reached the job's target
    targeted: int = 0  # repeats whose job set a target
    final: dict[str, float | None] = field(default_factory=dict)  # last evaluation, median over repeats


@dataclass(frozen=True)
class Scaling:
    """The row against its baseline and against the other backend (set once every row of the job is known)."""

    speedup: float | None = None
    efficiency: float | None = None
    ratio: float | None = None  # the headline pair's ratio at this world size, on both of its rows
    ratio_ci: tuple[float, float] | None = None  # bootstrap 95% interval of ``ratio`` (stats.ratio_interval)


ENERGY_SCOPE = ("GPU only: the GPUs' own energy counters (NVML nvmlDeviceGetTotalEnergyConsumption, Volta and "
                "later) over the timed steps, summed over ranks; no CPU, memory, network or cooling, so not "
                "comparable with MLPerf Power's whole-system figures")


@dataclass(frozen=True)
class Resources:
    """A row's resource figures (None: not recorded or not applicable)."""

    peak_memory_bytes: float | None = None  # per rank: the largest rank's, median over repeats
    memory_kind: str | None = None  # "GPU" (allocator peak) or "host RSS"
    energy_j: float | None = None  # GPU energy over the timed steps, all ranks, median over repeats
    energy_per_image_j: float | None = None
    gpu_hours_per_epoch: float | None = None  # GPUs x the timed step time x steps per epoch
    gpu_hours_to_target: float | None = None  # GPUs x time to target


@dataclass
class Row:
    """One backend x world size (x worker count, layout, machine) cell of a job's scaling table."""

    identity: Identity
    machine: Machine
    throughput: Throughput
    steps: StepTimes
    facts: RunFacts
    input: InputWait
    validation: Validation
    scaling: Scaling = field(default_factory=Scaling)
    resources: Resources = field(default_factory=Resources)
    runs: list[RunRecord] = field(default_factory=list)  # the repeats' records, in ``throughput.ips`` order

    @property
    def layout_counts(self) -> tuple[int | None, int | None]:
        """(nodes, ranks per node) of the layout ("2x4" -> (2, 4); None where not known or uneven)."""
        m = re.fullmatch(r"(\d+)x(\d+)?.*", self.identity.layout)
        return (int(m.group(1)), int(m.group(2)) if m.group(2) else None) if m else (None, None)

    @property
    def pair_key(self) -> tuple[str, int, int, str]:
        """What a ratio pairs on when a world size has several rows: hardware, nodes, workers, layout."""
        nodes = -1 if self.machine.nodes is None else self.machine.nodes
        return self.machine.hardware, nodes, self.identity.num_workers, self.identity.layout


@dataclass
class RatioRow:
    """One compared pair (numerator / denominator median throughput) at one world size."""

    num: str  # the numerator backend (its rows' plain label)
    den: str  # the denominator backend
    world_size: int
    den_workers: int | None  # denominator's worker count (None: no denominator run here)
    num_workers: int | None  # numerator's worker count
    den_ips: float | None
    num_ips: float | None
    ratio: float | None
    machine: str = ""  # the pair's hardware and nodes when the job ran on several machines ("": one machine)
    ratio_ci: tuple[float, float] | None = None  # bootstrap 95% interval (None: a cell has < 6 repeats)
    layout: str = ""  # the pair's layouts, e.g. "1x2" or "1x2 / 2x1" when they differ
    den_collective: str | None = None  # the rows' used collectives
    num_collective: str | None = None
    caveat: str | None = None  # why the ratio is not like for like (collectives_caveat), None when it is
    same_nodes: str | None = None  # "every round", "some rounds", "no": both backends' runs of a round on the same
    # nodes (None: no run recorded its nodes)
    paired: bool = False  # every round of both on the same nodes: ratio_ci (from 3 rounds) is the paired t interval
    # of the per-round ratios (stats.paired_t_interval)
    pairs: int = 0  # the paired rounds (both backends ran them on the same nodes): the paired interval's sample
    den_row: Row | None = None  # the rows the ratio pairs (None: that side did not run here)
    num_row: Row | None = None


@dataclass
class JobSummary:
    """Everything the report shows about one job (one job_hash); runs of other jobs never enter it."""

    job_hash: str
    name: str
    job: dict[str, Any]
    rows: list[Row]
    ratios: list[RatioRow]
    notes: list[str]
    runs: list[LoadedRun]
    version_mix: list[str] = field(default_factory=list)  # versions.version_mix(records): empty when consistent
    pairs: tuple[registry.Pair, ...] = registry.PAIRS  # the compared pairs, in ``ratios``' order; the first headlines

    def ratios_of(self, pair: registry.Pair) -> list[RatioRow]:
        """The ratio rows of one pair (by world size); [] when it was not compared."""
        return [q for q in self.ratios if (q.num, q.den) == pair]

    @property
    def backends(self) -> list[str]:
        """The row labels in table order (registry order of the backends, then their machines)."""
        return list(dict.fromkeys(r.identity.label for r in self.rows))

    @property
    def records(self) -> list[RunRecord]:
        return [r.record for r in self.runs]

    @property
    def unit(self) -> str:
        """Its throughput's unit: images/s for one of twinbench's datasets (all images: common.workload.datasets),
        samples/s for the user's own ("package.module:function": arrays or an input function, of anything)."""
        return SAMPLES if ":" in str(self.job.get("dataset", "")) else IMAGES


# -- how a run is labelled: the row it joins ---------------------------------------------------------------------------
def order_backends(names: Iterable[str]) -> list[str]:
    """The registry's backends in its order, then any other backend found in results, sorted."""
    names = set(names)
    known = registry.names()
    return [b for b in known if b in names] + sorted(names - set(known))


def row_label(run: RunRecord, tuning: bool = True) -> str:
    """The backend column of a run's row: its backend, or with a strategy other than the default e.g. "native
    (mirrored)", with tuning knobs not at their defaults e.g. "horovod (fusion 32 MiB)", and for an asynchronous
    run (``RunRecord.asynchronous``: parameter-server training) "native (parameter_server, asynchronous)": rows of
    their own, never merged with the default's, outside the backend ratio (which compares the backends' default
    ways of training; variants meet in the report's best vs best table). ``tuning=False``: without the tuning
    variant (what a baseline matches cells on)."""
    parts = [s for s in (run.strategy, run.tuning_variant if tuning else None) if s]
    if run.asynchronous is True:
        parts = [*(parts or ["?"]), "asynchronous"]
    return f"{run.backend} ({', '.join(parts)})" if parts else str(run.backend)


_GPU = re.compile(r"gpu:", re.IGNORECASE)  # TensorFlow's device names: "/physical_device:GPU:0", "/gpu:0"


def gpu_run(run: RunRecord) -> bool:
    """A rank of the run computed on a GPU (its ``devices`` name one; "cpu (CUDA_VISIBLE_DEVICES=0)" does not)."""
    return isinstance(run.devices, list) and any(_GPU.search(str(d)) for d in run.devices)


def cpu_run(run: RunRecord) -> bool:
    """Every rank of the run recorded a CPU as its device ("cpu", "cpu (CUDA_VISIBLE_DEVICES=0)"); False when the
    record names no devices."""
    devs = run.devices if isinstance(run.devices, list) else []
    return bool(devs) and all(str(d).lower().startswith(("cpu", "/physical_device:cpu", "/cpu")) for d in devs)


# -- a row and its figures, from its repeats' records ------------------------------------------------------------------
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
                       [(_round_of(r.path), r.record.nodelist or _hosts_of(r.record)) for r in runs]),
        input=_input_wait(recs),
        validation=row_validation(recs),
        resources=row_resources(recs, gpu),
        runs=recs,
    )


def _final_loss(run: RunRecord) -> float | None:
    return num(run.step_losses[-1]) if isinstance(run.step_losses, list) and run.step_losses else None


def _step_times(runs: list[RunRecord]) -> StepTimes:
    return StepTimes(p50=median(num(r.step_time.get("median")) for r in runs),
                     p95=median(num(r.step_time.get("p95")) for r in runs))


def _round_of(path: str | None) -> str | None:
    """A run's round: a sweep's, from its run directory (``<variant>-<layout>-r<k>``, common.sweep), the demo's from
    its file name (``...-<run id>-r<k>.json``, scripts/demo.sh; a run id ends in hex digits, never ``-r<k>``); None
    elsewhere."""
    m = re.search(r"-r(\d+)$", Path(path).parent.name) or re.search(r"-r(\d+)$", Path(path).stem) if path else None
    return m.group(1) if m else None


def _hosts_of(run: RunRecord) -> str | None:
    """The hosts a run's ranks ran on, as a set ("host:a,b"), for runs outside Slurm (no nodelist); None if unknown."""
    hosts = run.hosts if isinstance(run.hosts, list) else []
    return "host:" + ",".join(sorted({str(h) for h in hosts})) if hosts else None


def same_first_batches(run: RunRecord) -> bool:
    """The run's ranks (two or more) all got the same first batches: the fingerprints an input function's runs record
    per rank (``input.pipeline.per_rank``) are all equal, so its workers trained on the same data."""
    pipeline = run.input.get("pipeline") if isinstance(run.input, Mapping) else None
    per_rank = pipeline.get("per_rank") if isinstance(pipeline, Mapping) else None
    prints = [r.get("fingerprint") for r in per_rank if isinstance(r, Mapping)] if isinstance(per_rank, list) else []
    return len(prints) > 1 and None not in prints and len(set(map(str, prints))) == 1


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


def _peak(run: RunRecord, key: str) -> float | None:
    """The largest rank's ``memory.<key>`` of a run (None: no rank recorded it)."""
    m = run.machine if isinstance(run.machine, Mapping) else {}
    vals = [v for x in section(m, "memory") if isinstance(x, Mapping) and (v := num(x.get(key))) is not None]
    return max(vals) if vals else None


def energy_joules(run: RunRecord) -> float | None:
    """The run's GPU energy over its timed steps (``energy.gpu_joules``), None when not measured."""
    e = run.energy if isinstance(run.energy, Mapping) else {}
    return num(e.get("gpu_joules"))


def timed_images(run: RunRecord) -> float | None:
    """Images processed in the timed steps (global batch x timed steps)."""
    steps = num(run.step_time.get("timed_steps"))
    return float(run.global_batch_size) * steps if run.global_batch_size and steps else None


def _per_image(run: RunRecord) -> float | None:
    joules, images = energy_joules(run), timed_images(run)
    return joules / images if joules is not None and images else None


def _gpu_hours_per_epoch(run: RunRecord, gpus: int) -> float | None:
    step = num(run.step_time.get("mean"))
    return gpus * step * run.steps_per_epoch / 3600 if step is not None and run.steps_per_epoch else None


def row_resources(runs: Sequence[RunRecord], on_gpu: bool) -> Resources:
    """The Resources of one row's repeats; ``on_gpu``: the row ran on GPUs (one per replica)."""
    gpu = median(_peak(r, "peak_gpu_bytes") for r in runs)
    rss = median(_peak(r, "peak_rss_bytes") for r in runs)
    mem, kind = (gpu, "GPU") if gpu is not None else (rss, "host RSS") if rss is not None else (None, None)
    if not on_gpu:
        return Resources(mem, kind)
    ttt = [r.world_size * t / 3600 for r in runs if (t := num(r.time_to_target_s)) is not None]
    return Resources(mem, kind, median(energy_joules(r) for r in runs), median(_per_image(r) for r in runs),
                     median(_gpu_hours_per_epoch(r, r.world_size) for r in runs), median(ttt))


# -- validation --------------------------------------------------------------------------------------------------------
# What the section says about its numbers (rendered once, under the table).
TTT_METHOD = (
    "time to target = wall time from the first training step to the end of the first evaluation at which the job's "
    "target_metric reached target_value (>= for a metric, <= for the loss), evaluations included (they are excluded "
    "from images/s and the step times); median over the repeats that reached it, \"reached\" counts them; final "
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


# -- a row's cells (document.COLUMNS) ----------------------------------------------------------------------------------
def from_runs(read: Callable[[RunRecord], Any],
              combine: Callable[[list[Any]], Any] = median) -> Callable[[Row], Any]:
    """A column's value (document.Column) from the row's runs: ``read`` of each repeat's record, then ``combine`` over
    the repeats (default: the median of the numbers, None when no run holds one). A figure the ranks write into
    ``RunRecord`` reaches the report's md, html and csv by one Column line with this as its value."""
    return lambda row: combine([read(r) for r in row.runs])


def input_text(row: Row) -> str:
    """The row's input-wait cell, e.g. "0.4% kept up", "23% highly input-bound", "48% input + between steps"."""
    i = row.input
    if i.method is None or i.fraction is None:
        return NA
    share = f"{100 * i.fraction:.1f}%"
    if i.method == "fetch":
        return f"{share} {i.verdict}" if i.verdict else share
    what = f"{share} input + between steps" if i.method == "gap" else f"{share} ({i.method})"
    return f"{what}: kept up" if i.verdict == "kept up" else what


def memory_text(res: Resources) -> str | None:
    """e.g. "1.2 GiB GPU", "812 MiB host RSS"; None when not recorded."""
    b = res.peak_memory_bytes
    if b is None:
        return None
    size = f"{b / 2**30:.1f} GiB" if b >= 2**30 else f"{b / 2**20:.0f} MiB"
    return f"{size} {res.memory_kind}"


# -- summarising: rows, speedups, ratios -------------------------------------------------------------------------------
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


def _pairs(rows: list[Row], ws: int, pair: registry.Pair) -> list[tuple[Row | None, Row | None]]:
    """(denominator row, numerator row) of ``pair`` at one world size, never across hardware; several rows (worker
    counts, node counts) pair equal ones only."""
    den = [r for r in rows if r.identity.plain == pair[1] and r.identity.world_size == ws]
    nom = [r for r in rows if r.identity.plain == pair[0] and r.identity.world_size == ws]
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


def _pairing(d: Row, n: Row) -> tuple[str | None, list[tuple[float, float]]]:
    """Whether both rows' runs of each round ran on the same nodes ("every round", "some rounds", "no"; None when no
    run recorded its nodes), and the (numerator, denominator) throughput of every round that did. A round only one
    side has (its other run failed) pairs nothing and spoils nothing."""
    def by_round(r: Row) -> dict[str, tuple[float, str | None]]:
        return {k: (ips, nodes) for ips, (k, nodes) in zip(r.throughput.ips, r.facts.rounds) if k is not None}

    both = d.facts.rounds + n.facts.rounds
    if not any(k for k, _ in both) or not any(nodes for _, nodes in both):
        return None, []
    den, num = by_round(d), by_round(n)
    common = sorted(den.keys() & num.keys(), key=int)
    pairs = [(num[k][0], den[k][0]) for k in common if den[k][1] and den[k][1] == num[k][1]]
    rounds = len(d.throughput.ips) == len(den) and len(n.throughput.ips) == len(num) and len(common) == len(pairs)
    return ("every round" if rounds and pairs else "some rounds" if pairs else "no"), pairs


def _ratio_row(pair: registry.Pair, ws: int, d: Row | None, n: Row | None, several: bool,
               headline: bool) -> RatioRow:
    """The ratio at one world size of a pair of rows, set on both rows too when it is the headline pair (what
    report.csv's ratio column holds). Runs in rounds on the same nodes give the paired t interval (every round
    paired, at least 3), others the two cells' independent resamples (6 runs a cell)."""
    ratio = n.throughput.median / d.throughput.median if d and n else None
    same, pairs = _pairing(d, n) if d and n else (None, [])
    paired = same == "every round"  # the paired interval needs 3 rounds, the unpaired one 6 runs a cell
    if paired:
        ci = paired_t_interval([a for a, _ in pairs], [b for _, b in pairs])
        if ci is not None:  # the paired interval's centre: the geometric mean of the round ratios, not the medians'
            ratio = math.sqrt(ci[0] * ci[1])
    else:
        ci = ratio_interval(n.throughput.ips, d.throughput.ips) if d and n else None
    for r in (d, n) if headline else ():
        if r is not None:
            r.scaling = replace(r.scaling, ratio=ratio, ratio_ci=ci)
    return RatioRow(*pair, ws, d.identity.num_workers if d else None, n.identity.num_workers if n else None,
                    d.throughput.median if d else None, n.throughput.median if n else None, ratio,
                    machine=_pair_machine(d, n, several), ratio_ci=ci,
                    layout=" / ".join(dict.fromkeys(r.identity.layout for r in (d, n) if r is not None)),
                    den_collective=d.facts.collective if d else None, num_collective=n.facts.collective if n else None,
                    caveat=collectives_caveat(d, n) if d and n else None, same_nodes=same, paired=paired,
                    pairs=len(pairs) if paired else 0,
                    den_row=d, num_row=n)


def collectives_caveat(den: Row, num: Row) -> str | None:
    """Why a ratio of these rows does not compare like for like, or None: on GPUs, NCCL on one side only (e.g.
    native ring, whose gRPC collectives go through host memory, against Horovod's NCCL)."""
    dc, nc = den.facts.collective, num.facts.collective
    if not (den.machine.gpu or num.machine.gpu) or dc is None or nc is None:
        return None
    if (dc == "nccl") == (nc == "nccl"):
        return None
    return f"{den.identity.plain} {dc} vs {num.identity.plain} {nc} on GPUs"


def _pair_note(ws: int, d: Row, n: Row) -> str | None:
    """Why a pair's ratio compares different topologies, node counts or layouts, or None."""
    di, ni = d.identity, n.identity
    den, num = di.plain, ni.plain
    if di.num_workers != ni.num_workers:
        return (f"at world size {ws} the backends ran different topologies ({den}: {di.num_workers} "
                f"worker(s), {num}: {ni.num_workers} worker(s)); the ratio compares them as they ran")
    if d.machine.nodes != n.machine.nodes and None not in (d.machine.nodes, n.machine.nodes):
        return (f"at world size {ws} the backends ran on different node counts ({den}: {d.machine.nodes}, "
                f"{num}: {n.machine.nodes}); the ratio compares them as they ran")
    if di.layout != ni.layout:
        return (f"at world size {ws} the backends ran different layouts (nodes x ranks per node; {den}: "
                f"{di.layout}, {num}: {ni.layout}); the ratio compares them as they ran")
    return None


def _ratios(rows: list[Row], notes: list[str], pair: registry.Pair, headline: bool = True) -> list[RatioRow]:
    """The pair's throughput ratio per world size (set on both rows too for the headline pair); notes on what is
    missing."""
    num, den = pair
    names = order_backends(r.identity.plain for r in rows)
    several = any(r.machine.label for r in rows)
    ratios: list[RatioRow] = []
    missing = [b for b in (den, num) if b not in names]
    if missing:
        present = ", ".join(names) or "none"
        notes.append(f"no {' or '.join(missing)} runs for this job (backends present: {present}), so the "
                     f"{num}/{den} ratio is {NA}")
    lone_sizes: dict[str, list[int]] = {}  # backend -> world sizes only it ran (ratio n/a there)
    for ws in sorted({r.identity.world_size for r in rows}):
        for d, n in _pairs(rows, ws, pair):
            if d is None and n is None:  # only other backends ran at this world size
                continue
            q = _ratio_row(pair, ws, d, n, several, headline)
            ratios.append(q)
            if q.caveat:
                notes.append(f"at world size {ws} the {num}/{den} ratio is not like for like "
                             f"({q.caveat}): it compares the collectives as much as the backends")
            lone = d if n is None else n if d is None else None
            if not missing and lone is not None:
                lone_sizes.setdefault(lone.identity.label, []).append(ws)
            elif d and n and (note := _pair_note(ws, d, n)):
                notes.append(note)
    for b, sizes in lone_sizes.items():
        listed = ", ".join(str(x) for x in dict.fromkeys(sizes))
        notes.append(f"{num}/{den} ratio is {NA} at world size {listed}: only {b} ran there")
    return ratios


def pair_ratios(s: JobSummary, pair: registry.Pair) -> list[RatioRow]:
    """The ratio rows of ``pair`` in the job: the summary's own when it compared that pair, else computed now (its
    rows' figures untouched, its notes dropped): a section that asks one fixed question (common.report.migrate)
    reads its pair whatever the report compared."""
    return s.ratios_of(pair) if pair in s.pairs else _ratios(s.rows, [], pair, headline=False)


def _row_notes(rows: list[Row], notes: list[str]) -> None:
    """Notes on rows of a single repeat or of too few for an interval, repeats that used different collectives, and
    rows whose ranks all got the same first batches."""
    if any(r.throughput.repeats == 1 for r in rows):
        notes.append(f"rows with a single repeat show \"{NO_INTERVAL}\"; repeat those runs to get an interval")
    if any(1 < r.throughput.repeats < MIN_CI_RUNS for r in rows):
        notes.append(f"rows with 2-{MIN_CI_RUNS - 1} repeats show their range (min-max), not a confidence interval: "
                     f"a 95% interval of the median needs at least {MIN_CI_RUNS} repeats")
    for row in rows:
        if row.facts.collective and "," in row.facts.collective:
            notes.append(f"{row.identity.label} at {row.identity.world_size} replicas: its repeats used different "
                         f"collectives ({row.facts.collective}); pin one (native --comm) to compare like with like")
    for row in rows:
        if row.facts.same_batches:
            notes.append(f"{row.identity.label} at {row.identity.world_size} replicas: in {row.facts.same_batches} "
                         f"of {row.throughput.repeats} repeat(s) every rank got the same first batches (the input "
                         "function's fingerprints, input.pipeline): it does not shard by "
                         "input_context.input_pipeline_id, so the workers trained on the same data")


def _summarize_job(job_hash: str, runs: list[LoadedRun], pairs: tuple[registry.Pair, ...]) -> JobSummary:
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
    ratios = [q for i, pair in enumerate(pairs) for q in _ratios(rows, notes, pair, headline=i == 0)]
    _row_notes(rows, notes)
    notes += run_notes(job, runs, row_label)
    windows = sorted({int(w) for r in recs if isinstance(w := r.step_time.get("window_steps"), int) and w > 1})
    if windows:
        notes.append(f"step p50 / p95 are per-window: the host read the device every {' or '.join(map(str, windows))}"
                     " steps (job key sync_every_steps), so each value is the mean step time of such a window; "
                     "sync_every_steps = 1 gives per-step times at the price of a host sync per step")
    return JobSummary(job_hash, name, job, rows, ratios, notes, runs, _version_mix_per_stack(recs), pairs)


def _version_mix_per_stack(recs: Sequence[RunRecord]) -> list[str]:
    """A mix of versions inside one stack (one container image, or the host): runs of two images are two stacks,
    kept in rows of their own, so their versions may differ without being a mix."""
    stacks: dict[str, list[RunRecord]] = {}
    for r in recs:
        stacks.setdefault(stack_of(r), []).append(r)
    return list(dict.fromkeys(m for group in stacks.values() for m in version_mix(group)))


def summarize(runs: Iterable[LoadedRun | RunRecord | Mapping[str, Any]],
              pairs: Sequence[registry.Pair] = registry.PAIRS) -> list[JobSummary]:
    """One JobSummary per job_hash (sorted by job name, then hash); runs of different jobs are never mixed. A run
    may be loaded (load_runs), a record, or a parsed results JSON (read as a record, older schemas upgraded).
    ``pairs``: the backend pairs compared (numerator, denominator), the first the headline."""
    groups: dict[str, list[LoadedRun]] = {}
    for r in runs:
        run = LoadedRun.of(r)
        groups.setdefault(run.record.job_hash, []).append(run)
    out = [_summarize_job(h, rs, tuple(pairs)) for h, rs in groups.items()]
    return sorted(out, key=lambda s: (s.name, s.job_hash))
