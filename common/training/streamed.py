"""An input function's run on a set-up backend (the function and its checks: ``common.workload.inputfn``).

Before the model is built, every rank calls the function once with its own context and reads its first batches
(``inputfn.pipeline_facts``); one allgather then gives every rank everyone's facts, so a failure anywhere (a function
that raises, an empty worker) stops every rank with the same one line (exit 2) instead of leaving the others in a
collective. The plan's steps come from those facts (``inputfn.epoch_steps``); training calls the function again, with
the same seed, for the dataset it iterates (``dataset_fn``): its first batches are the fingerprinted ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from common.core.contract import Backend
from common.core.errors import UsageError
from common.training import evaluate
from common.training.context import RunContext
from common.workload import inputfn, usercode
from common.workload.job import Job


def plan(job: Job, backend: Backend, per_replica_batch: int) -> tuple[int, int, dict[str, Any]]:
    """(steps per epoch, total steps, the plan's ``pipeline``) from every rank's call of the function."""
    import tensorflow as tf

    if backend.capabilities().input_path.endswith("(coordinator)"):
        raise UsageError(f"dataset = {job.dataset!r}: an input function cannot feed parameter-server training "
                         "(its workers' datasets are made through the coordinator)")
    per = backend.info.replicas_per_worker
    mine, error, validation, labels = None, None, None, None
    try:
        mine, validation, labels = inputfn.pipeline_facts(tf, job, per_replica_batch, backend.rank,
                                                          backend.num_workers, per)
    except usercode.UserCodeError as e:
        error = str(e)
    gathered = backend.allgather({"facts": mine, "error": error})
    errors = [g["error"] for g in gathered if g["error"]]
    if errors:
        raise inputfn.InputFnError(errors[0])
    everyone = [g["facts"] for g in gathered]
    per_pass, spe = inputfn.epoch_steps(job, everyone, per)
    total = job.steps if job.steps > 0 else job.epochs * spe
    if backend.is_chief and backend.num_workers > 1 and len({f["fingerprint"] for f in everyone}) == 1:
        print(f"[twinbench] warning: every worker got the same first batches from dataset = {job.dataset!r}: does it "
              "shard by input_context.input_pipeline_id?", flush=True)
    if validation is not None and not job.input_batched:
        validation = validation.batch(evaluate.EVAL_BATCH)
    return spe, total, {"record": inputfn.record_block(job, everyone, per_pass), "per_pass": per_pass,
                        "labels": labels, "validation": validation}


def dataset_fn(ctx: RunContext, start_step: int) -> Callable[[int, int, int], Any]:
    """The dataset function ``backend.make_dataset`` calls per input pipeline: the function's dataset for that
    pipeline's context, batched, repeated and resumed as ``inputfn.training_stream`` says."""
    job, plan_ = ctx.job, ctx.plan
    assert plan_.pipeline is not None

    def fn(index: int, count: int, per: int) -> Any:
        import tensorflow as tf

        ds, _ = inputfn.call(tf, job, inputfn.input_context(tf, index, count, per), plan_.per_replica_batch)
        ds = inputfn.batched(tf, job, ds, plan_.per_replica_batch)
        return inputfn.training_stream(tf, ds, plan_.pipeline["per_pass"], per, start_step)

    return fn


def model_inputs(job: Job, pipeline: dict[str, Any]) -> tuple[Any, int | None]:
    """(input shapes for the model function: one tuple, or a dict / list of them as the features are; num_classes:
    the job's when set, else None: streamed labels are never all read), from the plan's ``pipeline``."""
    return _as_tuples(pipeline["record"]["input_shapes"]), job.num_classes or None


def _as_tuples(shapes: Any) -> Any:
    if isinstance(shapes, dict):
        return {k: _as_tuples(v) for k, v in shapes.items()}
    if shapes and all(isinstance(s, list | dict) for s in shapes):
        return [_as_tuples(s) for s in shapes]
    return tuple(shapes)


def check_model_inputs(job: Job, model: Any, shapes: Any) -> None:
    """UserCodeError (exit 2) naming ``model`` when its inputs do not take the dataset's features."""
    inputs = list(model.inputs)
    names = [i.name.split(":")[0] for i in inputs]
    names = list(getattr(model, "input_names", None) or names)
    what = f"model = {job.model!r}: inputs {names} do not match the features of dataset = {job.dataset!r}"
    if isinstance(shapes, dict):
        missing, extra = sorted(set(names) - set(shapes)), sorted(set(shapes) - set(names))
        if missing or extra:
            why = f"no feature {missing[0]!r}" if missing else f"feature {extra[0]!r} is no input of the model"
            raise usercode.UserCodeError(f"{what} ({sorted(shapes)}): {why}")
        pairs = [(f"features[{n!r}]", i, shapes[n]) for n, i in zip(names, inputs)]
    else:
        given = shapes if isinstance(shapes, list) else [shapes]
        if len(given) != len(inputs):
            raise usercode.UserCodeError(f"{what}: the model takes {len(inputs)} input(s), the elements' features "
                                         f"are {len(given)}")
        pairs = [(f"features[{k}]" if isinstance(shapes, list) else "features", i, s)
                 for k, (i, s) in enumerate(zip(inputs, given))]
    for path, tensor, shape in pairs:
        want = tuple(tensor.shape)[1:]
        if len(want) != len(shape) or any(a is not None and b is not None and a != b for a, b in zip(want, shape)):
            raise usercode.UserCodeError(f"{what}: input {tensor.name.split(':')[0]!r} takes shape (None, "
                                         f"{', '.join(str(d) for d in want)}), {path} is (None, "
                                         f"{', '.join(str(d) for d in shape)})")


def build_model(job: Job, shapes: Any, num_classes: int | None) -> Any:
    """The job's model for the dataset's features, checked against them (``check_model_inputs``)."""
    import tensorflow as tf

    from common.workload import models as models_mod

    if usercode.is_ref(job.model):  # shapes may be a dict or list of them, with None for variable lengths
        model = usercode.build_model(tf, job, shapes, num_classes)
    else:
        model = models_mod.build_model(job, shapes, num_classes)
    check_model_inputs(job, model, shapes)
    return model


def make_evaluator(ctx: RunContext, model: Any) -> evaluate.Evaluator | None:
    """The run's evaluator of the function's ``"validation"`` datasets, or None when it returned none."""
    assert ctx.plan.pipeline is not None
    dataset = ctx.plan.pipeline["validation"]
    if dataset is None:
        evaluate.say_no_evaluation(ctx.job, ctx.backend, ctx.trained_by.metrics)
        return None
    for name in ctx.trained_by.metrics:
        evaluate.metric_fn(name)  # UsageError (exit 2) before the first step for a name without per-example values
    return StreamEvaluator(ctx, model, dataset)


class StreamEvaluator(evaluate.Evaluator):
    """Every worker evaluates its own validation dataset whole, in the function's batches and order; the float64
    sums and the example count are then summed over workers (``backend.allsum``: every rank calls it at the same
    step), so every rank holds the same means. Same batches on both backends (same context), so the same numbers."""

    def __init__(self, ctx: RunContext, model: Any, dataset: Any) -> None:
        super().__init__(ctx.job, model, ctx.backend, (np.zeros(1), np.zeros(1)), ctx.plan.steps_per_epoch,
                         ctx.plan.total_steps, ctx.trained_by)
        self.dataset = dataset

    def values(self, ping: Callable[[], None] | None) -> dict[str, float]:
        names = ("loss", *self.spec.metrics)
        sums, n = [0.0] * len(names), 0
        for x, y in self.dataset:  # a fresh pass every evaluation
            parts = self._fn(x, y)
            for i, p in enumerate(parts):
                sums[i] += float(np.sum(p.numpy(), dtype=np.float64))
            n += int(parts[0].shape[0])
            if ping is not None:
                ping()
        *totals, count = self.backend.allsum([*sums, float(n)])
        return {name: s / count if count else float("nan") for name, s in zip(names, totals)}
