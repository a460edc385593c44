"""The job: what is trained, identical for every backend and world size.

A job is a frozen, validated dataclass loaded from a TOML file (stdlib ``tomllib``) plus ``--set key=value``
overrides. Its ``job_hash`` covers every field that changes the math or the measurement protocol, and never
the backend or the world size: two runs with the same hash are comparable. This module never imports
TensorFlow, so bad input is rejected before TF starts. Model and dataset names, and which job keys each one reads,
come from the registries ``common.workload.models.MODELS`` and ``common.workload.datasets.DATASETS`` (both importable
without TF).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, as the PyPI package tomli (requirements.txt)
    import tomli as tomllib

from common.core.privacy import public
from common.workload import usercode
from common.workload.datasets import DATASETS
from common.workload.models import MODELS


class JobError(ValueError):
    """A job file or override is invalid; the message is one line meant for the user."""


OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
LR_SCHEDULES = ("constant", "cosine")
# 2: tf_keras (Keras 2, what tf.keras is under TF_USE_LEGACY_KERAS=1); 3: Keras 3 (``import keras``), custom loop only.
KERAS_FAMILIES = (2, 3)
MODES = ("fit", "ctl")
LR_SCALINGS = ("none", "linear")
# Keys only some models / datasets read: hashed only when the job's model or dataset lists them in its job_fields.
OPTIONAL_KEYS = ("mlp_hidden", "image_shape", "num_classes", "synthetic_samples", "tfrecord_sharding",
                 "tfrecord_label_offset")
TFRECORD_SHARDINGS = ("exact", "files")
# Keys added after jobs were first hashed: hashed only when not at their default, so older hashes stay valid.
LATER_KEYS = ("sync_every_steps", "steps_per_execution", "model_args", "dataset_args", "loss", "metrics",
              "eval_every_epochs", "target_metric", "target_value", "code_digest", "input_batched", "keras",
              "optimizer_args", "lr_schedule", "lr_schedule_args", "loss_per_output", "loss_weights")
# Never hashed: where the user's code lies on this machine (code_digest covers the code itself), and notes.
UNHASHED_KEYS = ("name", "pythonpath", "not_carried")
DEFAULT_LOSS = "sparse_categorical_crossentropy"
# Job keys load_job computes: a job file or --set cannot give them.
COMPUTED_KEYS = ("code_digest",)


@dataclass(frozen=True)
class Job:
    # --- identity (not hashed: a label only) ---
    name: str = "unnamed"  # free label shown in reports; renaming a job keeps its hash
    # --- model ---
    model: str = "mlp"  # a builtin of common.workload.models.MODELS | a tf.keras.applications name | "pkg.mod:function"
    model_args: dict[str, Any] = field(default_factory=dict)  # user model only: keyword arguments of its function
    mlp_hidden: tuple[int, ...] = (128,)  # MLP hidden layer widths (only for model = "mlp")
    weight_decay: float = 0.0  # L2 factor on kernels; a regularisation loss, scaled per replica in both backends
    # --- data ---
    dataset: str = "synthetic"  # a name of common.workload.datasets.DATASETS (synthetic, mnist...) | "pkg.mod:function"
    dataset_args: dict[str, Any] = field(default_factory=dict)  # user dataset only: keyword arguments of its function
    input_batched: bool = True  # input function only: it batches by the per-replica batch (false: twinbench does)
    data_dir: str = ""  # where the real dataset's files are; nothing is ever downloaded
    image_shape: tuple[int, ...] = (28, 28, 1)  # synthetic / image_folder input shape (H, W, C); others fix their own
    num_classes: int = 10  # synthetic / image_folder label count; user dataset: 0 or unset = max(label) + 1
    synthetic_samples: int = 2048  # size of the synthetic dataset (one epoch), deterministic from the seed
    tfrecord_sharding: str = "exact"  # tfrecord: exact (global order: parity holds, so default) | files (per rank)
    tfrecord_label_offset: int = 1  # tfrecord: subtracted from image/class/label (ImageNet's build writes 1..1000)
    # --- schedule ---
    per_replica_batch_size: int = 32  # samples per replica per step; global batch = this x replicas
    steps: int = 0  # total training steps; when > 0 it overrides epochs
    epochs: int = 1  # used when steps = 0
    steps_per_epoch: int = 0  # 0 = one pass over the data (dataset size // global batch)
    timing_warmup_steps: int = 2  # first steps excluded from step-time stats (tracing, allocator, autotune)
    # --- optimisation ---
    # sgd | momentum | adam | adamw (tf_keras legacy, or Keras 3's with keras = 3) | "pkg.mod:function"
    optimizer: str = "sgd"
    optimizer_args: dict[str, Any] = field(default_factory=dict)  # keyword arguments of the optimizer or function
    momentum: float = 0.9  # only for optimizer = "momentum"
    learning_rate: float = 0.01  # base LR for one replica's batch
    lr_scaling: str = "none"  # none | linear (LR x global_batch / per_replica_batch_size, Goyal et al.)
    warmup_epochs: int = 0  # whole epochs of linear LR warm-up from LR/replicas to the scaled LR (Horovod's rule)
    lr_schedule: str = "constant"  # constant | cosine (to 0 at the last step, after the warm-up) | "pkg.mod:function"
    lr_schedule_args: dict[str, Any] = field(default_factory=dict)  # user schedule only: keyword arguments
    # the default takes logits (what builtin models output) | a tf.keras.losses name | "pkg.mod:function" (per example)
    loss: str = DEFAULT_LOSS
    # a model with a dict of outputs: output name -> loss (a name or "pkg.mod:function"), summed with loss_weights
    loss_per_output: dict[str, Any] = field(default_factory=dict)
    loss_weights: dict[str, Any] = field(default_factory=dict)  # output name -> weight (1.0 when not named)
    # --- execution ---
    keras: int = 2  # 2 = tf_keras (Keras 2) | 3 = Keras 3 (import keras): mode = "ctl" only, builtins and applications
    mode: str = "fit"  # fit = Keras model.fit | ctl = custom tf.function training loop
    seed: int = 1234  # global seed: weights, synthetic data and shuffling
    mixed_precision: bool = False  # mixed_float16 policy with dynamic loss scaling
    xla: bool = False  # jit_compile the collective-free part of the step (the forward pass and its loss)
    # --- measurement ---
    # 25 keeps the harness tax under 2% on a 1 ms step; 1 gives per-step times (and a forced sync per step).
    sync_every_steps: int = 25  # host reads the losses (and marks the clock) every N steps
    steps_per_execution: int = 1  # Keras fit only: steps per tf.function call (compile(steps_per_execution=))
    # --- evaluation (on the user dataset's validation split) ---
    metrics: tuple[str, ...] = ()  # Keras metric names evaluated on the validation data; none by default
    eval_every_epochs: int = 1  # evaluate every N epochs (when there is something to evaluate): every epoch
    target_metric: str = ""  # "loss" or one of metrics: the record holds the time to target_value; "" = none
    target_value: float = 0.0  # the target of target_metric (unused without one)
    # --- user code (model, dataset, loss given as "package.module:function") ---
    pythonpath: tuple[str, ...] = ()  # directories relative to the job file, first on sys.path; none by default
    code_digest: str = ""  # computed by load_job: sha256 of the user modules' sources ("" = no user code)
    # --- the Horovod script a job was ported from (python -m common.port) ---
    not_carried: tuple[str, ...] = ()  # the script's constructs this job does not run, one line each; printed at start

    # ------------------------------------------------------------------
    def __post_init__(self) -> None:
        _validate(self)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        return d

    @property
    def job_hash(self) -> str:
        """sha256 (16 hex chars) of the canonical JSON of every field that is used, except ``name``."""
        d = self.to_dict()
        for key in UNHASHED_KEYS:
            d.pop(key)
        # Keys the job does not use cannot change its math: leave them out so equal jobs hash equal.
        spec = MODELS.get(self.model)  # None: a tf.keras.applications or user model, which reads no optional key
        data = DATASETS.get(self.dataset)  # None: a user dataset, which reads num_classes
        used = set(data.job_fields if data else ("num_classes",)) | set(spec.job_fields if spec else ())
        for key in OPTIONAL_KEYS:
            if key not in used:
                d.pop(key)
        if self.optimizer != "momentum":
            d.pop("momentum")
        for key in LATER_KEYS:
            if d[key] == _jsonable(default_of(key)):
                d.pop(key)
        # Hashed as published: the record writes home directories as ~ (common/core/privacy.py), and a reader
        # recomputes this hash from the record's job.
        blob = json.dumps(public(d), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    # --- the host sees the device only between Keras executions: syncs and the timed window start there ---
    @property
    def sync_interval(self) -> int:
        """sync_every_steps rounded up to whole executions."""
        return -(-self.sync_every_steps // self.steps_per_execution) * self.steps_per_execution

    @property
    def warmup_interval(self) -> int:
        """timing_warmup_steps rounded up to whole executions."""
        return -(-self.timing_warmup_steps // self.steps_per_execution) * self.steps_per_execution

    # --- quantities derived for a given number of replicas (runtime, never part of the identity) ---
    def global_batch_size(self, replicas: int) -> int:
        return self.per_replica_batch_size * replicas

    def scaled_learning_rate(self, replicas: int) -> float:
        if self.lr_scaling == "linear":
            return self.learning_rate * replicas
        return self.learning_rate

    def resolve_steps(self, dataset_size: int, replicas: int) -> tuple[int, int]:
        """(steps_per_epoch, total_steps) for this world size; JobError if the data cannot fill one step."""
        gb = self.global_batch_size(replicas)
        spe = self.steps_per_epoch or dataset_size // gb
        if spe < 1:
            raise JobError(
                f"dataset has {dataset_size} samples, fewer than one global batch of {gb} "
                f"({self.per_replica_batch_size} per replica x {replicas}); lower per_replica_batch_size"
            )
        total = self.steps if self.steps > 0 else self.epochs * spe
        return spe, total


FIELDS = {f.name: f for f in dataclasses.fields(Job)}


def default_of(key: str) -> Any:
    """The default of job key ``key`` (a fresh one for the dict keys)."""
    f = FIELDS[key]
    return f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _is_keras_app_name(name: str) -> bool:
    # keras.applications names start upper case (ResNet50, MobileNetV2, EfficientNetB0...); checked against
    # the real module only once TensorFlow is loaded (common.workload.models).
    return bool(name) and name[0].isupper() and name.replace("_", "").isalnum()


def _validate(job: Job) -> None:
    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise JobError(msg)

    need(job.model in MODELS or _is_keras_app_name(job.model) or usercode.is_ref(job.model),
         f"unknown model {job.model!r}: use one of {', '.join(MODELS)} or a tf.keras.applications name "
         "such as ResNet50 (your own: \"package.module:function\")")
    need(job.dataset in DATASETS or usercode.is_ref(job.dataset),
         f"unknown dataset {job.dataset!r} (your own: \"package.module:function\"): use one of "
         f"{', '.join(DATASETS)}")
    _validate_user_code(job, need)
    need(job.optimizer in OPTIMIZERS or usercode.is_ref(job.optimizer),
         f"unknown optimizer {job.optimizer!r}: use one of {', '.join(OPTIMIZERS)} or \"package.module:function\"")
    need(job.lr_schedule in LR_SCHEDULES or usercode.is_ref(job.lr_schedule),
         f"unknown lr_schedule {job.lr_schedule!r}: use constant, cosine or \"package.module:function\"")
    need(job.mode in MODES, f"unknown mode {job.mode!r}: use fit or ctl")
    need(job.lr_scaling in LR_SCALINGS, f"unknown lr_scaling {job.lr_scaling!r}: use none or linear")
    need(job.per_replica_batch_size >= 1, f"per_replica_batch_size must be >= 1, got {job.per_replica_batch_size}")
    need(job.steps >= 0, f"steps must be >= 0 (0 = use epochs), got {job.steps}")
    need(job.epochs >= 1, f"epochs must be >= 1, got {job.epochs}")
    need(job.steps_per_epoch >= 0,
         f"steps_per_epoch must be >= 0 (0 = one pass over the data), got {job.steps_per_epoch}")
    need(job.timing_warmup_steps >= 0, f"timing_warmup_steps must be >= 0, got {job.timing_warmup_steps}")
    need(math.isfinite(job.learning_rate) and job.learning_rate > 0,
         f"learning_rate must be > 0, got {job.learning_rate}")
    need(0 <= job.momentum < 1, f"momentum must be in [0, 1), got {job.momentum}")
    need(job.warmup_epochs >= 0, f"warmup_epochs must be >= 0, got {job.warmup_epochs}")
    need(math.isfinite(job.weight_decay) and job.weight_decay >= 0,
         f"weight_decay must be >= 0, got {job.weight_decay}")
    user_data = usercode.is_ref(job.dataset)
    need(job.num_classes >= 2 or (user_data and job.num_classes == 0),
         f"num_classes must be >= 2, got {job.num_classes}" + (" (0 = inferred from the labels)" if user_data else ""))
    need(job.synthetic_samples >= 1, f"synthetic_samples must be >= 1, got {job.synthetic_samples}")
    need(len(job.image_shape) == 3 and all(d >= 1 for d in job.image_shape),
         f"image_shape must be [height, width, channels] with positive sizes, got {list(job.image_shape)}")
    need(all(w >= 1 for w in job.mlp_hidden), f"mlp_hidden widths must be >= 1, got {list(job.mlp_hidden)}")
    need(0 <= job.seed < 2**31, f"seed must be in [0, 2^31), got {job.seed}")
    need(job.tfrecord_sharding in TFRECORD_SHARDINGS,
         f"unknown tfrecord_sharding {job.tfrecord_sharding!r}: use exact or files")
    need(job.tfrecord_label_offset >= 0, f"tfrecord_label_offset must be >= 0, got {job.tfrecord_label_offset}")
    _validate_execution(job, need)
    _validate_keras(job, need)
    _validate_evaluation(job, need)
    _validate_outputs(job, need)
    if not user_data and DATASETS[job.dataset].needs_data_dir:
        need(bool(job.data_dir), f"dataset {job.dataset!r} needs data_dir (nothing is downloaded); "
             f"set it in the job file or with --set data_dir=PATH")


def _validate_user_code(job: Job, need: Any) -> None:
    """model / dataset / loss as "package.module:function", their arguments, pythonpath."""
    for key in usercode.KEYS:
        value = getattr(job, key)
        if usercode.is_ref(value):
            reason = usercode.check_ref(key, value)
            need(reason is None, reason or "")
    need(job.loss == DEFAULT_LOSS or usercode.is_ref(job.loss) or job.loss.replace("_", "").isalnum(),
         f"loss = {job.loss!r}: use a tf.keras.losses name (such as \"mse\") or \"package.module:function\"")
    for key, owner in (("model_args", "model"), ("dataset_args", "dataset"), ("optimizer_args", "optimizer"),
                       ("lr_schedule_args", "lr_schedule")):
        args = getattr(job, key)
        need(isinstance(args, dict) and all(isinstance(k, str) and k.isidentifier() for k in args),
             f"{key} must be a table of keyword arguments, got {args!r}")
        # a builtin optimizer takes its constructor's keyword arguments too (AdamW's weight_decay...)
        need(not args or usercode.is_ref(getattr(job, owner)) or key == "optimizer_args",
             f"{key} applies to a user {owner} ({owner} = \"package.module:function\"), not to {getattr(job, owner)!r}")
        try:
            json.dumps(args, allow_nan=False)
        except (TypeError, ValueError):
            need(False, f"{key}: values must be strings, numbers, booleans, lists or tables, got {args!r}")
    need(job.input_batched or usercode.is_ref(job.dataset),
         f"input_batched applies to a user input function (dataset = \"package.module:function\"), not to "
         f"{job.dataset!r}")
    need(job.weight_decay == 0 or not usercode.is_ref(job.model),
         "weight_decay applies to builtin models: a user model puts its own regularizers on its layers (their "
         "losses are added to the objective)")
    need(all(isinstance(p, str) and p for p in job.pythonpath),
         f"pythonpath must be a list of directories, got {list(job.pythonpath)}")
    need(all(isinstance(t, str) and t.strip() and "\n" not in t for t in job.not_carried),
         f"not_carried must be a list of one-line texts, got {list(job.not_carried)}")


def _validate_evaluation(job: Job, need: Any) -> None:
    """The evaluation keys (used by the evaluation of the validation split)."""
    need(all(isinstance(m, str) and m.replace("_", "").isalnum() for m in job.metrics),
         f"metrics must be Keras metric names such as \"accuracy\", got {list(job.metrics)}")
    need(len(set(job.metrics)) == len(job.metrics), f"metrics lists a name twice: {list(job.metrics)}")
    need(job.eval_every_epochs >= 1, f"eval_every_epochs must be >= 1, got {job.eval_every_epochs}")
    need(job.target_metric in ("", "loss", *job.metrics),
         f"target_metric = {job.target_metric!r}: use \"loss\" or one of metrics ({', '.join(job.metrics) or 'none'})")
    need(math.isfinite(job.target_value), f"target_value must be a finite number, got {job.target_value}")


def _validate_outputs(job: Job, need: Any) -> None:
    """A model with several outputs: ``loss_per_output``, a table output name -> loss (each a ``tf.keras.losses``
    name or ``"package.module:function"``, a per-example loss of that output), and ``loss_weights``, a table output
    name -> number (only with ``loss_per_output``; an output it does not name weighs 1.0, Keras' default). The model
    returns a dict of outputs with exactly those names and the labels are a dict with the same keys; the per-example
    objective is the weighted sum of the outputs' per-example losses, what Keras ``compile(loss=dict,
    loss_weights=dict)`` minimises (built in ``common.training.objective``). ``loss = "package.module:function"`` is
    the other way to train such a model (one function taking the label and output structures): the two exclude
    each other."""
    per, weights = job.loss_per_output, job.loss_weights
    need(not weights or bool(per), "loss_weights applies to loss_per_output (a loss per output): set "
         "loss_per_output too")
    if not per:
        return
    need(job.loss == DEFAULT_LOSS, f"loss = {job.loss!r} and loss_per_output: give one of them (loss_per_output: a "
         "loss per output; loss = \"package.module:function\": one loss over all outputs)")
    for name, value in per.items():
        key = f"loss_per_output[{name!r}]"
        is_name = isinstance(value, str) and bool(value) and value.replace("_", "").isalnum()  # checked by Keras later
        need(isinstance(value, str) and (is_name or usercode.is_ref(value)), f"{key} = {value!r}: use a "
             "tf.keras.losses name (such as \"mse\") or \"package.module:function\"")
        reason = usercode.check_ref(key, value) if usercode.is_ref(value) else None
        need(reason is None, reason or "")
    for name, w in weights.items():
        need(name in per, f"loss_weights[{name!r}]: no such output in loss_per_output ({', '.join(sorted(per))})")
        need(not isinstance(w, bool) and isinstance(w, int | float) and math.isfinite(w) and w >= 0,
             f"loss_weights[{name!r}] must be a number >= 0, got {w!r}")
    need(not job.metrics, f"metrics = {list(job.metrics)} with loss_per_output: metrics are computed for "
         "single-output models only (the validation loss is always computed; target_metric = \"loss\" works)")


def loss_weights_of(job: Job) -> dict[str, float]:
    """Every output of ``loss_per_output`` with its weight: ``loss_weights``' where given, else 1.0."""
    return {name: float(job.loss_weights.get(name, 1.0)) for name in sorted(job.loss_per_output)}


def _validate_keras(job: Job, need: Any) -> None:
    """keras = 3 runs what twinbench supports for Keras 3 (common/training/keras3.py); the rest is one line here."""
    need(job.keras in KERAS_FAMILIES, f"keras must be 2 (tf_keras) or 3 (Keras 3), got {job.keras}")
    # the schedule is set from the host before each step, and fit sees the host only between executions
    need(job.lr_schedule == "constant" or job.steps_per_execution == 1,
         f"lr_schedule = {job.lr_schedule!r} sets the learning rate before every step: use steps_per_execution = 1")
    if job.keras == 2:
        return
    # Keras 3's fit under MultiWorkerMirroredStrategy fails (TF 2.21, Keras 3.15.1, 2 workers: "ValueError: Attempt
    # to convert a value (PerReplica:...)"), and Horovod's Keras module does not take Keras 3 variables (Horovod
    # issue 4290): fit stays tf_keras'.
    need(job.mode == "ctl", "keras = 3 runs the custom loop only: set mode = \"ctl\" (Keras 3's fit fails under "
         "MultiWorkerMirroredStrategy, and Horovod's Keras module does not take Keras 3 variables)")
    for key in ("mixed_precision", "xla"):
        need(not getattr(job, key), f"{key} is not supported with keras = 3 (twinbench's Keras 3 loop is float32, "
             "without XLA): set it to false or use keras = 2")


def _validate_execution(job: Job, need: Any) -> None:
    """Host syncs and Keras executions: the harness can only read the device between two executions."""
    spe = job.steps_per_execution
    need(job.sync_every_steps >= 1, f"sync_every_steps must be >= 1, got {job.sync_every_steps}")
    need(spe >= 1, f"steps_per_execution must be >= 1, got {spe}")
    if spe == 1:
        return
    need(job.mode == "fit", f"steps_per_execution = {spe} applies to mode = \"fit\" only (the custom loop runs "
         "one step per call); set it to 1")
    for key in ("steps", "steps_per_epoch"):
        value = getattr(job, key)
        need(value % spe == 0, f"{key} = {value} must be a multiple of steps_per_execution = {spe} (the host "
             "sees the device only between executions)")


def _coerce(key: str, value: Any, *, from_string: bool) -> Any:
    """Type-check (and, for --set strings, parse) one value against the field's declared type."""
    kind = type(default_of(key))
    strings = FIELDS[key].type.startswith("tuple[str")
    if from_string:
        text = value.strip()
        try:
            if kind is dict:
                return _coerce(key, json.loads(text) if text else {}, from_string=False)
            if strings:  # a comma-separated list of strings
                return tuple(p.strip() for p in text.strip("[]()").split(",") if p.strip())
            if kind is bool:
                low = text.lower()
                if low not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                    raise ValueError
                return low in ("true", "1", "yes", "on")
            if kind is int:
                return int(text)
            if kind is float:
                return float(text)
            if kind is tuple:
                parts = [p for p in text.strip("[]() ").split(",") if p.strip()]
                return tuple(int(p) for p in parts)
            return text
        except ValueError:  # json.JSONDecodeError too
            raise JobError(f"--set {key}={value}: expected {_type_name(kind, strings)}") from None
    # values from TOML: exact types, ints accepted for floats, lists for tuples
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    item = str if strings else int
    if kind is tuple and isinstance(value, list) and all(type(v) is item for v in value):
        return tuple(value)
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise JobError(f"job key {key!r}: expected {_type_name(kind, strings)}, got {type(value).__name__} {value!r}")
    return value


def _type_name(kind: type, strings: bool = False) -> str:
    if strings:
        return "a list of strings"
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string",
            tuple: "a list of integers", dict: "a table (in --set: JSON text such as {\"width\": 32})"}[kind]


def _suggest(key: str) -> str:
    import difflib

    close = difflib.get_close_matches(key, FIELDS, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def parse_sets(sets: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in sets:
        if "=" not in item:
            raise JobError(f"--set {item!r}: expected key=value")
        k, v = item.split("=", 1)
        k = k.strip()
        if k not in FIELDS:
            raise JobError(f"--set {k}: unknown job key{_suggest(k)}; keys: {', '.join(FIELDS)}")
        out[k] = v
    return out


def load_job(path: str | Path | None, sets: list[str] | tuple[str, ...] = ()) -> Job:
    """Load a job TOML (flat table of keys) and apply ``--set`` overrides; raises JobError on any problem.

    With user code (``model``, ``dataset`` or ``loss`` = "package.module:function"): ``pythonpath`` is resolved
    against the job file's directory (every entry must exist) and put first on ``sys.path``, and the job gets the
    ``code_digest`` of the user modules' sources (found, not imported). Every rank and launcher calls this.
    """
    values = _read_values(path, sets)
    given = frozenset(values)
    if usercode.is_ref(str(values.get("dataset", ""))):
        values.setdefault("num_classes", 0)  # not set: inferred from the labels
    job = Job(**values)
    base = Path(path).resolve().parent if path is not None else Path.cwd()
    try:
        pythonpath = usercode.resolve_pythonpath(base, job.pythonpath)
        usercode.activate(pythonpath)
        job_refs = usercode.refs(job)
        digest = usercode.code_digest(job_refs, pythonpath) if job_refs else ""
    except usercode.UserCodeError as e:
        raise JobError(str(e)) from None
    job = dataclasses.replace(job, pythonpath=pythonpath, code_digest=digest)
    object.__setattr__(job, "_given", given)  # not a field: neither hashed nor recorded (given_keys)
    return job


def given_keys(job: Job) -> frozenset[str]:
    """The keys the job file or --set gave, even at their default (load_job's); else those not at their default."""
    default = frozenset(k for k in FIELDS if k not in COMPUTED_KEYS and getattr(job, k) != default_of(k))
    return getattr(job, "_given", default)


def _read_values(path: str | Path | None, sets: list[str] | tuple[str, ...]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise JobError(f"job file {str(p)!r} not found")
        try:
            raw = tomllib.loads(p.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise JobError(f"job file {str(p)!r} is not valid TOML: {e}") from None
        for k, v in raw.items():
            if k not in FIELDS:
                raise JobError(f"job file {str(p)!r}: unknown key {k!r}{_suggest(k)}")
            if k in COMPUTED_KEYS:
                raise JobError(f"job file {str(p)!r}: {k!r} is computed by twinbench, not a key to set")
            values[k] = _coerce(k, v, from_string=False)
        values.setdefault("name", p.stem)
    for k, v in parse_sets(list(sets)).items():
        if k in COMPUTED_KEYS:
            raise JobError(f"--set {k}: computed by twinbench, not a key to set")
        values[k] = _coerce(k, v, from_string=True)
    return values


def job_from_dict(d: dict[str, Any]) -> Job:
    """Rebuild a Job from a results JSON's ``job`` field (exact round trip of ``to_dict``)."""
    return Job(**{k: _coerce(k, v, from_string=False) for k, v in d.items()})
