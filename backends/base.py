"""The one interface both backends implement; everything else (data, model, loop, measurement) is shared.

Methods are called by ``common.train`` in this order: ``setup`` (communication + device pinning, before any
other TensorFlow op), ``scope`` (variable creation), ``make_dataset``, ``wrap_optimizer``, then per mode
``fit_callbacks`` or ``run``/``wrap_tape``, and finally ``allgather`` to bring per-rank records to the chief.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable
from typing import Any


class Backend(abc.ABC):
    name: str = "?"
    rank: int = 0  # this process's index among num_workers
    num_workers: int = 1  # processes taking part
    local_rank: int = 0  # index among processes on this host (device pinning)
    local_size: int = 1  # processes on this host (thread budget)
    replicas_per_worker: int = 1  # model replicas driven by one process (>1 only for native mirrored)
    watchdog: Any = None  # common.reliability.Watchdog once training has started with peers
    writes_checkpoint: bool = True  # does this rank take part in writing a checkpoint (see common.train)

    @property
    def num_replicas(self) -> int:
        return self.num_workers * self.replicas_per_worker

    @property
    def is_chief(self) -> bool:
        return self.rank == 0

    @abc.abstractmethod
    def setup(self) -> None:
        """Initialise communication and pin devices; must run before any other TensorFlow op."""

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]:
        """What the results JSON records about the backend (strategy, collectives, controller...)."""

    def scope(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    @abc.abstractmethod
    def make_dataset(self, dataset_fn: Callable[[int, int, int], Any]) -> Any:
        """Per-rank input: ``dataset_fn(pipeline_index, num_pipelines, replicas_per_pipeline)``."""

    def wrap_optimizer(self, optimizer: Any, mode: str) -> Any:
        return optimizer

    def fit_callbacks(self, job: Any, steps_per_epoch: int, learning_rate: float, fresh: bool = True) -> list[Any]:
        """Backend callbacks for Keras fit; ``fresh`` is False when resuming mid-run."""
        return []

    def wrap_tape(self, tape: Any) -> Any:
        return tape

    @abc.abstractmethod
    def run(self, step_fn: Callable[..., Any], batch: Any) -> Any:
        """Run one replica step on every local replica; returns this process's per-replica losses (list)."""

    def after_first_step(self, model: Any, optimizer: Any) -> None:
        """Hook for one-time synchronisation that needs optimizer slots to exist."""
        return None

    def before_training(self, model: Any) -> None:
        """Hook for one-time synchronisation of the freshly built model."""
        return None

    @abc.abstractmethod
    def any_flag(self, flag: bool) -> bool:
        """True on every rank if ``flag`` is True on any rank (a collective: all must call, at the same step)."""

    def restore(self, ckpt: Any, path: str, model: Any, optimizer: Any) -> None:
        """Load a checkpoint written by ``common.train`` into the (already built) model and optimizer."""
        ckpt.read(path).assert_existing_objects_matched()

    @abc.abstractmethod
    def allreduce_fn(self) -> Any:
        """A callable: float32 tensor -> SUM over all replicas (this process's copy), as gradients are reduced."""

    @abc.abstractmethod
    def allgather(self, obj: Any) -> list[Any]:
        """Every rank's JSON-serialisable ``obj``, in rank order, on every rank (a collective: all must call)."""

    def barrier(self) -> None:
        self.allgather(None)

    def sync_model_state(self, model: Any) -> None:
        """Make non-trainable state (BatchNorm moving statistics) what MWMS reads: the mean over replicas.

        A collective: all ranks call it, after the last step and before checkpointing or digesting weights.
        """
        return None

    def exit_barrier(self) -> None:
        """Return once every rank is past its last collective, so that exiting cannot break a peer's (no-op here).

        Called after the last collective on every exit path (done, preempted); errors are not failures: the
        work is finished, only the courtesy to peers is at stake.
        """
        return None

    def shutdown(self) -> None:
        """Release communication resources before exit (after ``exit_barrier``)."""
        return None
