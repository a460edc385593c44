"""Reading a results directory: finding the JSON files, validating training runs (common.core.results.RunRecord)
and loading them, and loading the allreduce microbenchmarks."""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from common.core.results import SCHEMA, BreakdownRecord, RecordError, RunRecord
from common.report.base import ReportError, warn
from common.report.stats import num

OTHER_KINDS = ("sweep", "allreduce", "breakdown")  # JSONs that live in results dirs but are not training runs
_HASH_RE = re.compile(r"[0-9a-f]{16}")


def recompute_job_hash(job: Mapping[str, Any]) -> str:
    """The hash ``common.workload.job.Job.job_hash`` gives this ``job`` dict (one definition: common.workload.job's)."""
    from common.workload.job import JobError, job_from_dict

    try:
        return job_from_dict(dict(job)).job_hash
    except (JobError, TypeError):
        return "invalid-job"


def result_files(results_dir: str | os.PathLike[str]) -> list[Path]:
    """``*.json`` in the directory and its direct subdirectories, minus hidden and ``.tmp`` (in-progress) files."""
    root = Path(results_dir)

    def visible(p: Path) -> bool:
        rel = p.relative_to(root).parts
        return not any(part.startswith(".") for part in rel) and not p.name.endswith(".tmp") and p.is_file()

    found = list(root.glob("*.json")) + list(root.glob("*/*.json"))
    return sorted(p for p in found if visible(p))


def check_run(d: Any) -> str | None:
    """Why this parsed JSON is not a usable training result, or None if it is.

    Presence and JSON types of the required fields are RunRecord's (``RunRecord.from_dict``); the values are
    checked here.
    """
    try:
        RunRecord.from_dict(d)
    except RecordError as e:
        return str(e)
    if d["schema"] != SCHEMA:
        return f"schema {d['schema']} is not supported (this report reads schema {SCHEMA})"
    if d["kind"] != "train":
        return f"kind {d['kind']!r} is not a training result"
    if not d["backend"]:
        return "empty 'backend'"
    if d["world_size"] < 1 or d["num_workers"] < 1:
        return f"world_size {d['world_size']} / num_workers {d['num_workers']} must be >= 1"
    if not _HASH_RE.fullmatch(d["job_hash"]):
        return f"job_hash {d['job_hash']!r} is not 16 lowercase hex digits"
    ips = float(d["images_per_sec"])
    if not (math.isfinite(ips) and ips > 0):
        return f"images_per_sec {d['images_per_sec']!r} is not a positive number"
    for k in ("median", "p95"):
        v = num(d["step_time"].get(k))
        if v is None or not math.isfinite(v) or v < 0:
            return f"step_time.{k} {d['step_time'].get(k)!r} is not a non-negative number"
    ttfs = float(d["time_to_first_step"])
    if not math.isfinite(ttfs) or ttfs < 0:
        return f"time_to_first_step {d['time_to_first_step']!r} is not a non-negative number"
    return None


# Files written before the record had ``capabilities`` said some of its facts only in ``backend_info``: read there
# for them alone. backend_info.strategy (a tf.distribute class name, or the flag's name) -> the --strategy flag.
LEGACY_STRATEGY_FLAGS = {
    # MultiWorkerMirroredStrategy's class is CollectiveAllReduceStrategy: what --strategy mwms recorded
    "CollectiveAllReduceStrategy": "mwms", "MultiWorkerMirroredStrategy": "mwms",
    "MirroredStrategy": "mirrored", "OneDeviceStrategy": "one_device",
    "CentralStorageStrategy": "central_storage", "ParameterServerStrategy": "parameter_server",
}
LEGACY_DEFAULT_STRATEGY = "mwms"  # native's default: no variant


def capabilities(d: Mapping[str, Any]) -> Mapping[str, Any]:
    """A run's (or an allreduce benchmark's) ``capabilities`` block (``common.core.contract.Capabilities.record``);
    for an older file without one, the same facts as its ``backend_info`` said them."""
    caps = d.get("capabilities")
    if isinstance(caps, Mapping):
        return caps
    info = d.get("backend_info")
    info = info if isinstance(info, Mapping) else {}
    raw = info.get("strategy")
    variant = LEGACY_STRATEGY_FLAGS.get(raw, raw) if isinstance(raw, str) and raw else None
    return {"variant": None if variant in (LEGACY_DEFAULT_STRATEGY, d.get("backend")) else variant,
            "compression": info.get("compression") or "none", "controller": info.get("controller"),
            "asynchronous": info.get("asynchronous") is True}


def collective_used(d: Mapping[str, Any]) -> str | None:
    """What carried the reduction (``collective.used``); for an older file without ``collective``, what its
    ``backend_info`` named (native's ``communication``, else Horovod's ``controller``)."""
    c = d.get("collective")
    used = c.get("used") if isinstance(c, Mapping) else None
    if isinstance(used, str) and used:
        return used
    info = d.get("backend_info")
    old = (info.get("communication") or info.get("controller")) if isinstance(info, Mapping) else None
    return old if isinstance(old, str) and old else None


def layout_of(d: Mapping[str, Any]) -> tuple[int | None, int | None, str]:
    """(nodes, ranks per node, layout text) of a run from ``hosts`` (one entry per rank; every schema has it):
    nodes = distinct hosts, ranks per node = ranks / nodes; text "2x4" (nodes x ranks per node), "2x(3+1)" when
    the nodes hold different numbers of ranks, "?" when the record names no hosts."""
    hosts = d.get("hosts")
    if not isinstance(hosts, list) or not hosts:
        return None, None, "?"
    counts = Counter(str(h) for h in hosts)
    per = sorted(counts.values(), reverse=True)
    if len(set(per)) == 1:
        return len(counts), per[0], f"{len(counts)}x{per[0]}"
    return len(counts), None, f"{len(counts)}x({'+'.join(map(str, per))})"


def upgrade_run(d: dict[str, Any]) -> None:
    """Fill in, in place, what an older results file says in another way: ``asynchronous`` (before it was a field
    of its own, only ``backend_info.asynchronous`` recorded parameter-server runs); ``evaluations`` ([]) and
    ``time_to_target_s`` (None) for files written before validation; and the derived layout (``_nodes``,
    ``_ranks_per_node``, ``_layout``: layout_of), which no record states but every one implies."""
    if not isinstance(d.get("asynchronous"), bool):
        d["asynchronous"] = capabilities(d).get("asynchronous") is True
    if not isinstance(d.get("evaluations"), list):  # files from before validation: no evaluation, no target time
        d["evaluations"] = []
    d.setdefault("time_to_target_s", None)
    d["_nodes"], d["_ranks_per_node"], d["_layout"] = layout_of(d)


def _read_json(path: Path, warn: Callable[[str], None]) -> tuple[bool, Any]:
    """(True, parsed JSON), or (False, None) after a one-line warning naming the file."""
    try:
        return True, json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        warn(f"skipping {path}: cannot read it ({e})")
    except json.JSONDecodeError as e:
        warn(f"skipping {path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})")
    return False, None


def load_runs(results_dir: str | os.PathLike[str], *, warn: Callable[[str], None] = warn) -> list[dict[str, Any]]:
    """Parse every complete results JSON under ``results_dir`` (and one level of subdirectories).

    Unreadable, unparsable or incomplete files are skipped with a one-line warning naming the file; a file
    repeating an already loaded ``run_id`` (a copy) is skipped too. Each returned dict is the JSON object plus
    ``_path`` (the file it came from). Raises ReportError if ``results_dir`` is not a directory.
    """
    root = Path(results_dir)
    if not root.exists():
        raise ReportError(f"results directory {str(root)!r} does not exist")
    if not root.is_dir():
        raise ReportError(f"{str(root)!r} is not a directory; pass the directory holding the results JSONs")
    runs: list[dict[str, Any]] = []
    seen: dict[str, Path] = {}
    for path in result_files(root):
        ok, data = _read_json(path, warn)
        if not ok:
            continue
        if isinstance(data, dict) and data.get("kind") in OTHER_KINDS:
            continue  # not a training run: sweep manifests, allreduce benchmarks, breakdowns (reported separately)
        problem = check_run(data)
        if problem:
            warn(f"skipping {path}: {problem}")
            continue
        run_id = data.get("run_id")
        if isinstance(run_id, str) and run_id:
            if run_id in seen:
                warn(f"skipping {path}: same run_id {run_id!r} as {seen[run_id]} (a copy)")
                continue
            seen[run_id] = path
        expected = recompute_job_hash(data["job"])
        if expected != data["job_hash"]:
            warn(f"{path}: job_hash {data['job_hash']} does not match its job fields (they hash to {expected}); "
                 "grouped by the recorded job_hash")
        upgrade_run(data)
        data["_path"] = str(path)
        runs.append(data)
    return runs


def _of_kind(results_dir: str | os.PathLike[str], kind: str) -> Iterator[tuple[Path, dict[str, Any]]]:
    """(path, parsed JSON) of the results files of ``kind`` under ``results_dir``."""
    for path in result_files(results_dir):
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue  # load_runs already warned about unreadable files
        if isinstance(d, dict) and d.get("kind") == kind:
            yield path, d


def load_allreduce(results_dir: str | os.PathLike[str], *, warn: Callable[[str], None] = warn) -> list[dict[str, Any]]:
    """The ``kind: allreduce`` JSONs (common.diagnostics.allreduce) under ``results_dir``, newest last per backend x
    size."""
    out = []
    for path, d in _of_kind(results_dir, "allreduce"):
        if not isinstance(d.get("rows"), list) or not isinstance(d.get("world_size"), int) or not d.get("backend"):
            warn(f"skipping {path}: incomplete allreduce benchmark")
            continue
        d["_path"] = str(path)
        out.append(d)
    return sorted(out, key=lambda d: (d["backend"], d["world_size"], str(d.get("finished_at", ""))))


def load_breakdowns(results_dir: str | os.PathLike[str], *,
                    warn: Callable[[str], None] = warn) -> list[BreakdownRecord]:
    """The ``kind: breakdown`` JSONs (``--diagnose breakdown``, common.diagnostics.breakdown) under ``results_dir``,
    oldest first; an unreadable one is skipped with a warning naming the file."""
    out = []
    for path, d in _of_kind(results_dir, "breakdown"):
        try:
            rec = BreakdownRecord.from_dict(d)
        except RecordError as e:
            warn(f"skipping {path}: {e}")
            continue
        if rec.schema != SCHEMA:
            warn(f"skipping {path}: schema {rec.schema} is not supported (this report reads schema {SCHEMA})")
            continue
        out.append(rec)
    return sorted(out, key=lambda r: str(r.finished_at or ""))
