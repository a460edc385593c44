"""The machines a job's runs ran on (each record's ``machine`` block, common.cluster.machine): the row keys that keep
runs on different machines apart, the report's Machine section and the plots' subtitle; and the Environment
section's data (who bound the CPUs, paths relative to the results directory with no home directory, the recorded
commands).

A run's machine signature is its CPU model(s), GPU model(s) and node count. Rows are never merged across
signatures: when a job's runs have more than one hardware (CPU and GPU models), every row names its hardware, and
each hardware is a series of its own (its own 1-replica baseline); when runs of one row would differ only in their
node count, that backend's rows name their node count too (the speedup baseline stays the series' 1-replica run).
Records older than the block have no signature ("machine not recorded") and report as before among themselves.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.cluster.machine import section
from common.core.results import RunRecord
from common.report.base import NA

NOT_RECORDED = "machine not recorded"  # the hardware label of a run whose record predates the machine block
Hardware = tuple[tuple[str, ...], tuple[str, ...]]  # (CPU models, GPU models) of a run


@dataclass(frozen=True)
class MachineKey:
    """Where a run's row sits among its job's machines."""

    hardware: str  # "" when the job's runs share one hardware, else the label part naming it
    nodes: int | None  # the run's node count (None: not recorded)
    show_nodes: bool  # the row label names the node count (runs of one row would differ only in it)

    def suffix(self) -> str:
        """The text appended to the row label in brackets ("" for none), e.g. "A100-SXM4-40GB, 2 nodes"."""
        parts = [self.hardware] if self.hardware else []
        if self.show_nodes:
            parts.append(nodes_text(self.nodes))
        return ", ".join(parts)


def block(run: RunRecord) -> Mapping[str, Any] | None:
    return run.machine if isinstance(run.machine, Mapping) else None


def hardware_of(run: RunRecord) -> Hardware | None:
    m = block(run)
    if m is None:
        return None
    return tuple(map(str, m.get("distinct_cpu_models") or ())), tuple(map(str, m.get("distinct_gpu_models") or ()))


def nodes_of(run: RunRecord) -> int | None:
    return _num_nodes(block(run))


def _num_nodes(m: Mapping[str, Any] | None) -> int | None:
    """A machine block's node count (None: not recorded)."""
    n = m.get("num_nodes") if m is not None else None
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def nodes_text(n: int | None) -> str:
    return "? nodes" if n is None else f"{n} node{'' if n == 1 else 's'}"


def short_model(name: str) -> str:
    """A model name as short as still tells it apart (labels, subtitles): "Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz"
    -> "Intel Xeon Gold 6248", "AMD EPYC 7742 64-Core Processor" -> "AMD EPYC 7742", "NVIDIA A100-SXM4-40GB" ->
    "A100-SXM4-40GB" (the Machine section keeps the full names)."""
    name = re.sub(r"\((R|TM|tm|r)\)|@.*$|\b\d+-Core\b|\bProcessor\b|\bCPU\b", " ", name)
    short = " ".join(re.sub(r"^\s*NVIDIA\s+", "", name).split())
    return short or " ".join(name.split())


def _models(models: Sequence[str], none: str) -> str:
    return " + ".join(short_model(m) for m in models) if models else none


HOST_STACK = "host"  # the stack of a run that recorded no container image: what the node itself had


def stack_of(run: RunRecord) -> str:
    """The software stack a run ran on, as its record names it: the container image's identity, else HOST_STACK."""
    image = run.versions.get("container_image") if isinstance(run.versions, Mapping) else None
    return str(image) if image else HOST_STACK


def stack_label(stack: str) -> str:
    """A stack in a row label: "host", or "image " and the image's digest cut to 8 hex digits, or its reference."""
    if stack == HOST_STACK:
        return "host stack"
    digest = re.search(r"sha256:([0-9a-f]{8})", stack)
    return f"image {digest.group(1)}" if digest else f"image {stack}"


def hardware_labels(runs: Sequence[RunRecord]) -> list[str]:
    """Per run, the machine part of its row label: "" when all the job's runs share one hardware and one stack; else
    what differs, the GPU model(s) ("no GPU") and/or the CPU model(s) (NOT_RECORDED for older records), and the
    stack (another container image is another stack: its runs are never pooled with the host's or another image's)."""
    stacks = [stack_of(r) for r in runs]
    hardware = _hardware_labels(runs)
    if len(set(stacks)) <= 1:
        return hardware
    return [", ".join(filter(None, [hw, stack_label(st)])) for hw, st in zip(hardware, stacks)]


def _hardware_labels(runs: Sequence[RunRecord]) -> list[str]:
    hws = [hardware_of(r) for r in runs]
    if len(set(hws)) <= 1:
        return [""] * len(runs)
    known = {h for h in hws if h is not None}
    cpu_differs = len({h[0] for h in known}) > 1
    gpu_differs = len({h[1] for h in known}) > 1

    def label(h: Hardware | None) -> str:
        if h is None:
            return NOT_RECORDED
        if not (cpu_differs or gpu_differs):  # one hardware besides older records: its most telling model
            return _models(h[1], "") or _models(h[0], "CPU")
        parts = [_models(h[1], "no GPU")] if gpu_differs else []
        return ", ".join(parts + ([_models(h[0], "unknown CPU")] if cpu_differs else []))

    return [label(h) for h in hws]


def machine_keys(runs: Sequence[RunRecord], label_of: Callable[[RunRecord], str]) -> list[MachineKey]:
    """Per run (in order), its place among the job's machines; ``label_of`` gives a run's row label without it."""
    hardware = hardware_labels(runs)
    nodes = [nodes_of(r) for r in runs]
    seen: dict[tuple[str, str, int, int], set[int | None]] = {}
    for r, hw, n in zip(runs, hardware, nodes):
        seen.setdefault((label_of(r), hw, r.world_size, r.num_workers), set()).add(n)
    split = {(label, hw) for (label, hw, _, _), ns in seen.items() if len(ns) > 1}
    return [MachineKey(hw, n, (label_of(r), hw) in split) for r, hw, n in zip(runs, hardware, nodes)]


# -- the Machine section ------------------------------------------------------------------------------------------
def _distinct(values: Sequence[str]) -> str:
    return " + ".join(dict.fromkeys(values)) or NA


def _cpu_text(m: Mapping[str, Any]) -> str:
    cpus = [c for c in section(m, "cpu") if isinstance(c, Mapping)]
    return _distinct([f"{c.get('model') or 'unknown CPU'} x {c.get('logical_cores') or '?'} logical cores"
                      for c in cpus])


def _gpu_text(m: Mapping[str, Any]) -> str:
    out = []
    for g in section(m, "gpu"):
        if not isinstance(g, Mapping) or not g.get("model"):
            out.append("no GPU")
            continue
        mem = g.get("memory_bytes")
        facts = [f"{mem / 2**30:.0f} GiB" if isinstance(mem, int | float) else None,
                 f"compute {g['compute_capability']}" if g.get("compute_capability") else None,
                 f"driver {g['driver']}" if g.get("driver") else None]
        out.append(f"{g['model']} ({', '.join(f for f in facts if f) or 'details n/a'})")
    return _distinct(out)


def _libraries_text(m: Mapping[str, Any], keys: Sequence[tuple[str, str]]) -> str:
    libs = [x for x in section(m, "libraries") if isinstance(x, Mapping)]
    # A library's version string up to its first comma: "Open MPI v4.1.4" (the record keeps the whole line)
    return ", ".join(f"{name} {_distinct([str(x.get(k)).split(',')[0] for x in libs if x.get(k)])}"
                     for k, name in keys)


def describe(m: Mapping[str, Any]) -> str:
    """One machine set: CPU x cores, GPU or "no GPU", nodes, the CUDA / cuDNN TensorFlow was built for, MPI (NCCL
    and Slurm jobs are listed per line by ``format_machines``: they differ between backends and runs of one
    machine)."""
    return (f"{_cpu_text(m)}; {_gpu_text(m)}; {nodes_text(_num_nodes(m))}; {_tf_build_text(m)}; "
            f"{_libraries_text(m, (('mpi', 'MPI'),))}")


def _tf_build_text(m: Mapping[str, Any]) -> str:
    """What TensorFlow was built for, apart from what the machine has: "TF built for CUDA 12.5.1, cuDNN 9" (a GPU
    build, on a GPU machine or not), "TF built without CUDA" (a CPU build)."""
    libs = [x for x in section(m, "libraries") if isinstance(x, Mapping)]
    if not any(x.get("cuda") or x.get("cudnn") for x in libs):
        return "TF built without CUDA"
    return "TF built for " + _libraries_text(m, (("cuda", "CUDA"), ("cudnn", "cuDNN")))


def _slurm_jobs(runs: Sequence[RunRecord]) -> list[str]:
    out = []
    for r in runs:
        for s in section(block(r) or {}, "slurm"):
            if isinstance(s, Mapping) and s.get("job_id"):
                step = f".{s['step_id']}" if s.get("step_id") not in (None, "") else ""
                out.append(f"{s['job_id']}{step}" + (f" ({s['partition']})" if s.get("partition") else ""))
    return list(dict.fromkeys(out))


def format_machines(runs: Sequence[RunRecord], label_of: Callable[[RunRecord], str]) -> list[str]:
    """The Machine section's lines: one per distinct machine set, with its runs (row label: replicas), the NCCL
    versions the runs' Horovod reported and their Slurm jobs."""
    groups: dict[str, list[RunRecord]] = {}
    for r in runs:
        m = block(r)
        groups.setdefault(describe(m) if m is not None else NOT_RECORDED + " (results written before the machine "
                          "block)", []).append(r)
    lines = []
    for text, members in groups.items():
        sizes: dict[str, list[int]] = {}
        for r in members:
            sizes.setdefault(label_of(r), []).append(r.world_size)
        which = "; ".join(f"{b}: {', '.join(map(str, sorted(set(ws))))} replica{'' if set(ws) == {1} else 's'}"
                          for b, ws in sizes.items())
        nccl = [f"{x['nccl']} ({r.backend})" for r in members for x in section(block(r) or {}, "libraries")
                if isinstance(x, Mapping) and x.get("nccl")]
        extra = f"; NCCL {_distinct(nccl)}" if nccl else ""
        jobs = _slurm_jobs(members)
        extra += f"; Slurm job(s) {', '.join(jobs)}" if jobs else ""
        lines.append(f"- {text}{extra} — {len(members)} run(s): {which}")
    return lines


def subtitle(runs: Sequence[RunRecord]) -> str:
    """The plots' second title line: the GPU model(s), else the CPU model(s), and the node counts ("" when no run
    recorded its machine)."""
    hws = [h for r in runs if (h := hardware_of(r)) is not None]
    if not hws:
        return ""
    names = list(dict.fromkeys(_models(g, "") or f"CPU {_models(c, '?')}" for c, g in hws))
    nodes = sorted({n for r in runs if (n := nodes_of(r)) is not None})
    count = (f"{nodes[0]}" if len(nodes) == 1 else f"{nodes[0]}-{nodes[-1]}") if nodes else "?"
    shown = " / ".join(names[:2]) + (f" / {len(names) - 2} more" if len(names) > 2 else "")
    return f"{shown}; {count} node{'' if count == '1' else 's'}"


# -- the Environment section's data --------------------------------------------------------------------------------
def distinct(values: Iterable[str], limit: int = 12) -> str:
    """The distinct values as code spans, in first-seen order, at most ``limit`` of them."""
    seen = list(dict.fromkeys(values))
    if not seen:
        return NA
    more = f", … and {len(seen) - limit} more" if len(seen) > limit else ""
    return ", ".join(f"`{v}`" for v in seen[:limit]) + more


def _rank_strings(per_run: Iterable[list[str] | None]) -> list[str]:
    """The per-rank strings (hosts, devices) of every run, in order."""
    return [str(x) for v in per_run if isinstance(v, list) for x in v]


def binding_mix(runs: Sequence[RunRecord]) -> str | None:
    """"native: self; horovod: none" when a job's runs were bound differently (``topology.cpu_bind``: who bound
    each rank), else None; runs that predate the record count as "unknown"."""
    seen: dict[str, set[str]] = {}
    for r in runs:
        how = (r.topology or {}).get("cpu_bind") or ["unknown"]
        seen.setdefault(str(r.backend), set()).update(str(x) for x in how)
    if len({frozenset(v) for v in seen.values()}) <= 1 and all(len(v) == 1 for v in seen.values()):
        return None
    return "; ".join(f"{b}: {', '.join(sorted(v))}" for b, v in sorted(seen.items()))


HOME_PATTERN = re.compile(r"(?:/home|/Users)/[^/\s'\"]+|/root(?=/|\s|$|['\"])")  # home directories on Linux,
# macOS and root's: the report names none, whoever made the runs


def shorten_paths(text: str, results_dir: Path | None = None) -> str:
    """``text`` with the results directory written "." and any home directory "~": the report's paths are relative
    to the results directory and name no home."""
    if results_dir is not None:
        for d in dict.fromkeys((str(results_dir.resolve()), str(results_dir.absolute()))):
            text = re.sub(re.escape(d.rstrip("/")) + r"(?=/|\s|$|['\"=,:])", ".", text)
    home = str(Path.home()).rstrip("/")
    if home not in ("", "/"):
        text = re.sub(re.escape(home) + r"(?=/|\s|$|['\"=,:])", "~", text)
    return HOME_PATTERN.sub("~", text)


def short_command(cmd: Sequence[Any], results_dir: Path | None = None) -> str:
    """A recorded command line as shell words, the interpreter by its name (its path is the environment's: the
    versions line says which Python) and paths shortened (``shorten_paths``)."""
    words = [str(c) for c in cmd]
    if words and "/" in words[0] and Path(words[0]).name.startswith("python"):
        words[0] = Path(words[0]).name
    return shorten_paths(shlex.join(words), results_dir)
