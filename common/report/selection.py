"""Choosing the jobs to report, and refusing to compare different jobs (naming the job fields that differ)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from common.report.base import MISSING, ReportError, fmt_value
from common.report.load import recompute_job_hash
from common.report.rows import JobSummary


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


def different_jobs_message(a: JobSummary, b: JobSummary) -> str:
    """The one-line refusal naming the job fields that differ between two jobs."""
    diff = job_diff(a.job, b.job) or [f"job fields identical but recorded hashes differ "
                                      f"({a.job_hash} vs {b.job_hash}): results written by different "
                                      "twinbench versions?"]
    return (f"runs belong to different jobs ({'; '.join(diff)}); compare one job at a time with "
            f"--job-hash {a.job_hash} or --job-hash {b.job_hash}")


def _jobs_present(summaries: Sequence[JobSummary]) -> str:
    return ", ".join(f"{s.job_hash} ({s.name}, {len(s.runs)} runs)" for s in summaries) or "none"


def _resolve(summaries: Sequence[JobSummary], wanted: str, where: str) -> JobSummary:
    key = wanted.strip().lower()
    exact = [s for s in summaries if s.job_hash == key]
    hits = exact or ([s for s in summaries if s.job_hash.startswith(key)] if key else [])
    if not hits:
        raise ReportError(f"no runs with job hash {wanted!r} in {where}; jobs present: {_jobs_present(summaries)}")
    if len(hits) > 1:
        raise ReportError(f"job hash prefix {wanted!r} matches {len(hits)} jobs in {where}: {_jobs_present(hits)}; "
                          "give more digits")
    return hits[0]


def _job_of_file(summaries: Sequence[JobSummary], job: Mapping[str, Any], where: str) -> list[JobSummary]:
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


def select_jobs(summaries: Sequence[JobSummary], *, job_hash: str | None = None,
                compare: Sequence[str] | None = None, job: Mapping[str, Any] | None = None,
                where: str = "the results") -> list[JobSummary]:
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
