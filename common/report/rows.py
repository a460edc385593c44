"""What a job's summary holds: its rows (one backend x machine x world size x layout cell of the scaling table),
their ratios, and how a run is labelled (the row it joins)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from common.core import registry
from common.core.results import RunRecord
from common.report.base import NA
from common.report.load import LoadedRun
from common.report.resources import Resources
from common.report.stats import Interval

RATIO_NUM, RATIO_DEN = registry.RATIO  # numerator and denominator of the throughput ratio


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

    def __post_init__(self) -> None:
        object.__setattr__(self, "plain", self.plain or self.label)
        object.__setattr__(self, "series", self.series or self.plain)


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
    """Medians over the row's repeats, in seconds (None: n/a)."""

    p50: float | None
    p95: float | None
    mean: float | None
    first_step: float | None  # time to first step
    timed_wall: float | None  # the slowest rank's timed wall time


@dataclass(frozen=True)
class RunFacts:
    """What the row's runs were and where they came from."""

    global_batch_size: int | None
    final_loss: float | None  # median over repeats of the last step's loss
    collective: str | None  # ``RunRecord.collective_used`` of the repeats ("a, b" if they differ); None: unknown
    files: list[str]  # the repeats' results files


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


def order_backends(names: Iterable[str]) -> list[str]:
    """The registry's backends in its order, then any other backend found in results, sorted."""
    names = set(names)
    known = registry.names()
    return [b for b in known if b in names] + sorted(names - set(known))


def row_label(run: RunRecord) -> str:
    """The backend column of a run's row: its backend, or with a strategy other than the default e.g. "native
    (mirrored)", with tuning knobs not at their defaults e.g. "horovod (fusion 32 MiB)", and for an asynchronous
    run (``RunRecord.asynchronous``: parameter-server training) "native (parameter_server, asynchronous)": rows of
    their own, never merged with the default's, outside the backend ratio (which compares the backends' default
    ways of training; variants meet in the report's best vs best table)."""
    parts = [s for s in (run.strategy, run.tuning_variant) if s]
    if run.asynchronous is True:
        parts = [*(parts or ["?"]), "asynchronous"]
    return f"{run.backend} ({', '.join(parts)})" if parts else str(run.backend)


_GPU = re.compile(r"gpu:", re.IGNORECASE)  # TensorFlow's device names: "/physical_device:GPU:0", "/gpu:0"


def gpu_run(run: RunRecord) -> bool:
    """A rank of the run computed on a GPU (its ``devices`` name one; "cpu (CUDA_VISIBLE_DEVICES=0)" does not)."""
    return isinstance(run.devices, list) and any(_GPU.search(str(d)) for d in run.devices)


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
