"""Where a rank runs on its host: its share of the CPUs (``--cpu-bind``), its intra-op thread budget, and the one
GPU it keeps. Both backends call these in ``setup``, before any other TensorFlow op; nothing here imports TensorFlow
at module level, so the flags' checks (``CPU_BIND``) stay cheap."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

from common.cluster import nccl
from common.core.errors import UsageError, one_line

CPU_BIND = ("none", "cores")  # --cpu-bind choices; none (default): this process's mask is left as launched


def cpu_share(local_rank: int, local_size: int, cpus: list[int]) -> list[int]:
    """``local_rank``'s block of ``cpus``: ``len(cpus) // local_size`` contiguous CPUs (a remainder stays idle, as
    the thread budget ignores it); with more ranks than CPUs, one CPU each, round robin."""
    if local_size >= len(cpus):
        return [cpus[local_rank % len(cpus)]]
    per = len(cpus) // local_size
    return cpus[local_rank * per:(local_rank + 1) * per]


def bind_cpus(local_rank: int, local_size: int, mode: str) -> tuple[list[int], str]:
    """Returns (the CPUs this process may use, who bound it: "launcher" | "self" | "none"). A mask narrower than
    the parent's was set by the launcher (srun --cpu-bind, mpirun's default binding) and is kept. Otherwise, with
    ``mode`` "cores" and other local ranks, bind this process to its ``cpu_share``, as srun --cpu-bind=cores would;
    horovodrun --gloo and the native --nproc launcher bind nothing. Binding changes the two backends differently
    (docs/multinode.md, "CPU binding"), hence opt-in and recorded."""
    mine = sorted(os.sched_getaffinity(0))
    try:
        parent = sorted(os.sched_getaffinity(os.getppid()))
    except OSError:  # the parent is gone or not ours to inspect: take the mask as the launcher's
        parent = mine
    if mine != parent:
        return mine, "launcher"
    if mode != "cores" or local_size <= 1:
        return mine, "none"
    share = cpu_share(local_rank, local_size, mine)
    # Every thread, as srun binds a whole task: sched_setaffinity(0) sets only the calling thread's mask, which
    # threads created later inherit (TensorFlow's pools); threads already running (Horovod's background thread,
    # started by hvd.init) keep theirs unless set one by one.
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), share)
    return share, "self"


def configure_threads(local_size: int, threads: int, local_rank: int = 0,
                      cpu_bind: str = "none") -> tuple[int, list[int], str]:
    """Give each local process an equal share of the cores (TF otherwise sizes pools for all cores per process),
    bound to them with ``cpu_bind`` "cores" (``bind_cpus``). Returns (intra-op threads, CPUs, who bound them)."""
    import tensorflow as tf

    cpus, how = bind_cpus(local_rank, local_size, cpu_bind)
    if threads <= 0:
        # bound (by us or a launcher): the mask is this process's own; unbound: an equal part of the shared mask
        share = len(cpus) if how != "none" else len(cpus) // max(local_size, 1)
        threads = max(1, share)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, threads)))
    except RuntimeError as e:  # TensorFlow's "... cannot be modified after initialization" (eager/context.py)
        raise UsageError(
            "TensorFlow started before twinbench could configure it: a module of the job (model, dataset, loss, "
            "optimizer... found through pythonpath) runs TensorFlow when imported, e.g. makes a tensor, variable or "
            "model at module level, whose variables would also be outside the strategy's scope: make them inside the "
            f"function ({one_line(e)})") from None
    return threads, cpus, how


@dataclass(frozen=True)
class Pinning:
    """The GPU this process kept, and the trace of the binding for the record."""

    device: str  # TensorFlow's name of the kept device ("cpu" when there is none)
    visible: str | None  # CUDA_VISIBLE_DEVICES as the launcher set it
    physical: str | None  # the physical GPU id among ``visible`` (== visible when nothing was picked)

    def label(self) -> str:
        """"cpu (CUDA_VISIBLE_DEVICES=1)", ".../GPU:2 (CUDA_VISIBLE_DEVICES=0,1,2,3, GPU 2)" or the bare device."""
        if self.visible is None:
            return self.device
        pick = f", GPU {self.physical}" if self.physical != self.visible else ""
        return f"{self.device} (CUDA_VISIBLE_DEVICES={self.visible}{pick})"


def pin_one_gpu(local_rank: int, prog: str, gpus: list[Any] | None = None) -> Pinning:
    """Keep one GPU for this process (memory growth on) and hide the others from TensorFlow.

    The only one if the launcher bound this task to one (``srun --gpus-per-task=1``, ``--gpu-bind=single:1``), else
    the ``local_rank``-th of the node's GPUs (horovodrun, mpirun, ``srun --gres=gpu:N`` alone): the rule Horovod
    documents, used by both backends. Without a GPU the launcher's ``CUDA_VISIBLE_DEVICES`` (fake gres, CPU runs)
    is still recorded: it is the only trace of the binding. Never the Slurm resolver's ``auto_set_gpu``, which would
    overwrite what Slurm set.
    """
    import sys

    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU") if gpus is None else gpus
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not gpus:
        return Pinning("cpu", visible, visible)
    index = 0 if len(gpus) == 1 else local_rank % len(gpus)
    if len(gpus) > 1 and local_rank >= len(gpus):
        print(f"[{prog}] warning: local rank {local_rank} but only {len(gpus)} GPUs visible; sharing GPU {index}",
              file=sys.stderr, flush=True)
    mine = gpus[index]
    nccl.enable(gpu=True)  # NCCL's log file (which network it chose), before NCCL starts; unless the user set theirs
    tf.config.set_visible_devices(mine, "GPU")
    tf.config.experimental.set_memory_growth(mine, True)
    ids = (visible or "").split(",")
    return Pinning(mine.name, visible, ids[index] if len(ids) == len(gpus) else str(index))
