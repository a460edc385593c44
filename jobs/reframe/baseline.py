"""What the ReFrame check (jobs/reframe/twinbench_check.py) reads from results JSONs: a run's own record, the
final losses of two runs, and the reference figures of a baseline directory (the results JSONs an earlier run
wrote: a ReFrame output directory, a sweep directory, ``demo-results/``).

Plain Python on the JSON files (no TensorFlow, no ReFrame), so that the reference rule is unit-tested
(tests/test_reframe_baseline.py) and runs in whatever Python the centre's ReFrame runs in.

The reference of a throughput is the **median** ``images_per_sec`` of the baseline's runs with the same job hash,
backend and layout (nodes x ranks per node, from each record's ``hosts``): the median because one disturbed run
on a shared cluster moves a mean but not a median. The check turns it into ReFrame's ``(value, lower, upper)`` with
a tolerance (a fraction): a throughput fails below ``value * (1 - tolerance)`` and is never capped above; the
horovod/native ratio fails outside ``value * (1 +- tolerance)``.

The tolerance is what the baseline's own spread supports (``interval_tolerance``): with at least 6 runs, how far
below the median the lower end of its distribution-free 95% interval lies (the order-statistic interval of
common/report/stats.py: [x(j), x(n+1-j)] with j the largest rank whose Binomial(n, 1/2) tail is <= 0.025); for
the ratio, the two medians' relative widths added. A baseline of fewer runs has no such interval: the check then
uses ``DEFAULT_TOLERANCE`` and says so. A tolerance the user gives (``-S reference_tolerance=``) wins.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

Record = dict[str, Any]
Layout = tuple[int, int]  # (nodes, ranks per node)
MIN_CI_RUNS = 6  # runs for a 95% interval of a median (fewer: none exists), as the report's
DEFAULT_TOLERANCE = 0.10  # a baseline too small for an interval: fail 10% below its median
MIN_TOLERANCE = 0.01  # never tighter than 1%, however narrow the baseline's interval (rounding of the figures)


def is_run_record(data: Any) -> bool:
    """A training run's results JSON (not a breakdown, a manifest or another tool's JSON)."""
    return (isinstance(data, dict) and data.get("kind", "train") == "train" and isinstance(data.get("job_hash"), str)
            and isinstance(data.get("backend"), str) and isinstance(data.get("images_per_sec"), int | float)
            and not isinstance(data.get("images_per_sec"), bool) and isinstance(data.get("hosts"), list))


def read_records(paths: Iterable[Path]) -> list[Record]:
    """The run records among ``paths`` (unreadable files and other JSONs are left out)."""
    out = []
    for path in sorted(paths):
        if path.name.startswith("."):
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        if is_run_record(data):
            data["_path"] = str(path)
            out.append(data)
    return out


def baseline_records(directory: str | Path) -> list[Record]:
    """Every run record under ``directory`` (recursively). Raises ValueError, one line, when it is no directory."""
    root = Path(directory)
    if not root.is_dir():
        raise ValueError(f"baseline={directory}: no such directory (give the results directory of an earlier run)")
    return read_records(root.rglob("*.json"))


def run_record(results_dir: str | Path) -> Record | None:
    """The one run record a twinbench run wrote into ``results_dir`` (the newest when there are several)."""
    found = read_records(Path(results_dir).glob("*.json"))
    return max(found, key=lambda r: str(r.get("finished_at") or "")) if found else None


def layout(record: Record) -> Layout | None:
    """(nodes, ranks per node) from the record's hosts; None when the nodes hold different numbers of ranks."""
    counts = Counter(str(h) for h in record.get("hosts") or [])
    per = set(counts.values())
    return (len(counts), per.pop()) if len(per) == 1 else None


def final_loss(record: Record) -> float | None:
    losses = record.get("step_losses")
    return float(losses[-1]) if isinstance(losses, list) and losses else None


def relative_difference(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


def throughputs(records: Iterable[Record], job_hash: str, backend: str, lay: Layout) -> list[float]:
    """The images/s of the records of this job hash, backend and layout."""
    return [float(r["images_per_sec"]) for r in records
            if r["job_hash"] == job_hash and r["backend"] == backend and layout(r) == lay]


def median_throughput(records: Iterable[Record], job_hash: str, backend: str, lay: Layout) -> float | None:
    """The median images/s of the records of this job hash, backend and layout; None when there is none."""
    values = throughputs(records, job_hash, backend, lay)
    return statistics.median(values) if values else None


def median_ranks(n: int) -> tuple[int, int] | None:
    """The 1-based ranks (j, k) of the 95% order-statistic interval of the median of n values; None for n < 6."""
    if n < MIN_CI_RUNS:
        return None
    tail, j = 0.0, 0
    for m in range(n + 1):  # the Binomial(n, 1/2) cdf, exactly
        tail += math.comb(n, m) / 2 ** n
        if tail > 0.025:
            break
        j = m + 1
    return j, n + 1 - j


def interval_tolerance(values: list[float]) -> float | None:
    """How far below the median (a fraction of it) the lower end of its 95% interval lies; None for < 6 values."""
    ranks = median_ranks(len(values))
    if ranks is None:
        return None
    xs, mid = sorted(values), statistics.median(values)
    return max((mid - xs[ranks[0] - 1]) / mid, MIN_TOLERANCE) if mid > 0 else None


def spread(values: list[float]) -> float | None:
    """The relative half-width the other way too: the larger of the interval's two sides; None for < 6 values."""
    ranks = median_ranks(len(values))
    if ranks is None:
        return None
    xs, mid = sorted(values), statistics.median(values)
    return max(mid - xs[ranks[0] - 1], xs[ranks[1] - 1] - mid, MIN_TOLERANCE * mid) / mid if mid > 0 else None


def throughput_reference(value: float | None, tolerance: float) -> tuple[float, float | None, float | None]:
    """ReFrame's (reference, lower, upper) for a throughput: fails more than ``tolerance`` below, never above;
    (0, None, None), recorded and never failing, without a baseline figure."""
    return (value, -tolerance, None) if value else (0, None, None)


def ratio_reference(value: float | None, tolerance: float) -> tuple[float, float | None, float | None]:
    """ReFrame's (reference, lower, upper) for the horovod/native ratio: fails more than ``tolerance`` off."""
    return (value, -tolerance, tolerance) if value else (0, None, None)
