"""The question users bring: can this job leave Horovod for native MultiWorkerMirroredStrategy? One table per job
(``registry.MIGRATION``), after the verdict, rendered in report.md, report.html and ``migration.csv``:
whether both compute the same math, whether the job scales exactly and whether Keras ``fit`` and the custom loop
agree (a ``common.check`` result found in the results directories, else "not checked", naming any check of other
code of the same job name), throughput per size with its interval and the verdict's words, time to target, peak
memory per rank, what each backend needs installed (the versions its records hold), the Horovod constructs the job
did not carry over (the records' ``job.not_carried``, when they hold it) and what the runs cannot tell.

``common.check`` is found by its summary file, ``check.json`` (``kind: "check"``), in a results directory or one of
its direct subdirectories: the job it checked (``job``, ``job_hash``), its exit status (``status``: ``STATUS``), its
last line (``line``), ``rtol``, ``finished_at`` and, from schema 2, one answer per question (``questions``:
``same_math`` from native vs Horovod at each size and mode, ``scales_exactly`` from 1 worker x 2b vs 2 workers x b,
``fit_vs_ctl``; each ``answer``, ``text``, ``causes``, ``likely``). A schema-1 file (one verdict for every pair) is
read by its line: it named the first pair that differed, in the order backend pairs, then 1 worker vs 2 workers,
then fit vs ctl, so the pairs before it agreed (``answers_from_line``). A check applies to a job of the report when
its job hash is the job's, or when the two jobs differ only in keys that change how long or how the run is measured,
not the step (``PROTOCOL_KEYS``).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.core import registry
from common.report.base import NA, md_escape, warn
from common.report.document import Block, Heading, Para, Table
from common.report.load import result_files
from common.report.summary import JobSummary, RatioRow, Row, gpu_run, memory_text, pair_ratios
from common.report.verdict import speed

CHECK_KIND = "check"
CHECK_FILE = "check.json"  # what common.check --results DIR would write as DIR/check.json (check_summary)
CHECK_SCHEMA = 2  # 2: one answer per question (questions); 1: the status and last line only
MIGRATION_CSV = "migration.csv"
# The question is leaving Horovod for native MWMS, the registry's MIGRATION role, not any compared pair (``--pair``):
# its rows are those two backends' own (Horovod's constructs not carried over, the horovod and horovod_patch versions,
# common.check's native vs Horovod answers, MWMS's needs), so another pair would get answers it never asked.
LEAVE = registry.MIGRATION
FROM, TO = LEAVE  # the backend left (the ratio's numerator), the one moved to
# Job keys that say how long a run is, how it is measured or evaluated, or what it is called: a check of the job
# with other values of these checked the same step (common.check runs few steps, in both modes, at b and 2b).
PROTOCOL_KEYS = ("name", "pythonpath", "steps", "epochs", "steps_per_epoch", "mode", "timing_warmup_steps",
                 "sync_every_steps", "eval_every_epochs", "target_metric", "target_value")
# common.check's exit statuses (common/check.py's EXIT_*: tests/test_check.py holds them equal): 0 every pair
# agrees, 1 native and Horovod differ (or a run failed: no check.json), 5 an input function that does not shard,
# 6 the backends agree but 1 worker x 2b vs 2 workers x b differs, 7 the backends agree and the job scales exactly
# but fit vs the custom loop differs. The same-math cell of a file without answers (schema 1) says these words.
STATUS = {0: "yes", 1: "NO", 5: "not as a data-parallel job", 6: "yes", 7: "yes"}
UNSHARDED_STATUS = 5
# The three questions a check answers (check.json's ``questions``), each a row of the table under this label
SAME_MATH, SCALES, MODES = "same_math", "scales_exactly", "fit_vs_ctl"
QUESTIONS = {SAME_MATH: "same math", SCALES: "scales exactly: 1 worker x 2b = 2 workers x b",
             MODES: "fit = custom loop"}
YES, NO, NOT_COMPARED, NOT_KNOWN = "yes", "no", "not compared", "not known"
SCALING_PAIR = "1 worker x 2b vs 2 workers x b"  # in common.check's pair labels (common.check.pairs)
MODES_PAIR = ": fit vs ctl"


@dataclass(frozen=True)
class Answer:
    """common.check's answer to one question: ``answer`` (yes, no, not compared; not known for what an older
    check.json cannot tell), what it compared or what differs first (``text``), and when it differs, what may cause
    it (``causes``; ``likely``: the check's evidence points at them, else they are possible causes)."""

    answer: str
    text: str = ""
    causes: tuple[str, ...] = ()
    likely: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"answer": self.answer, "text": self.text, "causes": list(self.causes), "likely": self.likely}

    @classmethod
    def from_dict(cls, d: Any) -> Answer | None:
        """The answer of a check.json's question, or None when it is not one (a file of another writer)."""
        if not isinstance(d, Mapping) or not isinstance(d.get("answer"), str):
            return None
        causes = d.get("causes") if isinstance(d.get("causes"), list) else []
        return cls(d["answer"], str(d.get("text") or ""), tuple(str(c) for c in causes), d.get("likely") is True)

    def words(self) -> str:
        """The answer as the table and common.check's last lines say it."""
        out = self.answer + (f": {self.text}" if self.text else "")
        if self.causes:
            label = ("likely cause" if self.likely else "possible cause") + ("s" if len(self.causes) > 1 else "")
            listed = self.causes[0] if len(self.causes) == 1 else \
                " ".join(f"({i}) {c};" for i, c in enumerate(self.causes, 1)).rstrip(";")
            out += f"; {label}: {listed}"
        return out


def answers_from_line(status: int, line: str) -> dict[str, Answer]:
    """The answers a schema-1 check.json (one verdict for every pair) still gives: it stopped at the first pair
    that differed, backend pairs first, then 1 worker vs 2 workers, then fit vs ctl, so those before it agreed."""
    unknown = Answer(NOT_KNOWN, "an older check.json gives one verdict for every pair: rerun common.check")
    if status == 0:
        return {q: Answer(YES, line) for q in QUESTIONS}
    if status != 1 or not line.startswith("DIFFERS: "):
        word = STATUS.get(status, f"exit {status}")
        return {SAME_MATH: Answer(word, line), SCALES: unknown, MODES: unknown}
    problem = line[len("DIFFERS: "):]
    agreed = Answer(YES, "the native vs Horovod pairs agreed (an older check: it stopped at the first pair that "
                         "differs, " + problem.split(":")[0] + ")")
    if SCALING_PAIR in problem:
        return {SAME_MATH: agreed, SCALES: Answer(NO, problem), MODES: unknown}
    if MODES_PAIR in problem:
        return {SAME_MATH: agreed, SCALES: Answer(YES, "agreed or not compared (an older check: every pair before "
                                                      "fit vs ctl)"), MODES: Answer(NO, problem)}
    return {SAME_MATH: Answer(NO, problem), SCALES: unknown, MODES: unknown}


@dataclass(frozen=True)
class CheckResult:
    """One ``check.json``: what common.check found for a job."""

    path: str
    job: dict[str, Any]
    job_hash: str
    status: int
    line: str
    finished_at: str = ""
    answers: Mapping[str, Answer] = field(default_factory=dict)  # by question (SAME_MATH, SCALES, MODES)

    def answer(self, question: str) -> Answer:
        return self.answers.get(question) or answers_from_line(self.status, self.line)[question]


def check_summary(job: Mapping[str, Any], job_hash: str, status: int, line: str, rtol: float,
                  finished_at: str, answers: Mapping[str, Answer] | None = None) -> dict[str, Any]:
    """The ``check.json`` this module reads (``load_checks``), for common.check to write: the job as the user gave
    it (their --set, not the check's own steps; home directories as ~), its hash, the exit status, last line and
    the answer to each question."""
    out = {"kind": CHECK_KIND, "schema": CHECK_SCHEMA if answers else 1, "job": dict(job), "job_hash": job_hash,
           "status": status, "line": line, "rtol": rtol, "finished_at": finished_at}
    if answers:
        out["questions"] = {q: a.to_dict() for q, a in answers.items()}
    return out


def load_checks(dirs: Sequence[Path], warn: Callable[[str], None] = warn) -> list[CheckResult]:
    """Every ``kind: "check"`` JSON in the directories (and their direct subdirectories), oldest first; one missing
    a field is skipped with a warning naming the file; a question its ``questions`` lacks (an older file) is
    answered from its status and line."""
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
            given = data.get("questions") if isinstance(data.get("questions"), dict) else {}
            answers = {q: a for q in QUESTIONS if (a := Answer.from_dict(given.get(q))) is not None}
            out.append(CheckResult(str(path), job, h, status, line, str(data.get("finished_at") or ""), answers))
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


def other_checks(s: JobSummary, checks: Sequence[CheckResult], used: CheckResult | None) -> list[CheckResult]:
    """The newest check of each other job hash of the same job name that does not apply to this job (``check_for``
    would not take it: another code_digest, another key than ``PROTOCOL_KEYS``), oldest first."""
    newest: dict[str, CheckResult] = {}
    for c in checks:  # oldest first: the newest of each hash stays
        if c is used or c.job_hash == s.job_hash or c.job.get("name") != s.name:
            continue
        if set(differing_keys(c.job, s.job)) - set(PROTOCOL_KEYS):
            newest[c.job_hash] = c
    return sorted(newest.values(), key=lambda c: c.finished_at)


def rerun(s: JobSummary) -> str:
    """``python -m common.check --job FILE`` for this job: the job file and the --set overrides that change the
    step (not ``PROTOCOL_KEYS``) as a run's recorded command gave them; ``JOB.toml`` when no record names one."""
    for r in s.records:
        cmd = [str(a) for a in (r.command or [])]
        words = [w for a in cmd for w in (a.split("=", 1) if a.startswith(("--job=", "--set=")) else [a])]
        if "--job" not in words[:-1]:
            continue
        sets = [v for k, v in zip(words, words[1:]) if k == "--set" and v.split("=")[0] not in PROTOCOL_KEYS]
        return shlex.join(["python", "-m", "common.check", "--job", words[words.index("--job") + 1],
                           *(w for v in sets for w in ("--set", v))])
    return "python -m common.check --job JOB.toml"


def _other_words(s: JobSummary, c: CheckResult) -> str:
    keys = [k for k in differing_keys(c.job, s.job) if k not in PROTOCOL_KEYS]
    what = "other code" if keys == ["code_digest"] else f"this job name with other {', '.join(keys)}"
    return f"a check of {what} (hash {c.job_hash}{', ' + c.finished_at if c.finished_at else ''}, {c.path})"


def question_cells(s: JobSummary, checks: Sequence[CheckResult]) -> list[str]:
    """The table's answers to "same math?", "scales exactly?" and "fit = custom loop?" (QUESTIONS' order): from the
    newest check of this job, else "not checked"; checks of other code of the same job name are named either way."""
    found = check_for(s, checks)
    others = [_other_words(s, c) for c in other_checks(s, checks, found[0] if found else None)]
    if found is None:
        first = "not checked: no common.check result for this job in the results directories (common.check runs " \
                "it on both backends at 1 and 2 workers, fit and custom loop, and compares losses and weights: " \
                f"`{rerun(s)} --results DIR/check`)"
        if others:
            first = f"not checked: {'; '.join(others)} {'was' if len(others) == 1 else 'were'} found, not of this " \
                    f"job: rerun `{rerun(s)}`"
        return [first, "not checked", "not checked"]
    c, keys = found
    when = f", {c.finished_at}" if c.finished_at else ""
    other = [k for k in keys if k != "name"]
    source = f" (common.check of {'this job with other ' + ', '.join(other) if other else 'this job'}{when})"
    same = c.answer(SAME_MATH)
    if c.status == UNSHARDED_STATUS:
        first = f"{STATUS[UNSHARDED_STATUS]}: {c.line}"
    else:
        first = same.words()
        first = ("NO" + first[2:]) if same.answer == NO else first
    also = f"; also found: {'; '.join(others)}" if others else ""
    return [first + source + also, c.answer(SCALES).words(), c.answer(MODES).words()]


def same_math(s: JobSummary, checks: Sequence[CheckResult]) -> str:
    """The table's answer to "same math?"."""
    return question_cells(s, checks)[0]


def not_carried(s: JobSummary) -> str | None:
    """The Horovod constructs the job did not carry over (the records' ``job.not_carried``: a list of names, of
    {name, why} tables, or a table of name -> why), each once; None when no record holds any."""
    items: list[str] = []
    for r in s.records:
        value = r.job.get("not_carried") if isinstance(r.job, Mapping) else None
        pairs = value.items() if isinstance(value, Mapping) else \
            [(x, "") if isinstance(x, str) else (x.get("name") or x.get("construct") or x.get("what"),
                                                  x.get("why") or x.get("reason") or "")
             for x in (value if isinstance(value, list) else []) if isinstance(x, str | Mapping)]
        for name, why in pairs:
            text = f"{name}: {why}" if why else str(name)
            if name and text not in items:
                items.append(text)
    return "; ".join(items) or None


def _version(runs: Sequence[Any], backend: str, key: str) -> str | None:
    """The value(s) of ``versions[key]`` in the backend's records, " + "-joined; None when none holds it."""
    vals = sorted({str(v) for r in runs if r.backend == backend and isinstance(r.versions, dict)
                   and (v := r.versions.get(key)) is not None})
    return " + ".join(vals) if vals else None


def needs(s: JobSummary) -> tuple[str, str]:
    """What each backend needs installed, from its records' versions: TensorFlow alone for native MWMS (part of
    it), a Horovod build for that TensorFlow on top."""
    runs = s.records
    tf = _version(runs, TO, "tensorflow") or NA
    keras = _version(runs, TO, "tf_keras")
    native = f"TensorFlow {tf}" + (f" (with tf-keras {keras})" if keras else "") + \
        ": MultiWorkerMirroredStrategy is part of TensorFlow, nothing else"
    hvd, patch = _version(runs, FROM, "horovod"), _version(runs, FROM, "horovod_patch")
    tf_h = _version(runs, FROM, "tensorflow") or NA
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
    pairs = [(q, d, n) for q in pair_ratios(s, LEAVE) if (d := q.den_row) is not None and (n := q.num_row) is not None]

    def ips(r: Row) -> str:
        return f"{r.throughput.median:.1f} {r.throughput.interval.text() if r.throughput.interval else 'no interval'}"

    body = [[f"images/s, {_size(q)}", ips(d), ips(n), speed(q, d, n)] for q, d, n in pairs]
    if any(d.validation.targeted or n.validation.targeted for _, d, n in pairs):
        body += [[f"time to target, {_size(q)}", _ttt(d), _ttt(n), ""] for q, d, n in pairs]
    if any(d.resources.memory_kind or n.resources.memory_kind for _, d, n in pairs):
        body += [[f"peak memory per rank, {_size(q)}", memory_text(d.resources) or NA, memory_text(n.resources) or NA,
                  ""] for q, d, n in pairs]
    return body


HEADER = ("question", f"{TO} (MultiWorkerMirroredStrategy)", FROM, f"{FROM} vs {TO}")
NOTE = ("Same math: common.check's comparison of per-step losses, final weights and validation of native against "
        "Horovod at each size and mode (1e-5); whether 1 worker x 2b equals 2 workers x b, and fit the custom loop, "
        "are rows of their own (a job can leave Horovod whatever they say: both backends share them). Throughput: "
        "the median and its interval per size, compared as in the verdict. What each side needs: the versions its "
        "records hold. These runs measure this job on this machine: what they cannot tell is listed, and the "
        "verdict's caveats apply.")


def migration_part(summaries: Sequence[JobSummary], checks: Sequence[CheckResult]) -> list[Block]:
    """The section: per job where both backends ran at a size, its table; nothing when none did."""
    blocks: list[Block] = []
    for s in summaries:
        body = _per_size(s)
        if not body:
            continue
        native, hvd = needs(s)
        dropped = not_carried(s)
        body = [*([QUESTIONS[q], "", "", cell] for q, cell in zip(QUESTIONS, question_cells(s, checks))), *body,
                ["needs installed", native, hvd, ""],
                *([["not carried over from Horovod", "", "", dropped]] if dropped else []),
                ["these runs cannot tell", "", "", cannot_tell(s)]]
        blocks += [Para(f"`{md_escape(s.name)}` (`{s.job_hash}`):"),
                   Table(HEADER, tuple(tuple(r) for r in body), csv=MIGRATION_CSV, key=(s.job_hash, s.name))]
    if not blocks:
        return []
    return [Heading(f"Can this job leave {FROM} for {TO} MultiWorkerMirroredStrategy?", 2),
            *blocks, Para(NOTE, note=True)]
