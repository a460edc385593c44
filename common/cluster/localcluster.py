"""Local clusters on one host: free loopback ports, TF_CONFIG (MWMS workers, or chief + workers + ps for
parameter-server training), and a supervisor for N local processes (no TF).

Used by the native launcher (``--nproc``), ``bench/`` and the tests, so that ports and TF_CONFIG are made one way.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common.cluster import netif
from common.core.errors import EXIT_PREEMPTED

LOOPBACK = "127.0.0.1"


BAND_START = 20000  # above the sbatch scripts' port bases (12000-19999, jobs/slurm/env.sh)
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
MIN_BAND = 1000  # fewer ports below the ephemeral range than this: let the kernel choose (port 0)


def port_band() -> tuple[int, int] | None:
    """[BAND_START, the kernel's first ephemeral port): ports the kernel never picks by itself, neither for an
    outgoing connection nor for a bind to port 0; None when that range is unknown or smaller than MIN_BAND."""
    try:
        first = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return (BAND_START, first) if first - BAND_START >= MIN_BAND else None


def free_ports(n: int, host: str = LOOPBACK) -> list[int]:
    """``n`` distinct ports free on ``host`` right now (all held open together, so none is handed out twice).

    Drawn at random from ``port_band`` where there is one: the workers bind them seconds later, and a port from
    the kernel's ephemeral range could meanwhile become the local end of any process' outgoing connection (other
    runs' gRPC and Gloo connect a lot); below that range only a program choosing the same number could take it.
    Ports in use (or in TIME_WAIT: no SO_REUSEADDR here) fail the probe and another is drawn."""
    band, rng = port_band(), random.SystemRandom()
    socks: list[socket.socket] = []
    try:
        for attempt in range(100 * n):
            if len(socks) == n:
                break
            s = socket.socket()
            try:
                s.bind((host, rng.randrange(*band) if band and attempt < 50 * n else 0))
            except OSError:
                s.close()
                continue
            socks.append(s)
        if len(socks) < n:
            raise OSError(f"no {n} free ports on {host}")
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def loopback_workers(n: int) -> list[str]:
    """``host:port`` addresses for ``n`` workers on loopback."""
    return [f"{LOOPBACK}:{p}" for p in free_ports(n)]


def tf_config(workers: list[str], index: int) -> str:
    """The TF_CONFIG of worker ``index`` in a cluster of ``workers`` (MultiWorkerMirroredStrategy's format)."""
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})


def supervise(procs: list[subprocess.Popen[Any]], prog: str, linger: float | None = None) -> int:
    """Wait for local workers; the first failure kills the others; SIGTERM/SIGUSR1 are forwarded to every worker.

    Status: 0 when all succeed; 75 when they checkpointed after a signal (all then exit 75); otherwise the first
    failure's status (128 + signal for a killed worker), naming that worker on stderr. With ``linger`` (a
    parameter-server cluster: ``procs[0]`` is the chief, the others are servers that exit once it has gone), the
    others get ``linger`` seconds after the chief's exit to end on their own, then are killed (named on stderr):
    the launcher never leaves a process behind.
    """

    def forward(signum: int, frame: Any) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, forward)
    status = 0
    try:
        pending = set(range(len(procs)))
        chief_gone: float | None = None
        while pending:
            for i in sorted(pending):
                rc = procs[i].poll()
                if rc is None:
                    continue
                pending.discard(i)
                chief_gone = time.monotonic() if i == 0 else chief_gone
                status = _after_exit(procs, pending, i, rc, status, prog)
            if linger is not None and chief_gone is not None and pending \
                    and time.monotonic() - chief_gone > linger:
                _kill_lingering(procs, pending, linger, prog)
                pending.clear()
            time.sleep(0.2)
    except KeyboardInterrupt:
        for p in procs:
            p.kill()
        status = 130
    return status


def _after_exit(procs: list[subprocess.Popen[Any]], pending: set[int], i: int, rc: int, status: int,
                prog: str) -> int:
    """The launcher's status once process ``i`` has exited with ``rc``; a first failure kills the others."""
    if rc == EXIT_PREEMPTED and status in (0, EXIT_PREEMPTED):
        return EXIT_PREEMPTED  # the others checkpointed with it and are exiting too
    if rc != 0 and status in (0, EXIT_PREEMPTED):
        how = f"was killed by {signal.Signals(-rc).name}" if rc < 0 else f"exited with status {rc}"
        print(f"[{prog}] worker {i} (pid {procs[i].pid}) {how} first; stopping the others", file=sys.stderr,
              flush=True)
        for j in pending:
            procs[j].kill()  # not SIGTERM: that would ask them to checkpoint with a peer missing
        return rc if rc > 0 else 128 - rc
    return status


def _kill_lingering(procs: list[subprocess.Popen[Any]], pending: set[int], linger: float, prog: str) -> None:
    for j in sorted(pending):
        print(f"[{prog}] process {j} (pid {procs[j].pid}) still running {linger:g} s after the chief exited; "
              "killing it", file=sys.stderr, flush=True)
        procs[j].kill()
        procs[j].wait()


def start_tf_config_workers(n: int, argv: list[str], env: dict[str, str] | None = None,
                            **popen: Any) -> list[subprocess.Popen[Any]]:
    """Start ``n`` processes ``argv`` on loopback (or, with an interface chosen, on its address), each with its
    TF_CONFIG and local rank/size variables."""
    iface = (os.environ if env is None else env).get(netif.ENV)
    host = str(netif.ipv4(iface).ip) if iface else LOOPBACK  # the workers check their TF_CONFIG against it
    workers = [f"{host}:{p}" for p in free_ports(n, host)]
    procs = []
    for i in range(n):
        mine = dict(os.environ if env is None else env)
        mine["TF_CONFIG"] = tf_config(workers, i)
        mine["TWINBENCH_LOCAL_RANK"] = str(i)
        mine["TWINBENCH_LOCAL_SIZE"] = str(n)
        procs.append(subprocess.Popen(argv, env=mine, **popen))
    return procs


def ps_cluster(workers: int, ps: int) -> dict[str, list[str]]:
    """A parameter-server cluster on loopback: one chief, ``workers`` workers and ``ps`` parameter servers."""
    addresses = loopback_workers(1 + workers + ps)
    return {"chief": addresses[:1], "worker": addresses[1:1 + workers], "ps": addresses[1 + workers:]}


def start_ps_cluster(workers: int, ps: int, argv: list[str], env: dict[str, str] | None = None,
                     **popen: Any) -> list[subprocess.Popen[Any]]:
    """Start the chief, then the workers, then the parameter servers of a loopback cluster, each ``argv`` with its
    TF_CONFIG; the list is in that order (``procs[0]`` is the chief, as ``supervise(linger=...)`` expects)."""
    cluster = ps_cluster(workers, ps)
    procs = []
    for task_type in ("chief", "worker", "ps"):
        for i in range(len(cluster[task_type])):
            mine = dict(os.environ if env is None else env)
            mine["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": task_type, "index": i}})
            # Workers are the processes that compute: they share the cores, and worker i keeps GPU i.
            mine["TWINBENCH_LOCAL_RANK"] = str(i if task_type == "worker" else 0)
            mine["TWINBENCH_LOCAL_SIZE"] = str(workers)
            procs.append(subprocess.Popen(argv, env=mine, **popen))
    return procs
