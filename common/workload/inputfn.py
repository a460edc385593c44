"""Input functions: ``dataset = "package.module:fn"`` whose first parameter is ``input_context``.

The field's contract (tf.distribute's ``distribute_datasets_from_function``; Horovod scripts shard by rank the same
way): ``fn(input_context, **dataset_args)`` returns this worker's own ``tf.data.Dataset``, sharded by
``input_context.input_pipeline_id`` of ``input_context.num_input_pipelines`` and batched with
``input_context.get_per_replica_batch_size(global_batch)``. Nothing of it is read into NumPy or a constant, and it is
called only in the ranks, never where a job is checked or a sweep submitted.

What twinbench adds, the same on both backends (the dataset function ``common.training.train.training_input`` hands
``Backend.make_dataset``, so every backend builds the same context for the same worker):
- the context: ``tf.distribute.InputContext(num_input_pipelines=workers, input_pipeline_id=worker index,
  num_replicas_in_sync=replicas)``, what tf.distribute gives that worker;
- TensorFlow's global seed set to the job's seed right before each call, so an unseeded shuffle draws the same seeds
  on every backend and in every call;
- ``input_batched = false`` only: ``batch(b, drop_remainder=True)`` of the function's elements;
- a finite dataset: its first steps of batches (the fewest any worker has: every worker takes as
  many steps), repeated (each pass an epoch); one of unknown length (tf.data cardinality: files, a filter) repeated
  as it is, ``steps`` then required; a resumed run skips the steps already done.
Nothing that reorders elements: the function's own parallelism, prefetch and options stay as it set them.

Also here: the facts the record keeps (``pipeline_facts``: a fingerprint of the first batches, batches per epoch,
files) and the checks of what a function returned (``InputFnError``: one line naming ``dataset``, exit 2).
No TensorFlow at import.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
from typing import Any

from common.core.errors import UsageError, one_line
from common.workload import usercode

PARAM = "input_context"  # the first parameter that makes a dataset function an input function
GLOBAL_BATCH = "global_batch_size"  # a parameter of that name gets the run's global batch (it varies with the world)
FINGERPRINT_BATCHES = 2  # batches per rank hashed into the record's fingerprint (read before training starts)
_KINDS: dict[tuple[str, str], bool] = {}


class InputFnError(usercode.UserCodeError, UsageError):
    """An input function or what it returned cannot be used: one line naming ``dataset``, exit status 2."""


# -- is it one? (no user code called) ---------------------------------------------------------------------------
def is_input_fn(job: Any) -> bool:
    """Does the job's ``dataset`` name a function whose first parameter is ``input_context``? Read from the
    module's source (``ast``) without importing it; imported (never called) only when the source does not say."""
    ref = job.dataset
    if not usercode.is_ref(ref):
        return False
    key = (ref, job.code_digest)
    if key not in _KINDS:
        first = _first_param_from_source(ref)
        if first is None:
            first = _first_param_imported(ref)
        _KINDS[key] = first == PARAM
    return _KINDS[key]


def _first_param_from_source(ref: str) -> str | None:
    try:
        _, files = usercode._locate("dataset", ref)
        tree = ast.parse(files[-1].read_text())
    except (usercode.UserCodeError, OSError, SyntaxError, IndexError, UnicodeDecodeError):
        return None
    name = ref.split(":")[1]
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            params = [*node.args.posonlyargs, *node.args.args]
            return params[0].arg if params else ""
    return None


def _first_param_imported(ref: str) -> str | None:
    try:
        params = list(inspect.signature(usercode.function("dataset", ref)).parameters)
    except (TypeError, ValueError):
        return None
    return params[0] if params else ""


# -- the context and the call -------------------------------------------------------------------------------------
def input_context(tf: Any, index: int, count: int, per: int) -> Any:
    """The ``tf.distribute.InputContext`` of input pipeline ``index`` of ``count``, each feeding ``per`` replicas."""
    return tf.distribute.InputContext(num_input_pipelines=count, input_pipeline_id=index,
                                      num_replicas_in_sync=count * per)


def call(tf: Any, job: Any, context: Any, b: int) -> tuple[Any, dict[str, Any]]:
    """(the training dataset, what else the function returned) from ``fn(context, **dataset_args)``, checked; a
    function with a ``global_batch_size`` parameter gets the run's (per-replica batch ``b`` x replicas) there."""
    kwargs = dict(job.dataset_args)
    if GLOBAL_BATCH in inspect.signature(usercode.function("dataset", job.dataset)).parameters:
        kwargs[GLOBAL_BATCH] = b * context.num_replicas_in_sync
    tf.random.set_seed(job.seed)  # unseeded shuffles draw the same op seeds in every call, on every backend
    out = usercode.call("dataset", job.dataset, context, **kwargs)
    ref, extra = job.dataset, {}
    if isinstance(out, dict):
        unknown = set(out) - {"train", "validation", "files"}
        if "train" not in out or unknown:
            raise InputFnError(f"dataset = {ref!r} returned a dict with keys {sorted(out)}: expected \"train\", "
                               "optionally \"validation\" and \"files\" (this worker's)")
        extra = {k: v for k, v in out.items() if k != "train"}
        out = out["train"]
        if extra.get("validation") is not None:
            _check_validation(tf, ref, extra["validation"])
    if not isinstance(out, tf.data.Dataset):
        raise InputFnError(f"dataset = {ref!r} returned a {type(out).__module__}.{type(out).__name__}: an input "
                           "function (first parameter input_context) returns this worker's tf.data.Dataset")
    _check_elements(ref, out.element_spec)
    return out, extra


def _check_validation(tf: Any, ref: str, ds: Any) -> None:
    if not isinstance(ds, tf.data.Dataset):
        raise InputFnError(f"dataset = {ref!r}: \"validation\" is a {type(ds).__name__}, not a tf.data.Dataset")
    _check_elements(ref, ds.element_spec)
    n = int(ds.cardinality())
    if n == int(tf.data.INFINITE_CARDINALITY) or n == 0:
        raise InputFnError(f"dataset = {ref!r}: the \"validation\" dataset is {'infinite' if n else 'empty'}: every "
                           "evaluation reads it whole")


def _check_elements(ref: str, spec: Any) -> None:
    if not isinstance(spec, tuple) or len(spec) != 2:
        raise InputFnError(f"dataset = {ref!r}: elements must be (features, labels) pairs, got {spec}")
    for path, s in _leaves(spec):
        dtype = getattr(s, "dtype", None)
        if dtype is None or not (dtype.is_floating or dtype.is_integer or dtype.is_bool):
            raise InputFnError(f"dataset = {ref!r}: element {path} is {s}: features and labels must be numeric "
                               "tensors (decode strings in the function)")


def _leaves(spec: Any, path: str = "") -> list[tuple[str, Any]]:
    """(a readable path such as features['ids'], the leaf) of a (features, labels) element spec."""
    if isinstance(spec, dict):
        return [leaf for k in sorted(spec) for leaf in _leaves(spec[k], f"{path}[{k!r}]")]
    if isinstance(spec, tuple | list):
        names = ("features", "labels") if path == "" and len(spec) == 2 else None
        return [leaf for i, s in enumerate(spec) for leaf in _leaves(s, names[i] if names else f"{path}[{i}]")]
    return [(path or "element", spec)]


def batched(tf: Any, job: Any, ds: Any, b: int) -> Any:
    """The function's dataset in per-replica batches of ``b``: batched by twinbench under ``input_batched = false``,
    else checked (a known leading dimension other than ``b``, or an element of rank 0, is refused)."""
    if not job.input_batched:
        return ds.batch(b, drop_remainder=True)
    for path, s in _leaves(ds.element_spec):
        dims = s.shape.as_list() if s.shape.rank is not None else None
        if dims is not None and (not dims or dims[0] not in (None, b)):
            got = "an unbatched scalar" if not dims else f"shape {dims}"
            raise InputFnError(f"dataset = {job.dataset!r}: {path} has {got}, not batches of "
                               f"input_context.get_per_replica_batch_size(global batch) = {b}; batch it, or set "
                               "input_batched = false to have twinbench batch its elements")
    return ds


def cardinality(tf: Any, ds: Any) -> int | None:
    """Batches in one pass, None when infinite or unknown to tf.data."""
    n = int(ds.cardinality())
    return n if n >= 0 else None


def training_stream(tf: Any, ds: Any, per_pass: int | None, per: int, start_step: int) -> Any:
    """What the loops iterate: a finite dataset's first ``per_pass`` steps (the fewest any worker has), repeated;
    then the steps a resumed run already did, skipped. Never auto-sharded (the function shards itself). A dataset
    of a length tf.data cannot tell (files, a filter) is repeated as it is: each worker starts its next pass when its
    own pass ends (a no-op if it is in fact infinite)."""
    if per_pass is not None:
        ds = ds.take(per_pass * per).repeat()
    elif int(ds.cardinality()) == int(tf.data.UNKNOWN_CARDINALITY):
        ds = ds.repeat()
    if start_step:
        ds = ds.skip(start_step * per)
    options = tf.data.Options()
    # the function shards by input_pipeline_id itself: tf.distribute must not shard again (several local replicas)
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options)


# -- the facts of one rank, before training ------------------------------------------------------------------------
def fingerprint(tf: Any, ds: Any, n: int, b: int, ref: str) -> tuple[str, Any]:
    """(sha256 of the first ``n`` batches' bytes, shapes and dtypes, 16 hex; the first batch's labels) of a fresh
    iteration of ``ds``; InputFnError if a batch is not ``b`` examples or there is none."""
    h = hashlib.sha256()
    first_labels = None
    for i, element in enumerate(ds.take(n)):
        for path, t in _leaves(element):
            leading = int(t.shape[0]) if t.shape.rank else None
            if leading != b:
                raise InputFnError(f"dataset = {ref!r}: batch {i} has {path} of shape {t.shape.as_list()}: every "
                                   f"batch must hold the per-replica batch of {b} examples (batch(..., "
                                   "drop_remainder=True))")
            h.update(f"{path}:{t.dtype.name}:{t.shape.as_list()}".encode() + t.numpy().tobytes())
        if first_labels is None:
            first_labels = element[1]
    if first_labels is None:
        raise InputFnError(f"dataset = {ref!r}: this worker's dataset is empty (fewer shards than workers? some "
                           "workers would get nothing)")
    return h.hexdigest()[:16], first_labels


def pipeline_facts(tf: Any, job: Any, plan_batch: int, index: int, count: int,
                   per: int) -> tuple[dict[str, Any], Any, Any]:
    """(this rank's facts: batches per epoch (None: infinite or unknown), files it reported, fingerprint...; its
    validation dataset or None; the first batch's first two labels as NumPy, in their structure (a dict, a tuple or
    one array), what the loss is checked on, or None when they are not dense tensors)."""
    ds, extra = call(tf, job, input_context(tf, index, count, per), plan_batch)
    ds = batched(tf, job, ds, plan_batch)
    batches = cardinality(tf, ds)
    if batches == 0:
        raise InputFnError(f"dataset = {job.dataset!r}: worker {index} of {count} got an empty dataset (fewer "
                           "shards than workers? some workers would get nothing)")
    try:
        digest, labels = fingerprint(tf, ds, FINGERPRINT_BATCHES, plan_batch, job.dataset)
    except InputFnError:
        raise
    except Exception as e:  # tf.errors while reading: the function's pipeline, named by its key
        raise InputFnError(f"dataset = {job.dataset!r}: reading worker {index}'s first batches raised "
                           f"{one_line(e)}") from None
    files = extra.get("files")
    return {"validation": extra.get("validation") is not None, "batches_per_epoch": batches, "fingerprint": digest,
            "files": None if files is None else len(list(files)),
            "input_shapes": _shapes(ds.element_spec[0])}, extra.get("validation"), _label_sample(tf, labels)


def _label_sample(tf: Any, labels: Any) -> Any:
    if not all(isinstance(t, tf.Tensor) for t in tf.nest.flatten(labels)):
        return None
    return tf.nest.map_structure(lambda t: t.numpy()[:2], labels)


def _shapes(spec: Any) -> Any:
    """The features' shapes without the batch dimension, in their structure (a dict, a tuple, or one shape)."""
    if isinstance(spec, dict):
        return {k: _shapes(v) for k, v in spec.items()}
    if isinstance(spec, tuple | list):
        return [_shapes(v) for v in spec]
    return [None if d is None else int(d) for d in spec.shape.as_list()[1:]]


def epoch_steps(job: Any, everyone: list[dict[str, Any]], per: int) -> tuple[int | None, int]:
    """(steps in one pass over the data: the fewest batches any worker has, None when infinite or unknown; steps
    per epoch: the job's ``steps_per_epoch`` when set, else that pass, else ``steps``) from every rank's facts."""
    for i, f in enumerate(everyone):
        if f["files"] == 0:
            raise InputFnError(f"dataset = {job.dataset!r}: worker {i} of {len(everyone)} was given no files "
                               "(fewer shards than workers: some workers would get nothing)")
    if len({f["validation"] for f in everyone}) > 1:
        raise InputFnError(f"dataset = {job.dataset!r} returned \"validation\" on some workers only: each evaluation "
                           "sums every worker's")
    counts = [f["batches_per_epoch"] for f in everyone]
    if None in counts:
        if job.steps <= 0:
            raise InputFnError(f"dataset = {job.dataset!r} is infinite or of unknown length (tf.data cardinality) "
                               "on some worker: set steps (and steps_per_epoch, the steps between evaluations)")
        return None, job.steps_per_epoch or job.steps
    per_pass = min(counts) // per
    if per_pass < 1:
        raise InputFnError(f"dataset = {job.dataset!r}: a worker has {min(counts)} batches, fewer than one step "
                           f"of its {per} replicas")
    return per_pass, job.steps_per_epoch or per_pass


def record_block(job: Any, everyone: list[dict[str, Any]], per_pass: int | None) -> dict[str, Any]:
    """The record's ``input.pipeline``: what the function gave each rank (no label values)."""
    return {
        "function": job.dataset,
        "batched_by": "function" if job.input_batched else "twinbench",
        "auto_sharded": False,  # twinbench's input paths never auto-shard: the function shards by its context
        "steps_per_pass": per_pass,  # None: infinite or of unknown length
        "input_shapes": everyone[0]["input_shapes"],
        "fingerprint_batches": FINGERPRINT_BATCHES,
        "per_rank": [{k: f[k] for k in ("fingerprint", "batches_per_epoch", "files")} for f in everyone],
        "validation": everyone[0]["validation"],  # evaluated on every worker's own share, summed over workers
    }
