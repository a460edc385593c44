"""Run records: step-time statistics and the results JSON the chief writes (no TensorFlow here).

Throughput is measured, never extrapolated: global batch x timed steps / the slowest rank's timed wall time,
where the timed window starts after ``timing_warmup_steps`` and ends at the last step on every rank.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import secrets
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

SCHEMA = 1  # bump when a field changes meaning; reports check it


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    if not values:
        return float("nan")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def step_times_from_ends(start: float, ends: list[float]) -> list[float]:
    """Per-step durations from the timestamp before step 1 and the end timestamp of every step.

    Step-to-step intervals (not just the compute call) so input pipeline stalls and callback overhead count.
    """
    out = []
    prev = start
    for t in ends:
        out.append(t - prev)
        prev = t
    return out


def throughput_stats(per_rank_step_times: list[list[float]], global_batch: int, warmup: int) -> dict[str, Any]:
    """Images/s and step-time stats over the timed window (steps after ``warmup``) of all ranks."""
    steps = min(len(r) for r in per_rank_step_times)
    warm = min(warmup, max(steps - 1, 0))  # always keep at least one timed step
    timed = steps - warm
    walls = [sum(r[warm:steps]) for r in per_rank_step_times]
    slowest = max(walls)
    # A synchronous step ends when the slowest rank ends, so the per-step time is the max over ranks.
    per_step = [max(r[i] for r in per_rank_step_times) for i in range(warm, steps)]
    return {
        "images_per_sec": global_batch * timed / slowest if slowest > 0 else float("nan"),
        "timed_wall_time": slowest,
        "step_time": {
            "median": percentile(per_step, 50),
            "p95": percentile(per_step, 95),
            "mean": sum(per_step) / len(per_step) if per_step else float("nan"),
            "timed_steps": timed,
            "warmup_steps": warm,
        },
    }


def versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for mod in ("tensorflow", "tf_keras", "horovod", "numpy"):
        m = sys.modules.get(mod)
        if m is not None and hasattr(m, "__version__"):
            out[mod] = str(m.__version__)
    return out


def hostname() -> str:
    return socket.gethostname()


def new_run_id() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def result_filename(rec: dict[str, Any]) -> str:
    return f"{rec['backend']}-{rec['mode']}-n{rec['world_size']}-{rec['job_hash']}-{rec['run_id']}.json"


def write_atomic(path: Path, data: bytes | str) -> Path:
    """Write to a hidden temp file in the same directory, fsync, then rename: readers see all or nothing."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; results are meant to be shared like any file
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: Path, data: dict[str, Any]) -> Path:
    return write_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def check_results_dir(path: str | os.PathLike[str]) -> Path:
    """Create the results dir if needed and prove it writable now, before any training starts."""
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".probe-", dir=p)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise OSError(f"results dir {str(p)!r} is not writable ({e.strerror}); "
                      "pass --results to a writable dir") from None
    return p


def now_iso_from(epoch_seconds: float) -> str:
    return _dt.datetime.fromtimestamp(epoch_seconds, _dt.UTC).isoformat(timespec="seconds")


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
