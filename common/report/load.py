"""Loading: the results directories read as one set, each JSON file as its record type (training runs as
``LoadedRun``: common.core.results.RunRecord plus the file it came from and the layout its hosts give; allreduce
benchmarks and breakdowns as common.core.results.AllreduceRecord and BreakdownRecord), and the software versions
that make a comparison suspect. Older files are upgraded to their type's current schema as they are read
(common.core.results' upgrade_* steps), so nothing past this module asks what a file lacks. Which jobs are reported
is chosen here too, beside the loading (``select_jobs``: all, one by hash, the job of a file, or two hashes that
must name the same job, refusing different jobs by the fields that differ; ``check_versions``: mixed software
versions refused), on anything shaped as a summary (``Summarized``)."""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol, TypeVar

from common.core.results import AllreduceRecord, BreakdownRecord, RecordError, RunRecord
from common.report.base import MISSING, MixedVersionsError, ReportError, fmt_value, warn
from common.report.stats import num

# JSONs in results dirs that are not training runs (check: common.check's summary, read by common.report.migrate)
OTHER_KINDS = ("sweep", "allreduce", "breakdown", "check")
_HASH_RE = re.compile(r"[0-9a-f]{16}")


class Layout(NamedTuple):
    """Where a run's ranks ran, from its ``hosts`` (one entry per rank; every schema has it): nodes = distinct
    hosts, ranks per node = ranks / nodes (None when the nodes hold different numbers), text "2x4" (nodes x ranks
    per node), "2x(3+1)" for uneven nodes, "?" when the record names no hosts."""

    nodes: int | None
    ranks_per_node: int | None
    text: str


def layout_of(hosts: Sequence[Any] | None) -> Layout:
    """The Layout of a run whose ranks ran on ``hosts``."""
    if not isinstance(hosts, list) or not hosts:
        return Layout(None, None, "?")
    counts = Counter(str(h) for h in hosts)
    per = sorted(counts.values(), reverse=True)
    if len(set(per)) == 1:
        return Layout(len(counts), per[0], f"{len(counts)}x{per[0]}")
    return Layout(len(counts), None, f"{len(counts)}x({'+'.join(map(str, per))})")


@dataclass(frozen=True)
class LoadedRun:
    """A training run as the report holds it: its record (of the current schema: older files are upgraded on
    reading) and where it came from."""

    record: RunRecord
    path: str | None = None  # the results file it was read from; None for a record handed in, not read

    @property
    def layout(self) -> Layout:
        return layout_of(self.record.hosts)

    @classmethod
    def of(cls, run: LoadedRun | RunRecord | Mapping[str, Any]) -> LoadedRun:
        """A run handed to the report: loaded already, a record, or a parsed results JSON (RecordError if it is not
        a readable one)."""
        if isinstance(run, LoadedRun):
            return run
        return cls(run if isinstance(run, RunRecord) else RunRecord.from_dict(run))


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


def check_record(rec: RunRecord) -> str | None:
    """Why this record is not a usable training result (its values), or None if it is."""
    if rec.kind != "train":
        return f"kind {rec.kind!r} is not a training result"
    if not rec.backend:
        return "empty 'backend'"
    if rec.world_size < 1 or rec.num_workers < 1:
        return f"world_size {rec.world_size} / num_workers {rec.num_workers} must be >= 1"
    if not _HASH_RE.fullmatch(rec.job_hash):
        return f"job_hash {rec.job_hash!r} is not 16 lowercase hex digits"
    if not (math.isfinite(rec.images_per_sec) and rec.images_per_sec > 0):
        return f"images_per_sec {rec.images_per_sec!r} is not a positive number"
    for k in ("median", "p95"):
        v = num(rec.step_time.get(k))
        if v is None or not math.isfinite(v) or v < 0:
            return f"step_time.{k} {rec.step_time.get(k)!r} is not a non-negative number"
    if not math.isfinite(rec.time_to_first_step) or rec.time_to_first_step < 0:
        return f"time_to_first_step {rec.time_to_first_step!r} is not a non-negative number"
    return None


def read_run(d: Any) -> RunRecord | str:
    """The record of a parsed results JSON (upgraded to the current schema), or why it is not a usable training
    result: a missing field, a wrong type, an unsupported schema or a bad value."""
    try:
        rec = RunRecord.from_dict(d)
    except RecordError as e:
        return str(e)
    return check_record(rec) or rec



def _read_json(path: Path, warn: Callable[[str], None]) -> tuple[bool, Any]:
    """(True, parsed JSON), or (False, None) after a one-line warning naming the file."""
    try:
        return True, json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        warn(f"skipping {path}: cannot read it ({e})")
    except json.JSONDecodeError as e:
        warn(f"skipping {path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})")
    return False, None


def load_runs(results_dir: str | os.PathLike[str], *, warn: Callable[[str], None] = warn) -> list[LoadedRun]:
    """Parse every complete results JSON under ``results_dir`` (and one level of subdirectories).

    Unreadable, unparsable or incomplete files are skipped with a one-line warning naming the file; a file
    repeating an already loaded ``run_id`` (a copy) is skipped too. Raises ReportError if ``results_dir`` is not
    a directory.
    """
    root = Path(results_dir)
    if not root.exists():
        raise ReportError(f"results directory {str(root)!r} does not exist")
    if not root.is_dir():
        raise ReportError(f"{str(root)!r} is not a directory; pass the directory holding the results JSONs")
    runs: list[LoadedRun] = []
    seen: dict[str, Path] = {}
    for path in result_files(root):
        ok, data = _read_json(path, warn)
        if not ok:
            continue
        if isinstance(data, dict) and data.get("kind") in OTHER_KINDS:  # the file's kind, before it is typed
            continue  # not a training run: sweep manifests, allreduce benchmarks, breakdowns (reported separately)
        rec = read_run(data)
        if isinstance(rec, str):
            warn(f"skipping {path}: {rec}")
            continue
        if rec.run_id:
            if rec.run_id in seen:
                warn(f"skipping {path}: same run_id {rec.run_id!r} as {seen[rec.run_id]} (a copy)")
                continue
            seen[rec.run_id] = path
        expected = recompute_job_hash(rec.job)
        if expected != rec.job_hash:
            warn(f"{path}: job_hash {rec.job_hash} does not match its job fields (they hash to {expected}); "
                 "grouped by the recorded job_hash")
        runs.append(LoadedRun(rec, str(path)))
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


def load_allreduce(results_dir: str | os.PathLike[str], *,
                   warn: Callable[[str], None] = warn) -> list[AllreduceRecord]:
    """The ``kind: allreduce`` JSONs (common.diagnostics.allreduce) under ``results_dir``, newest last per backend x
    size."""
    out = []
    for path, d in _of_kind(results_dir, "allreduce"):
        try:
            out.append(AllreduceRecord.from_dict(d))
        except RecordError as e:
            warn(f"skipping {path}: incomplete allreduce benchmark ({e})")
    return sort_allreduce(out)


def sort_allreduce(benches: Iterable[AllreduceRecord]) -> list[AllreduceRecord]:
    """Per backend and world size, oldest first (the newest is the last)."""
    return sorted(benches, key=lambda b: (b.backend, b.world_size, str(b.finished_at or "")))


def load_breakdowns(results_dir: str | os.PathLike[str], *,
                    warn: Callable[[str], None] = warn) -> list[BreakdownRecord]:
    """The ``kind: breakdown`` JSONs (``--diagnose breakdown``, common.diagnostics.breakdown) under ``results_dir``,
    oldest first; an unreadable one is skipped with a warning naming the file."""
    out = []
    for path, d in _of_kind(results_dir, "breakdown"):
        try:
            out.append(BreakdownRecord.from_dict(d))
        except RecordError as e:
            warn(f"skipping {path}: {e}")
    return sorted(out, key=lambda r: str(r.finished_at or ""))


PathArg = str | os.PathLike[str]


def roots(results_dir: PathArg | Sequence[PathArg]) -> list[Path]:
    """One results directory, or several read as one set (each named once, in the order given)."""
    dirs = [results_dir] if isinstance(results_dir, str | os.PathLike) else list(results_dir)
    if not dirs:
        raise ReportError("no results directory given")
    return list(dict.fromkeys(Path(d) for d in dirs))


def load_set(roots: Sequence[Path], warn: Callable[[str], None] = warn) -> list[LoadedRun]:
    """The runs of every directory as one set; a run_id already loaded from another directory is a copy (skipped
    with a warning, as a copy within one directory is)."""
    runs: list[LoadedRun] = []
    seen: dict[str, str | None] = {}
    for root in roots:
        for r in load_runs(root, warn=warn):
            rid = r.record.run_id
            if rid is not None and rid in seen:
                warn(f"skipping {r.path}: same run_id {rid!r} as {seen[rid]} (a copy)")
                continue
            if rid:
                seen[rid] = r.path
            runs.append(r)
    return runs


# -- software versions across runs ----------------------------------------------------------------------
COMPARED = ("python", "tensorflow", "tf_keras", "horovod", "horovod_patch")  # keys that must agree
UNKNOWN = "unknown"  # shown for a compared key a run did not record


def versions_by_key(runs: Sequence[RunRecord]) -> dict[str, dict[str, set[str]]]:
    """version key -> value -> backends that ran with it (keys in the order first recorded)."""
    out: dict[str, dict[str, set[str]]] = {}
    for r in runs:
        if isinstance(r.versions, dict):
            for k, v in r.versions.items():
                out.setdefault(str(k), {}).setdefault(fmt_value(v), set()).add(r.backend)
    return out


def _natural(value: str) -> tuple[bool, list[Any]]:
    """Sort key: "unknown" last, numbers in versions compared as numbers (2.9 before 2.18)."""
    parts = re.split(r"(\d+)", value)
    return value == UNKNOWN, [int(p) if i % 2 else p for i, p in enumerate(parts)]


def version_mix(runs: Sequence[RunRecord]) -> list[str]:
    """``"key v1 vs v2"`` for every compared key whose values differ across ``runs`` (empty: no mix)."""
    out = []
    for key in COMPARED:
        users = {r.backend for r in runs if isinstance(r.versions, dict) and key in r.versions}
        values = set()
        for r in runs:
            if r.backend in users:
                vers = r.versions
                values.add(fmt_value(vers[key]) if isinstance(vers, dict) and key in vers else UNKNOWN)
        if len(values) > 1:
            out.append(f"{key} {' vs '.join(sorted(values, key=_natural))}")
    return out


def mix_message(name: str, job_hash: str, mix: Sequence[str]) -> str:
    """The start of the one-line refusal or warning about a mix of versions in one job's comparison."""
    return f"runs of job {name!r} ({job_hash}) mix versions: {'; '.join(mix)}"


# -- selection: which jobs are reported, refusing to compare different jobs or mixed versions --------------------------
class Summarized(Protocol):
    """What selection reads of a job's summary (common.report.summary.JobSummary)."""

    @property
    def job_hash(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def job(self) -> dict[str, Any]: ...
    @property
    def runs(self) -> list[LoadedRun]: ...
    @property
    def version_mix(self) -> list[str]: ...


S = TypeVar("S", bound=Summarized)


def check_versions(summaries: Sequence[S], *, allow_mixed: bool,
                   warn: Callable[[str], None] = warn) -> None:
    """Refuse (MixedVersionsError, the first such job) a comparison whose runs mix software versions, or, when
    ``allow_mixed``, warn once per such job."""
    for s in summaries:
        if s.version_mix:
            msg = mix_message(s.name, s.job_hash, s.version_mix)
            if not allow_mixed:
                raise MixedVersionsError(f"{msg}; pass --allow-mixed-versions to compare them anyway")
            warn(f"{msg}; compared anyway (--allow-mixed-versions)")



def job_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """``"field: a vs b"`` for every hashed job field that differs, in the Job's declared field order."""
    try:
        from common.workload.job import FIELDS  # stdlib-only module: field order for a readable diff

        order = [k for k in FIELDS if k in a or k in b]
    except ImportError:  # the report copied elsewhere without the rest of twinbench
        order = []
    keys = order + sorted((set(a) | set(b)) - set(order))
    return [f"{k}: {fmt_value(a.get(k, MISSING))} vs {fmt_value(b.get(k, MISSING))}"
            for k in keys if k != "name" and a.get(k, MISSING) != b.get(k, MISSING)]


def different_jobs_message(a: Summarized, b: Summarized) -> str:
    """The one-line refusal naming the job fields that differ between two jobs."""
    diff = job_diff(a.job, b.job) or [f"job fields identical but recorded hashes differ "
                                      f"({a.job_hash} vs {b.job_hash}): results written by different "
                                      "twinbench versions?"]
    return (f"runs belong to different jobs ({'; '.join(diff)}); compare one job at a time with "
            f"--job-hash {a.job_hash} or --job-hash {b.job_hash}")


def _jobs_present(summaries: Sequence[S]) -> str:
    return ", ".join(f"{s.job_hash} ({s.name}, {len(s.runs)} runs)" for s in summaries) or "none"


def _resolve(summaries: Sequence[S], wanted: str, where: str) -> S:
    key = wanted.strip().lower()
    exact = [s for s in summaries if s.job_hash == key]
    hits = exact or ([s for s in summaries if s.job_hash.startswith(key)] if key else [])
    if not hits:
        raise ReportError(f"no runs with job hash {wanted!r} in {where}; jobs present: {_jobs_present(summaries)}")
    if len(hits) > 1:
        raise ReportError(f"job hash prefix {wanted!r} matches {len(hits)} jobs in {where}: {_jobs_present(hits)}; "
                          "give more digits")
    return hits[0]


def _job_of_file(summaries: Sequence[S], job: Mapping[str, Any], where: str) -> list[S]:
    """The summary of the job a ``Job.to_dict()`` defines; ReportError naming the closest job otherwise."""
    h = recompute_job_hash(job)
    hit = [s for s in summaries if s.job_hash == h]
    if hit:
        return hit
    label = job.get("name", "unnamed")
    if not summaries:
        raise ReportError(f"no runs of job {label!r} ({h}) in {where}")
    closest = min(summaries, key=lambda s: (len(job_diff(job, s.job)), s.job_hash))
    diff = "; ".join(job_diff(job, closest.job)) or "no field differs"
    raise ReportError(f"no runs of job {label!r} ({h}) in {where}: runs belong to different jobs (closest is "
                      f"{closest.job_hash} '{closest.name}': {diff}); compare one job at a time with "
                      f"--job-hash {closest.job_hash}")


def select_jobs(summaries: Sequence[S], *, job_hash: str | None = None,
                compare: Sequence[str] | None = None, job: Mapping[str, Any] | None = None,
                where: str = "the results") -> list[S]:
    """The jobs to report: all of them (default), one by hash (a unique prefix is enough), the job of a
    ``Job.to_dict()``, or ``compare`` = two hashes, which must name the same job. ReportError otherwise."""
    if sum(x is not None for x in (job_hash, compare, job)) > 1:
        raise ReportError("use only one of --job-hash, --job and --compare")
    if job_hash is not None:
        return [_resolve(summaries, job_hash, where)]
    if compare is not None:
        if len(compare) != 2:
            raise ReportError(f"--compare takes two job hashes, got {len(compare)}")
        a, b = (_resolve(summaries, h, where) for h in compare)
        if a.job_hash != b.job_hash:
            raise ReportError(different_jobs_message(a, b))
        return [a]
    if job is not None:
        return _job_of_file(summaries, job, where)
    return list(summaries)
