"""Where a sweep's runs go (``common.sweep submit``): world sizes, backends, and each run's layout and resources.

A layout is nodes x ranks per node, one rank per GPU. By default a size takes the fewest whole nodes that hold it
(``--gres-per-node`` GPUs each: nodes filled first), so it has one layout. ``--nodes 1,2`` runs every size at each
listed node count that divides it with at most ``--gres-per-node`` ranks per node: size 2 then runs as ``1x2``
(both ranks on one node, the collective over the node's own links) and as ``2x1`` (one rank on each of two nodes,
over the network), two cells the report keeps apart. Both backends of one layout get the same sbatch options.
No TensorFlow here.
"""

from __future__ import annotations

import argparse

from common.core import registry
from common.core.contract import Launch


class SweepError(Exception):
    """Bad input; the message is the one line the user sees."""


def slurm_launches() -> dict[str, Launch]:
    """The backends whose sbatch script chooses among Slurm launchers (``Launch.slurm_variable``, e.g. Horovod's
    HVD_LAUNCH), by name: the sweep's flag for each (``Launch.slurm_flag``), its check and its export read these."""
    launches = {b: registry.spec(b).LAUNCH for b in registry.names()}
    return {b: x for b, x in launches.items() if x.slurm_variable}


def slurm_launch_flags(s: argparse.ArgumentParser) -> None:
    """``submit``'s flag per backend with a choice of Slurm launchers (``--hvd-launch``), its choices declared by the
    backend (``Launch.at("slurm")``), the first by default."""
    for b, launch in slurm_launches().items():
        choices = [x.name for x in launch.at("slurm")]
        said = "; ".join(f"{x.name}: {x.summary}" for x in launch.at("slurm"))
        s.add_argument(launch.slurm_flag or "", dest=f"{b}_launch", choices=choices, default=choices[0],
                       help=f"how {registry.entry(b).slurm_script} starts {b}'s ranks, exported as "
                            f"{launch.slurm_variable} (default {choices[0]}; {said})")


def chosen_launchers(a: argparse.Namespace) -> dict[str, str]:
    """Each backend's Slurm launcher as ``submit`` chose it (the backends without a choice absent)."""
    return {b: getattr(a, f"{b}_launch") for b in slurm_launches()}


def parse_counts(text: str, flag: str, what: str) -> list[int]:
    """A comma separated list of distinct integers >= 1 (``--sizes``, ``--nodes``)."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            n = int(part)
        except ValueError:
            raise SweepError(f"{flag}: {part!r} is not an integer (expected e.g. 1,2,4,8)") from None
        if n < 1:
            raise SweepError(f"{flag}: {what} must be >= 1, got {n}")
        if n in out:
            raise SweepError(f"{flag}: {n} is listed twice")
        out.append(n)
    return out


def parse_sizes(text: str) -> list[int]:
    return parse_counts(text, "--sizes", "world size")


def parse_backends(text: str) -> list[str]:
    out = [b.strip() for b in text.split(",") if b.strip()]
    if not out:
        raise SweepError(f"--backends: no backend given (expected {','.join(registry.names())})")
    for b in out:
        if b not in registry.REGISTRY:
            raise SweepError(f"--backends: unknown backend {b!r} (choose from {', '.join(registry.names())})")
    if len(set(out)) != len(out):
        raise SweepError(f"--backends: a backend is listed twice in {text!r}")
    return out


def layout(size: int, gpus_per_node: int) -> dict[str, int]:
    """Nodes, tasks per node and GPUs per node for ``size`` ranks, one task per GPU, nodes filled first."""
    if gpus_per_node == 0:  # CPU cluster: everything on one node
        return {"nodes": 1, "ntasks_per_node": size, "gpus_per_node": 0}
    if size <= gpus_per_node:
        return {"nodes": 1, "ntasks_per_node": size, "gpus_per_node": size}
    if size % gpus_per_node:
        raise SweepError(f"world size {size} does not fill whole nodes of {gpus_per_node} GPUs "
                         f"(use a multiple of {gpus_per_node}, or change --gres-per-node)")
    return {"nodes": size // gpus_per_node, "ntasks_per_node": gpus_per_node, "gpus_per_node": gpus_per_node}


def layouts(size: int, gpus_per_node: int, nodes: list[int] | None) -> list[dict[str, int]]:
    """Every layout ``size`` runs at: ``layout`` without ``--nodes``; with it, one per listed node count that
    divides ``size`` with at most ``gpus_per_node`` ranks per node (0: no GPUs, no limit), in the listed order."""
    if nodes is None:
        return [layout(size, gpus_per_node)]
    out = []
    for n in nodes:
        per_node, rest = divmod(size, n)
        if rest or (gpus_per_node and per_node > gpus_per_node):
            continue
        out.append({"nodes": n, "ntasks_per_node": per_node, "gpus_per_node": per_node if gpus_per_node else 0})
    if not out:
        limit = f" with at most {gpus_per_node} rank(s) per node (--gres-per-node)" if gpus_per_node else ""
        raise SweepError(f"--nodes {','.join(map(str, nodes))}: world size {size} fits none of these node "
                         f"counts{limit}")
    return out


def layout_name(lay: dict[str, int]) -> str:
    """``1x2``: nodes x ranks per node, as the report names its rows."""
    return f"{lay['nodes']}x{lay['ntasks_per_node']}"


def resource_args(lay: dict[str, int], a: argparse.Namespace) -> list[str]:
    """The sbatch options that define a run's resources: the same list for every backend of one layout."""
    out = [f"--nodes={lay['nodes']}", f"--ntasks-per-node={lay['ntasks_per_node']}"]
    if lay["gpus_per_node"]:
        out.append(f"--gres=gpu:{lay['gpus_per_node']}")
    if a.cpus_per_task:
        out.append(f"--cpus-per-task={a.cpus_per_task}")
    if a.time:
        out.append(f"--time={a.time}")
    if a.partition:
        out.append(f"--partition={a.partition}")
    if a.account:
        out.append(f"--account={a.account}")
    if a.exclusive:
        out.append("--exclusive")
    return out + list(a.sbatch_args)
