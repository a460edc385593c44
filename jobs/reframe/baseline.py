"""What the ReFrame check (jobs/reframe/twinbench_check.py) reads from results JSONs: a run's own record, the
final losses of two runs, and the reference figures of a baseline directory (the results JSONs an earlier run
wrote: a ReFrame output directory, a sweep directory, ``demo-results/``).

Plain Python on the JSON files (no TensorFlow, no ReFrame), so that the reference rule is unit-tested
(tests/test_reframe_baseline.py) and runs in whatever Python the centre's ReFrame runs in.

The reference of a throughput is the **median** ``images_per_sec`` of the baseline's runs with the same job hash,
backend and layout (nodes x ranks per node, from each record's ``hosts``): the median because one disturbed run
on a shared cluster moves a mean but not a median. The check turns it into ReFrame's ``(value, lower, upper)`` with
``tolerance`` (a fraction, default 0.10): a throughput fails below ``value * (1 - tolerance)`` and is never capped
above; the horovod/native ratio fails outside ``value * (1 +- tolerance)``.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

Record = dict[str, Any]
Layout = tuple[int, int]  # (nodes, ranks per node)


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


def median_throughput(records: Iterable[Record], job_hash: str, backend: str, lay: Layout) -> float | None:
    """The median images/s of the records of this job hash, backend and layout; None when there is none."""
    values = [float(r["images_per_sec"]) for r in records
              if r["job_hash"] == job_hash and r["backend"] == backend and layout(r) == lay]
    return statistics.median(values) if values else None


def throughput_reference(value: float | None, tolerance: float) -> tuple[float, float | None, float | None]:
    """ReFrame's (reference, lower, upper) for a throughput: fails more than ``tolerance`` below, never above;
    (0, None, None), recorded and never failing, without a baseline figure."""
    return (value, -tolerance, None) if value else (0, None, None)


def ratio_reference(value: float | None, tolerance: float) -> tuple[float, float | None, float | None]:
    """ReFrame's (reference, lower, upper) for the horovod/native ratio: fails more than ``tolerance`` off."""
    return (value, -tolerance, tolerance) if value else (0, None, None)
