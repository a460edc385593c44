"""Allreduce microbenchmark, launched exactly like a training run (``--bench allreduce``) on either backend.

Times a SUM allreduce of float32 tensors of each size on every rank (synchronised per iteration: the step of a
synchronous job ends when the slowest rank's allreduce ends, so an iteration's time is the max over ranks), and
reports nccl-tests' bandwidths: algbw = bytes / time, busbw = algbw x 2(n-1)/n (what each link carries in a ring).
The chief prints them as nccl-tests' ``all_reduce_perf`` table (out-of-place columns) with its ``Avg bus bandwidth``
line, so the parsers written for nccl-tests read twinbench's output too.
"""

from __future__ import annotations

import time
from pathlib import Path

from common.cluster import machine
from common.core import results as res
from common.core.contract import Backend
from common.core.privacy import public
from common.core.results import AllreduceRecord
from common.diagnostics import p2p
from common.training import observe
from common.training.runconfig import BenchOptions

DEFAULT_SIZES = "4K,16K,64K,256K,1M,4M,16M,64M,256M"  # nccl-tests style sweep, 4 KiB to 256 MiB
UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


def parse_sizes(text: str) -> list[int]:
    """'4K,1M,256M' -> bytes (binary units); each a positive multiple of 4 bytes (float32 elements)."""
    out = []
    for part in text.split(","):
        part = part.strip().upper().removesuffix("B").removesuffix("I")
        if not part:
            continue
        unit = part[-1] if part[-1] in "KMG" else ""
        try:
            n = int(float(part[: len(part) - len(unit)]) * UNITS[unit])
        except ValueError:
            raise ValueError(f"--sizes: cannot read {part!r}; use e.g. 4K,64K,1M,256M") from None
        if n < 4 or n % 4:
            raise ValueError(f"--sizes: {part} is not a positive multiple of 4 bytes (float32 elements)")
        out.append(n)
    if not out:
        raise ValueError("--sizes: no size given")
    return out


def bus_factor(n: int) -> float:
    """nccl-tests' allreduce bus bandwidth factor 2(n-1)/n (0 for one rank: nothing crosses a link)."""
    return 2.0 * (n - 1) / n if n > 0 else 0.0


def run_allreduce(backend: Backend, bench: BenchOptions, results_dir: str | None, command: list[str],
                  verbose: bool = True, iface: str | None = None) -> AllreduceRecord | None:
    """SUM allreduce of float32 ones at each size; the chief writes the ``kind: "allreduce"`` record. ``iface``:
    the run's --iface (the data interface the record's ``machine`` block describes; None: the host name's)."""
    import tensorflow as tf

    sizes, iters, warmup = list(bench.sizes), bench.iters, bench.warmup_iters
    link = p2p.probe(backend)  # the raw link first (a collective), the yardstick for busbw
    reduce_fn = backend.allreduce_fn()
    n = backend.num_replicas
    mine: dict[str, list[float]] = {}
    wrong: dict[str, int] = {}
    for size in sizes:
        t = tf.ones([size // 4], dtype=tf.float32)
        # nccl-tests' #wrong: elements of the (untimed) first result that are not the expected sum
        wrong[str(size)] = bad = int(tf.math.count_nonzero(tf.not_equal(reduce_fn(t), float(n))))
        if bad:  # a benchmark of a reduction that does not reduce measures nothing
            raise RuntimeError(f"allreduce of ones over {n} replicas: {bad} wrong elements at {size} bytes")
        for _ in range(warmup):
            float(reduce_fn(t)[0])
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            float(reduce_fn(t)[0])  # reading one element waits for the whole reduction
            times.append(time.perf_counter() - t0)
        mine[str(size)] = times
        del t
    everyone = backend.allgather({"host": res.hostname(), "times": mine, "wrong": wrong,
                                  "machine": machine.rank_machine(iface)})
    if not backend.is_chief:
        return None
    rows = []
    for size in sizes:
        per_iter = [max(r["times"][str(size)][i] for r in everyone) for i in range(iters)]
        med = res.percentile(per_iter, 50)
        algbw = size / med / 1e9
        rows.append({"bytes": size, "time_median": med, "time_p95": res.percentile(per_iter, 95),
                     "algbw_GBps": algbw, "busbw_GBps": algbw * bus_factor(n), "iters": iters,
                     "wrong": sum(r["wrong"][str(size)] for r in everyone)})
    p2p.annotate(rows, link)  # busbw_pct_of_link per row
    caps = backend.capabilities()
    record = AllreduceRecord(
        backend=backend.name, backend_info=backend.describe(),
        collective=caps.collective.to_dict(), capabilities=caps.record(),  # what the report reads
        world_size=n, num_workers=backend.num_workers, warmup_iters=warmup,
        rows=rows, bus_factor=bus_factor(n), versions=res.versions(),
        hosts=[r["host"] for r in everyone], command=command, finished_at=res.now_iso(),
        run_id=res.new_run_id(),
        link=link,  # common.diagnostics.p2p: the probed point-to-point rate
        machine=machine.combine([r["machine"] for r in everyone]),
    )
    if verbose:
        print(f"[twinbench] allreduce, {backend.name}, {n} ranks (float32 sum; busbw = algbw x {bus_factor(n):.3f})")
    # The result itself (printed under --quiet too): time = median over the iterations of the slowest rank's time
    heading = (f"twinbench allreduce_perf: backend {backend.name}, {n} ranks, {iters} iterations per size "
               f"({warmup} untimed); time = median of the slowest rank's")
    print("\n".join(observe.nccl_table(rows, heading)), flush=True)
    if p2p.summary(rows, link):
        print(p2p.summary(rows, link), flush=True)
    if results_dir is not None:
        path = res.write_json_atomic(Path(results_dir) / record.filename(), public(record.to_dict()))
        print(f"[twinbench] results: {path}", flush=True)
    return record
