"""A model the job's model function returned compiled (``model.compile(optimizer=..., loss=..., metrics=...)``, as
TensorFlow's multi-worker tutorial's ``build_and_compile_cnn_model``): its optimizer, loss and metrics are the job's,
never replaced in silence.

- The optimizer is rebuilt in every rank from its class and ``get_config()`` (as Keras' ``optimizers.deserialize``
  does), inside the backend's scope: a ``tf.keras.optimizers.legacy`` one as it is; tf_keras' newer ``SGD`` and
  ``Adam`` (what ``tf.keras.optimizers.SGD`` and ``compile(optimizer="adam")`` make) as their legacy twins, the same
  update rule, which twinbench's keras = 2 loops need (they set the LR from the host; Horovod's fit wraps a legacy
  optimizer). Its learning rate is the recipe's base: ``lr_scaling`` (for the run's replicas or ``--lr-replicas``),
  ``warmup_epochs`` and ``lr_schedule`` apply to it as they would to the ``learning_rate`` key; a compiled
  LearningRateSchedule is kept as it is (no scaling, no warm-up, no job schedule on top of it).
- The loss becomes the recipe's ``loss``: the job ``loss`` value that builds the same loss
  (``common.training.objective``); the metrics the recipe's ``metrics``.
- All of it is the run's one ``Recipe`` (``recipe``; common/training/context.py), written in every record; the job
  (its file and --set keys) stays the run's identity: its hash, its ``job`` block, its checkpoint.
- A job key the job file set that says otherwise, or anything compiled that cannot be carried over exactly (another
  optimizer class, a loss with its own settings or a function of the user's, loss_weights, weighted_metrics,
  steps_per_execution, jit_compile, a model class with its own ``train_step``): one line naming the keys to set
  instead (exit 2, in every rank before the first step).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from common.training import objective
from common.training.context import Recipe, RunContext
from common.workload import usercode
from common.workload.job import Job, given_keys

# tf_keras' newer optimizers whose update is the legacy twin's (tf_keras/src/optimizers/{sgd,adam}.py against
# ResourceApplyKerasMomentum / ResourceApplyAdam): the constructor arguments carried over
_TWINS = {"SGD": ("momentum", "nesterov"), "Adam": ("beta_1", "beta_2", "epsilon", "amsgrad")}
# the newer optimizers' base arguments, each at the value that leaves the update as the legacy twin's
_NEUTRAL = {"weight_decay": (None, 0, 0.0), "use_ema": (False,), "clipnorm": (None,), "clipvalue": (None,),
            "global_clipnorm": (None,), "adaptive_epsilon": (False,)}
# builtin optimizer names -> the legacy class name they build (common.training.optimizers)
_BUILTIN_CLASS = {"sgd": "SGD", "momentum": "SGD", "adam": "Adam"}


@dataclasses.dataclass(frozen=True)
class Compiled:
    """What the model function compiled, as twinbench trains it."""

    optimizer_class: Any  # the legacy tf_keras optimizer class rebuilt in every rank
    optimizer_config: dict[str, Any]  # its get_config(): learning_rate a float, or the schedule object
    compiled_class: str  # module.Class of the optimizer compile() made
    learning_rate: float  # the base LR (before lr_scaling); a schedule's value at step 0
    schedule: dict[str, Any] | None  # {"class": module.Class, "config": ...} of a compiled LearningRateSchedule
    loss: str | None  # the job loss value it equals; None: compile() gave no loss (the job's trains)
    metrics: tuple[str, ...] | None  # None: compile() gave none (the job's are evaluated)

    def rebuild(self, lr: float) -> Any:
        """A new optimizer of the compiled class and configuration, learning rate ``lr`` (a schedule: its own)."""
        config = dict(self.optimizer_config)
        lr_value = config.get("learning_rate")
        if self.schedule is not None:
            config["learning_rate"] = type(lr_value).from_config(lr_value.get_config())
        else:
            config["learning_rate"] = lr
        return self.optimizer_class.from_config(config)

    def record(self) -> dict[str, Any]:
        """The record's ``compiled``: what was trained in place of the job's optimizer, loss and metrics keys."""
        config = {k: v for k, v in self.optimizer_config.items() if k != "learning_rate"}
        return {"optimizer": {"class": _name(self.optimizer_class), "compiled_class": self.compiled_class,
                              "config": _plain(config)},
                "learning_rate": self.learning_rate, "schedule": self.schedule,
                "loss": self.loss, "metrics": None if self.metrics is None else list(self.metrics)}

    def describe(self) -> str:
        """One line for the banner."""
        lr = f"schedule {self.schedule['class']}" if self.schedule else f"learning_rate {self.learning_rate:g}"
        return (f"{self.optimizer_class.__name__}({lr}, {_shown(self.optimizer_config)}); "
                f"loss {self.loss or '(none compiled: the job loss)'}; metrics "
                f"{list(self.metrics) if self.metrics is not None else '(none compiled: the job metrics)'}")


def _shown(config: dict[str, Any]) -> str:
    """The update's settings of an optimizer config, as ``k=v`` text."""
    keys = ("momentum", "nesterov", "beta_1", "beta_2", "epsilon", "amsgrad")
    return ", ".join(f"{k}={v}" for k, v in _plain(config).items() if k in keys)


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _plain(config: dict[str, Any]) -> dict[str, Any]:
    """A config as JSON values (numpy scalars as numbers, a float32 in its shortest decimal, lists such as a
    schedule's boundaries as they are, other objects by their class name)."""
    out = {}
    for k, v in config.items():
        v = f32(v) if isinstance(v, np.float32) else v.item() if isinstance(v, np.generic) else v
        try:
            out[k] = json.loads(json.dumps(v, allow_nan=False))
        except (TypeError, ValueError):
            out[k] = _name(type(v))
    return out


def f32(x: float) -> float:
    """``x`` as the float32 a Keras variable holds, written in its shortest decimal (0.001, not 0.0010000000474...)."""
    return float(str(np.float32(x)))


def from_model(tf: Any, job: Job, model: Any) -> Compiled | None:
    """The Compiled of a model ``usercode.build_model`` returned compiled, checked against the job; None if it was
    not compiled. UserCodeError (one line, exit 2) for what cannot be carried over or a job key that contradicts it."""
    parts = usercode.compiled_parts(model)
    if parts is None:
        return None
    ref = job.model
    _refuse_extras(ref, parts)
    cls, config, compiled_class = _optimizer(tf, ref, parts["optimizer"])
    lr, schedule = _learning_rate(tf, ref, job, config)
    compiled = Compiled(cls, config, compiled_class, lr, schedule, objective.compiled_loss(ref, parts.get("loss")),
                        _metrics(ref, parts.get("metrics")))
    check_job(job, compiled)
    return compiled


def _refuse_extras(ref: str, parts: dict[str, Any]) -> None:
    what = f"model = {ref!r} returned a compiled model"
    if parts.get("train_step"):
        raise usercode.UserCodeError(f"{what} whose class overrides train_step: twinbench trains with its own step on "
                                     "both backends; return a model without its own train_step, the objective set "
                                     "by loss, optimizer, learning_rate in the job")
    for arg, keys in (("loss_weights", "loss_per_output and loss_weights"), ("weighted_metrics", "metrics"),
                      ("steps_per_execution", "steps_per_execution"), ("jit_compile", "xla")):
        value = parts.get(arg)
        if value not in (None, False) and not (arg == "steps_per_execution" and value == 1):
            raise usercode.UserCodeError(f"{what} with compile({arg}={value!r}), which twinbench cannot carry over: "
                                         f"compile without it and set {keys} in the job")


def _optimizer(tf: Any, ref: str, optimizer: Any) -> tuple[Any, dict[str, Any], str]:
    """(legacy class, its config, the compiled optimizer's module.Class)."""
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # compile() wraps it under mixed_float16
    kind = type(optimizer)
    legacy = tf.keras.optimizers.legacy
    if isinstance(optimizer, legacy.Optimizer):
        return kind, optimizer.get_config(), _name(kind)
    config = optimizer.get_config() if hasattr(optimizer, "get_config") else {}
    twin = _TWINS.get(kind.__name__) if kind.__module__.startswith("tf_keras.") else None
    odd = sorted(k for k, ok in _NEUTRAL.items() if k in config and config[k] not in ok)
    if twin is None or odd:
        why = f"its {', '.join(f'{k}={config[k]!r}' for k in odd)}" if twin else "its class"
        default = " (compile()'s default optimizer is rmsprop)" if kind.__name__ == "RMSprop" else ""
        raise usercode.UserCodeError(
            f"model = {ref!r} was compiled with {_name(kind)}{default}, which twinbench cannot rebuild exactly "
            f"({why}; it rebuilds tf.keras.optimizers.legacy optimizers, and SGD and Adam): compile with "
            f"tf.keras.optimizers.legacy.{kind.__name__}, or set optimizer, optimizer_args and learning_rate in the "
            "job and return the model uncompiled")
    cls = getattr(legacy, kind.__name__)
    kept = {k: config[k] for k in ("name", "learning_rate", *twin) if k in config}
    lr = getattr(optimizer, "_learning_rate", None)
    if isinstance(lr, tf.keras.optimizers.schedules.LearningRateSchedule):
        kept["learning_rate"] = lr
    return cls, kept, _name(kind)


def _learning_rate(tf: Any, ref: str, job: Job, config: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    lr = config.get("learning_rate")
    if isinstance(lr, dict):  # a legacy optimizer's serialised schedule
        lr = tf.keras.optimizers.schedules.deserialize(lr)
        config["learning_rate"] = lr
    if not isinstance(lr, tf.keras.optimizers.schedules.LearningRateSchedule):
        return f32(float(lr)), None
    defaults = (("lr_scaling", "none"), ("warmup_epochs", 0), ("lr_schedule", "constant"))
    clash = [f"{k} = {getattr(job, k)!r}" for k, default in defaults if getattr(job, k) != default]
    if clash:
        raise usercode.UserCodeError(f"model = {ref!r} was compiled with a learning-rate schedule "
                                     f"({type(lr).__name__}) and the job sets {', '.join(clash)}: twinbench cannot "
                                     "put them on top of it; remove them, or compile with a number and give the "
                                     "schedule as lr_schedule")
    return f32(float(lr(0))), {"class": _name(type(lr)), "config": _plain(lr.get_config())}


def _metrics(ref: str, metrics: Any) -> tuple[str, ...] | None:
    if not metrics:
        return None
    if isinstance(metrics, list | tuple) and all(isinstance(m, str) and m.replace("_", "").isalnum()
                                                 for m in metrics):
        return tuple(metrics)
    raise usercode.UserCodeError(f"model = {ref!r} was compiled with metrics {metrics!r}: twinbench carries over "
                                 "metrics given by name only (such as [\"accuracy\"]); compile without them and set "
                                 "metrics in the job")


def check_job(job: Job, compiled: Compiled) -> None:
    """UserCodeError naming both values when a job key the job file set says otherwise than the compiled model."""
    given = given_keys(job)
    compiled_as = f"model = {job.model!r} compiled"
    config = compiled.optimizer_config

    def clash(key: str, theirs: str) -> None:
        raise usercode.UserCodeError(f"{key} = {getattr(job, key)!r} in the job, but {compiled_as} {theirs}: the "
                                     f"compiled model is the job's; remove {key} from the job or change the model")

    if "learning_rate" in given and compiled.schedule is None and f32(job.learning_rate) != compiled.learning_rate:
        clash("learning_rate", f"learning_rate {compiled.learning_rate:g}")
    if "learning_rate" in given and compiled.schedule is not None:
        clash("learning_rate", f"a learning-rate schedule ({compiled.schedule['class']})")
    if "optimizer" in given and (usercode.is_ref(job.optimizer)
                                 or _BUILTIN_CLASS.get(job.optimizer) != compiled.optimizer_class.__name__
                                 or (job.optimizer == "momentum" and config.get("momentum") != job.momentum)):
        lr = "a schedule" if compiled.schedule else f"learning_rate {compiled.learning_rate:g}"
        clash("optimizer", f"{compiled.compiled_class} ({lr}, {_shown(config)})")
    for arg, value in job.optimizer_args.items() if "optimizer_args" in given else ():
        if _plain({arg: config.get(arg)})[arg] != value:
            raise usercode.UserCodeError(f"optimizer_args {arg} = {value!r} in the job, but {compiled_as} "
                                         f"{compiled.compiled_class} with {arg} = {config.get(arg)!r}: remove it "
                                         "from the job or change the model")
    if "lr_schedule" in given and compiled.schedule is not None:
        clash("lr_schedule", f"a learning-rate schedule ({compiled.schedule['class']})")
    if compiled.loss is not None:
        if "loss" in given and job.loss != compiled.loss:
            clash("loss", f"loss {compiled.loss!r}")
        if "loss_per_output" in given:
            clash("loss_per_output", f"loss {compiled.loss!r}")
    if compiled.metrics is not None and "metrics" in given and tuple(job.metrics) != compiled.metrics:
        clash("metrics", f"metrics {list(compiled.metrics)}")


def recipe(job: Job, compiled: Compiled | None, lr_replicas: int) -> Recipe:
    """The run's one recipe: the job's keys, or what the model function compiled in place of the optimizer, the
    learning rate, the loss and the metrics (``compiled``, checked against the job by ``from_model``). The base
    learning rate is scaled for ``lr_replicas`` replicas (``job.lr_scaling``): the run's, or ``--lr-replicas``; a
    compiled schedule is the optimizer's own (no scaling: ``from_model`` refuses one under lr_scaling = "linear")."""
    shared = {"lr_scaling": job.lr_scaling, "lr_replicas": lr_replicas, "warmup_epochs": job.warmup_epochs,
              "lr_schedule": job.lr_schedule, "lr_schedule_args": dict(job.lr_schedule_args), "keras": job.keras}
    if compiled is None:
        config = {"momentum": job.momentum} if job.optimizer == "momentum" else {}
        return Recipe(source="job", optimizer=job.optimizer, optimizer_config={**config, **job.optimizer_args},
                      compiled_class=None, base_learning_rate=job.learning_rate,
                      learning_rate=job.scaled_learning_rate(lr_replicas), schedule=None, loss=job.loss,
                      loss_per_output=dict(job.loss_per_output), loss_weights=dict(job.loss_weights),
                      metrics=tuple(job.metrics), **shared)
    base = compiled.learning_rate
    scaled = base * lr_replicas if job.lr_scaling == "linear" and compiled.schedule is None else base
    own_loss = compiled.loss is not None  # a compiled loss: no loss_per_output (check_job refuses one given)
    config = {k: v for k, v in compiled.optimizer_config.items() if k not in ("learning_rate", "name")}
    return Recipe(source="compiled", optimizer=_name(compiled.optimizer_class), optimizer_config=_plain(config),
                  compiled_class=compiled.compiled_class, base_learning_rate=base, learning_rate=scaled,
                  schedule=compiled.schedule, loss=compiled.loss if own_loss else job.loss,
                  loss_per_output={} if own_loss else dict(job.loss_per_output),
                  loss_weights={} if own_loss else dict(job.loss_weights),
                  metrics=compiled.metrics if compiled.metrics is not None else tuple(job.metrics), **shared)


def banner(run: RunContext, compiled: Compiled | None) -> str:
    """The chief's line on the global batch, the learning rate and the optimizer the loops train with (the recipe;
    ``compiled``: what the model function compiled, to say which parts are its)."""
    plan, recipe = run.plan, run.trained_by
    lr, replicas = recipe.learning_rate, recipe.lr_replicas
    warm = f", warm-up {recipe.warmup_epochs} epoch(s) from {lr / replicas:g}" if recipe.warmup_epochs else ""
    warm += f", then {recipe.lr_schedule}" if recipe.lr_schedule != "constant" else ""
    as_if = f" as if {replicas} replicas (--lr-replicas)" if replicas != plan.replicas else ""
    optimizer = f"optimizer {recipe.optimizer}" if compiled is None else \
        f"the model function's compiled {compiled.describe()}"
    return (f"[twinbench] global batch {plan.global_batch} = {plan.per_replica_batch} per replica x {plan.replicas}; "
            f"LR {lr:g} (base {recipe.base_learning_rate:g}, scaling {recipe.lr_scaling}{as_if}{warm}; {optimizer}, "
            f"keras {recipe.keras})")
