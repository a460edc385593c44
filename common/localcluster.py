"""Local clusters on one host: free loopback ports, TF_CONFIG, and a supervisor for N local processes (no TF).

Used by the native launcher (``--nproc``), ``bench/`` and the tests, so that ports and TF_CONFIG are made one way.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from common.errors import EXIT_PREEMPTED

LOOPBACK = "127.0.0.1"


def free_ports(n: int, host: str = LOOPBACK) -> list[int]:
    """``n`` distinct ports free on ``host`` right now (all held open together, so none is handed out twice)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
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


def supervise(procs: list[subprocess.Popen[Any]], prog: str) -> int:
    """Wait for local workers; the first failure kills the others; SIGTERM/SIGUSR1 are forwarded to every worker.

    Status: 0 when all succeed; 75 when they checkpointed after a signal (all then exit 75); otherwise the first
    failure's status (128 + signal for a killed worker), naming that worker on stderr.
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
        while pending:
            for i in sorted(pending):
                rc = procs[i].poll()
                if rc is None:
                    continue
                pending.discard(i)
                if rc == EXIT_PREEMPTED and status in (0, EXIT_PREEMPTED):
                    status = EXIT_PREEMPTED  # the others checkpointed with it and are exiting too
                    continue
                if rc != 0 and status in (0, EXIT_PREEMPTED):
                    how = f"was killed by {signal.Signals(-rc).name}" if rc < 0 else f"exited with status {rc}"
                    status = rc if rc > 0 else 128 - rc
                    print(f"[{prog}] worker {i} (pid {procs[i].pid}) {how} first; stopping the others",
                          file=sys.stderr, flush=True)
                    for j in pending:
                        procs[j].kill()  # not SIGTERM: that would ask them to checkpoint with a peer missing
            time.sleep(0.2)
    except KeyboardInterrupt:
        for p in procs:
            p.kill()
        status = 130
    return status


def start_tf_config_workers(n: int, argv: list[str], env: dict[str, str] | None = None,
                            **popen: Any) -> list[subprocess.Popen[Any]]:
    """Start ``n`` processes ``argv`` on loopback, each with its TF_CONFIG and local rank/size variables."""
    workers = loopback_workers(n)
    procs = []
    for i in range(n):
        mine = dict(os.environ if env is None else env)
        mine["TF_CONFIG"] = tf_config(workers, i)
        mine["TWINBENCH_LOCAL_RANK"] = str(i)
        mine["TWINBENCH_LOCAL_SIZE"] = str(n)
        procs.append(subprocess.Popen(argv, env=mine, **popen))
    return procs
