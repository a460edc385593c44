"""What a row's runs cost besides time: peak memory per rank, GPU energy (NVML's counter over the timed steps,
``RunRecord.energy``, GPU only) and GPU-hours per epoch and to target, medians over the repeats.

Memory: the TensorFlow allocator's peak on the rank's GPU when a rank recorded one (``machine`` block,
``memory.peak_gpu_bytes``), else the process's peak resident set (``memory.peak_rss_bytes``, host memory). Energy
and GPU-hours exist only for runs on GPUs: absent, never zero, on a CPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from common.cluster.machine import section
from common.core.results import RunRecord
from common.report.stats import median, num

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
