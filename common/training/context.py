"""One run's context: what every named step of ``common.training.train`` and both loops read (the job, the set-up
backend, the runtime options, the derived sizes and the recipe that trains), made once per run instead of passed as
long parameter lists.

The job is the run's identity (its file and --set keys: ``job_hash``, the record's ``job``, the checkpoint); the
``Recipe`` is what trains: the loss, the metrics, the optimizer and its learning rate, resolved once from the job's
keys or from a model its function returned compiled (``common.training.compiled.recipe``). Two objects, never a
second ``Job``: every record carries the job's hash and the recipe that trained."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
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
class Recipe:
    """What trains, resolved once per run (``common.training.compiled.recipe``): from the job's keys (``source``
    "job"), or the optimizer, learning rate, loss and metrics a model function compiled in their place ("compiled").
    The objective and the learning-rate schedule (``common.training.objective``) read it where they read these keys.
    Not part of the job's identity: ``--lr-replicas`` changes it, never the job hash."""

    source: str  # "job": the job's keys; "compiled": the model function's compile() (the rest: the job's keys)
    optimizer: str  # the job's optimizer key, or the module.Class rebuilt from what compile() made
    optimizer_config: Mapping[str, Any]  # the update's settings: momentum and optimizer_args, or the compiled config
    compiled_class: str | None  # module.Class of the optimizer compile() made; None: the job's optimizer key
    base_learning_rate: float  # the job's learning_rate or the compiled one (a compiled schedule's value at step 0)
    lr_scaling: str  # the job's: none | linear
    lr_replicas: int  # the replicas the LR is scaled and warmed up for: the run's, or --lr-replicas
    learning_rate: float  # the base scaled for lr_replicas: the LR after warm-up, where a job lr_schedule starts
    warmup_epochs: int  # the job's (Horovod's warm-up rule, from learning_rate / lr_replicas)
    lr_schedule: str  # the job's: constant | cosine | "package.module:function"
    lr_schedule_args: Mapping[str, Any]
    schedule: Mapping[str, Any] | None  # a compiled LearningRateSchedule ({"class", "config"}): the optimizer's own
    loss: str  # the job's loss value that builds it (common.training.objective)
    loss_per_output: Mapping[str, str]
    loss_weights: Mapping[str, float]
    metrics: tuple[str, ...]  # evaluated on the validation data (common.training.evaluate), never per step
    keras: int  # the Keras family the optimizer and a user schedule belong to (the job's)

    def record(self) -> dict[str, Any]:
        """The records' ``recipe`` (JSON values)."""
        out = dataclasses.asdict(self)
        out["metrics"] = list(self.metrics)
        return out


@dataclass(frozen=True)
class RunContext:
    """The job (the identity), the backend after ``setup`` (how), the runtime options, the plan, and the recipe
    that trains (None until the model is built: its function may compile its own; ``common.training.train``)."""

    job: Job
    backend: Backend
    opts: RunOptions
    plan: Plan
    recipe: Recipe | None = None

    @property
    def verbose(self) -> bool:
        """Does this process print progress (the chief, unless --quiet)."""
        return self.opts.verbose and self.backend.is_chief

    @property
    def trained_by(self) -> Recipe:
        """The recipe, once the model is built (what the loops and the records read)."""
        if self.recipe is None:
            raise RuntimeError("the run's recipe is read before the model is built")
        return self.recipe

    @property
    def label(self) -> str:
        """<backend>-<mode>-n<replicas>: names the run's profile directory."""
        return f"{self.backend.name}-{self.job.mode}-n{self.plan.replicas}"
