"""What every record type shares, the allreduce benchmark's record (``AllreduceRecord``), and one ``upgrade_*``
per record type that turns an older file into the current schema before it is read as its type.

Older files are upgraded, not refused, wherever the older schema says the same facts in another way: results
directories hold months of runs, and a report that refused them would send the user to an older checkout to read
files it can read itself. The upgrade is keyed on the file's ``schema`` (a chain of steps, one per version, each
from the facts that version wrote), so a reader of a record type sees only its current schema and never asks
which fields a file lacks. A schema with no step to the current one (the wall clock changed what schema 1's
throughput meant: nothing turns it into a wall-clock figure) is refused with a one-line RecordError naming the
versions that are read. No TensorFlow here.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# One per record type; bump it when a field changes meaning or becomes always written, with an upgrade step.
RUN_SCHEMA = 3  # RunRecord (results.SCHEMA); 2: wall-clock throughput; 3: capabilities, asynchronous, evaluations
ALLREDUCE_SCHEMA = 3  # AllreduceRecord; 3: collective and capabilities always written
BREAKDOWN_SCHEMA = 2  # BreakdownRecord: written first under schema 2


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


# -- RunRecord (common.core.results) ---------------------------------------------------------------------------
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
