"""``python -m common.check --job FILE.toml``: does YOUR job compute the same math on every backend and world size?

Runs the job for a few steps (``--steps``, default 20) on each backend at 1 and 2 local workers (CPU), in Keras
``fit`` and in the custom loop: 8 runs by default, one at a time, each through its backend's own local launcher
(``registry.load(kind).local_command``), started in the working directory the check was started in (paths given
to it are made absolute first: ``--job``, ``--results`` and the job's relative paths mean what they mean to the
user). The 2-worker runs use the job's per-replica batch b, the 1-worker runs 2b (``--set
per_replica_batch_size=2b``, and with ``lr_scaling = "linear"`` or ``warmup_epochs`` ``--lr-replicas 2``: the LR,
and Horovod's warm-up from LR / replicas, that 2 workers get): the same global batch and LR, so the same math. Then
it compares, pair by pair, one question each:

- same math: each backend against the first one (registry order) at the same workers and mode: what the report's
  "can this job leave Horovod" answer rests on;
- does the job scale exactly: 1 worker x 2b against 2 workers x b, per backend and mode. A job may not (Dropout
  draws its masks per replica, BatchNormalization normalises per replica, float32 sums round in another order),
  on both backends alike: a property of the job, not a backend's. When it differs the check names what may cause
  it (``scaling_causes``: what the model's source shows, read without importing it; the step the difference starts
  at and its size; the threads per rank);
- fit against the custom loop, per backend and workers;

on the per-step losses (largest relative difference; they must agree to ``RTOL``), the final trainable weights
(``RunRecord.trainable_weights_fingerprint``: per variable sum and sum of squares, within ``RTOL`` of the
variable's L2 norm) and, when the job evaluates, the validation numbers of every evaluation (within ``RTOL``).
An input function's runs (the record's ``input.pipeline``) also compare each rank's fingerprint of its first batches
at equal workers ("saw different data"), warn when every rank of a run got the same ones (no sharding), and skip
1 worker x 2b against 2 workers x b: the function shards its own data, so the world size changes the batches. Every
pair left out is listed ("not compared: ..." and why). Its last lines answer the three questions (as the report's
rows), then the verdict's line; ``--results DIR`` keeps the runs and writes both in ``DIR/check.json``.

Exit statuses:

- 0: every pair agrees;
- 1 (``EXIT_DIFFERS``): native and Horovod differ at a size and mode (same math: no), naming the first pair and
  step that differ (both values); or a run failed (with its stderr's tail; no check.json);
- 2: bad input, one line, before any run (a job key, an argument the user's function has no parameter for, a
  missing path: common.workload.argcheck);
- 5 (``EXIT_UNSHARDED``, named in its line): the backends agree, but an input function gave every rank of a run the
  same first batches: every worker trained on the same data, not a clean pass;
- 6 (``EXIT_SCALES_INEXACTLY``): the backends agree (same math), but 1 worker x 2b vs 2 workers x b differs: the job
  does not scale exactly (its line names the first pair; the answer above it, the possible causes);
- 7 (``EXIT_MODES_DIFFER``): the backends agree and the job scales exactly, but fit vs the custom loop differs.

This is how a user finds out that a model does something rank-dependent (a per-rank seed, a data order that depends
on the rank, a layer that reads the rank: 1 worker vs 2 workers, status 6) or backend-dependent (status 1) before
publishing a comparison. ``--results DIR`` keeps the runs (default: a temporary directory, removed).
No TensorFlow in this process.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from common import launches
from common.cluster import container
from common.core import registry
from common.core.errors import UsageError, fail
from common.core.privacy import public
from common.core.results import EVALUATION_META, now_iso, write_atomic
from common.core.text import text_table
from common.report.migrate import CHECK_FILE, NO, NOT_COMPARED, QUESTIONS, SAME_MATH, SCALES, YES, Answer, check_summary
from common.report.migrate import MODES as FIT_VS_CTL
from common.workload import argcheck, usercode
from common.workload.job import MODES, JobError, load_job
from common.workload.models import MODELS

PROG = "common.check"
REPO = Path(__file__).resolve().parent.parent
RTOL = 1e-5  # the parity tests' tolerance (float32 reductions in another order); in practice bit for bit
DEFAULT_STEPS = 20
RUN_TIMEOUT = 900.0  # seconds for one run
TAIL_LINES = 25  # lines of a failed run's stderr shown
LR_REPLICAS_FLAG = "--lr-replicas"  # every backend's: scale the recipe's LR as for N replicas (common/cli.py)
EXIT_DIFFERS = 1  # native and Horovod differ at a size and mode (same math: no), or a run failed
EXIT_UNSHARDED = 5  # every pair agrees, but an input function gave every rank of a run the same first batches
EXIT_SCALES_INEXACTLY = 6  # the backends agree (same math), but 1 worker x 2b vs 2 workers x b differs
EXIT_MODES_DIFFER = 7  # the backends agree and the job scales exactly, but fit vs the custom loop differs
BACKENDS, SCALING, MODES_KIND = "backends", "scaling", "modes"  # Row.kind: the question a pair answers
QUESTION_OF = {BACKENDS: SAME_MATH, SCALING: SCALES, MODES_KIND: FIT_VS_CTL}
# A first difference below ROUNDING (relative), after step 1, is the size of float32 sums added in another order;
# one that then stays below DRIFT over the check's few steps grows as such rounding does, not as another computation
ROUNDING = 1e-4
DRIFT = 1e-2


class RunKey(NamedTuple):
    backend: str
    mode: str
    workers: int

    def text(self) -> str:
        return f"{self.backend} {self.mode} {self.workers} worker{'s' if self.workers != 1 else ''}"


@dataclass(frozen=True)
class Row:
    """One compared pair: what differs first (None: nothing), and the largest per-step loss difference."""

    pair: str
    a: RunKey
    b: RunKey
    steps: int
    max_rel: float | None  # largest relative per-step loss difference (None: the step counts differ)
    loss_diff: str | None  # the first differing step, "step N: x vs y"
    weights: bool | None  # final trainable weights agree (None: not recorded)
    weights_diff: str | None
    validation: bool | None  # every evaluation agrees (None: neither run evaluated)
    validation_diff: str | None
    data_diff: str | None = None  # an input function's first batches differ between the two runs' ranks
    first_step: int | None = None  # the first step (1-based) whose losses differ beyond the tolerance
    first_rel: float | None = None  # their relative difference
    exact: bool = False  # bit for bit: the same losses and final weights' fingerprints

    @property
    def kind(self) -> str:
        """Which question the pair answers: BACKENDS (same math), SCALING (1 worker x 2b vs 2 workers x b) or
        MODES (fit vs ctl)."""
        return BACKENDS if self.a.backend != self.b.backend else SCALING if self.a.workers != self.b.workers \
            else MODES_KIND

    @property
    def ok(self) -> bool:
        return self.loss_diff is None and self.weights is not False and self.validation is not False \
            and self.data_diff is None

    def first_problem(self) -> str | None:
        if self.data_diff:  # first: it explains every other difference
            who = "the two backends" if self.a.backend != self.b.backend else "the two runs"
            return f"{self.pair}: {who} saw different data, {self.data_diff}"
        for what, diff in (("loss", self.loss_diff), ("final weights", self.weights_diff),
                           ("validation", self.validation_diff)):
            if diff:
                return f"{self.pair}: {what} differs, {diff}"
        return None


# -- the comparison (pure: records in, rows out) -------------------------------------------------------------------
def rel_diff(x: float, y: float) -> float:
    return abs(x - y) / max(abs(x), abs(y), 1e-12)


def compare_losses(a: Sequence[float], b: Sequence[float], rtol: float = RTOL) -> tuple[float | None, str | None]:
    """(largest relative difference, the first step beyond ``rtol`` as "step N: a vs b" or None)."""
    if len(a) != len(b):
        return None, f"{len(a)} vs {len(b)} steps"
    diffs = [rel_diff(x, y) for x, y in zip(a, b)]
    first = next((i for i, d in enumerate(diffs) if not d <= rtol), None)  # a NaN differs
    msg = None if first is None else f"step {first + 1}: {a[first]!r} vs {b[first]!r}"
    return (max(diffs) if diffs else 0.0), msg


def first_difference(a: Sequence[float], b: Sequence[float], rtol: float = RTOL) -> tuple[int, float] | None:
    """(the first step, 1-based, whose losses differ beyond ``rtol``, their relative difference), or None."""
    return next(((i + 1, d) for i, (x, y) in enumerate(zip(a, b)) if not (d := rel_diff(x, y)) <= rtol), None)


def compare_weights(a: Any, b: Any, rtol: float = RTOL) -> tuple[bool | None, str | None]:
    """Fingerprints ([sum, sum of squares] per variable): a sum within ``rtol`` x the variable's L2 norm (a sum of
    many values may cancel to about 0), a sum of squares within ``rtol`` relative."""
    if not isinstance(a, list) or not isinstance(b, list):
        return None, None
    if len(a) != len(b):
        return False, f"{len(a)} vs {len(b)} trainable variables"
    for i, ((sa, qa), (sb, qb)) in enumerate(zip(a, b)):
        norm = math.sqrt(max(qa, qb, 0.0))
        if not abs(sa - sb) <= rtol * max(abs(sa), abs(sb), norm, 1e-12):
            return False, f"variable {i} sum {sa!r} vs {sb!r}"
        if not rel_diff(qa, qb) <= rtol:
            return False, f"variable {i} sum of squares {qa!r} vs {qb!r}"
    return True, None


def compare_evaluations(a: Any, b: Any, rtol: float = RTOL) -> tuple[bool | None, str | None]:
    """Every evaluation's step and numbers (loss, metrics) within ``rtol``; None when neither run evaluated."""
    a, b = a or [], b or []
    if not a and not b:
        return None, None
    if len(a) != len(b):
        return False, f"{len(a)} vs {len(b)} evaluations"
    for ea, eb in zip(a, b):
        if ea.get("step") != eb.get("step"):
            return False, f"evaluated after step {ea.get('step')} vs {eb.get('step')}"
        for k in sorted(set(ea) | set(eb)):
            if k in EVALUATION_META:  # times differ; the step is compared on its own
                continue
            va, vb = ea.get(k), eb.get(k)
            if not isinstance(va, int | float) or not isinstance(vb, int | float) or not rel_diff(va, vb) <= rtol:
                return False, f"step {ea.get('step')} {k}: {va!r} vs {vb!r}"
    return True, None


def fingerprints(record: Mapping[str, Any]) -> list[str] | None:
    """Each rank's fingerprint of its first batches (an input function's runs: ``input.pipeline``), else None."""
    pipeline = (record.get("input") or {}).get("pipeline")
    return [r["fingerprint"] for r in pipeline["per_rank"]] if pipeline else None


def compare_data(a: Mapping[str, Any], b: Mapping[str, Any]) -> str | None:
    """The first rank whose first batches differ between two runs at equal workers ("rank R: x vs y"), or None."""
    fa, fb = fingerprints(a), fingerprints(b)
    if fa is None or fb is None:
        return None
    return next((f"rank {r}: first batches {x} vs {y}" for r, (x, y) in enumerate(zip(fa, fb)) if x != y), None)


def same_batch_warnings(records: Mapping[RunKey, Mapping[str, Any]]) -> list[str]:
    """A warning per run whose ranks all got the same first batches: an input function that does not shard."""
    return [f"[check] warning: {key.text()}: every rank got the same first batches: does the input function shard "
            "by input_context.input_pipeline_id?" for key in unsharded(records)]


def pairs(keys: Sequence[RunKey]) -> list[tuple[str, RunKey, RunKey]]:
    """(label, a, b) of every comparison the runs in ``keys`` allow, in the order the table shows them."""
    have = set(keys)
    kinds = list(dict.fromkeys(k.backend for k in keys))
    modes = list(dict.fromkeys(k.mode for k in keys))
    workers = sorted({k.workers for k in keys})
    out = []
    for m in modes:
        for w in workers:
            for other in kinds[1:]:
                a, b = RunKey(kinds[0], m, w), RunKey(other, m, w)
                if a in have and b in have:
                    out.append((f"{kinds[0]} vs {other}, {m}, {w} worker{'s' if w != 1 else ''}", a, b))
    for kind in kinds:
        for m in modes:
            a, b = RunKey(kind, m, 1), RunKey(kind, m, 2)
            if a in have and b in have:
                out.append((f"{kind} {m}: 1 worker x 2b vs 2 workers x b", a, b))
    for kind in kinds:
        for w in workers:
            a, b = RunKey(kind, "fit", w), RunKey(kind, "ctl", w)
            if a in have and b in have:
                out.append((f"{kind} {w} worker{'s' if w != 1 else ''}: fit vs ctl", a, b))
    return out


def skip_reason(ka: RunKey, kb: RunKey, records: Mapping[RunKey, Mapping[str, Any]], across_sizes: bool = True,
                note: str = "") -> str | None:
    """Why the pair (ka, kb) is not compared, or None: an input function's runs at two world sizes (it shards its
    own data: another world size, other batches; docs/jobs.md), or ``across_sizes`` False (``note`` says why)."""
    if ka.workers == kb.workers:
        return None
    if fingerprints(records[ka]) or fingerprints(records[kb]):
        return "an input function shards its own data, so 2 workers read other batches than 1"
    return None if across_sizes else note or "left out"


def skipped(records: Mapping[RunKey, Mapping[str, Any]], *, across_sizes: bool = True, note: str = "") -> list[str]:
    """A line per pair the runs allow that ``compare`` leaves out, naming it and why."""
    return [f"[check] not compared: {ka.backend} {ka.mode}, 1 worker vs 2 workers: {why}"
            for _, ka, kb in pairs(list(records)) if (why := skip_reason(ka, kb, records, across_sizes, note))]


def unsharded(records: Mapping[RunKey, Mapping[str, Any]]) -> list[RunKey]:
    """The runs whose ranks all got the same first batches: an input function that does not shard."""
    return [k for k, r in records.items() if (f := fingerprints(r)) and len(f) > 1 and len(set(f)) == 1]


def compare(records: Mapping[RunKey, Mapping[str, Any]], rtol: float = RTOL, *,
            across_sizes: bool = True) -> list[Row]:
    """One Row per pair the records allow (``pairs``) but those ``skip_reason`` leaves out; ``across_sizes``
    False leaves out 1 worker vs 2 workers."""
    rows = []
    for label, ka, kb in pairs(list(records)):
        a, b = records[ka], records[kb]
        if skip_reason(ka, kb, records, across_sizes):
            continue
        max_rel, loss_diff = compare_losses(a.get("step_losses") or [], b.get("step_losses") or [], rtol)
        weights, weights_diff = compare_weights(a.get("trainable_weights_fingerprint"),
                                                b.get("trainable_weights_fingerprint"), rtol)
        val, val_diff = compare_evaluations(a.get("evaluations"), b.get("evaluations"), rtol)
        la, lb = a.get("step_losses") or [], b.get("step_losses") or []
        first = first_difference(la, lb, rtol) if len(la) == len(lb) else None
        exact = bool(la) and la == lb and a.get("trainable_weights_fingerprint") == b.get(
            "trainable_weights_fingerprint")
        rows.append(Row(label, ka, kb, len(la), max_rel, loss_diff, weights, weights_diff,
                        val, val_diff, compare_data(a, b) if ka.workers == kb.workers else None,
                        *(first or (None, None)), exact))
    return rows


def format_table(rows: Sequence[Row]) -> str:
    """The table the command prints (plain text, one pair a line)."""
    def yes(v: bool | None) -> str:
        return "n/a" if v is None else "agree" if v else "DIFFER"

    header = ("pair", "steps", "max rel loss diff", "final weights", "validation", "verdict")
    body = [(r.pair, str(r.steps), "n/a" if r.max_rel is None else f"{r.max_rel:.1e}", yes(r.weights),
             yes(r.validation), "ok" if r.ok else "DIFFERS") for r in rows]
    return "\n".join(text_table([header, *body], rule=True))


def verdict(rows: Sequence[Row], same_data: Sequence[RunKey] = (), not_compared: int = 0) -> tuple[int, str]:
    """(exit status, the line that says it): EXIT_DIFFERS on the first native vs Horovod pair that differs (same
    math: no); else EXIT_UNSHARDED when runs in ``same_data`` gave every rank the same first batches (each worker
    trained on the same data: not a data-parallel job, whatever the pairs say); else EXIT_SCALES_INEXACTLY on the
    first 1 worker x 2b vs 2 workers x b pair that differs; else EXIT_MODES_DIFFER on the first fit vs ctl pair that
    differs; else 0, saying how many pairs were ``not_compared``."""
    first = {k: next((p for r in rows if r.kind == k and (p := r.first_problem())), None)
             for k in (BACKENDS, SCALING, MODES_KIND)}
    if first[BACKENDS]:
        return EXIT_DIFFERS, f"DIFFERS: {first[BACKENDS]} (tolerance {RTOL:g})"
    if same_data:
        return EXIT_UNSHARDED, (f"NOT CLEAN (exit {EXIT_UNSHARDED}): every rank got the same first batches in "
                                f"{', '.join(k.text() for k in same_data)}: the input function does not shard by "
                                "input_context.input_pipeline_id, so every worker trained on the same data (the "
                                f"{len(rows)} pairs agree, but not as a data-parallel job)")
    agree = "the backends agree (same math)" if any(r.kind == BACKENDS for r in rows) else \
        "no backend pair compared"
    if first[SCALING]:
        also = f"; and {first[MODES_KIND]}" if first[MODES_KIND] else ""
        return EXIT_SCALES_INEXACTLY, (f"SCALES INEXACTLY (exit {EXIT_SCALES_INEXACTLY}): {agree}, but "
                                       f"{first[SCALING]}{also} (tolerance {RTOL:g})")
    if first[MODES_KIND]:
        return EXIT_MODES_DIFFER, (f"FIT DIFFERS FROM CTL (exit {EXIT_MODES_DIFFER}): {agree} and the job scales "
                                   f"exactly, but {first[MODES_KIND]} (tolerance {RTOL:g})")
    left = f"; {not_compared} not compared (listed above)" if not_compared else ""
    agree = f"all {len(rows)} pairs agree" if len(rows) != 1 else "the 1 pair agrees"
    return 0, f"{agree} to {RTOL:g}{left}"


# -- the answers: one per question, with what may cause a difference ----------------------------------------------
# Layers and ops that draw random numbers per call, so per replica: each replica draws for its own b examples where
# 1 worker draws for 2b at once (tf_keras' and Keras 3's names; tf.nn.dropout as "dropout")
RANDOM_TERMS = frozenset({"Dropout", "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D", "GaussianDropout",
                          "AlphaDropout", "GaussianNoise", "RandomFlip", "RandomRotation", "RandomZoom", "RandomCrop",
                          "RandomTranslation", "RandomContrast", "RandomBrightness", "RandomHeight", "RandomWidth",
                          "StochasticDepth", "dropout"})
RANDOM_MODULES = ("tf.random", "tensorflow.random", "keras.random")  # tf.random.uniform(...) and the like
# Layers whose training-mode output depends on the batch (its mean and variance): per replica without a sync
BATCH_TERMS = frozenset({"BatchNormalization", "batch_normalization"})
# Where a process learns its rank (the launchers' variables, Horovod's calls): a model that reads it computes
# differently on each replica
RANK_TERMS = frozenset({"HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "TF_CONFIG", "rank",
                        "local_rank", "task_id"})


@dataclass(frozen=True)
class ModelTerms:
    """What the model's source uses that makes 1 worker x 2b differ from 2 workers x b, read without importing
    it: ``where`` names what was read ("" when nothing could be), ``random`` the per-call random layers and ops,
    ``batch`` the per-batch statistics."""

    where: str = ""
    random: tuple[str, ...] = ()
    batch: tuple[str, ...] = ()
    rank: tuple[str, ...] = ()  # what tells it the rank: a launcher's variable named, hvd.rank() called


def _term(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name) and node.id in RANDOM_TERMS | BATCH_TERMS:
        return node.id
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in RANK_TERMS \
            and node.value.isupper():
        return node.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in RANK_TERMS:
        return f"{ast.unparse(node.func)}()"  # hvd.rank(), input_context... task_id is an attribute: below
    if isinstance(node, ast.Attribute):
        if node.attr in RANDOM_TERMS | BATCH_TERMS:
            return node.attr
        if node.attr == "task_id":
            return ast.unparse(node)
        if ast.unparse(node.value) in RANDOM_MODULES:
            return ast.unparse(node)
    return None


def used_terms(tree: ast.Module, start: str) -> set[str]:
    """The RANDOM_TERMS, BATCH_TERMS and RANDOM_MODULES calls in the module-level function or class ``start`` and
    in those of the module it names, transitively (the whole module when it defines no ``start``)."""
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    if start not in defs:
        return {t for n in ast.walk(tree) if (t := _term(n))}
    found: set[str] = set()
    todo, seen = [start], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for node in ast.walk(defs[name]):
            if isinstance(node, ast.Name) and node.id in defs:
                todo.append(node.id)
            if term := _term(node):
                found.add(term)
    return found


def model_source(job: Any) -> tuple[Path, str, str] | None:
    """(the file, the function in it, how to name it) that builds the job's model: the user's module (found as
    code_digest finds it, not imported), twinbench's builtin, or the Keras application's module; None if none."""
    if usercode.is_ref(job.model):
        root, files = usercode._locate("model", job.model)  # the module's file, as the digest finds it
        return files[-1], job.model.split(":")[1], f"{files[-1].relative_to(root).as_posix()}'s " \
                                                   f"{job.model.split(':')[1]}"
    if job.model in MODELS:
        build = MODELS[job.model].build
        return Path(build.__code__.co_filename), build.__name__, f"twinbench's {job.model}"
    package = "keras" if job.keras == 3 else "tf_keras"
    spec = importlib.util.find_spec(package)  # a top-level package: found, not imported
    if spec is None or not spec.origin:
        return None
    for path in sorted((Path(spec.origin).parent / "src" / "applications").glob("*.py")):
        if f"def {job.model}(" in path.read_text(encoding="utf-8"):
            return path, job.model, f"{package}'s {job.model}"
    return None


def model_terms(job: Any) -> ModelTerms:
    """The job's ModelTerms; ModelTerms() when its source cannot be found or read."""
    try:
        found = model_source(job)
        if found is None:
            return ModelTerms()
        path, name, where = found
        terms = used_terms(ast.parse(path.read_text(encoding="utf-8")), name)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError, usercode.UserCodeError):
        return ModelTerms()
    rank = {t for t in terms if t in RANK_TERMS or t.endswith(("rank()", ".task_id"))}
    return ModelTerms(where, tuple(sorted(terms - BATCH_TERMS - rank)), tuple(sorted(terms & BATCH_TERMS)),
                      tuple(sorted(rank)))


def _threads(records: Mapping[RunKey, Mapping[str, Any]], key: RunKey) -> Any:
    info = records.get(key, {}).get("backend_info")
    return info.get("threads_per_process") if isinstance(info, Mapping) else None


def scaling_causes(bad: Sequence[Row], records: Mapping[RunKey, Mapping[str, Any]],
                   terms: ModelTerms) -> tuple[tuple[str, ...], bool]:
    """(what may make the ``bad`` 1 worker x 2b vs 2 workers x b pairs differ, whether the evidence points at it):
    a difference from step 1 is the forward pass itself (per-replica random draws or batch statistics, when the
    model's source shows them: likely); one that starts later and small is float32 sums added in another order
    (likely when it starts below ROUNDING and stays below DRIFT), with the threads per rank when they differ."""
    found = []
    if terms.random:
        found.append(f"per-replica random draws: {terms.where} uses {', '.join(terms.random)}: each replica draws "
                     "its own random numbers (a Dropout mask) for its b examples where 1 worker draws them for 2b at "
                     "once: the same distribution, other numbers, from step 1")
    if terms.batch:
        found.append(f"per-replica batch statistics: {terms.where} uses {', '.join(terms.batch)}: each replica "
                     "normalises its b examples by their own mean and variance where 1 worker normalises 2b together")
    if terms.rank:
        found.append(f"the model reads the rank: {terms.where} uses {', '.join(terms.rank)}: each replica computes "
                     "something else, where 1 worker is rank 0 alone")
    read = f"{terms.where}'s source shows none" if terms.where else "the model's source could not be read"
    unseen = f"a random draw or batch statistic per replica ({read}), or a computation that depends on the rank"
    if any(r.first_step == 1 for r in bad):
        return (tuple(found), True) if found else ((unseen,), False)
    causes = ["reduction order: 2 workers sum their gradients over 2 replicas where 1 worker sums one batch of 2b, "
              "and float32 sums in another order round differently (about 1e-7); the difference starts small and "
              "grows slowly as the weights drift"]
    pairs = {(t1, t2) for r in bad if (t1 := _threads(records, r.a)) != (t2 := _threads(records, r.b))}
    causes += [f"threads per rank differ ({t1} at 1 worker, {t2} at 2 workers): TensorFlow splits a reduction over "
               "another number of threads, which rounds differently (docs/parity.md, layouts)" for t1, t2 in pairs]
    # the losses' first difference (or, when only the final weights or validation differ, the losses' largest)
    tiny = all(r.max_rel is not None and (r.first_rel if r.first_rel is not None else r.max_rel) < ROUNDING
               and r.max_rel < DRIFT for r in bad)
    return tuple(causes if tiny else [*causes, *found, unseen]), tiny


def modes_causes(terms: ModelTerms) -> tuple[tuple[str, ...], bool]:
    """What may make fit and the custom loop differ: random draws traced twice, when the model has some."""
    if not terms.random:
        return (), False
    return (f"random draws in another order: {terms.where} uses {', '.join(terms.random)}, and Keras fit and the "
            "custom loop trace the model's random ops in functions of their own",), False


def _scope(kind: str, rows: Sequence[Row]) -> str:
    backends = list(dict.fromkeys(b for r in rows for b in (r.a.backend, r.b.backend)))
    modes = " and ".join(dict.fromkeys(m for r in rows for m in (r.a.mode, r.b.mode)))
    ws = sorted({w for r in rows for w in (r.a.workers, r.b.workers)})
    workers = f"{' and '.join(map(str, ws))} worker{'s' if ws != [1] else ''}"
    if kind == BACKENDS:
        return f"{' = '.join(backends)} in {modes} at {workers}"
    return f"{', '.join(backends)} in {modes}" if kind == SCALING else f"{', '.join(backends)} at {workers}"


def _problems(bad: Sequence[Row]) -> str:
    """The first problem of each differing pair; pairs of one mode whose numbers are the same on every backend
    said once (the job's own math at two sizes or in two modes, not a backend's)."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in bad:
        groups.setdefault((r.a.mode if r.kind == SCALING else str(r.a.workers),
                           (r.first_problem() or "")[len(r.pair):]), []).append(r)
    out = []
    for rows in groups.values():
        others = [r.a.backend for r in rows[1:]]
        same = f" (the same numbers on {', '.join(others)}: the job's own math, not a backend's)" if others else ""
        out.append(f"{rows[0].first_problem()}{same}")
    return "; ".join(out)


def answers(rows: Sequence[Row], records: Mapping[RunKey, Mapping[str, Any]], why_not: Mapping[str, str],
            terms: ModelTerms | None = None) -> dict[str, Answer]:
    """The answer to each question (common.report.migrate.QUESTIONS) from its pairs: yes (how many agree, bit for
    bit or within RTOL), no (what differs first, and its causes), or not compared (``why_not[kind]``)."""
    terms = terms or ModelTerms()
    out = {}
    for kind, question in QUESTION_OF.items():
        mine = [r for r in rows if r.kind == kind]
        bad = [r for r in mine if not r.ok]
        if not mine:
            out[question] = Answer(NOT_COMPARED, why_not.get(kind, "no such pair ran"))
        elif not bad:
            exact = ", bit for bit" if all(r.exact for r in mine) else ""
            n = f"{len(mine)} pairs agree" if len(mine) != 1 else "the 1 pair agrees"
            out[question] = Answer(YES, f"{n} to {RTOL:g}{exact} ({_scope(kind, mine)})")
        else:
            causes = scaling_causes(bad, records, terms) if kind == SCALING else \
                modes_causes(terms) if kind == MODES_KIND else ((), False)
            out[question] = Answer(NO, _problems(bad), *causes)
    return out


def why_not_compared(records: Mapping[RunKey, Mapping[str, Any]], across_sizes: bool = True,
                     note: str = "") -> dict[str, str]:
    """Why a question has no pair, by Row.kind: one backend or one mode checked, or the reason ``skip_reason``
    leaves 1 worker vs 2 workers out."""
    backends = list(dict.fromkeys(k.backend for k in records))
    modes = list(dict.fromkeys(k.mode for k in records))
    out = {}
    if len(backends) == 1:
        out[BACKENDS] = f"one backend checked ({backends[0]}: --backends)"
    if len(modes) == 1:
        out[MODES_KIND] = f"one mode checked ({modes[0]}: --modes)"
    reasons = [why for _, ka, kb in pairs(list(records))
               if ka.workers != kb.workers and (why := skip_reason(ka, kb, records, across_sizes, note))]
    if reasons:
        out[SCALING] = reasons[0]
    return out


# -- the runs -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    job: str  # absolute path of the job file
    sets: tuple[str, ...]  # the user's --set overrides, then steps
    batch: int  # the job's per-replica batch b (2 workers); 1 worker runs 2b
    keys: tuple[RunKey, ...]
    # lr_scaling = "linear" gives 2 workers twice the job's LR: the 1-worker runs are told to scale it for 2
    # replicas (LR_REPLICAS_FLAG; None: as is)
    one_worker_lr: float | None = None
    # why 1 worker x 2b cannot equal 2 workers x b for this job (the pair is not compared), or ""
    world_size_note: str = ""
    # --results as an absolute path (None: a temporary directory), and the directory the runs start in: the
    # user's working directory when the check started, so a relative path means what it means to them
    results: Path | None = None
    cwd: str = "."
    terms: ModelTerms = ModelTerms()  # what the model's source shows that 1 worker vs 2 workers may reveal


def _csv(text: str, allowed: Sequence[str], what: str) -> list[str]:
    items = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in items if s not in allowed]
    if bad or not items:
        fail(PROG, f"--{what} {text!r}: use a comma-separated list of {', '.join(allowed)}")
    return list(dict.fromkeys(items))


def parser() -> argparse.ArgumentParser:
    from common.cli import OneLineParser

    p = OneLineParser(prog=PROG, description="Run a job on every backend at 1 and 2 local workers (CPU), fit and "
                                             "custom loop, and check that they compute the same math.")
    p.add_argument("--job", required=True, help="the job TOML file to check")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a job key in every run (repeatable)")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help=f"steps per run (default {DEFAULT_STEPS})")
    p.add_argument("--modes", default=None, help="fit,ctl (default both; ctl alone for a keras = 3 job)")
    p.add_argument("--backends", default=",".join(registry.names()),
                   help=f"which backends (default all: {','.join(registry.names())})")
    p.add_argument("--results", default=None, metavar="DIR",
                   help="keep the runs' results in DIR (default: a temporary directory, removed at the end)")
    p.add_argument("--timeout", type=float, default=RUN_TIMEOUT, help=f"seconds per run (default {RUN_TIMEOUT:g})")
    return p


def make_plan(args: argparse.Namespace) -> Plan:
    """Everything checked before any run: bad input is one line and exit 2 (as common.cli.prepare)."""
    from common.workload import data as data_mod

    if args.steps < 1:
        fail(PROG, f"--steps must be >= 1, got {args.steps}")
    if not args.timeout > 0:
        fail(PROG, f"--timeout must be > 0 seconds, got {args.timeout}")
    kinds = _csv(args.backends, registry.names(), "backends")
    sets = (*args.sets, f"steps={args.steps}")
    try:
        job = load_job(args.job, sets)
        argcheck.refuse(job, Path.cwd())  # every run starts in this working directory (run_one)
        # Keras 3 runs the custom loop only (common.workload.job): its check compares what can run
        modes = _csv(args.modes or ("ctl" if job.keras == 3 else ",".join(MODES)), MODES, "modes")
        if job.keras == 3 and "fit" in modes:
            raise JobError(f"--modes {args.modes}: a keras = 3 job runs the custom loop only: use --modes ctl")
        if not data_mod.streams(job):  # an input function is called only in the ranks
            n, _, _ = data_mod.dataset_info(job)
            job.resolve_steps(n, 2)  # the 2-worker runs' global batch must fit in the data
        if job.steps_per_execution > 1 and "ctl" in modes:
            raise JobError(f"steps_per_execution = {job.steps_per_execution} applies to fit only: check with "
                           "--modes fit, or set steps_per_execution = 1")
        if args.results:
            from common.core import results as res

            res.check_results_dir(args.results)
    except (JobError, data_mod.DataError, usercode.UserCodeError, OSError) as e:  # the user's data refused: one line
        fail(PROG, str(e))
    keys = tuple(RunKey(k, m, w) for m in modes for w in (1, 2) for k in kinds)
    # 1 worker x 2b trains as 2 workers would: the LR scaled (lr_scaling = "linear") and Horovod's warm-up rule
    # (common/training/objective.py: from lr / replicas) both follow --lr-replicas 2, so that pair is compared too
    as_two = job.lr_scaling == "linear" or job.warmup_epochs > 0
    return Plan(str(Path(args.job).resolve()), sets, job.per_replica_batch_size, keys,
                job.scaled_learning_rate(2) if as_two else None, "",
                Path(args.results).expanduser().absolute() if args.results else None, str(Path.cwd()),
                model_terms(job))


def run_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)  # the local launchers make their own
    env["TF_USE_LEGACY_KERAS"] = "1"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def run_one(plan: Plan, key: RunKey, out: Path, timeout: float) -> tuple[dict[str, Any] | None, str]:
    """Run one configuration into ``out``; (its record, "") or (None, why it failed with the stderr's tail)."""
    batch = plan.batch * 2 if key.workers == 1 else plan.batch
    overrides = [*plan.sets, f"mode={key.mode}", f"per_replica_batch_size={batch}"]
    sets = [a for s in overrides for a in ("--set", s)]
    # lr_scaling = "linear": 1 worker scales the recipe's LR (the job file's or a compiled model's) for the 2
    # replicas the other run has, so both train at the same LR; not a --set, which would change the job's hash
    lr = [LR_REPLICAS_FLAG, "2"] if key.workers == 1 and plan.one_worker_lr is not None else []
    args = ["--job", plan.job, "--results", str(out), "--quiet", *lr, *sets]
    box = container.parse()  # checked by main before any run (bad input: exit 2)
    cmd = registry.load(key.backend).local_command(key.workers, args, python=box.python if box else sys.executable)
    cmd = container.wrap(cmd, box) if box else cmd
    before = set(out.glob("*.json")) if out.is_dir() else set()
    try:
        proc = subprocess.run(cmd, cwd=plan.cwd, env=run_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"{key.text()} did not finish in {timeout:g} s: {' '.join(cmd)}"
    new = sorted(set(out.glob("*.json")) - before, key=lambda p: p.stat().st_mtime)
    if proc.returncode != 0 or not new:
        tail = "\n".join((proc.stderr or proc.stdout).splitlines()[-TAIL_LINES:])
        return None, f"{key.text()} failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}"
    return json.loads(new[-1].read_text()), ""


def run_all(plan: Plan, root: Path, timeout: float) -> dict[RunKey, dict[str, Any]]:
    """Every run, one at a time; exits 1 at the first that fails."""
    records = {}
    for i, key in enumerate(plan.keys, 1):
        t = time.monotonic()
        print(f"[check] run {i}/{len(plan.keys)}: {key.text()} ...", end=" ", flush=True)
        rec, why = run_one(plan, key, root / f"{key.backend}-{key.mode}-n{key.workers}", timeout)
        if rec is None:
            print("FAILED", flush=True)
            print(f"{PROG}: {why}", file=sys.stderr)
            raise SystemExit(1)
        print(f"{time.monotonic() - t:.1f} s", flush=True)
        records[key] = rec
    return records


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    plan = make_plan(args)
    try:
        box = container.parse()  # the site's container (TWINBENCH_CONTAINER): every run of the check inside its image
        env, said = launches.resolve(sorted({k.backend for k in plan.keys}), box.python if box else sys.executable)
    except (container.ContainerError, UsageError) as e:
        fail(PROG, str(e))
    print("\n".join(f"[check] {line}" for line in said), flush=True)
    root = plan.results or Path(tempfile.mkdtemp(prefix="twinbench-check-"))
    try:
        with launches.exported(env):
            records = run_all(plan, root, args.timeout)
    finally:
        if plan.results is None:
            shutil.rmtree(root, ignore_errors=True)
    across = not plan.world_size_note
    rows = compare(records, across_sizes=across)
    left_out = skipped(records, across_sizes=across, note=plan.world_size_note)
    print("\n".join([*same_batch_warnings(records), *left_out, format_table(rows)]))
    status, line = verdict(rows, unsharded(records), len(left_out))
    said_q = answers(rows, records, why_not_compared(records, across, plan.world_size_note), plan.terms)
    if plan.results:
        write_summary(plan, root, status, line, said_q)
        print(f"[check] runs kept in {root}, the verdict in {root / CHECK_FILE}")
    # the last lines: one per question (the report's "leave Horovod" rows), then the verdict (the exit status's)
    print("\n".join(f"[check] {QUESTIONS[q]}: {a.words()}" for q, a in said_q.items()), flush=True)
    print(line, file=sys.stderr if status else sys.stdout)
    return status


def write_summary(plan: Plan, root: Path, status: int, line: str,
                  said: Mapping[str, Answer] | None = None) -> Path:
    """``ROOT/check.json``: the job as the user gave it (their --set, not the check's own steps), its hash, the
    verdict and the answer to each question, which the report's "leave Horovod" section reads
    (common/report/migrate.py): a check kept in a subdirectory of a results directory is found there, while its
    runs, a level deeper, are not taken as benchmarks."""
    job = load_job(plan.job, list(plan.sets[:-1]))
    summary = check_summary(public(job.to_dict()), job.job_hash, status, line, RTOL, now_iso(), said)
    return write_atomic(root / CHECK_FILE, json.dumps(summary, indent=1))


if __name__ == "__main__":
    sys.exit(main())
