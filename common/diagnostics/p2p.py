"""A raw point-to-point probe between two ranks, run by twinbench itself: what one TCP stream moves between the
chief's host and another host, the yardstick for the allreduce microbenchmark's bus bandwidth
(``common.diagnostics.allreduce``).

The chief sends for ``PROBE_SECONDS`` to the first rank on another host (rank 1 when every rank shares one host),
at that rank's address on ``--iface`` (else its host name): the path the collectives take. The receiver counts the
bytes from accept to end of stream, so data still queued in buffers when the sender stops is counted and timed.
No TensorFlow here; the exchange of addresses and the result ride on the backend's ``allgather``.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from common.cluster import netif
from common.core import results as res
from common.core.contract import Backend, size_text

PROBE_SECONDS = 1.0  # s of sending: far above a TCP ramp-up on a LAN, short next to a benchmark
CHUNK = 1 << 20  # bytes per send/recv call
ACCEPT_TIMEOUT = 30.0  # s the receiver waits for the sender (it connects right after the same allgather)


def pick_pair(peers: list[dict[str, Any]]) -> tuple[int, int]:
    """(sender, receiver): the chief and the first rank on another host, else rank 1."""
    other = [p["rank"] for p in peers if p["host"] != peers[0]["host"]]
    return 0, (other[0] if other else 1)


def probe(backend: Backend, iface: str | None = None, seconds: float = PROBE_SECONDS) -> dict[str, Any] | None:
    """The link rate between two ranks (a collective: every rank calls); None with one rank. ``iface``: default
    the run's ``--iface``. A failed probe (no route, refused) is reported in the result, never raised: every rank
    must reach the closing allgather."""
    if backend.num_workers == 1:
        return None
    iface = iface or netif.selected()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("0.0.0.0", 0))
        server.listen(1)  # before the allgather: the sender's connect then always finds it listening
        peers = backend.allgather({"rank": backend.rank, "host": res.hostname(), "address": netif.reach_address(iface),
                                   "port": server.getsockname()[1]})
        src, dst = pick_pair(peers)
        mine: dict[str, Any] | None = None
        try:
            if backend.rank == dst:
                mine = _receive(server)
            elif backend.rank == src:
                _send(peers[dst]["address"], peers[dst]["port"], seconds)
        except OSError as e:
            mine = {"error": f"rank {backend.rank}: {type(e).__name__}: {e}"}
    results = backend.allgather(mine)
    measured = results[dst] or {}
    errors = [r["error"] for r in results if r and "error" in r]
    return {
        "method": f"one TCP stream, {seconds:g} s, receiver-timed",
        "from_rank": src, "to_rank": dst,
        "hosts": [peers[src]["host"], peers[dst]["host"]],
        "address": peers[dst]["address"],
        "bytes_per_s": None if errors else measured.get("bytes_per_s"),
        "bytes": measured.get("bytes"), "seconds": measured.get("seconds"),
        "error": "; ".join(errors) or None,
    }


def _receive(server: socket.socket) -> dict[str, Any]:
    server.settimeout(ACCEPT_TIMEOUT)
    conn, _ = server.accept()
    with conn:
        conn.settimeout(ACCEPT_TIMEOUT)
        n, t0 = 0, time.perf_counter()
        while chunk := conn.recv(CHUNK):
            n += len(chunk)
        dt = time.perf_counter() - t0
    return {"bytes_per_s": n / dt if dt > 0 else 0.0, "bytes": n, "seconds": dt}


def _send(host: str, port: int, seconds: float) -> None:
    buf = b"\0" * CHUNK
    with socket.create_connection((host, port), timeout=ACCEPT_TIMEOUT) as conn:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            conn.sendall(buf)


def annotate(rows: list[dict[str, Any]], link: dict[str, Any] | None) -> None:
    """Add each row's bus bandwidth as a percentage of the probed link (``busbw_pct_of_link``)."""
    if not link or not link["bytes_per_s"]:
        return
    for row in rows:
        row["busbw_pct_of_link"] = 100.0 * row["busbw_GBps"] * 1e9 / link["bytes_per_s"]


def summary(rows: list[dict[str, Any]], link: dict[str, Any] | None) -> str | None:
    """One line: the probed link and the largest message's bus bandwidth as a share of it."""
    if not link or not rows or "busbw_pct_of_link" not in rows[-1]:
        return None
    big = max(rows, key=lambda r: r["bytes"])
    return (f"[twinbench] link rank {link['from_rank']} ({link['hosts'][0]}) -> rank {link['to_rank']} "
            f"({link['hosts'][1]}): {link['bytes_per_s'] / 1e6:.1f} MB/s raw TCP; busbw at {size_text(big['bytes'])} "
            f"{big['busbw_GBps'] * 1e3:.1f} MB/s = {big['busbw_pct_of_link']:.0f}% of it")
