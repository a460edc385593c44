"""Fail fast, resume exactly: a peer watchdog, preemption signals, and atomic checkpoints (no TF at import).

- ``Watchdog``: every rank listens on a TCP port (accepted by the kernel even while Python is busy in a step) and
  probes every peer's port; a peer whose port stops answering (killed, OOM, crashed host) is named and this rank
  exits with ``EXIT_PEER_LOST`` instead of hanging in the next collective. No training step is involved, so it
  costs nothing in the timed loop. It also ends a rank whose steps have stopped progressing (``stall_timeout``).
  Peers are probed at addresses, never names (``netif.reach_address``), and a peer that never answered is a set-up
  error (``EXIT_USAGE``): its heartbeat was open before the addresses were exchanged, so it was never reachable.
- ``Preemption``: SIGTERM / SIGUSR1 (Slurm ``--signal``, ``scancel``, requeue) set a flag; every
  ``check_every`` steps all ranks agree (one tiny collective) on whether anyone was signalled, so they all stop
  after the same step, write one checkpoint and exit with ``EXIT_PREEMPTED``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from common.core.errors import EXIT_PEER_LOST, EXIT_PREEMPTED, EXIT_USAGE, exit_now  # noqa: F401 - codes re-exported

PEER_TIMEOUT = 20.0  # s without an answer before a peer is declared lost: well under 60 s, far above a TCP connect
STALL_TIMEOUT = 900.0  # s without a finished step: longer than any sane step incl. first-step tracing/XLA compile
PROBE_INTERVAL = 1.0  # s between probes of all peers


class Heartbeat:
    """A listening socket whose only job is to exist while this process is alive."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, name="twinbench-heartbeat", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
                conn.close()
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()


class Watchdog:
    def __init__(self, rank: int, peers: list[dict[str, Any]], peer_timeout: float = PEER_TIMEOUT,
                 stall_timeout: float = STALL_TIMEOUT, exit_fn: Any = None) -> None:
        self.rank = rank
        self.peers = [p for p in peers if p["rank"] != rank]
        self.peer_timeout = peer_timeout
        self.stall_timeout = stall_timeout
        self.last_progress = time.monotonic()
        self.what = "setup"
        self._stop = threading.Event()
        self._exit = exit_fn or _hard_exit
        self._thread = threading.Thread(target=self._run, name="twinbench-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def progress(self, what: str) -> None:
        self.last_progress = time.monotonic()
        self.what = what

    def stop(self) -> None:
        self._stop.set()

    def _probe(self, peer: dict[str, Any]) -> bool:
        return self._reach(peer) is None

    def _reach(self, peer: dict[str, Any]) -> str | None:
        """None when ``peer``'s heartbeat port answers, else why not (the socket error, one line)."""
        try:
            # "address": netif.reach_address, an address (never a name) on the data network when --iface chose one
            with socket.create_connection((peer["address"], peer["port"]), timeout=min(5.0, self.peer_timeout)):
                return None
        except OSError as e:
            return f"{type(e).__name__}: {e.strerror or e}"

    def lost_peers(self, grace: float = 0.0) -> list[dict[str, Any]]:
        """The peers that do not answer (twice, a second apart), probing every half second for up to ``grace``
        seconds until one stops: a peer killed a moment ago may still hold its port open while it exits (its
        threads ending one by one on a busy machine), after the failed collective already saw its connection go.
        None once the watchdog is stopped: past the last collective, peers exit when they are done, and a failure
        then (writing the record, the TensorBoard logs) is this rank's own."""
        if self._stop.is_set():
            return []
        deadline = time.monotonic() + grace
        while True:
            gone = [p for p in self.peers if not self._probe(p)]
            if gone:
                time.sleep(1.0)
                gone = [p for p in gone if not self._probe(p)]
            if gone or time.monotonic() >= deadline:
                return gone
            time.sleep(0.5)

    def _run(self) -> None:
        last_ok = {p["rank"]: time.monotonic() for p in self.peers}
        misses = {p["rank"]: 0 for p in self.peers}
        answered: set[int] = set()  # peers that answered once: only those can be lost
        while not self._stop.wait(PROBE_INTERVAL):
            now = time.monotonic()
            for p in self.peers:
                why = self._reach(p)
                if why is None:
                    last_ok[p["rank"]], misses[p["rank"]] = now, 0
                    answered.add(p["rank"])
                    continue
                misses[p["rank"]] += 1
                # A refused connection means the process is gone: 2 misses in a row suffice. A silent host
                # (timeouts) gets the full peer_timeout.
                if misses[p["rank"]] >= 2 and (now - last_ok[p["rank"]] >= self.peer_timeout or misses[p["rank"]] >= 3):
                    if self._stop.is_set():
                        return
                    if p["rank"] not in answered:
                        self._exit(EXIT_USAGE, unreachable(self.rank, p, why))
                    else:
                        self._exit(EXIT_PEER_LOST,
                                   f"lost rank {p['rank']} (host {p['host']}, pid {p['pid']}): it no longer answers; "
                                   f"stopping rank {self.rank} instead of waiting in a collective forever")
                    return
            if self.stall_timeout > 0 and now - self.last_progress > self.stall_timeout:
                self._exit(EXIT_PEER_LOST,
                           f"no progress for {self.stall_timeout:.0f} s after {self.what} (a hung collective?); "
                           f"stopping rank {self.rank}")
                return


def unreachable(rank: int, peer: dict[str, Any], why: str) -> str:
    """The set-up error of a peer that never answered: every rank published its heartbeat before the watchdogs
    started, so an address that fails from the first probe is one this rank cannot use, not a peer that died."""
    return (f"set-up: rank {rank} cannot reach rank {peer['rank']} (host {peer['host']}, pid {peer['pid']}) at "
            f"{peer['address']} port {peer['port']}, the address it published ({why}); the ranks' addresses are not "
            "reachable from one another: give --iface (or TWINBENCH_IFACE) the network interface the nodes share, "
            "and let the heartbeat ports through any firewall between them")


COLLECTIVE_MODULES = ("tensorflow", "horovod", "grpc")  # where the errors of a failed collective are defined


def from_collective(e: BaseException) -> bool:
    """Whether ``e`` (or an exception it was raised from) may be a collective failing because a peer went away: a
    TensorFlow op error (``tf.errors.OpError``: what MWMS's and Horovod's ops raise), an exception class of
    TensorFlow, Horovod or gRPC, or a broken connection. A Python error of the job's own code (``ValueError``, an
    ``ImportError``, TensorBoard missing) is not one: it is reported as itself even if a peer died of it too."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        module = type(cur).__module__ or ""
        if module.split(".")[0] in COLLECTIVE_MODULES and type(cur).__name__ != "TBNotInstalledError":
            return True
        if isinstance(cur, ConnectionError | EOFError | TimeoutError):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def _hard_exit(code: int, message: str) -> None:
    print(f"[twinbench] error: {message}", file=sys.stderr, flush=True)
    exit_now(code)  # no interpreter teardown: TF/Horovod threads may be blocked in the dead collective


class Preemption:
    """Records SIGTERM/SIGUSR1; the training loop asks ``should_stop`` at agreed steps."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self) -> None:
        self.signalled: str | None = None
        for s in self.SIGNALS:
            signal.signal(s, self._handler)

    def _handler(self, signum: int, frame: Any) -> None:
        self.signalled = signal.Signals(signum).name




def ckpt_dir(results_dir: str | os.PathLike[str], backend: str, world_size: int, job_hash: str,
             variant: str | None = None) -> Path:
    """One resumable checkpoint per (backend, variant, world size, job) in a results dir: a backend variant
    (``Capabilities.variant``, e.g. native's mirrored strategy) is part of the name, so a run never resumes another
    variant's checkpoint at the same world size; the default (None) keeps the name checkpoints always had."""
    tag = f"-{variant}" if variant else ""
    return Path(results_dir) / "checkpoints" / f"{backend}-n{world_size}-{job_hash}{tag}"


def read_meta(path: Path) -> dict[str, Any] | None:
    """The checkpoint's metadata, or None when there is no complete checkpoint."""
    try:
        return json.loads((path / "meta.json").read_text())
    except (OSError, ValueError):
        return None


def check_resume(meta: dict[str, Any], job_hash: str, job_name: str, world_size: int | None,
                 where: Path) -> str | None:
    """A one-line reason why ``meta`` cannot resume this run, or None (``world_size`` None: not known yet)."""
    if meta.get("job_hash") != job_hash:
        return (f"checkpoint {str(where)!r} belongs to job {meta.get('job_name')!r} ({meta.get('job_hash')}), not "
                f"{job_name!r} ({job_hash}); use another --results dir or the matching job file")
    if world_size is not None and meta.get("world_size") != world_size:
        return (f"checkpoint {str(where)!r} was written with {meta.get('world_size')} replicas, this run has "
                f"{world_size}: resuming would change the global batch; relaunch with {meta.get('world_size')} "
                "or use another --results dir")
    return None


def publish_dir(tmp: Path, final: Path) -> None:
    """Replace ``final`` by the complete directory ``tmp`` (rename: readers never see a half-written one)."""
    old = final.with_name(final.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)
