"""GPU energy over a run's timed steps: NVML's total energy counter (``nvmlDeviceGetTotalEnergyConsumption``, mJ
since the driver was loaded; Volta and later), read on every rank at the end of the untimed warm-up and after the
last step, the difference summed over the ranks' GPUs by the chief.

It is the GPUs' own energy, nothing else (no CPU, host memory, network, cooling): labelled "GPU only", never
comparable with MLPerf Power's whole-system measurements. No GPU, no NVML, or a GPU without the counter: no meter,
and the record's ``energy`` is absent (None), never zero. No TensorFlow at import.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from common.cluster.machine import load_nvml, nvml_handle, visible_id

SCOPE = "GPU only"
METHOD = ("NVML nvmlDeviceGetTotalEnergyConsumption (mJ counter), read at the end of the warm-up and after the last "
          "step on every rank; the difference summed over the ranks' distinct GPUs")


class EnergyMeter:
    """One rank's GPU energy counter; ``at_mark`` is called at each clock mark of the run (steps done in it).

    A part of the host's syncs (``common.training.hostsync.Part``, whose protocol it follows without importing it:
    this layer is below training): read right after the clock's marks, asks for no sync of its own, measures
    ``{"energy": result()}``."""

    before_mark = False  # right after the mark: a read at the warm-up's end is inside the timed window, once
    untimed = 0

    def __init__(self, nvml: Any, handle: Any, gpu: str) -> None:
        self.nvml, self.handle, self.gpu = nvml, handle, gpu
        self.first_mj: int | None = None  # counter at the end of the warm-up (mJ)
        self.last_mj: int | None = None  # counter after the last step (mJ)

    def read(self) -> int:
        return int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))

    def at_mark(self, done: int, warm: int, last: int) -> None:
        """At the mark after ``done`` steps: the start of the timed window (``warm``) or its end (``last``). A
        failed read leaves the figure absent rather than a wrong one."""
        try:
            if done == warm and self.first_mj is None:
                self.first_mj = self.read()
            if done >= last and self.first_mj is not None and self.last_mj is None:
                self.last_mj = self.read()
        except Exception:  # noqa: BLE001 - whatever NVML raises mid-run: no energy figure, the run goes on
            self.first_mj = self.last_mj = None
            self.at_mark = lambda *_: None  # type: ignore[method-assign]

    def start(self, at: Any) -> None:
        self.at_mark(0, at.warm, at.run_steps)

    def wants_sync(self, last: int, done: int, global_step: int) -> bool:
        return False  # read at the syncs that happen anyway: the warm-up's end and the last step are always syncs

    def at_sync(self, at: Any) -> None:
        self.at_mark(at.done, at.warm, at.run_steps)

    def measured(self) -> dict[str, Any]:
        """This rank's part of ``combine``'s input, under the record's name; shuts NVML down (once, after the loop)."""
        return {"energy": self.result()}

    def result(self) -> dict[str, Any] | None:
        """{"gpu": its NVML selector, "joules": energy over the timed steps}, None when not both reads happened;
        shuts NVML down (call once, after the loop)."""
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down is best effort
            pass
        if self.first_mj is None or self.last_mj is None or self.last_mj < self.first_mj:
            return None
        return {"gpu": self.gpu, "joules": (self.last_mj - self.first_mj) / 1000.0}


def open_meter(ordinal: int | None, cuda_visible: str | None, nvml: Any | None) -> EnergyMeter | None:
    """The meter of CUDA device ``ordinal`` of this process, None without one (no GPU, no NVML, no counter)."""
    if ordinal is None or nvml is None:
        return None
    selector = visible_id(ordinal, cuda_visible)
    if selector is None:
        return None
    try:
        nvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver or library
        return None
    try:
        handle = nvml_handle(nvml, selector)
        nvml.nvmlDeviceGetTotalEnergyConsumption(handle)  # NVMLError (NotSupported) before Volta
        return EnergyMeter(nvml, handle, selector)
    except Exception:  # noqa: BLE001 - no such device or no counter: no meter
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
        return None


def rank_meter(tf: Any | None = None, environ: Mapping[str, str] | None = None,
               nvml: Any | None = None) -> EnergyMeter | None:
    """This rank's meter: the first GPU TensorFlow sees is the rank's (the backends pin one per process)."""
    if tf is None:
        import tensorflow as tf
    gpus = tf.config.get_visible_devices("GPU")
    if not gpus:
        return None
    env = os.environ if environ is None else environ
    return open_meter(int(gpus[0].name.rsplit(":", 1)[1]), env.get("CUDA_VISIBLE_DEVICES"),
                      nvml if nvml is not None else load_nvml())


def combine(per_rank: Sequence[Mapping[str, Any] | None], hosts: Sequence[str],
            images: float | None) -> dict[str, Any] | None:
    """The record's ``energy`` block from every rank's ``EnergyMeter.result()`` (rank order): the sum over distinct
    GPUs (host, selector: ranks sharing a GPU count it once), None unless every rank measured."""
    if not per_rank or any(r is None for r in per_rank):
        return None
    gpus = {(h, r["gpu"]): float(r["joules"]) for h, r in zip(hosts, per_rank) if r is not None}
    total = sum(gpus.values())
    return {"gpu_joules": total, "scope": SCOPE, "method": METHOD,
            "per_rank_joules": [float(r["joules"]) for r in per_rank if r is not None],
            "joules_per_image": total / images if images else None}
