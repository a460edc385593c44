"""The contract every backend implements; everything else (data, model, loop, measurement) is shared.

``Backend`` is the per-rank half, eleven groups: ``setup`` (communication and device pinning before any other
TensorFlow op, returning the rank's frozen ``RankInfo``), ``capabilities`` (the typed record of what shared code
asks: collective, compression, controller, input path, variant, knobs...), ``describe`` (free-form provenance,
only displayed), ``scope``, ``make_dataset``, ``fit_callbacks``, the step (``run_step`` + ``reduce_gradients``: the
one gradient reduction of Keras fit, the custom loop, Keras 3, the breakdown and parameter-server training,
``common.training.step``), the collectives (``allsum``, ``allgather``, ``allreduce_fn``, ``barrier``), the
``Lifecycle`` hooks (``before_training``, ``sync_model_state``, ``restore``, ``exit_barrier``, ``shutdown``),
``train_loop`` (a loop of the backend's own, or None) and the timeline (``start_timeline``/``stop_timeline``).
Eight are abstract, ``reduce_gradients`` among them: a backend that does not say how it reduces gradients cannot be
constructed (TypeError naming it), where a default would train one independent model per rank. The others default
to what a one-process backend without a collective library of its own would do. ``BackendSpec`` is the module-level
half (``PROG``, ``Options``, ``parser``, ``make_backend``, ``local_command``, ``doctor``, ``main``, and what it knows
without being built: ``LAUNCH``, its launchers, and ``stack``, its check of a stack as it is).

Shared code reads ``Capabilities`` fields, never keys of ``describe()``, and never asks which backend it runs:
what only one backend means (native's parameter servers, its profiler warning) stays in that backend's module.
"""

from __future__ import annotations

import abc
import argparse
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable


@dataclass(frozen=True)
class RankInfo:
    """Where this process stands in the run; fixed once ``Backend.setup`` has connected it."""

    rank: int  # this process's index among num_workers
    num_workers: int  # processes taking part
    local_rank: int  # index among processes on this host (device pinning)
    local_size: int  # processes on this host (thread budget)
    replicas_per_worker: int  # model replicas driven by one process (>1 only for native mirrored)
    device: str  # what the results record, e.g. "cpu (CUDA_VISIBLE_DEVICES=1)" or "/physical_device:GPU:0"
    threads: int  # intra-op threads of this process
    cpus: tuple[int, ...] = ()  # the CPUs this process may run on, once bound (configure_threads)
    cpu_bind: str = "none"  # who bound them: "self" (--cpu-bind cores), "launcher" (srun, mpirun...) or "none"

    @property
    def num_replicas(self) -> int:
        return self.num_workers * self.replicas_per_worker

    @property
    def is_chief(self) -> bool:
        return self.rank == 0


@dataclass(frozen=True)
class Diagnosis:
    """What ``python -m common.doctor`` prints for one backend: can it run here, with what, and what is missing."""

    ok: bool
    status: str  # "ok" or "cannot run: <why>"
    details: dict[str, Any]  # name -> value, one doctor line each
    missing: list[str]  # install hints, one MISSING line each


_Options = TypeVar("_Options", bound="BaseOptions")  # typing.Self is Python 3.11+


@dataclass(frozen=True)
class BaseOptions:
    """Runtime options every backend takes (the backend's own ``Options`` extend it)."""

    threads: int = 0  # intra-op threads per process; 0 = cores / processes on this host
    cpu_bind: str = "none"  # none: as launched; cores: local ranks a launcher left unbound take disjoint CPU shares

    @classmethod
    def from_args(cls: type[_Options], args: argparse.Namespace) -> _Options:
        """The options a parsed command line gives: each field from the flag of its name (argparse's ``dest``).
        The flags' defaults are the fields' (``common.cli.with_defaults``): one place for each default."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


@dataclass(frozen=True)
class Collective:
    """Which collective implementation a run asked for and which one ran (the record's ``collective``).

    ``requested`` is the flag (native ``--comm auto|ring|nccl``; Horovod has no flag: "auto"), ``used`` what carried
    the gradient all-reduce (native: "nccl" | "ring"; Horovod: "nccl" | "gloo" | "mpi"), ``reason`` one line why.
    """

    requested: str
    used: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"requested": self.requested, "used": self.used, "reason": self.reason}


@dataclass(frozen=True)
class Knob:
    """One tuning knob of a backend as it was in effect for a run (the record's ``tuning``).

    Knobs are runtime choices (like the world size), not part of the job hash; runs whose knobs differ get report rows
    of their own, labelled by ``label`` of each knob that is not at its ``default``.
    """

    name: str  # the record's key, e.g. "fusion_threshold_bytes"
    value: Any  # in effect for this run (a number, bool or string; never "default")
    default: Any  # the library's own default, as a value of the same kind
    label: str  # how a report row names a non-default value, e.g. "fusion 32 MiB"

    @property
    def is_default(self) -> bool:
        return self.value == self.default


def size_text(n: int) -> str:
    """Bytes as a label says them: 32 MiB, 16 KiB, 1.5 MiB, 100 B (the largest unit that fits)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def tuning_record(knobs: list[Knob], env: dict[str, str]) -> dict[str, Any]:
    """The record's ``tuning`` block: every knob's value and default, the variant label (None when all knobs are at
    their defaults) and the communication-library environment variables the rank saw (``env``)."""
    changed = [k.label for k in knobs if not k.is_default]
    return {
        "knobs": {k.name: k.value for k in knobs},
        "defaults": {k.name: k.default for k in knobs},
        "variant": ", ".join(changed) if changed else None,
        "env": dict(sorted(env.items())),
    }


@dataclass(frozen=True)
class Capabilities:
    """What shared code asks of a set-up backend, typed: the loop, the checkpoint, the record and the report read
    these fields, never keys of ``describe()``. The record keeps them as ``RunRecord.capabilities`` (``record()``;
    ``collective`` and ``knobs`` have record fields of their own: ``collective`` and ``tuning``).

    ``input_path``: "per-worker" = this process's own tf.data iterator, its tensors passed straight to the step;
    "distributed" = tf.distribute's distributed input; a backend feeding otherwise names its path. ``variant``: a
    non-default way of training that changes the math or the schedule (native: a --strategy other than mwms),
    or None; a variant gets report rows of its own and is part of the checkpoint's name.
    """

    collective: Collective  # what carried the gradient all-reduce
    controller: str | None = None  # what coordinates the ranks besides the collectives (Horovod: gloo | mpi)
    compression: str = "none"  # gradient values on the wire: "none" (float32) or "fp16"
    input_path: str = "per-worker"  # how make_dataset feeds the steps (the record's input.path)
    variant: str | None = None  # None: the backend's default way of training
    asynchronous: bool = False  # ranks update the variables without waiting for each other: in no parity claim
    every_rank_writes_checkpoint: bool = True  # False: only the chief writes (the others get its state on restore)
    # True: the optimizer reduces the gradients itself and the step must not (common.training.step). tf.distribute's
    # parameter-server and central-storage strategies: tf_keras' apply_gradients refuses
    # experimental_aggregate_gradients=False there (tf_keras/src/optimizers/legacy/optimizer_v2.py) and reduces
    # across one worker's local replicas; no all-reduce across workers exists in them.
    optimizer_reduces: bool = False
    knobs: tuple[Knob, ...] = ()  # tuning knobs in effect, defaults included as their values

    def __post_init__(self) -> None:
        if self.compression not in COMPRESSION_BYTES:
            raise ValueError(f"compression {self.compression!r}: use one of {', '.join(COMPRESSION_BYTES)}")

    def gradient_bytes(self, trainable_params: int) -> int:
        """Bytes one replica puts into the gradient allreduce per step (the scaling model's S)."""
        return trainable_params * COMPRESSION_BYTES[self.compression]

    def record(self) -> dict[str, Any]:
        """The record's ``capabilities`` block: every field but ``collective`` and ``knobs``."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("collective", "knobs")}


COMPRESSION_BYTES = {"none": 4, "fp16": 2}  # bytes per gradient value on the wire


@dataclass(frozen=True)
class Warmup:
    """A fit run's LR warm-up, offered to ``Backend.fit_callbacks`` only for a run starting at step 0 (a backend's
    own callback counts Keras epochs from 0)."""

    epochs: int
    steps_per_epoch: int
    learning_rate: float


TrainLoop = Callable[..., None]  # (ctx: RunContext, model, optimizer, dataset, hooks), as loops.run_ctl and run_fit


class Lifecycle:
    """The contract's hooks with a default: one-time synchronisation and the end of a run (no-ops here)."""

    def before_training(self, model: Any, optimizer: Any) -> None:
        """Synchronise the built (or restored) model and its optimizer's state, slots included (before the first
        step: ``common.training.train.build`` creates the slots)."""

    def sync_model_state(self, model: Any) -> None:
        """Make non-trainable state (BatchNorm moving statistics) what MWMS reads: the mean over replicas.
        A collective: all ranks call it, after the last step and before checkpointing or digesting weights."""

    def restore(self, ckpt: Any, path: str, model: Any, optimizer: Any) -> None:
        """Load a checkpoint written by ``common.training.train`` into the (already built) model and optimizer."""
        ckpt.read(path).assert_existing_objects_matched()

    def exit_barrier(self) -> None:
        """Return once every rank is past its last collective, so that exiting cannot break a peer's. Called after
        the last collective on every exit path; errors are not failures (the work is done)."""

    def shutdown(self) -> None:
        """Release communication resources before exit (after ``exit_barrier``)."""


class Backend(Lifecycle, abc.ABC):
    """The contract: abstract members first (what a backend must say), then the ones with a default."""

    name: ClassVar[str] = "?"
    _info: RankInfo | None = None

    def setup(self) -> RankInfo:
        """Initialise communication and pin devices (before any other TensorFlow op); returns this rank's place."""
        self._info = self._connect()
        return self._info

    @abc.abstractmethod
    def _connect(self) -> RankInfo:
        """The backend's own set-up; see ``setup``."""

    @abc.abstractmethod
    def capabilities(self) -> Capabilities:
        """What shared code asks of this backend as set up (after ``setup``)."""

    @abc.abstractmethod
    def make_dataset(self, dataset_fn: Callable[[int, int, int], Any]) -> Any:
        """Per-rank input: ``dataset_fn(pipeline_index, num_pipelines, replicas_per_pipeline)``."""

    @abc.abstractmethod
    def run_step(self, step_fn: Callable[..., Any], batch: Any) -> Any:
        """Run one replica step on every local replica; returns this process's per-replica losses (list)."""

    @abc.abstractmethod
    def reduce_gradients(self, grads: list[Any]) -> list[Any]:
        """This replica's gradients (tensors, none None) -> their SUM over every replica of the run, in the replica
        function (a collective: every replica calls it at the same step). The one reduction of the training step
        (``common.training.step``): each replica's loss is already divided by the global batch
        (``common.training.objective``), and the optimizer then applies the sum without reducing again."""

    # -- collectives: every rank must call them, at the same step ---------------------------------------------
    @abc.abstractmethod
    def allsum(self, values: list[float]) -> list[float]:
        """Element-wise float64 SUM over workers, one contribution per worker (the preemption agreement)."""

    @abc.abstractmethod
    def allgather(self, obj: Any) -> list[Any]:
        """Every rank's JSON-serialisable ``obj``, in rank order, on every rank."""

    @abc.abstractmethod
    def allreduce_fn(self) -> Any:
        """A callable: float32 tensor -> SUM over all replicas (this process's copy), as gradients are reduced."""

    def barrier(self) -> None:
        self.allgather(None)

    # -- with a default -------------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """Free-form provenance for the record's ``backend_info``: the report displays it, never branches on it."""
        return {"device": self.info.device, "threads_per_process": self.info.threads}

    def scope(self) -> contextlib.AbstractContextManager[Any]:
        """Where the model and optimizer are created."""
        return contextlib.nullcontext()

    def fit_callbacks(self, warmup: Warmup | None) -> tuple[list[Any], bool]:
        """Keras fit callbacks (state broadcast, metric averaging), and whether they include the backend's own LR
        warm-up for ``warmup`` (False: twinbench adds its re-implementation of the rule)."""
        return [], False

    def train_loop(self) -> TrainLoop | None:
        """A loop of the backend's own instead of the shared fit and custom loops (native: parameter servers)."""
        return None

    def start_timeline(self, path: str) -> bool:
        """Called on every rank as the profiler trace starts: start the backend's own collective timeline into
        ``path`` (Horovod's); True when this rank writes it. Default: none."""
        return False

    def stop_timeline(self) -> None:
        """Stop what ``start_timeline`` started (files flushed before this returns)."""

    # -- derived: RankInfo once set up ----------------------------------------------------------------------
    @property
    def info(self) -> RankInfo:
        if self._info is None:
            raise RuntimeError(f"{self.name} backend used before setup()")
        return self._info

    @property
    def rank(self) -> int:
        return self.info.rank

    @property
    def num_workers(self) -> int:
        return self.info.num_workers

    @property
    def num_replicas(self) -> int:
        return self.info.num_replicas

    @property
    def is_chief(self) -> bool:
        return self.info.is_chief


# -- what a backend knows of starting its ranks and of the stack -------------------------------------------------
SCOPES = ("local", "hosts", "slurm")  # where a launcher starts ranks: this host, a host list, a Slurm allocation


@dataclass(frozen=True)
class Launcher:
    """One way a backend's ranks are started, and what a rank it started reads to know its place.

    ``rank``, ``local_rank`` and ``local_size`` name the environment variables the launcher exports to each rank,
    the first one set counting; empty when the rank learns its place otherwise (native's TF_CONFIG task index)."""

    name: str  # as the sbatch script's choice and the sweep's flag name it: "srun", "horovodrun", "mpirun", "nproc"
    scopes: tuple[str, ...]  # where it starts ranks, of SCOPES
    summary: str  # one line: the command, and what it needs
    rank: tuple[str, ...] = ()
    local_rank: tuple[str, ...] = ()
    local_size: tuple[str, ...] = ()
    job_step: bool = False  # under Slurm, every rank is a task of a job step (srun): Slurm signals and binds it

    def __post_init__(self) -> None:
        if not self.scopes or not set(self.scopes) <= set(SCOPES):
            raise ValueError(f"launcher {self.name}: scopes {self.scopes}: use some of {', '.join(SCOPES)}")


LaunchEnv = tuple[dict[str, str], str]  # (variables to export to every launch line, one line saying the choice)


def no_launch_env(python: str) -> LaunchEnv | None:
    """``Launch.env``'s default: the launch lines depend on nothing resolved beforehand."""
    return None


def _first_int(environ: Mapping[str, str], names: tuple[str, ...]) -> int | None:
    """The first of ``names`` set to a count; Slurm's per-node lists ("2(x3),1") give their first node's."""
    for name in names:
        v = environ.get(name, "").split("(")[0].split(",")[0].strip()
        if v.isdigit():
            return int(v)
    return None


@dataclass(frozen=True)
class Launch:
    """What a backend knows of starting its ranks (the spec's ``LAUNCH``): its launchers (under Slurm the first is
    the sbatch script's default), the variable its sbatch script reads to choose its Slurm launcher (the sweep
    passes it: ``HVD_LAUNCH`` is the sweep's ``--hvd-launch``; None: no choice), and what a command starting many
    runs resolves once for all their launch lines (``env``; the default: nothing)."""

    launchers: tuple[Launcher, ...]
    slurm_variable: str | None = None
    env: Callable[[str], LaunchEnv | None] = no_launch_env

    def at(self, scope: str) -> tuple[Launcher, ...]:
        """The launchers that start ranks in ``scope``; under Slurm the first is the sbatch script's default."""
        return tuple(x for x in self.launchers if scope in x.scopes)

    def named(self, name: str, scope: str) -> Launcher:
        """The launcher ``name`` of ``scope``; ValueError (one line) naming the ones there are."""
        for x in self.at(scope):
            if x.name == name:
                return x
        raise ValueError(f"unknown {scope} launcher {name!r}: use one of {', '.join(x.name for x in self.at(scope))}")

    @property
    def slurm_flag(self) -> str | None:
        """The sweep's flag that sets ``slurm_variable``: HVD_LAUNCH -> --hvd-launch."""
        return "--" + self.slurm_variable.lower().replace("_", "-") if self.slurm_variable else None

    def _by_precedence(self) -> list[Launcher]:
        # A launcher started inside a Slurm job step (horovodrun or mpirun in the batch step) leaves that step's
        # variables (SLURM_PROCID: the batch step's 0) in every rank's environment: the job-step launchers count last.
        return sorted(self.launchers, key=lambda x: x.job_step)

    def rank_variables(self) -> tuple[str, ...]:
        """Every variable a launcher puts the rank in, the first set counting."""
        return tuple(dict.fromkeys(v for x in self._by_precedence() for v in x.rank))

    def rank(self, environ: Mapping[str, str]) -> int | None:
        """This process's rank as a launcher exported it (before any library is initialised), None when none did."""
        return _first_int(environ, self.rank_variables())

    def local_place(self, environ: Mapping[str, str]) -> tuple[int, int] | None:
        """(local rank, local size) as the first launcher that exported a local rank says them, None when none did
        (a size it does not export: 1)."""
        for x in self._by_precedence():
            local = _first_int(environ, x.local_rank)
            if local is not None:
                return local, _first_int(environ, x.local_size) or 1
        return None


@dataclass(frozen=True)
class StackCheck:
    """One backend's verdict in ``python -m common.doctor --stack``: can it run on this stack as it is, and its own
    lines (what it imports beyond TensorFlow, how its ranks would start)."""

    ok: bool
    lines: tuple[str, ...] = ()


@runtime_checkable
class BackendSpec(Protocol):
    """The module-level half of a backend (``backends/NAME.py``), what code that never builds a ``Backend`` calls:
    the registry's users (report, sweep, doctor, demo) and ``backends.entrypoint.run_main``."""

    PROG: str  # the module: python -m PROG
    T0: float  # time.time() first thing in the module: the process start, for time-to-first-step
    Options: type[BaseOptions]  # frozen; its fields' defaults are the flags' defaults

    def parser(self) -> argparse.ArgumentParser:
        """Every flag (start from ``common.cli.base_parser``; bad flags: one line, exit 2)."""

    def make_backend(self, args: argparse.Namespace, argv: list[str], job: Any) -> Backend | int:
        """The backend to set up for a parsed command line, or the exit status of a launcher that ran the ranks
        instead (native ``--nproc``); ``UsageError``: one line, exit 2."""

    def local_command(self, n: int, args: list[str], python: str = ...) -> list[str]:
        """The command that runs ``n`` ranks of this backend on this host."""

    def doctor(self, tf_version: str | None) -> Diagnosis:
        """Can it run here, with what, and what is missing."""

    LAUNCH: Launch  # how its ranks start: local, multi-host, Slurm; what each rank reads to know its place

    def stack(self, shared_ok: bool) -> StackCheck:
        """``python -m common.doctor --stack``: can it run on this Python's stack as it is, nothing built, given
        whether the shared stack (TensorFlow and tf-keras, judged by the doctor) can (``shared_ok``)."""

    def main(self, argv: list[str] | None = None) -> int:
        """``backends.entrypoint.run_main(PROG, T0, parser, make_backend, argv)``."""
