"""The question users bring: can this job leave Horovod for native MultiWorkerMirroredStrategy? One table per job
(``registry.RATIO``'s two backends), after the verdict, rendered in report.md, report.html and ``migration.csv``:
whether both compute the same math (a ``common.check`` result found in the results directories, else "not
checked"), throughput per size with its interval and the verdict's words, time to target, peak memory per rank,
what each backend needs installed (the versions its records hold) and what the runs cannot tell.

``common.check`` is found by its summary file, ``check.json`` (``kind: "check"``), in a results directory or one of
its direct subdirectories: the job it checked (``job``, ``job_hash``), its exit status (``status``: 0 every pair
agrees, 1 a pair differs, 5 an input function that does not shard), its last line (``line``), ``rtol``,
``finished_at`` and ``versions``. A check applies to a job of the report when its job hash is the job's, or when the
two jobs differ only in keys that change how long or how the run is measured, not the step (``PROTOCOL_KEYS``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.report.base import NA, md_escape, warn
from common.report.document import Block, Heading, Para, Table
from common.report.load import result_files
from common.report.summary import RATIO_DEN, RATIO_NUM, JobSummary, RatioRow, Row, gpu_run, memory_text
from common.report.verdict import speed

CHECK_KIND = "check"
CHECK_FILE = "check.json"  # what common.check --results DIR would write as DIR/check.json (check_summary)
MIGRATION_CSV = "migration.csv"
# Job keys that say how long a run is, how it is measured or evaluated, or what it is called: a check of the job
# with other values of these checked the same step (common.check runs few steps, in both modes, at b and 2b).
PROTOCOL_KEYS = ("name", "pythonpath", "steps", "epochs", "steps_per_epoch", "mode", "timing_warmup_steps",
                 "sync_every_steps", "eval_every_epochs", "target_metric", "target_value")
STATUS = {0: "yes", 1: "NO", 5: "not as a data-parallel job"}  # common.check's exit statuses


@dataclass(frozen=True)
class CheckResult:
    """One ``check.json``: what common.check found for a job."""

    path: str
    job: dict[str, Any]
    job_hash: str
    status: int
    line: str
    finished_at: str = ""


def check_summary(job: Mapping[str, Any], job_hash: str, status: int, line: str, rtol: float,
                  finished_at: str) -> dict[str, Any]:
    """The ``check.json`` this module reads (``load_checks``), for common.check to write: the job as the user gave
    it (their --set, not the check's own steps; home directories as ~), its hash, the exit status and last line."""
    return {"kind": CHECK_KIND, "schema": 1, "job": dict(job), "job_hash": job_hash, "status": status, "line": line,
            "rtol": rtol, "finished_at": finished_at}


def load_checks(dirs: Sequence[Path], warn: Callable[[str], None] = warn) -> list[CheckResult]:
    """Every ``kind: "check"`` JSON in the directories (and their direct subdirectories), oldest first; one missing
    a field is skipped with a warning naming the file."""
    out = []
    for d in dirs:
        for path in result_files(d):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError):
                continue  # load_runs already warned about unreadable files
            if not isinstance(data, dict) or data.get("kind") != CHECK_KIND:
                continue
            job, h, status, line = (data.get(k) for k in ("job", "job_hash", "status", "line"))
            if not (isinstance(job, dict) and isinstance(h, str) and type(status) is int and isinstance(line, str)):
                warn(f"skipping {path}: a check result needs job, job_hash, status and line")
                continue
            out.append(CheckResult(str(path), job, h, status, line, str(data.get("finished_at") or "")))
    return sorted(out, key=lambda c: c.finished_at)


def differing_keys(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """The job keys whose values differ (absent on one side counts), sorted."""
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def check_for(s: JobSummary, checks: Sequence[CheckResult]) -> tuple[CheckResult, list[str]] | None:
    """The newest check of this job (its hash), else of a job that differs only in ``PROTOCOL_KEYS`` (with the
    keys that differ); None when there is none."""
    same = [c for c in checks if c.job_hash == s.job_hash]
    if same:
        return same[-1], []
    near = [(c, d) for c in checks if not set(d := differing_keys(c.job, s.job)) - set(PROTOCOL_KEYS)]
    return near[-1] if near else None


def same_math(s: JobSummary, checks: Sequence[CheckResult]) -> str:
    """The table's answer to "same math?"."""
    found = check_for(s, checks)
    if found is None:
        return ("not checked: no common.check result for this job in the results directories (common.check runs "
                "it on both backends at 1 and 2 workers, fit and custom loop, and compares losses and weights)")
    c, keys = found
    when = f", {c.finished_at}" if c.finished_at else ""
    other = [k for k in keys if k != "name"]
    which = f"this job with other {', '.join(other)}" if other else "this job"
    return f"{STATUS.get(c.status, f'exit {c.status}')}: {c.line} (common.check of {which}{when})"


def _version(runs: Sequence[Any], backend: str, key: str) -> str | None:
    """The value(s) of ``versions[key]`` in the backend's records, " + "-joined; None when none holds it."""
    vals = sorted({str(v) for r in runs if r.backend == backend and isinstance(r.versions, dict)
                   and (v := r.versions.get(key)) is not None})
    return " + ".join(vals) if vals else None


def needs(s: JobSummary) -> tuple[str, str]:
    """What each backend needs installed, from its records' versions: TensorFlow alone for native MWMS (part of
    it), a Horovod build for that TensorFlow on top."""
    runs = s.records
    tf = _version(runs, RATIO_DEN, "tensorflow") or NA
    keras = _version(runs, RATIO_DEN, "tf_keras")
    native = f"TensorFlow {tf}" + (f" (with tf-keras {keras})" if keras else "") + \
        ": MultiWorkerMirroredStrategy is part of TensorFlow, nothing else"
    hvd, patch = _version(runs, RATIO_NUM, "horovod"), _version(runs, RATIO_NUM, "horovod_patch")
    tf_h = _version(runs, RATIO_NUM, "tensorflow") or NA
    build = f"the same, plus Horovod {hvd or NA} compiled against TensorFlow {tf_h}"
    if patch and patch not in ("none", "unknown"):
        build += f" (its sdist patched: {patch})"
    return native, build + " and its launcher (horovodrun, or MPI)"


def cannot_tell(s: JobSummary) -> str:
    """What no run of the job measured."""
    rows = s.rows
    nodes = max((r.layout_counts[0] or 0 for r in rows), default=0)
    ws = max((r.identity.world_size for r in rows), default=0)
    out = [] if any(gpu_run(r) for r in s.records) else ["GPUs and NCCL (every run here on CPU)"]
    out.append(f"more than {nodes or NA} node{'' if nodes == 1 else 's'} or {ws} replicas (the largest measured)")
    out.append("other machines, networks, models or batch sizes than these runs'")
    return "; ".join(out)


def _size(q: RatioRow) -> str:
    return f"{q.world_size} replica{'' if q.world_size == 1 else 's'} ({q.layout or NA})"


def _ttt(r: Row) -> str:
    v = r.validation
    if not v.targeted:
        return NA
    return f"{v.ttt:.1f} s ({v.reached}/{v.targeted} reached)" if v.ttt is not None else f"not reached (0/{v.targeted})"


def _per_size(s: JobSummary) -> list[list[str]]:
    """Throughput (with the verdict's words), time to target and memory, per size where both backends ran."""
    pairs = [(q, d, n) for q in s.ratios if (d := q.den_row) is not None and (n := q.num_row) is not None]

    def ips(r: Row) -> str:
        return f"{r.throughput.median:.1f} {r.throughput.interval.text() if r.throughput.interval else 'no interval'}"

    body = [[f"images/s, {_size(q)}", ips(d), ips(n), speed(q, d, n)] for q, d, n in pairs]
    if any(d.validation.targeted or n.validation.targeted for _, d, n in pairs):
        body += [[f"time to target, {_size(q)}", _ttt(d), _ttt(n), ""] for q, d, n in pairs]
    if any(d.resources.memory_kind or n.resources.memory_kind for _, d, n in pairs):
        body += [[f"peak memory per rank, {_size(q)}", memory_text(d.resources) or NA, memory_text(n.resources) or NA,
                  ""] for q, d, n in pairs]
    return body


HEADER = ("question", f"{RATIO_DEN} (MultiWorkerMirroredStrategy)", RATIO_NUM, f"{RATIO_NUM} vs {RATIO_DEN}")
NOTE = ("Same math: common.check's comparison of per-step losses, final weights and validation on both backends "
        "(1e-5). Throughput: the median and its interval per size, compared as in the verdict. What each side needs: "
        "the versions its records hold. These runs measure this job on this machine: what they cannot tell is listed, "
        "and the verdict's caveats apply.")


def migration_part(summaries: Sequence[JobSummary], checks: Sequence[CheckResult]) -> list[Block]:
    """The section: per job where both backends ran at a size, its table; nothing when none did."""
    blocks: list[Block] = []
    for s in summaries:
        body = _per_size(s)
        if not body:
            continue
        native, hvd = needs(s)
        body = [["same math", "", "", same_math(s, checks)], *body, ["needs installed", native, hvd, ""],
                ["these runs cannot tell", "", "", cannot_tell(s)]]
        blocks += [Para(f"`{md_escape(s.name)}` (`{s.job_hash}`):"),
                   Table(HEADER, tuple(tuple(r) for r in body), csv=MIGRATION_CSV, key=(s.job_hash, s.name))]
    if not blocks:
        return []
    return [Heading(f"Can this job leave {RATIO_NUM} for {RATIO_DEN} MultiWorkerMirroredStrategy?", 2),
            *blocks, Para(NOTE, note=True)]
