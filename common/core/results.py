"""The records twinbench writes and the report reads, one schema each, and how a run's figures are measured.

- ``RunRecord`` (``SCHEMA``): one training run's results JSON, the one definition of what the chief writes and what
  the report reads: its fields are the JSON's keys, in the order written. ``BreakdownRecord``: a ``--diagnose
  breakdown`` run. ``AllreduceRecord``: a ``--bench allreduce`` run. What they share: the required fields (derived
  from the dataclass, never listed), ``RecordError``, and one ``upgrade_*`` per record type.
- Step-time statistics, the throughput rule, file names and atomic writes. No TensorFlow here.

Older files are upgraded, not refused, wherever the older schema says the same facts in another way: results
directories hold months of runs, and a report that refused them would send the user to an older checkout to read
files it can read itself. The upgrade is keyed on the file's ``schema`` (a chain of steps, one per version, each
from the facts that version wrote), so a reader of a record type sees only its current schema and never asks
which fields a file lacks. A schema with no step to the current one (the wall clock changed what schema 1's
throughput meant: nothing turns it into a wall-clock figure) is refused with a one-line RecordError naming the
versions that are read.

Throughput is measured, never extrapolated: global batch x timed steps / the slowest rank's timed wall time.
Each rank's timed wall time is its own clock from the host sync that ends the untimed warm-up
(``timing_warmup_steps``) to the sync after its last step: everything the rank does in between counts (steps,
input waits, the harness' work between steps, preemption agreements). Step times are step end to step end: with
``sync_every_steps`` = 1 one value per step; with K > 1 the host sees the device only every K steps, so each value
is the mean step time of a window of (up to) K steps, weighted by its steps in the percentiles.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import secrets
import socket
import sys
import tempfile
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.core.privacy import public

# One per record type; bump it when a field changes meaning or becomes always written, with an upgrade step.
RUN_SCHEMA = 3  # RunRecord (SCHEMA); 2: wall-clock throughput; 3: capabilities, asynchronous, evaluations
ALLREDUCE_SCHEMA = 3  # AllreduceRecord; 3: collective and capabilities always written
BREAKDOWN_SCHEMA = 2  # BreakdownRecord: written first under schema 2
SCHEMA = RUN_SCHEMA  # RunRecord's; a bump comes with a step in upgrade_run from the schema before


class RecordError(ValueError):
    """A JSON object that is not a readable record; the message is one line naming the problem."""


def always_written(default: Any) -> Any:
    """A field with a default for writers that every file must nevertheless carry (readers require it)."""
    return field(default=default, metadata={"required": True})


def required_fields(record_class: type[Any]) -> dict[str, tuple[type, ...]]:
    """Field -> accepted JSON types, for the fields every file of ``record_class`` must carry (in field order)."""
    hints = typing.get_type_hints(record_class)
    out: dict[str, tuple[type, ...]] = {}
    for f in dataclasses.fields(record_class):
        no_default = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if no_default or f.metadata.get("required"):
            t = typing.get_origin(hints[f.name]) or hints[f.name]
            out[f.name] = (int, float) if t is float else (t,)  # a JSON number may be written without a point
    return out


def check_required(data: Any, required: Mapping[str, tuple[type, ...]]) -> Mapping[str, Any]:
    """``data`` as a mapping holding every required field with a value of its JSON type; RecordError otherwise."""
    if not isinstance(data, Mapping):
        raise RecordError(f"top level is a JSON {type(data).__name__}, not an object")
    for name, types in required.items():
        if name not in data:
            raise RecordError(f"missing field {name!r}")
        value = data[name]
        if isinstance(value, bool) or not isinstance(value, types):
            raise RecordError(f"field {name!r} has the wrong type ({type(value).__name__})")
    return data


Step = Callable[[dict[str, Any]], dict[str, Any]]  # one schema version to the next


def upgrade(data: Mapping[str, Any], current: int, steps: Mapping[int, Step], what: str) -> dict[str, Any]:
    """``data`` (a copy) brought to schema ``current`` by ``steps`` (schema -> the step from it to the next one);
    RecordError naming the schemas this reader reads when no chain of steps reaches ``current``."""
    out = dict(data)
    while out.get("schema") != current:
        step = steps.get(out.get("schema"))
        if step is None:
            read = " and ".join(map(str, sorted({*steps, current})))
            raise RecordError(f"schema {out.get('schema')!r} is not supported (this report reads {what} of "
                              f"schema {read})")
        out = step(out)
    return out


# An evaluation's keys that say when and how long, not what it measured (the rest: loss and the job's metrics).
EVALUATION_META = ("epoch", "step", "seconds", "wall_time")


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """One training run's results JSON (schema ``SCHEMA``), written by the chief, read by the report.

    Fields without a default (plus ``schema`` and ``kind``) are required: a file lacking one, or holding a value
    of the wrong JSON type, is not a usable result (``from_dict`` raises RecordError). An older file is read
    through ``upgrade_run`` (keyed on its schema), so a record always says what the current schema says.
    """

    schema: int = always_written(SCHEMA)
    kind: str = always_written("train")
    backend: str
    backend_info: dict[str, Any] | None = None  # Backend.describe(): free-form provenance, displayed, never read
    world_size: int  # replicas
    num_workers: int  # processes
    mode: str | None = None  # fit | ctl
    job_hash: str
    job: dict[str, Any]  # Job.to_dict()
    global_batch_size: int | None = None
    learning_rate: float | None = None  # after scaling: the recipe's learning_rate
    steps: int | None = None
    steps_per_epoch: int | None = None
    step_losses: list[float] | None = None  # mean over ranks, every step (including those before a resume)
    per_rank_step_losses: list[list[float]] | None = None
    images_per_sec: float  # throughput_stats(): measured over the timed window
    timed_wall_time: float | None = None  # seconds, the slowest rank's
    step_time: dict[str, Any]  # median, p95, mean (s), timed_steps, warmup_steps, window_steps, windows
    per_rank_timed_wall: list[float] | None = None  # seconds, each rank's own clock over the timed window
    per_rank_sync_marks: list[list[list[float]]] | None = None  # per rank: [steps done in the run, s] at each sync
    time_to_first_step: float  # seconds from process start, the slowest rank's
    resumed_from_step: int = 0  # > 0: times and throughput cover only the steps after the resume
    # versions(): python, tensorflow, tf_keras, horovod(_patch), numpy; the stack: container, container_image,
    # horovod_build (twinbench or found); keras when Keras 3 trained the model; twinbench (its commit) and modules
    # (the loaded environment modules, where a module system ran)
    versions: dict[str, str] | None = None
    hosts: list[str] | None = None  # one per rank
    devices: list[str] | None = None  # one per rank
    command: list[str] | None = None
    started_at: str | None = None  # ISO 8601, UTC
    finished_at: str | None = None
    run_id: str | None = None  # new_run_id(); part of the file name
    trainable_params: int | None = None
    gradient_bytes: int | None = None  # bytes allreduced per step: the scaling model's S
    initial_weights_digest: str | None = None
    weights_digest: str | None = None
    trainable_weights_digest: str | None = None  # without BatchNorm statistics
    weights_consistent: bool | None = None  # identical trainable weights on every rank
    all_weights_consistent: bool | None = None  # non-trainable state too
    asynchronous: bool = False  # parameter-server training: never in a parity claim, throughput and final loss only
    input: dict[str, Any] | None = None  # did the input pipeline keep up (time waiting for the next batch)
    network: dict[str, Any] | None = None  # the data interface and each rank's address the collectives used
    topology: dict[str, Any] | None = None  # hosts, local size per rank, cross size (the launcher's placement)
    collective: dict[str, Any] | None = None  # Capabilities.collective: requested, used, reason
    tuning: dict[str, Any] | None = None  # base.tuning_record(): knobs in effect, defaults, variant label, env
    capabilities: dict[str, Any] | None = None  # Capabilities.record(): variant, compression, controller... (typed)
    machine: dict[str, Any] | None = None  # common.cluster.machine: CPU, GPUs, libraries, Slurm, network, memory
    artifacts: dict[str, Any] | None = None  # TensorBoard / profiler / timeline paths, relative to the results dir
    # [sum, sum of squares] per trainable variable (float64, model order): final weights compared with a tolerance
    trainable_weights_fingerprint: list[list[float]] | None = None
    # validation (common.training.evaluate): per evaluation epoch, step, loss, each job metric, seconds (its own
    # duration, excluded from the clock marks and throughput) and wall_time (s since the first step, evaluations in)
    evaluations: list[dict[str, Any]] = field(default_factory=list)  # keys: EVALUATION_META, "loss", the metrics
    time_to_target_s: float | None = None  # wall_time of the first evaluation reaching the job's target; None: not
    # GPU energy over the timed steps (common.cluster.energy.combine): gpu_joules summed over the ranks' GPUs, scope
    # "GPU only", per rank; None without a GPU or a counter (pre-Volta): absent, never zero
    energy: dict[str, Any] | None = None
    # the Slurm job and job step the ranks ran in and the step's nodes (Slurm's compressed list, e.g. "node[1-2]");
    # None outside Slurm: two runs with the same nodelist ran on the same nodes
    slurm_job: str | None = None
    slurm_step: str | None = None
    nodelist: str | None = None
    # NCCL's network per rank, in rank order (common.cluster.nccl.parse: transport, interfaces, plugin, inferred);
    # None without a finding on any rank (CPU runs, a user's own NCCL_DEBUG without a file)
    nccl_transport: list[dict[str, Any] | None] | None = None
    # a model its function returned compiled (common.training.compiled): the optimizer (class, compiled class,
    # config), base learning_rate, schedule, loss and metrics trained in place of the job's keys; None: the job's
    # keys trained (every file before this field: their writers never honoured a compiled model)
    compiled: dict[str, Any] | None = None
    # what trained (common.training.context.Recipe.record: source "job" or "compiled", optimizer, optimizer_config,
    # compiled_class, base_learning_rate, lr_scaling, lr_replicas, learning_rate, warmup_epochs, lr_schedule,
    # lr_schedule_args, schedule, loss, loss_per_output, loss_weights, metrics, keras); ``job`` and ``job_hash`` stay
    # the job file's identity. None: a file written before this field (its job keys, or ``compiled``, trained)
    recipe: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object (a deep copy), keys in field order."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> RunRecord:
        """Read a parsed results JSON of any schema ``upgrade_run`` reads: required fields checked
        (present, right JSON type), optional ones default, unknown keys (fields of a newer writer) ignored. Raises
        RecordError naming the first problem."""
        d = upgrade_run(check_required(data, REQUIRED))
        return cls(**{k: v for k, v in d.items() if k in _FIELD_NAMES})

    # Typed views of the blocks the report reads (the blocks stay JSON objects: the writers own their keys).
    @property
    def strategy(self) -> str | None:
        """The run's non-default way of training (``capabilities.variant``, e.g. native's --strategy mirrored),
        None for its backend's default."""
        return _text(self.capabilities, "variant")

    @property
    def compression(self) -> str | None:
        """``capabilities.compression`` ("none", "fp16"), None when not recorded."""
        return _text(self.capabilities, "compression")

    @property
    def tuning_variant(self) -> str | None:
        """The tuning variant (``tuning.variant``, e.g. "fusion 32 MiB"), None at the default knobs."""
        return _text(self.tuning, "variant")

    @property
    def collective_used(self) -> str | None:
        """The collective that carried the gradients (``collective.used``), None when not recorded."""
        return _text(self.collective, "used")


def _text(block: Mapping[str, Any] | None, key: str) -> str | None:
    """A non-empty string a record's block holds at ``key``, else None."""
    value = block.get(key) if isinstance(block, Mapping) else None
    return value if isinstance(value, str) and value else None


FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(RunRecord))  # the JSON keys, in order
_FIELD_NAMES = frozenset(FIELDS)
REQUIRED: dict[str, tuple[type, ...]] = required_fields(RunRecord)  # what a reader requires (derived, never listed)


# -- RunRecord's upgrade ----------------------------------------------------------------------------------------
# Schema-2 files written before the record had ``capabilities`` said some of its facts only in ``backend_info``.
# backend_info.strategy (a tf.distribute class name, or the flag's name) -> the --strategy flag.
LEGACY_STRATEGY_FLAGS = {
    # MultiWorkerMirroredStrategy's class is CollectiveAllReduceStrategy: what --strategy mwms recorded
    "CollectiveAllReduceStrategy": "mwms", "MultiWorkerMirroredStrategy": "mwms",
    "MirroredStrategy": "mirrored", "OneDeviceStrategy": "one_device",
    "CentralStorageStrategy": "central_storage", "ParameterServerStrategy": "parameter_server",
}
LEGACY_DEFAULT_STRATEGY = "mwms"  # native's default: no variant


def _info(d: Mapping[str, Any]) -> Mapping[str, Any]:
    info = d.get("backend_info")
    return info if isinstance(info, Mapping) else {}


def _run_from_2(d: dict[str, Any]) -> dict[str, Any]:
    """Schema 2 -> 3. Schema-2 writers added fields as they went, so a file may lack what schema 3 always writes:
    ``capabilities`` (then the facts its ``backend_info`` said: strategy, compression, controller, asynchronous),
    ``asynchronous`` (then ``capabilities.asynchronous``) and ``evaluations`` (none: written before validation)."""
    if not isinstance(d.get("capabilities"), Mapping):
        info = _info(d)
        raw = info.get("strategy")
        variant = LEGACY_STRATEGY_FLAGS.get(raw, raw) if isinstance(raw, str) and raw else None
        d["capabilities"] = {
            "variant": None if variant in (LEGACY_DEFAULT_STRATEGY, d.get("backend")) else variant,
            "compression": info.get("compression") or "none", "controller": info.get("controller"),
            "asynchronous": info.get("asynchronous") is True}
    if not isinstance(d.get("asynchronous"), bool):
        d["asynchronous"] = d["capabilities"].get("asynchronous") is True
    if not isinstance(d.get("evaluations"), list):
        d["evaluations"] = []
    return {**d, "schema": 3}


def upgrade_run(data: Mapping[str, Any]) -> dict[str, Any]:
    """A parsed results JSON of any schema this reader reads, as schema RUN_SCHEMA says it (a copy)."""
    return upgrade(data, RUN_SCHEMA, {2: _run_from_2}, "results files")


# -- the --diagnose breakdown record (common.diagnostics.breakdown) ---------------------------------------------
BREAKDOWN_PHASES = ("input", "compute", "comm", "apply", "rest")  # in step order; they sum to the step time


@dataclass(frozen=True, kw_only=True)
class BreakdownRecord:
    """One ``--diagnose breakdown`` run: the custom loop's step split into phases, each timed on the device with
    the phases serialized (no overlap). A diagnostic, never a benchmark figure: its ``kind`` keeps it out of the
    training runs the report compares. Times in seconds per step; ``phases`` are means over the timed steps and
    over ranks, and sum to ``step_time`` (device clock, step end to step end)."""

    schema: int = always_written(BREAKDOWN_SCHEMA)
    kind: str = always_written("breakdown")
    backend: str
    backend_info: dict[str, Any] | None = None
    world_size: int  # replicas
    num_workers: int
    mode: str = "ctl"  # the custom loop's math, split into phases
    job_hash: str
    job: dict[str, Any]
    global_batch_size: int | None = None
    steps: int
    timed_steps: int  # after warmup_steps untimed ones
    warmup_steps: int
    phases: dict[str, float]  # BREAKDOWN_PHASES -> mean s per step (mean over ranks); comm includes waiting
    phases_median: dict[str, float] | None = None  # median over steps of the per-step mean over ranks
    wait: float | None = None  # mean s per step of comm spent waiting for the slowest rank (mean over ranks)
    step_time: float  # mean s per step on the device clock: sum of ``phases``
    host_step_time: float  # the slowest rank's host wall clock over the timed steps / timed steps
    slowest_rank: int | None = None  # the rank the others wait for (least time in comm)
    per_rank: list[dict[str, Any]] | None = None  # rank, host, mean and median per phase, wait
    per_rank_step_phases: list[list[list[float]]] | None = None  # per rank, per timed step: BREAKDOWN_PHASES (s)
    step_losses: list[float] | None = None  # mean over ranks, every step: the same math as a ctl training run
    trainable_params: int | None = None
    gradient_bytes: int | None = None  # bytes one replica allreduces per step
    versions: dict[str, str] | None = None
    hosts: list[str] | None = None
    command: list[str] | None = None
    started_at: str | None = None
    finished_at: str | None = None
    run_id: str | None = None
    machine: dict[str, Any] | None = None  # common.cluster.machine: CPU, GPUs, libraries, Slurm, network, memory
    # what trained (common.training.context.Recipe.record: source "job" or "compiled", optimizer, optimizer_config,
    # compiled_class, base_learning_rate, lr_scaling, lr_replicas, learning_rate, warmup_epochs, lr_schedule,
    # lr_schedule_args, schedule, loss, loss_per_output, loss_weights, metrics, keras); ``job`` and ``job_hash`` stay
    # the job file's identity. None: a file written before this field (its job keys, or ``compiled``, trained)
    recipe: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> BreakdownRecord:
        """Read a parsed breakdown JSON; RecordError naming the first problem (fields, types, schema, phases)."""
        if not isinstance(data, Mapping):
            raise RecordError(f"top level is a JSON {type(data).__name__}, not an object")
        for name, types in _BREAKDOWN_REQUIRED.items():
            value = data.get(name)
            if name not in data or isinstance(value, bool) or not isinstance(value, types):
                raise RecordError(f"field {name!r} is missing or has the wrong type")
        data = upgrade_breakdown(data)
        if data["kind"] != "breakdown":
            raise RecordError(f"kind {data['kind']!r} is not a breakdown")
        for p in BREAKDOWN_PHASES:
            v = data["phases"].get(p)
            if isinstance(v, bool) or not isinstance(v, int | float) or not (v >= 0 and v < float("inf")):
                raise RecordError(f"phases.{p} {v!r} is not a non-negative number")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def filename(self) -> str:
        """``breakdown-<backend>-n<world_size>-<job_hash>-<run_id>.json``."""
        return f"breakdown-{self.backend}-n{self.world_size}-{self.job_hash}-{self.run_id}.json"


def upgrade_breakdown(data: Mapping[str, Any]) -> dict[str, Any]:
    """A parsed breakdown JSON as schema BREAKDOWN_SCHEMA says it (a copy): every breakdown file so far is of it."""
    return upgrade(data, BREAKDOWN_SCHEMA, {}, "breakdowns")


_BREAKDOWN_REQUIRED = required_fields(BreakdownRecord)


# -- the --bench allreduce record (common.diagnostics.allreduce) --------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class AllreduceRecord:
    """One ``--bench allreduce`` run: a SUM allreduce of float32 tensors per message size, timed on every rank.
    ``rows``: per size ``bytes``, ``time_median`` and ``time_p95`` (s, the slowest rank's per iteration),
    ``algbw_GBps``, ``busbw_GBps``, ``iters``, ``wrong`` (elements not the expected sum), ``busbw_pct_of_link``."""

    schema: int = always_written(ALLREDUCE_SCHEMA)
    kind: str = always_written("allreduce")
    backend: str
    backend_info: dict[str, Any] | None = None  # Backend.describe(): displayed, never read
    collective: dict[str, Any] | None = None  # Capabilities.collective: requested, used, reason
    capabilities: dict[str, Any] | None = None  # Capabilities.record()
    world_size: int  # ranks
    num_workers: int | None = None
    dtype: str = "float32"
    op: str = "sum"
    warmup_iters: int | None = None
    rows: list[dict[str, Any]]
    bus_factor: float | None = None  # 2(n-1)/n
    versions: dict[str, str] | None = None
    hosts: list[str] | None = None  # one per rank
    command: list[str] | None = None
    finished_at: str | None = None
    run_id: str | None = None
    link: dict[str, Any] | None = None  # common.diagnostics.p2p: the probed point-to-point rate
    machine: dict[str, Any] | None = None  # common.cluster.machine

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> AllreduceRecord:
        """Read a parsed allreduce JSON of any schema ``upgrade_allreduce`` reads; RecordError naming the problem."""
        d = upgrade_allreduce(check_required(data, _ALLREDUCE_REQUIRED))
        if d["kind"] != "allreduce":
            raise RecordError(f"kind {d['kind']!r} is not an allreduce benchmark")
        if not d["backend"]:
            raise RecordError("empty 'backend'")
        return cls(**{k: v for k, v in d.items() if k in _ALLREDUCE_FIELDS})

    def filename(self) -> str:
        """``allreduce-<backend>-n<world_size>-<run_id>.json``."""
        return f"allreduce-{self.backend}-n{self.world_size}-{self.run_id}.json"

    @property
    def collective_used(self) -> str | None:
        """What carried the reduction (``collective.used``), None when not recorded."""
        used = self.collective.get("used") if isinstance(self.collective, Mapping) else None
        return used if isinstance(used, str) and used else None


def _allreduce_from_2(d: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 or 2 -> 3 (the wall clock, schema 2, changed training throughput, not this benchmark's timing): a
    file written before ``collective`` named what carried the reduction in ``backend_info`` (native's
    ``communication``, else Horovod's ``controller``)."""
    c = d.get("collective")
    if not (isinstance(c, Mapping) and isinstance(c.get("used"), str) and c["used"]):
        info = _info(d)
        old = info.get("communication") or info.get("controller")
        d["collective"] = {**(c if isinstance(c, Mapping) else {}), "used": old if isinstance(old, str) else None}
    return {**d, "schema": 3}


def upgrade_allreduce(data: Mapping[str, Any]) -> dict[str, Any]:
    """A parsed allreduce JSON of any schema this reader reads, as schema ALLREDUCE_SCHEMA says it (a copy)."""
    return upgrade(data, ALLREDUCE_SCHEMA, {1: _allreduce_from_2, 2: _allreduce_from_2}, "allreduce benchmarks")


_ALLREDUCE_REQUIRED = required_fields(AllreduceRecord)
_ALLREDUCE_FIELDS = frozenset(f.name for f in dataclasses.fields(AllreduceRecord))


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    if not values:
        return float("nan")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _window_step_times(per_rank_marks: list[list[list[float]]], warm: int) -> list[tuple[int, float]]:
    """(steps, per-step time) of each window after the warm-up: the slowest rank's duration / the window's steps.

    A synchronous step ends when the slowest rank ends, hence the max over ranks; every rank syncs at the same
    steps (the rule is deterministic), which is checked.
    """
    steps = [[int(d) for d, _ in marks] for marks in per_rank_marks]
    if any(s != steps[0] for s in steps):
        raise ValueError("ranks synced at different steps: their clock marks cannot be compared")
    out = []
    for i in range(1, len(steps[0])):
        lo, hi = steps[0][i - 1], steps[0][i]
        if lo >= warm and hi > lo:
            out.append((hi - lo, max(m[i][1] - m[i - 1][1] for m in per_rank_marks) / (hi - lo)))
    return out


def throughput_stats(per_rank_marks: list[list[list[float]]], global_batch: int, warm: int,
                     window_steps: int) -> dict[str, Any]:
    """Images/s and step-time stats from every rank's clock marks ([steps done, seconds] at each host sync).

    ``warm``: untimed steps (there is a mark at exactly that step); ``window_steps``: the job's sync_every_steps.
    """
    walls = []
    for marks in per_rank_marks:
        start = next((t for d, t in marks if int(d) == warm), None)
        if start is None:
            raise ValueError(f"no clock mark at the end of the {warm} warm-up steps")
        walls.append(marks[-1][1] - start)
    timed = int(per_rank_marks[0][-1][0]) - warm
    slowest = max(walls)
    windows = _window_step_times(per_rank_marks, warm)
    weighted = [t for n, t in windows for _ in range(n)]  # each step counts once in the percentiles
    return {
        "images_per_sec": global_batch * timed / slowest if slowest > 0 else float("nan"),
        "timed_wall_time": slowest,
        "per_rank_timed_wall": walls,
        "step_time": {
            "median": percentile(weighted, 50),
            "p95": percentile(weighted, 95),
            "mean": slowest / timed if timed else float("nan"),  # what the throughput is made of
            "timed_steps": timed,
            "warmup_steps": warm,
            "window_steps": window_steps,  # 1: per-step times; K > 1: per-window means (up to K steps each)
            "windows": len(windows),
        },
    }


def versions() -> dict[str, str]:
    from common.core import buildinfo

    out = {"python": sys.version.split()[0]}
    for mod in ("tensorflow", "tf_keras", "horovod", "numpy"):
        m = sys.modules.get(mod)
        if m is not None and hasattr(m, "__version__"):
            out[mod] = str(m.__version__)
    if "horovod" in out:  # the patches scripts/setup.sh applied to its sdist (short sha256s), "none" or "unknown"
        out["horovod_patch"] = buildinfo.horovod_patch()
    out.update(buildinfo.stack_versions())  # container, container_image, horovod_build
    out["twinbench"] = buildinfo.source_version()  # a stack update may be twinbench's own: --baseline names it
    modules = buildinfo.loaded_modules()
    if modules is not None:
        out["modules"] = modules
    return out


def hostname() -> str:
    return socket.gethostname()


def new_run_id() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def result_filename(rec: RunRecord | Mapping[str, Any]) -> str:
    """``<backend>-<mode>-n<world_size>-<job_hash>-<run_id>.json``."""
    d = rec.to_dict() if isinstance(rec, RunRecord) else rec
    return f"{d['backend']}-{d['mode']}-n{d['world_size']}-{d['job_hash']}-{d['run_id']}.json"


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


def write_record(results_dir: str | os.PathLike[str], rec: RunRecord) -> Path:
    """Write ``rec`` atomically as ``results_dir/result_filename(rec)``, home directories written as ``~`` (a record
    is published: the job's paths and the command line name them); returns the path."""
    return write_json_atomic(Path(results_dir) / result_filename(rec), public(rec.to_dict()))


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
    return _dt.datetime.fromtimestamp(epoch_seconds, _dt.timezone.utc).isoformat(timespec="seconds")


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
