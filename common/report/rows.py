"""What a job's summary holds: its rows (one backend x machine x world size x layout cell of the scaling table),
their ratios, how a run is labelled (the row it joins), and each row's figures from its repeats' records: validation
(time to target, MLPerf's time-to-train idea, and the final validation numbers, from ``RunRecord.evaluations`` and
``time_to_target_s``) and what the runs cost besides time (peak memory per rank, GPU energy over the timed steps,
``RunRecord.energy``, and GPU-hours; energy and GPU-hours only for runs on GPUs: absent, never zero, on a CPU).

Memory: the TensorFlow allocator's peak on the rank's GPU when a rank recorded one (``machine`` block,
``memory.peak_gpu_bytes``), else the process's peak resident set (``memory.peak_rss_bytes``, host memory)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from common.cluster.machine import section
from common.core import registry
from common.core.results import EVALUATION_META, RunRecord
from common.report.base import IMAGES, NA, SAMPLES
from common.report.stats import Interval, median, num

RATIO_NUM, RATIO_DEN = registry.RATIO  # numerator and denominator of the throughput ratio


class Layout(NamedTuple):
    """Where a run's ranks ran, from its ``hosts`` (one entry per rank; every schema has it): nodes = distinct
    hosts, ranks per node = ranks / nodes (None when the nodes hold different numbers), text "2x4" (nodes x ranks
    per node), "2x(3+1)" for uneven nodes, "?" when the record names no hosts."""

    nodes: int | None
    ranks_per_node: int | None
    text: str


def layout_of(hosts: Sequence[Any] | None) -> Layout:
    """The Layout of a run whose ranks ran on ``hosts``."""
    if not isinstance(hosts, list) or not hosts:
        return Layout(None, None, "?")
    counts = Counter(str(h) for h in hosts)
    per = sorted(counts.values(), reverse=True)
    if len(set(per)) == 1:
        return Layout(len(counts), per[0], f"{len(counts)}x{per[0]}")
    return Layout(len(counts), None, f"{len(counts)}x({'+'.join(map(str, per))})")


@dataclass(frozen=True)
class LoadedRun:
    """A training run as the report holds it: its record (of the current schema: older files are upgraded on
    reading) and where it came from."""

    record: RunRecord
    path: str | None = None  # the results file it was read from; None for a record handed in, not read

    @property
    def layout(self) -> Layout:
        return layout_of(self.record.hosts)

    @classmethod
    def of(cls, run: LoadedRun | RunRecord | Mapping[str, Any]) -> LoadedRun:
        """A run handed to the report: loaded already, a record, or a parsed results JSON (RecordError if it is not
        a readable one)."""
        if isinstance(run, LoadedRun):
            return run
        return cls(run if isinstance(run, RunRecord) else RunRecord.from_dict(run))


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
    # per repeat (in ``Throughput.ips`` order): its sweep round (the run directory's -r<k>) and the nodes its job step
    # ran on (``RunRecord.nodelist``); None where not recorded (runs outside a sweep, outside Slurm)
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
    ratio: float | None = None  # registry.RATIO at this world size, on both backends' rows
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


def memory_text(res: Resources) -> str | None:
    """e.g. "1.2 GiB GPU", "812 MiB host RSS"; None when not recorded."""
    b = res.peak_memory_bytes
    if b is None:
        return None
    size = f"{b / 2**30:.1f} GiB" if b >= 2**30 else f"{b / 2**20:.0f} MiB"
    return f"{size} {res.memory_kind}"


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
    """registry.RATIO (numerator / denominator median throughput) at one world size."""

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
    paired: bool = False  # every round of both on the same nodes: ratio_ci (from 6 rounds) is the paired bootstrap
    # over rounds (stats.paired_ratio_interval)
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


# -- validation ----------------------------------------------------------------------------------------------------
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


def same_first_batches(run: RunRecord) -> bool:
    """The run's ranks (two or more) all got the same first batches: the fingerprints an input function's runs record
    per rank (``input.pipeline.per_rank``) are all equal, so its workers trained on the same data."""
    pipeline = run.input.get("pipeline") if isinstance(run.input, Mapping) else None
    per_rank = pipeline.get("per_rank") if isinstance(pipeline, Mapping) else None
    prints = [r.get("fingerprint") for r in per_rank if isinstance(r, Mapping)] if isinstance(per_rank, list) else []
    return len(prints) > 1 and None not in prints and len(set(map(str, prints))) == 1
