"""Which Slurm task runs where: the step's task layout from Slurm's variables (no TensorFlow, no scontrol).

MWMS needs every worker's ``host:port`` in rank order. TensorFlow's SlurmClusterResolver builds that list by
sorting the step's hostnames as strings and packing tasks per host in that order, i.e. it assumes block
distribution *and* that Slurm's node order is string order. Both fail silently on real clusters: with
``--distribution=cyclic``, or with ten or more nodes named without zero padding (``n9`` sorts after ``n10``); a
rank is then looked for at an address where another rank listens. Here the layout follows Slurm's own
rules (block and cyclic over the step's nodes in Slurm's order), and every task checks its own entry against what
Slurm told it (``SLURMD_NODENAME``, ``SLURM_LOCALID``): when every task's own entry is right, the list is right.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

SUPPORTED = ("block", "cyclic")


class LayoutError(ValueError):
    """The step's layout cannot be derived or does not match this task (one line, for the user)."""


def expand_hostlist(expr: str) -> list[str]:
    """Slurm hostlist syntax: ``n[01-03,7],gpu5,r1i[0-1]n[0-1]`` -> names in Slurm's order (zero padding kept)."""
    names: list[str] = []
    for part in _split_top(expr.strip()):
        names.extend(_expand_one(part))
    if not names:
        raise LayoutError(f"empty Slurm node list {expr!r}")
    return names


def _split_top(expr: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise LayoutError(f"unbalanced brackets in Slurm node list {expr!r}")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise LayoutError(f"unbalanced brackets in Slurm node list {expr!r}")
    parts.append(cur)
    return [p for p in parts if p]


def _expand_one(part: str) -> list[str]:
    m = re.match(r"^([^\[]*)\[([^\]]*)\](.*)$", part)
    if not m:
        return [part]
    prefix, ranges, rest = m.groups()
    out = []
    for r in ranges.split(","):
        lo, _, hi = r.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise LayoutError(f"cannot read range {r!r} in Slurm node list {part!r}")
        width = len(lo)
        for i in range(int(lo), int(hi or lo) + 1):
            for tail in _expand_one(rest) if rest else [""]:
                out.append(f"{prefix}{i:0{width}d}{tail}")
    return out


def expand_tasks_per_node(expr: str) -> list[int]:
    """``2(x3),1`` -> [2, 2, 2, 1] (SLURM_STEP_TASKS_PER_NODE)."""
    out: list[int] = []
    for part in expr.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise LayoutError(f"cannot read SLURM_STEP_TASKS_PER_NODE={expr!r}")
        out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return out


def task_layout(nodes: list[str], tasks: list[int], distribution: str = "block") -> list[tuple[str, int]]:
    """(node, local id) of every task in rank order, as Slurm places them (node-level distribution)."""
    if len(nodes) != len(tasks):
        raise LayoutError(f"{len(nodes)} nodes but tasks per node given for {len(tasks)}")
    if distribution == "block":
        return [(n, i) for n, k in zip(nodes, tasks) for i in range(k)]
    if distribution == "cyclic":
        left, used, out = list(tasks), [0] * len(nodes), []
        while any(left):
            for j, n in enumerate(nodes):  # one task per node per round, skipping full nodes
                if left[j]:
                    out.append((n, used[j]))
                    used[j] += 1
                    left[j] -= 1
        return out
    raise LayoutError(f"Slurm task distribution {distribution!r} is not supported: use block or cyclic")


def node_distribution(env: Mapping[str, str]) -> str:
    """The node-level part of SLURM_DISTRIBUTION (``cyclic:block,Pack`` -> cyclic); block when unset."""
    d = (env.get("SLURM_DISTRIBUTION") or "block").split(",")[0].split(":")[0].strip().lower()
    if d in ("", "*"):  # "*" is Slurm's "default" placeholder
        return "block"
    return d.split("=")[0]  # plane=4 -> plane (unsupported, reported by task_layout)


def step_workers(port_base: int, env: Mapping[str, str] | None = None) -> list[str]:
    """``host:port`` of every task of this srun step in rank order (port = port_base + local id), after checking
    this task's own entry against Slurm's SLURMD_NODENAME / SLURM_LOCALID. Raises LayoutError (one line)."""
    env = os.environ if env is None else env
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or ""
    dist = node_distribution(env)
    layout = task_layout(expand_hostlist(nodelist), expand_tasks_per_node(per_node), dist)
    ntasks = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS")
    if ntasks and ntasks.isdigit() and int(ntasks) != len(layout):
        raise LayoutError(f"SLURM_STEP_TASKS_PER_NODE={per_node!r} gives {len(layout)} tasks but the step has "
                          f"{ntasks}")
    procid = int(env.get("SLURM_PROCID", "0"))
    if not 0 <= procid < len(layout):
        raise LayoutError(f"SLURM_PROCID={procid} outside the step's {len(layout)} tasks")
    node, local = layout[procid]
    me, my_local = env.get("SLURMD_NODENAME"), env.get("SLURM_LOCALID")
    if (me is not None and me != node) or (my_local not in (None, "") and int(my_local) != local):
        where = f"on {me} " if me else ""
        raise LayoutError(
            f"Slurm placed task {procid} {where}as local task {my_local}, but a {dist} distribution over "
            f"{nodelist} puts it on {node} as local task {local}: launch with srun --distribution=block (or cyclic)")
    return [f"{n}:{port_base + i}" for n, i in layout]
