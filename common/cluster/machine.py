"""What machine a run ran on (every record's ``machine`` block), from what a rank can read without root.

Each rank calls ``rank_machine`` after its last step (so the peak RSS is the run's peak) and the chief ``combine``s
the gathered dicts. The facts: the CPU (model, logical cores, the size of the rank's CPU mask), the GPU the rank kept
(model, memory, compute capability, driver, and which source answered: NVML, nvidia-smi or TensorFlow), the CUDA and
cuDNN TensorFlow was built with, the NCCL Horovod was built with, the MPI library, the Slurm job, the data interface's
link speed and the RDMA devices, and the rank's peak host and GPU memory.

No TensorFlow import at module level (the report reads these blocks and never imports TensorFlow); ``rank_machine``
imports it lazily. Every reader returns None (or "none") for what it cannot read instead of failing: a finished run
is never lost to a missing ``nvidia-smi``.
"""

from __future__ import annotations

import os
import platform
import resource
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

SYSFS = "/sys"  # where Linux shows network interfaces (class/net) and RDMA devices (class/infiniband)
CPUINFO = "/proc/cpuinfo"  # Linux's CPU description; its "model name" lines name the CPU model (x86)
NVIDIA_SMI = "nvidia-smi"  # looked up on PATH, as a user would run it
SMI_QUERY = "name,memory.total,compute_cap,driver_version"  # the GPU fields, in the order they are parsed
COMMAND_TIMEOUT = 20.0  # seconds for nvidia-smi / mpirun --version: they answer in under a second; a hung driver
# must not hang a rank that has finished training
ALWAYS_PER_RANK = ("cpu_mask", "gpu", "memory")  # facts of each process: listed per rank even when all are equal
NO_GPU: dict[str, Any] = {"source": "none", "id": None, "model": None, "memory_bytes": None,
                          "compute_capability": None, "driver": None}


# -- CPU ------------------------------------------------------------------------------------------------------
def cpu_facts(cpuinfo: str = CPUINFO) -> dict[str, Any]:
    """The CPU model (``cpuinfo``'s first "model name", else ``platform.processor()``, else None) and the logical
    cores of the host (``os.cpu_count()``, which ignores the process's CPU mask)."""
    model = None
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() == "model name" and value.strip():
                    model = " ".join(value.split())
                    break
    except OSError:
        pass  # not Linux, or /proc not mounted: the platform's answer below
    return {"model": model or platform.processor() or None, "logical_cores": os.cpu_count()}


def cpu_mask_size() -> int | None:
    """How many CPUs this process may run on (its affinity mask: what a launcher or --cpu-bind left it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity masks on this OS
        return None


# -- GPU ------------------------------------------------------------------------------------------------------
def visible_id(ordinal: int, cuda_visible: str | None) -> str | None:
    """The NVML selector (an index, or a UUID or UUID prefix) of CUDA device ``ordinal`` of this process.

    NVML and nvidia-smi ignore CUDA_VISIBLE_DEVICES: they number every GPU of the host. CUDA numbers the devices
    CUDA_VISIBLE_DEVICES lists, in its order, and stops at the first invalid entry (such as -1), so the ordinal-th
    entry names the device. An index entry is taken as an NVML index, which holds when CUDA enumerates in PCI bus
    order (CUDA_DEVICE_ORDER=PCI_BUS_ID, and in practice on nodes of identical GPUs); a UUID is unambiguous.
    """
    if cuda_visible is None:
        return str(ordinal)
    entries = []
    for entry in (e.strip() for e in cuda_visible.split(",")):
        if not entry or entry.startswith("-"):
            break
        entries.append(entry)
    return entries[ordinal] if 0 <= ordinal < len(entries) else None


def _text(value: Any) -> str:
    """A string from NVML (older pynvml versions return bytes)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_handle(nvml: Any, selector: str) -> Any:
    if selector.isdigit():
        return nvml.nvmlDeviceGetHandleByIndex(int(selector))
    try:
        return nvml.nvmlDeviceGetHandleByUUID(selector)
    except nvml.NVMLError:  # a unique prefix, which CUDA accepts and NVML does not
        found = [h for h in map(nvml.nvmlDeviceGetHandleByIndex, range(nvml.nvmlDeviceGetCount()))
                 if _text(nvml.nvmlDeviceGetUUID(h)).startswith(selector)]
        if len(found) != 1:
            raise
        return found[0]


def gpu_from_nvml(selector: str, nvml: Any) -> dict[str, Any]:
    """The GPU NVML calls ``selector`` (raises whatever NVML raises: the caller falls back)."""
    nvml.nvmlInit()
    try:
        handle = nvml_handle(nvml, selector)
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        return {"model": _text(nvml.nvmlDeviceGetName(handle)),
                "memory_bytes": int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
                "compute_capability": f"{major}.{minor}", "driver": _text(nvml.nvmlSystemGetDriverVersion())}
    finally:
        nvml.nvmlShutdown()


def _smi_value(text: str) -> str | None:
    return None if not text or text.startswith("[") else text  # "[N/A]", "[Not Supported]"


def gpu_from_smi(selector: str, smi: str = NVIDIA_SMI) -> dict[str, Any]:
    """The GPU nvidia-smi calls ``selector`` (``-i``: an NVML index or a UUID); raises when it does not answer."""
    out = subprocess.run([smi, f"--query-gpu={SMI_QUERY}", "--format=csv,noheader,nounits", "-i", selector],
                         capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=True).stdout
    name, memory, cc, driver = (_smi_value(p.strip()) for p in out.strip().splitlines()[0].split(","))
    if name is None:
        raise ValueError(f"nvidia-smi named no GPU: {out.strip()!r}")
    mib = float(memory) if memory is not None else None
    return {"model": name, "memory_bytes": int(mib * 2**20) if mib is not None else None,  # nounits: MiB
            "compute_capability": cc, "driver": driver}


def gpu_from_tensorflow(details: Mapping[str, Any]) -> dict[str, Any]:
    """What ``tf.config.experimental.get_device_details`` tells: model and compute capability only."""
    cc = details.get("compute_capability")
    if not details.get("device_name"):
        raise ValueError("TensorFlow gave no device name")
    return {"model": str(details["device_name"]), "memory_bytes": None,
            "compute_capability": f"{cc[0]}.{cc[1]}" if cc else None, "driver": None}


def load_nvml() -> Any | None:
    """The pynvml module (package nvidia-ml-py), or None when it is not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def gpu_facts(ordinal: int | None, cuda_visible: str | None = None, *, nvml: Any | None = None,
              smi: str = NVIDIA_SMI, details: Callable[[], Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The GPU this rank kept (CUDA device ``ordinal`` of the process; None: it kept none), from NVML, else
    nvidia-smi, else TensorFlow's ``details()``; ``source`` says which answered ("none" when none did)."""
    if ordinal is None:
        return dict(NO_GPU)
    selector = visible_id(ordinal, cuda_visible)
    tries: list[tuple[str, Callable[[], dict[str, Any]]]] = []
    if selector is not None:
        if nvml is not None:
            tries.append(("nvml", lambda: gpu_from_nvml(selector, nvml)))
        tries.append(("nvidia-smi", lambda: gpu_from_smi(selector, smi)))
    if details is not None:
        tries.append(("tensorflow", lambda: gpu_from_tensorflow(details())))
    for source, read in tries:
        try:
            return {"source": source, "id": selector, **read()}
        except Exception:  # noqa: BLE001 - whatever one source raises (no library, no driver, no binary), try the next
            continue
    return {**NO_GPU, "id": selector}


# -- libraries ------------------------------------------------------------------------------------------------
def nccl_version(code: int) -> str:
    """NCCL_VERSION_CODE as "major.minor.patch" (X*10000 + Y*100 + Z since 2.9, X*1000 + Y*100 + Z before)."""
    major, rest = divmod(code, 10000) if code >= 10000 else divmod(code, 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def horovod_nccl() -> str | None:
    """The NCCL this process's Horovod was built with (``nccl_built()`` returns its version code, 0 without NCCL);
    None when the process runs no Horovod (the native backend's NCCL is TensorFlow's, which it does not report)."""
    hvd = sys.modules.get("horovod.tensorflow")
    if hvd is None:
        return None
    try:
        code = int(hvd.nccl_built())
    except Exception:  # noqa: BLE001 - Horovod not initialised or its library missing: unknown, not fatal
        return None
    return nccl_version(code) if code > 0 else None


def _first_line(text: str) -> str | None:
    line = text.replace("\x00", "").strip().splitlines()[0].strip() if text.strip("\x00 \n") else ""
    return line or None


def mpi_version() -> str | None:
    """The MPI library's version string (its first line): mpi4py's ``MPI.Get_library_version()``, else the first
    line of ``mpirun --version`` or ``ompi_info --version``; None when there is no MPI."""
    try:
        import mpi4py

        previous = mpi4py.rc.initialize
        # Only the version string, which MPI_Get_library_version gives before MPI_Init: a rank that does not run MPI
        # (the native backend) must not start it. Without effect if mpi4py.MPI is already imported.
        mpi4py.rc.initialize = False
        try:
            from mpi4py import MPI
        finally:
            mpi4py.rc.initialize = previous
        return _first_line(MPI.Get_library_version())
    except Exception:  # noqa: BLE001 - no mpi4py, or no MPI library it can load: ask the commands
        pass
    for command in (["mpirun", "--version"], ["ompi_info", "--version"]):
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
        except (OSError, subprocess.SubprocessError):
            continue
        if proc.returncode == 0 and _first_line(proc.stdout):
            return _first_line(proc.stdout)
    return None


def library_facts(build_info: Mapping[str, Any] | None) -> dict[str, str | None]:
    """CUDA and cuDNN TensorFlow was built with (``tf.sysconfig.get_build_info()``; absent on CPU builds), Horovod's
    NCCL and the MPI library."""
    info = build_info or {}
    return {"cuda": info.get("cuda_version"), "cudnn": info.get("cudnn_version"), "nccl": horovod_nccl(),
            "mpi": mpi_version()}


# -- Slurm, network, memory -----------------------------------------------------------------------------------
SLURM_VARS = {  # field -> variables, first set wins (older Slurm spells some without _JOB_)
    "job_id": ("SLURM_JOB_ID", "SLURM_JOBID"),
    "step_id": ("SLURM_STEP_ID", "SLURM_STEPID"),
    "nodelist": ("SLURM_JOB_NODELIST", "SLURM_NODELIST"),
    "num_nodes": ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"),
    "ntasks": ("SLURM_NTASKS", "SLURM_NPROCS"),
    "cpus_per_task": ("SLURM_CPUS_PER_TASK",),
    "partition": ("SLURM_JOB_PARTITION",),
}
SLURM_INTS = ("num_nodes", "ntasks", "cpus_per_task")  # counts; the ids stay strings (a step may be "batch")


def slurm_facts(environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The Slurm job this rank ran in, from its SLURM_* variables; None outside Slurm (no job id)."""
    env = os.environ if environ is None else environ
    out: dict[str, Any] = {}
    for field, names in SLURM_VARS.items():
        value = next((env[n] for n in names if env.get(n)), None)
        if field in SLURM_INTS and value is not None:
            value = int(value) if value.isdigit() else None
        out[field] = value
    return out if out["job_id"] else None


def step_facts(environ: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """The run record's ``slurm_job``, ``slurm_step`` and ``nodelist``: this job step's, from srun's variables
    (SLURM_STEP_NODELIST: the step's nodes, a subset of the job's in a one-allocation sweep; else the job's)."""
    env = os.environ if environ is None else environ
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or None
    if not job:
        return {"slurm_job": None, "slurm_step": None, "nodelist": None}
    return {"slurm_job": job, "slurm_step": env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID") or None,
            "nodelist": env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
            or None}


def link_speed(iface: str | None, sysfs: str = SYSFS) -> int | None:
    """``iface``'s link speed in Mbit/s (``class/net/IF/speed``); None when unknown (-1: no link or a virtual
    interface; unreadable: loopback, no such interface)."""
    if not iface or "/" in iface:
        return None
    try:
        speed = int((Path(sysfs) / "class" / "net" / iface / "speed").read_text().strip())
    except (OSError, ValueError):
        return None
    return speed if speed > 0 else None


def rdma_devices(sysfs: str = SYSFS) -> list[str]:
    """The RDMA devices of this host (``class/infiniband``: InfiniBand HCAs, RoCE NICs), sorted."""
    try:
        return sorted(os.listdir(Path(sysfs) / "class" / "infiniband"))
    except OSError:  # no RDMA stack loaded
        return []


def network_facts(iface: str | None, sysfs: str = SYSFS) -> dict[str, Any]:
    """The data interface (the run's --iface, else the one holding the address this host name resolves to), its
    link speed and the host's RDMA devices."""
    if not iface:
        from common.cluster import netif

        iface = netif.own_endpoint(None)["interface"]
    return {"interface": iface, "link_speed_mbps": link_speed(iface, sysfs), "rdma_devices": rdma_devices(sysfs)}


def peak_rss_bytes(status: str = "/proc/self/status") -> int:
    """This process's peak resident set size so far (getrusage's ru_maxrss: KiB on Linux, bytes on macOS), and at
    least Linux's VmHWM and VmRSS: the kernel syncs each thread's RSS counters lazily, so with many threads (as
    TensorFlow runs) ru_maxrss can trail the current RSS by a few pages."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    best = int(peak) if sys.platform == "darwin" else int(peak) * 1024
    try:
        with open(status, encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmHWM", "VmRSS") and value.split() and value.split()[0].isdigit():
                    best = max(best, int(value.split()[0]) * 1024)  # "VmRSS:   123456 kB"
    except OSError:
        pass  # not Linux: getrusage's figure alone
    return best


# -- one rank, then the record --------------------------------------------------------------------------------
def _tensorflow_facts(tf: Any) -> tuple[int | None, Callable[[], Mapping[str, Any]] | None, dict[str, Any],
                                        int | None]:
    """(CUDA ordinal of the kept GPU, its device details reader, TF's build info, TF's peak GPU memory in bytes).

    The backends pin one GPU per process: the first GPU TensorFlow still sees is the rank's (its physical index is
    the CUDA ordinal within CUDA_VISIBLE_DEVICES)."""
    info = dict(tf.sysconfig.get_build_info())
    gpus = tf.config.get_visible_devices("GPU")
    if not gpus:
        return None, None, info, None
    try:
        peak = int(tf.config.experimental.get_memory_info("GPU:0")["peak"])
    except (ValueError, RuntimeError):  # the device was never initialised in this process
        peak = None
    ordinal = int(gpus[0].name.rsplit(":", 1)[1])
    return ordinal, lambda: tf.config.experimental.get_device_details(gpus[0]), info, peak


def rank_machine(iface: str | None, *, sysfs: str = SYSFS, cpuinfo: str = CPUINFO,
                 environ: Mapping[str, str] | None = None, tf: Any | None = None) -> dict[str, Any]:
    """This rank's machine facts (JSON-serialisable); call it after the last step, on every rank.

    ``tf``: the TensorFlow module (default: imported here); ``sysfs``, ``cpuinfo``, ``environ``: where the facts are
    read (defaults: this host's)."""
    if tf is None:
        import tensorflow as tf
    env = os.environ if environ is None else environ
    ordinal, details, build_info, peak_gpu = _tensorflow_facts(tf)
    return {
        "host": socket.gethostname(),
        "cpu": cpu_facts(cpuinfo),
        "cpu_mask": cpu_mask_size(),
        "gpu": gpu_facts(ordinal, env.get("CUDA_VISIBLE_DEVICES"), nvml=load_nvml(), details=details),
        "libraries": library_facts(build_info),
        "slurm": slurm_facts(env),
        "network": network_facts(iface, sysfs),
        "memory": {"peak_rss_bytes": peak_rss_bytes(), "peak_gpu_bytes": peak_gpu},
    }


def combine(per_rank: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The record's ``machine`` block from every rank's ``rank_machine`` (in rank order): the facts equal on every
    rank once (``shared``), the others as a list per rank (``per_rank``; always the GPU, memory and CPU mask), plus
    the distinct CPU and GPU models and the number of nodes (distinct hosts). ``section`` reads either way."""
    names = [k for k in per_rank[0] if k != "host"] if per_rank else []
    shared: dict[str, Any] = {}
    ranks: dict[str, list[Any]] = {}
    for name in names:
        values = [r.get(name) for r in per_rank]
        if name not in ALWAYS_PER_RANK and all(v == values[0] for v in values):
            shared[name] = values[0]
        else:
            ranks[name] = values
    return {
        "num_ranks": len(per_rank),
        "num_nodes": len({r.get("host") for r in per_rank}),
        "distinct_cpu_models": list(dict.fromkeys(m for r in per_rank if (m := (r.get("cpu") or {}).get("model")))),
        "distinct_gpu_models": list(dict.fromkeys(m for r in per_rank if (m := (r.get("gpu") or {}).get("model")))),
        "shared": shared,
        "per_rank": ranks,
    }


def section(block: Mapping[str, Any], name: str) -> list[Any]:
    """One section of a ``machine`` block (``combine``'s output) as a list with one value per rank."""
    shared = block.get("shared") or {}
    if name in shared:
        return [shared[name]] * int(block.get("num_ranks") or 1)
    return list((block.get("per_rank") or {}).get(name) or [])
