"""Does each cell of a sweep fit the partition's nodes? Checked before anything is submitted (``submit``, dry run
included), so a sweep is not left half submitted by ``sbatch: error: Batch job submission failed: Requested node
configuration is not available`` (or a job that could never start).

What a cell asks for is its sbatch command's options over its script's ``#SBATCH`` defaults (command-line options
override them, as sbatch does): ``--nodes``, ``--ntasks-per-node``, ``--cpus-per-task``, ``--gres=gpu:N`` (or
``--gpus-per-node``) and ``--partition`` (long ``--key=value`` forms, and ``-N``/``-c``/``-p`` with the value
attached, as ``--sbatch-arg`` passes one word). What the nodes have is ``scontrol show node -o`` (one line per node:
``CPUTot``, ``Gres``, ``Partitions``); without ``--partition`` the default partition is the one ``sinfo -h -o %P``
marks with ``*``. A cell fits when at least ``--nodes`` nodes of the partition each have ``ntasks-per-node x
cpus-per-task`` CPUs and the GPUs asked for, whatever their state (a drained node comes back; a node too small
never grows). When Slurm cannot be asked (no ``scontrol``, no answer) nothing is refused and the submission says
so. No TensorFlow here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from common.sweep.layout import SweepError

SBATCH_LINE = re.compile(r"^#SBATCH\s+(\S+)")
SHORT = {"-N": "nodes", "-c": "cpus-per-task", "-p": "partition", "-n": "ntasks"}  # sbatch's short options


@dataclass(frozen=True)
class Node:
    """One node as ``scontrol show node -o`` describes it."""

    name: str
    cpus: int
    gpus: int
    partitions: tuple[str, ...]


@dataclass(frozen=True)
class Request:
    """What one sbatch command asks for per node."""

    nodes: int
    tasks_per_node: int
    cpus_per_task: int
    gpus_per_node: int
    partitions: tuple[str, ...]  # () = the default partition

    def text(self) -> str:
        gpus = f", gpu:{self.gpus_per_node}" if self.gpus_per_node else ""
        return (f"{self.nodes} node(s) x {self.tasks_per_node} task(s) x {self.cpus_per_task} CPU(s) per task "
                f"({self.tasks_per_node * self.cpus_per_task} CPUs{gpus} per node)")


def gpu_count(gres: str) -> int:
    """GPUs in a ``Gres=`` value: ``gpu:2``, ``gpu:a100:4(S:0-1)``, ``gpu:tesla:2,mps:100``, ``(null)``."""
    total = 0
    for item in re.split(r",(?![^(]*\))", gres or ""):
        parts = re.sub(r"\(.*?\)", "", item).split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            total += int(parts[-1])
        elif parts[0] == "gpu" and len(parts) == 1:
            total += 1
    return total


def parse_nodes(text: str) -> list[Node]:
    """The nodes of ``scontrol show node -o`` output (one line per node, ``key=value`` words)."""
    out = []
    for line in text.splitlines():
        fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
        if not fields.get("NodeName"):
            continue
        cpus = fields.get("CPUTot") or fields.get("CPUEfctv") or "0"
        out.append(Node(fields["NodeName"], int(cpus) if cpus.isdigit() else 0, gpu_count(fields.get("Gres", "")),
                        tuple(p for p in fields.get("Partitions", "").split(",") if p)))
    return out


def default_partition(sinfo: str) -> str | None:
    """The partition ``sinfo -h -o %P`` marks with ``*`` (the default), or None."""
    return next((p.strip().rstrip("*") for p in sinfo.split() if p.strip().endswith("*")), None)


def options(words: Sequence[str]) -> dict[str, str]:
    """sbatch options (``--key=value``, ``-Nvalue``) as key -> value (the last one wins); flags map to ""."""
    out: dict[str, str] = {}
    for w in words:
        if w.startswith("--"):
            key, _, value = w[2:].partition("=")
            out[key] = value
        elif w[:2] in SHORT and len(w) > 2:
            out[SHORT[w[:2]]] = w[2:].lstrip("=")
    return out


def script_options(path: Path) -> dict[str, str]:
    """A script's ``#SBATCH`` options (read up to its first command, as sbatch does)."""
    words = []
    for line in path.read_text().splitlines():
        s = line.strip()
        if s and not s.startswith("#"):
            break
        m = SBATCH_LINE.match(s)
        if m:
            words.append(m.group(1))
    return options(words)


def _count(value: str, default: int) -> int:
    """``2``, or the least of a range ``1-2``; ``default`` when absent or unreadable."""
    m = re.match(r"\d+", value or "")
    return int(m.group()) if m else default


def request(words: Sequence[str], script: Path) -> Request:
    """What an sbatch command (its options ``words``) of ``script`` asks for."""
    o = {**script_options(script), **options(words)}
    gpus = gpu_count(o["gres"]) if "gres" in o else _count(o.get("gpus-per-node", ""), 0)
    return Request(_count(o.get("nodes", ""), 1), _count(o.get("ntasks-per-node", ""), 1),
                   _count(o.get("cpus-per-task", ""), 1), gpus,
                   tuple(p for p in o.get("partition", "").split(",") if p))


def misfit(req: Request, nodes: Sequence[Node], default: str | None) -> str | None:
    """Why ``req`` fits no ``req.nodes`` nodes of its partition, or None."""
    names = req.partitions or ((default,) if default else ())
    pool = [n for n in nodes if not names or set(n.partitions) & set(names)]
    where = f"partition {','.join(names)!r}" if names else "the cluster"
    if not pool:
        return f"{where} has no nodes (scontrol show node)"
    fit = [n for n in pool if n.cpus >= req.tasks_per_node * req.cpus_per_task and n.gpus >= req.gpus_per_node]
    if len(fit) >= req.nodes:
        return None
    kinds: dict[tuple[int, int], int] = {}
    for n in pool:
        kinds[(n.cpus, n.gpus)] = kinds.get((n.cpus, n.gpus), 0) + 1
    have = ", ".join(f"{k} x ({c} CPUs{f', gpu:{g}' if g else ''})" for (c, g), k in sorted(kinds.items()))
    return f"asks for {req.text()}, {where} has {len(fit)} such node(s) ({have})"


def check(commands: Sequence[tuple[str, Sequence[str], Path]], ask: Callable[[list[str]], str | None]) -> str | None:
    """SweepError naming the first cell (name, sbatch options, script) the nodes cannot hold, before anything is
    submitted; else None, or the line saying the nodes could not be asked (``ask``: a Slurm command's stdout)."""
    text = ask(["scontrol", "show", "node", "-o"])
    nodes = parse_nodes(text or "")
    if not nodes:
        return "the cells' requests are not checked against the nodes: `scontrol show node -o` gave none here"
    default = default_partition(ask(["sinfo", "-h", "-o", "%P"]) or "")
    bad = [(name, why) for name, words, script in commands if (why := misfit(request(words, script), nodes, default))]
    if bad:
        more = f" (and {len(bad) - 1} more cell(s))" if len(bad) > 1 else ""
        raise SweepError(f"cell {bad[0][0]} {bad[0][1]}{more}: nothing submitted; lower --cpus-per-task (the "
                         "scripts ask for 4 by default) or --gres-per-node, or choose --nodes / --partition")
    return None
