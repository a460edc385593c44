"""Which network NCCL used, per rank, from its own log: InfiniBand, TCP sockets or a plugin, and on which interfaces.

The most common way a GPU comparison goes wrong unseen is one backend's NCCL falling back to sockets (a missing
NCCL_SOCKET_IFNAME, a container without the InfiniBand plugin) while the other uses InfiniBand. NCCL says what it
chose at ``NCCL_DEBUG=INFO`` (default subsystem INIT), one line per process and fact, e.g.::

    node1:4711:4711 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so), using internal implementation
    node1:4711:4711 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.0.0.1<0>
    node1:4711:4711 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.1.1<0>
    node1:4711:4711 [0] NCCL INFO Using network IB

and ``NCCL_DEBUG_FILE`` (``%h`` host, ``%p`` process id) writes that to a file per process. ``debug_env`` sets both
on a GPU rank before NCCL starts, only when the user set neither (the log level changes nothing NCCL chooses), never
on a CPU run; after the last step each rank reads its own file (``own_finding``) and the record keeps every rank's
finding in ``nccl_transport`` (``per_rank``). ``parse`` reads one process's log; ``mismatch`` is the report's rule
for the two backends. Tested on log lines in NCCL's format only: this has never run on a GPU.
"""

from __future__ import annotations

import os
import re
import socket
import tempfile
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

from common.core import registry

DEBUG_FILE = "nccl-%h-%p.log"  # NCCL_DEBUG_FILE's name: %h the host (up to its first dot), %p the process id
_LINE = re.compile(r"NCCL INFO (.*)$")
_SOCKET = re.compile(r"NET/Socket ?: Using (.*)$")
_IB = re.compile(r"NET/IB ?: Using (.*?)(?: ; OOB (\S+))?$")
_NETWORK = re.compile(r"Using network (.+?)\s*$")
_PLUGIN = re.compile(r"NET/Plugin ?: ?(?:Loaded net plugin|Successfully loaded external plugin) (.+?)"
                     r"(?: \(v\d+\))?\s*$")
_DEVICE = re.compile(r"\[\d+\]([^\s:\[]+(?::\d+/\w+)?)")  # [0]eth0:10.0.0.1<0> -> eth0; [0]mlx5_0:1/IB -> mlx5_0:1/IB


def log_dir() -> Path:
    """Where the ranks' NCCL logs go when twinbench asks for them: a directory of this user's in the temp dir."""
    return Path(tempfile.gettempdir()) / f"twinbench-nccl-{os.getuid()}"


def debug_env(environ: Mapping[str, str], gpu: bool, directory: Path | None = None) -> dict[str, str]:
    """The variables to set for NCCL's log file: none on a CPU run or when the user set NCCL_DEBUG or
    NCCL_DEBUG_FILE (theirs stand), else NCCL_DEBUG=INFO and NCCL_DEBUG_FILE=<directory>/nccl-%h-%p.log."""
    if not gpu or environ.get("NCCL_DEBUG") or environ.get("NCCL_DEBUG_FILE"):
        return {}
    return {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": str((directory or log_dir()) / DEBUG_FILE)}


_SET_HERE: dict[str, str] = {}  # what ``enable`` set in this process: not the user's knobs (``users_env``)


def enable(gpu: bool, environ: MutableMapping[str, str] | None = None) -> None:
    """On a GPU rank, before NCCL starts: ask it for its log file (``debug_env``) unless the user decided."""
    env = os.environ if environ is None else environ
    extra = debug_env(env, gpu)
    if extra:
        log_dir().mkdir(mode=0o700, exist_ok=True)
        env.update(extra)
        _SET_HERE.update(extra)


def users_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without the variables ``enable`` set (the record's tuning environment is the user's)."""
    return {k: v for k, v in env.items()  # os.environ's value too: the record's may have its home written as ~
            if k not in _SET_HERE or _SET_HERE[k] not in (v, os.environ.get(k))}


def parse(text: str) -> dict[str, Any] | None:
    """{"transport": "IB" | "Socket" | a plugin's network name, "interfaces": [...], "plugin": name or None,
    "inferred": bool} from one process's NCCL log; None when it says nothing of the network. ``inferred``: the log
    has no "Using network" line (NCCL before 2.12 names only what it initialised; IB wins when it has a device)."""
    socket_ifs: list[str] = []
    ib_devs: list[str] = []
    oob: str | None = None
    network: str | None = None
    plugin: str | None = None
    for raw in text.splitlines():
        m = _LINE.search(raw)
        if not m:
            continue
        line = m.group(1).strip()
        if (s := _SOCKET.search(line)) is not None:
            socket_ifs = _DEVICE.findall(s.group(1))
        elif (i := _IB.search(line)) is not None:
            ib_devs, oob = _DEVICE.findall(i.group(1)), (i.group(2) or "").split(":")[0] or None
        elif (n := _NETWORK.search(line)) is not None:
            network = n.group(1)
        elif (p := _PLUGIN.search(line)) is not None:
            plugin = p.group(1)
    if network is None and not ib_devs and not socket_ifs:
        return None
    transport = network or ("IB" if ib_devs else "Socket")
    if transport == "IB":
        interfaces = ib_devs
    elif transport == "Socket":
        interfaces = socket_ifs
    else:  # an external plugin's network (e.g. AWS Libfabric): NCCL's own lines do not name its devices
        interfaces, plugin = [], plugin or transport
    return {"transport": transport, "interfaces": interfaces, "plugin": plugin, "inferred": network is None,
            **({"oob": oob} if transport == "IB" and oob else {})}


def own_finding(environ: Mapping[str, str] | None = None, host: str | None = None,
                pid: int | None = None) -> dict[str, Any] | None:
    """This process's finding from the file NCCL_DEBUG_FILE names (%h, %p filled in); None without one."""
    env = os.environ if environ is None else environ
    pattern = env.get("NCCL_DEBUG_FILE")
    if not pattern or (env.get("NCCL_DEBUG") or "").upper() not in ("INFO", "TRACE"):
        return None
    name = pattern.replace("%h", (host or socket.gethostname()).split(".")[0]).replace(
        "%p", str(os.getpid() if pid is None else pid))
    try:
        return parse(Path(name).read_text(errors="replace"))
    except OSError:
        return None


def per_rank(findings: Sequence[dict[str, Any] | None]) -> list[dict[str, Any] | None] | None:
    """The record's ``nccl_transport``: every rank's finding in rank order, None when no rank has one."""
    return list(findings) if any(f is not None for f in findings) else None


def networks(records_transport: Sequence[Sequence[dict[str, Any] | None] | None]) -> set[tuple[str, tuple[str, ...]]]:
    """The distinct (transport, interfaces) over runs' ``nccl_transport`` lists (ranks without a finding left out)."""
    return {(f["transport"], tuple(f.get("interfaces") or ())) for per in records_transport for f in (per or []) if f}


def mismatch(a: Sequence[Sequence[dict[str, Any] | None] | None], b: Sequence[Sequence[dict[str, Any] | None] | None],
             names: tuple[str, str] = registry.PAIRS[0]) -> str | None:
    """The report's caveat when the two backends' runs (``a``, ``b``: their ``nccl_transport`` lists; ``names``:
    the report's ratio, numerator first) used different NCCL transports or interfaces, e.g. "NCCL used IB
    (mlx5_0:1/IB) for horovod but Socket (eth0) for native"; None when they agree or either side has no finding
    (CPU runs, a user's own NCCL_DEBUG without a file)."""
    na, nb = networks(a), networks(b)
    if not na or not nb or na == nb:
        return None

    def text(ns: set[tuple[str, tuple[str, ...]]]) -> str:
        return " / ".join(f"{t} ({','.join(i) or '?'})" for t, i in sorted(ns))
    return f"NCCL used {text(na)} for {names[0]} but {text(nb)} for {names[1]}: the two backends measured different " \
           "networks"
