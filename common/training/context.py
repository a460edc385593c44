"""One run's context: what every named step of ``common.training.train`` and both loops read (the job, the set-up
backend, the runtime options and the derived sizes), made once per run instead of passed as long parameter lists."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from common.core.contract import Backend
from common.training.runconfig import RunOptions
from common.workload.data import DataFacts
from common.workload.job import Job


@dataclass(frozen=True)
class Plan:
    """The run's derived sizes and the data's facts, made once per run (``common.training.train.make_plan``) and read
    by everything after it: the chief's banner, the model, the loops, the record."""

    per_replica_batch: int  # the job's per_replica_batch_size: the global batch is made of these
    learning_rate: float  # scaled for the replica count (job.lr_scaling)
    steps_per_epoch: int
    total_steps: int
    replicas: int
    pipeline: dict[str, Any] | None = None  # an input function's facts (common.training.streamed), else None
    data: DataFacts | None = None  # the training data's size and shapes (None: an input function's, in ``pipeline``)

    @property
    def global_batch(self) -> int:
        """Samples per step over all replicas (what the objective divides by and the data is cut into)."""
        return self.per_replica_batch * self.replicas


@dataclass(frozen=True)
class RunContext:
    """The job (what is trained), the backend after ``setup`` (how), the runtime options and the plan."""

    job: Job
    backend: Backend
    opts: RunOptions
    plan: Plan

    @property
    def verbose(self) -> bool:
        """Does this process print progress (the chief, unless --quiet)."""
        return self.opts.verbose and self.backend.is_chief

    @property
    def label(self) -> str:
        """<backend>-<mode>-n<replicas>: names the run's profile directory."""
        return f"{self.backend.name}-{self.job.mode}-n{self.plan.replicas}"
