"""The user's own code in a job: ``model``, ``dataset`` and ``loss`` given as ``"package.module:function"``.

What this module owns (the objective itself stays in ``common.training.objective``):
- the reference format (``is_ref``) and the job's ``pythonpath`` (directories relative to the job file, resolved and
  put first on ``sys.path`` by ``common.workload.job.load_job`` in every rank, before any user module is imported);
- the job's identity for user code: ``code_digest``, a sha256 of the user modules' source files, found *without
  importing them* (``importlib.machinery.PathFinder``), so ``load_job`` stays free of user code and TensorFlow;
- importing and calling the user's functions, each failure one line naming the job key (``UserCodeError``: exit 2);
- the user's model (``build_model``): of the job's Keras family (``keras``: 2 = tf_keras, 3 = Keras 3; the other
  family is one line naming the key), functional, float32 output under mixed precision, and what the function's
  ``compile()`` gave a tf_keras model kept for ``common.training.compiled`` (``compiled_parts``). A model function
  without positional parameters (TensorFlow's tutorial's ``build_and_compile_cnn_model()``) is called with
  ``model_args`` only (``takes_model_inputs``; ``common.workload.argcheck`` reads the source by the same rule);
- the user's data in memory (``load_data``: arrays checked, labels checked against ``num_classes``).

This module imports nothing of the project above ``common.core`` (``common.workload.job`` imports it) and no
TensorFlow at import time.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any

import numpy as np

from common.core import tfquiet
from common.core.errors import UsageError, one_line
from common.workload import tfdata

# "package.module:function": dotted module path, a colon, a function name
_REF = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")
KEYS = ("model", "dataset", "loss", "optimizer", "lr_schedule")  # the job keys that may name user code
KERAS3_HINT = ("build it with tf.keras (twinbench sets TF_USE_LEGACY_KERAS=1, so tf.keras is tf_keras, Keras 2) or "
               "`import tf_keras as keras`, not `import keras` (Keras 3)")


class UserCodeError(ValueError, UsageError):
    """The user's code or data cannot be used; the message is one line naming the job key (exit status 2)."""


def is_ref(value: str) -> bool:
    """Is ``value`` a ``"package.module:function"`` reference (rather than a builtin name)?"""
    return ":" in value


def check_ref(key: str, value: str) -> str | None:
    """Why ``value`` is not a well-formed reference for job key ``key``, or None."""
    if _REF.fullmatch(value):
        return None
    return f"{key} = {value!r}: expected \"package.module:function\" (a dotted module path, a colon, a function name)"


def refs(job: Any) -> dict[str, str]:
    """The job keys that name user code, and their references."""
    found = {key: getattr(job, key) for key in KEYS if is_ref(getattr(job, key))}
    for name, value in sorted(getattr(job, "loss_per_output", {}).items()):  # checked in common/workload/job.py
        if isinstance(value, str) and is_ref(value):
            found[f"loss_per_output[{name!r}]"] = value
    return found


# ----------------------------------------------------------------------------------------------------------------
# pythonpath and the source digest (no user code imported)
# ----------------------------------------------------------------------------------------------------------------
def resolve_pythonpath(base: Path, entries: Iterable[str]) -> tuple[str, ...]:
    """Each entry resolved against ``base`` (the job file's directory); UserCodeError if one is not a directory."""
    out = []
    for entry in entries:
        p = (base / Path(entry).expanduser()).resolve()
        if not p.is_dir():
            raise UserCodeError(f"pythonpath entry {entry!r} is not a directory (resolved against the job file's "
                                f"directory {str(base)!r}: {str(p)!r})")
        out.append(str(p))
    return tuple(out)


def activate(paths: Iterable[str]) -> None:
    """Put ``paths`` first on ``sys.path``, in their order (an entry already there moves to the front)."""
    paths = list(paths)
    for p in reversed(paths):
        while p in sys.path:
            sys.path.remove(p)
        sys.path.insert(0, p)
    if paths:
        importlib.invalidate_caches()


def _locate(key: str, ref: str) -> tuple[Path, list[Path]]:
    """(the directory on sys.path holding the module's top-level package, the files of its packages and itself)."""
    module = ref.split(":")[0]
    parts = module.split(".")
    search: list[str] | None = None
    root: Path | None = None
    files: list[Path] = []
    for i in range(len(parts)):
        name = ".".join(parts[:i + 1])
        spec = PathFinder.find_spec(name, search)
        if spec is None or (search is None and spec.origin is None and not spec.submodule_search_locations):
            raise UserCodeError(f"{key} = {ref!r}: module {name!r} not found on the job's pythonpath or sys.path")
        if spec.origin and spec.has_location:
            files.append(Path(spec.origin))
        if root is None:
            top = Path(spec.origin) if spec.origin and spec.has_location else Path(
                list(spec.submodule_search_locations)[0]) / "__init__.py"
            root = top.parent.parent if top.name == "__init__.py" else top.parent
        search = list(spec.submodule_search_locations or [])
        if not search and i < len(parts) - 1:
            raise UserCodeError(f"{key} = {ref!r}: {name!r} is a module, not a package")
    assert root is not None
    return root, files


def code_digest(job_refs: dict[str, str], pythonpath: Iterable[str]) -> str:
    """sha256 of the user modules' sources: for a module under one of the job's ``pythonpath`` directories every
    ``.py`` file of its top-level package (its helpers too), for one elsewhere (an installed package) its own file
    and its packages' ``__init__.py``. Paths enter relative to their sys.path directory: equal on every machine."""
    mine = [Path(p) for p in pythonpath]
    chosen: dict[str, Path] = {}
    for key, ref in sorted(job_refs.items()):
        root, files = _locate(key, ref)
        top = root / ref.split(":")[0].split(".")[0]
        if any(root == d or d in root.parents for d in mine):
            files = sorted(top.rglob("*.py")) if top.is_dir() else files
        for f in files:
            if "__pycache__" not in f.parts:
                chosen[f.relative_to(root).as_posix()] = f
    h = hashlib.sha256()
    for rel in sorted(chosen):
        h.update(rel.encode() + b"\0" + chosen[rel].read_bytes() + b"\0")
    return h.hexdigest()[:16]


# ----------------------------------------------------------------------------------------------------------------
# importing and calling
# ----------------------------------------------------------------------------------------------------------------
def function(key: str, ref: str) -> Callable[..., Any]:
    """The function ``ref`` names (its module imported); UserCodeError naming ``key`` if it cannot be had."""
    module_name, attr = ref.split(":")
    if "tensorflow" not in sys.modules and module_name not in sys.modules:  # TensorFlow first, where it is quiet
        tfquiet.before_importing(_source(key, ref))
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # ImportError, SyntaxError, or anything the module raises at import
        raise UserCodeError(f"{key} = {ref!r}: cannot import module {module_name!r}: {one_line(e)}") from None
    fn = getattr(module, attr, None)
    if fn is None:
        raise UserCodeError(f"{key} = {ref!r}: module {module_name!r} ({getattr(module, '__file__', '?')}) has no "
                            f"function {attr!r}")
    if not callable(fn):
        raise UserCodeError(f"{key} = {ref!r}: {attr!r} in module {module_name!r} is a {type(fn).__name__}, "
                            "not a function")
    return fn


def _source(key: str, ref: str) -> Path | None:
    try:
        return _locate(key, ref)[1][-1]
    except (UserCodeError, IndexError):
        return None


def check_functions(job: Any) -> None:
    """Import every user module of the job and check each named function exists (before TensorFlow starts)."""
    for key, ref in refs(job).items():
        function(key, ref)


def call(key: str, ref: str, *args: Any, **kwargs: Any) -> Any:
    """``function(key, ref)(*args, **kwargs)``; an exception it raises becomes one line naming ``key``."""
    fn = function(key, ref)
    try:
        return fn(*args, **kwargs)
    except UserCodeError:
        raise
    except Exception as e:
        raise UserCodeError(f"{key} = {ref!r} raised {one_line(e)}") from None


# ----------------------------------------------------------------------------------------------------------------
# the model
# ----------------------------------------------------------------------------------------------------------------
def build_model(tf: Any, job: Any, input_shape: tuple[int, ...], num_classes: int | None) -> Any:
    """The user's model, ``function(input_shape, num_classes, **model_args)`` (``function(**model_args)`` for a
    function without other positional parameters: ``takes_model_inputs``): a model of the job's Keras family (``keras``:
    2 = tf.keras, i.e. tf_keras; 3 = Keras 3), made functional if it is not (fit needs its inputs, the loss check its
    output shape), its output cast to float32 under mixed precision (Keras 2 only). A tf_keras model the function
    compiled keeps its ``compile()`` for ``compiled_parts``; a compiled Keras 3 model is refused (one line)."""
    ref = job.model
    structured = isinstance(input_shape, dict | list)  # an input function's features: a shape per input
    inputs = (input_shape if structured else tuple(input_shape), num_classes)
    passed = inputs if takes_model_inputs(function("model", ref), job.model_args) else ()
    model = call("model", ref, *passed, **job.model_args)
    if job.keras == 3:
        if getattr(model, "compiled", False) is True:  # keras/src/trainers/trainer.py sets it in compile()
            raise UserCodeError(f"model = {ref!r} returned a compiled Keras 3 model: twinbench cannot carry its "
                                "compile() over to keras = 3 runs; return it uncompiled and set optimizer, "
                                "optimizer_args, learning_rate, loss and metrics in the job")
        return _keras3_model(ref, model, input_shape)
    if not isinstance(model, tf.keras.Model):
        raise UserCodeError(_wrong_family(ref, model, 2))
    compiled = compile_parts(tf, model)
    out = _functional(tf, job, ref, model, input_shape)
    if compiled is not None:
        _COMPILED[id(out)] = (out, compiled)
    return out


def takes_model_inputs(fn: Callable[..., Any], model_args: Iterable[str] = ()) -> bool:
    """Does a model function take twinbench's ``input_shape, num_classes``: yes unless it has no positional
    parameter besides those ``model_args`` names (and no ``*args``), as TensorFlow's tutorial's
    ``build_and_compile_cnn_model()``; one it cannot inspect is passed them. ``common.workload.argcheck`` reads the
    source by the same rule (``model_inputs_rule``)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return True
    return model_inputs_rule([p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)],
                             any(p.kind == p.VAR_POSITIONAL for p in params), model_args)


def model_inputs_rule(positional: Iterable[str], var_args: bool, model_args: Iterable[str]) -> bool:
    """The rule of ``takes_model_inputs`` on a function's positional parameters' names and its ``*args``."""
    return var_args or bool(set(positional) - set(model_args))


# id(model twinbench returns) -> (that model, its compile() parts): the functional model loses the user's compile
_COMPILED: dict[int, tuple[Any, dict[str, Any]]] = {}


def compiled_parts(model: Any) -> dict[str, Any] | None:
    """What the model function's ``compile()`` gave the model ``build_model`` returned (``compile_parts``), or None
    when it returned the model uncompiled."""
    found = _COMPILED.get(id(model))
    return found[1] if found is not None and found[0] is model else None


def compile_parts(tf: Any, model: Any) -> dict[str, Any] | None:
    """A tf_keras model's ``compile()`` as given (its arguments, the optimizer it made, whether the model class
    overrides ``train_step``), or None for a model never compiled."""
    if not getattr(model, "_is_compiled", False):
        return None
    given = dict(getattr(getattr(model, "_compile_config", None), "config", None) or {})
    return {**given, "optimizer": model.optimizer, "loss": given.get("loss"),
            "train_step": type(model).train_step is not tf.keras.Model.train_step}


def _functional(tf: Any, job: Any, ref: str, model: Any, input_shape: tuple[int, ...]) -> Any:
    """``model`` as a functional tf.keras model of float32 output."""
    try:
        if getattr(model, "_is_graph_network", False):  # functional, or Sequential with a known input
            inputs, outputs = model.inputs, model.output  # one tensor, or a dict / list of them
        else:  # subclassed: called once on a symbolic input
            inputs = tf.keras.Input(shape=tuple(input_shape), name="features")
            outputs = _one_or_structure(tf, model(inputs))
    except Exception as e:
        raise UserCodeError(f"model = {ref!r} cannot take input of shape {tuple(input_shape)}: {one_line(e)}") \
            from None
    if job.mixed_precision:  # as the builtins: the loss sees float32 even under mixed_float16
        flat = tf.nest.flatten(outputs)
        cast = [tf.keras.layers.Activation("linear", dtype="float32", name="float32_output" + (
            f"_{i}" if len(flat) > 1 else ""))(t) for i, t in enumerate(flat)]
        return tf.keras.Model(inputs, tf.nest.pack_sequence_as(outputs, cast), name=model.name)
    if inputs is model.inputs:
        return model
    return tf.keras.Model(inputs, outputs, name=model.name)


def _one_or_structure(tf: Any, outputs: Any) -> Any:
    """A model's outputs: its one tensor (also when wrapped in a list of one), else their structure (a dict of
    outputs by name, a list: common/training/outputs.py)."""
    flat = tf.nest.flatten(outputs)
    return flat[0] if len(flat) == 1 else outputs


def _wrong_family(ref: str, model: Any, keras: int) -> str:
    """Why ``model`` is not a model of the job's Keras family ``keras``: one line naming the keys."""
    kind = f"{type(model).__module__}.{type(model).__name__}"
    if keras == 2 and kind.startswith("keras."):
        return f"model = {ref!r} returned a Keras 3 model ({kind}): set keras = 3 in the job to train it as it is, " \
               f"or {KERAS3_HINT}"
    if keras == 3 and kind.startswith("tf_keras."):
        return f"model = {ref!r} returned a tf_keras (Keras 2) model ({kind}) but the job has keras = 3: build it " \
               "with `import keras` (Keras 3), or set keras = 2"
    return f"model = {ref!r} returned a {kind}, not a {'keras' if keras == 3 else 'tf.keras'}.Model"


def _keras3_model(ref: str, model: Any, input_shape: tuple[int, ...]) -> Any:
    """A Keras 3 model, functional (a subclassed one called once on a symbolic input)."""
    import keras

    if not isinstance(model, keras.Model):
        raise UserCodeError(_wrong_family(ref, model, 3))
    try:
        try:
            inputs, outputs = model.inputs, model.output  # functional, or Sequential with a known input
        except (AttributeError, ValueError):  # subclassed: no graph of its own
            inputs = keras.Input(shape=tuple(input_shape), name="features")
            outputs = _one_or_structure(keras.tree, model(inputs))
    except Exception as e:
        raise UserCodeError(f"model = {ref!r} cannot take input of shape {tuple(input_shape)}: {one_line(e)}") \
            from None
    if inputs is model.inputs:
        return model
    return keras.Model(inputs, outputs, name=model.name)


# ----------------------------------------------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class UserData:
    """A user dataset in memory, as given (no scaling), checked."""

    x: np.ndarray  # training features [N, ...]
    y: np.ndarray  # training labels / targets [N, ...]
    validation: tuple[np.ndarray, np.ndarray] | None  # the "validation" split, if the function gave one
    num_classes: int | None  # the job's num_classes when set, else max(label) + 1 for integer labels, else None
    call: str = ""  # how the function was called: "fn(batch_size=64)"
    done: tuple[str, ...] = ()  # what twinbench did to a tf.data.Dataset it returned (the banner's words)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.x.shape[1:])


BATCH_PARAMS = ("global_batch_size", "batch_size")  # a parameter of that name gets the run's global batch
_MEMO: dict[tuple[Any, ...], UserData] = {}  # per process: the data is asked for several times per run
_WORLD: dict[str, int] = {}  # the run's replicas, once the backend knows them (set_replicas)


def set_replicas(replicas: int) -> None:
    """The run's replica count: from now on a batch-size parameter gets per_replica_batch_size x ``replicas``."""
    _WORLD["replicas"] = replicas


def batch_param(job: Any) -> str | None:
    """The dataset function's parameter twinbench fills with the global batch (``BATCH_PARAMS``, the first the
    function has that ``dataset_args`` does not give), or None."""
    try:
        params = inspect.signature(function("dataset", job.dataset)).parameters
    except (TypeError, ValueError):
        return None
    return next((p for p in BATCH_PARAMS if p in params and p not in job.dataset_args), None)


def _kwargs(job: Any) -> dict[str, Any]:
    kwargs = dict(job.dataset_args)
    param = batch_param(job)
    if param:  # the tutorial's mnist_dataset(global_batch_size); one replica's until the world size is known
        kwargs[param] = job.per_replica_batch_size * _WORLD.get("replicas", 1)
    return kwargs


def _memo_key(job: Any, kwargs: dict[str, Any]) -> tuple[Any, ...]:
    return job.dataset, json.dumps(kwargs, sort_keys=True), job.num_classes, job.code_digest, job.seed


def load_data(job: Any) -> UserData:
    """Call the job's dataset function (once per process, job and batch argument) and check what it returned."""
    kwargs = _kwargs(job)
    key = _memo_key(job, kwargs)
    if key not in _MEMO:
        _MEMO[key] = _load(job, kwargs)
    return _MEMO[key]


def load_before_tf(job: Any) -> UserData | None:
    """The data before the backend configured TensorFlow, when that is possible: the function called as it is when
    its module's source never names tensorflow, else in a throwaway graph (``common.workload.tfdata.probe``:
    TensorFlow's runtime does not start). None when the data needs the ranks: a batch-size parameter (the world size
    is not known yet), a ``tf.data.Dataset`` returned (read there, after the backend's set-up), or a call that raised
    in the graph (called again there, eagerly, where its own error is said)."""
    if batch_param(job):
        return None
    kwargs = _kwargs(job)
    key = _memo_key(job, kwargs)
    if key not in _MEMO and not tfquiet.mentions(_source("dataset", job.dataset)):  # numpy alone: as it is
        _MEMO[key] = _load(job, kwargs)
    if key not in _MEMO:
        ok, out = tfdata.probe(lambda: function("dataset", job.dataset)(**kwargs), job.seed)
        if not ok:
            return None
        _MEMO[key] = _checked(job, out, _call_text(job, kwargs), ())
    return _MEMO[key]


def _call_text(job: Any, kwargs: dict[str, Any]) -> str:
    return f"{job.dataset.split(':')[1]}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"


def _load(job: Any, kwargs: dict[str, Any]) -> UserData:
    tf = sys.modules.get("tensorflow")
    if tf is None and tfquiet.mentions(_source("dataset", job.dataset)):  # first: quietly, and to seed the call
        tf = tfquiet.import_tensorflow()
    if tf is not None:  # an unseeded shuffle in the function then draws the same op seeds in every process
        tf.random.set_seed(job.seed)
    out = call("dataset", job.dataset, **kwargs)
    parts = out.values() if isinstance(out, dict) else [out]
    if tf is None and any(tfdata.is_dataset(p) for p in parts):  # it imported TensorFlow itself: seed, call again
        sys.modules["tensorflow"].random.set_seed(job.seed)
        out = call("dataset", job.dataset, **kwargs)
    done: list[str] = []
    return _checked(job, out, _call_text(job, kwargs), done)


def _checked(job: Any, out: Any, call_text: str, done: list[str] | tuple[str, ...]) -> UserData:
    ref = job.dataset
    if isinstance(out, dict):
        unknown = set(out) - {"train", "validation"}
        if "train" not in out or unknown:
            raise UserCodeError(f"dataset = {ref!r} returned a dict with keys {sorted(out)}: expected \"train\" and "
                                "optionally \"validation\"")
        train, val = out["train"], out.get("validation")
    else:
        train, val = out, None
    done = list(done)
    x, y = _pair(ref, train, "training", done)
    explicit = job.num_classes if job.num_classes > 0 else None
    num_classes = explicit
    if _is_int(y):
        num_classes = explicit or int(y.max()) + 1
        _check_labels(ref, y, num_classes, explicit, "training")
    validation = None
    if val is not None:
        vx, vy = _pair(ref, val, "validation", done)
        if vx.shape[1:] != x.shape[1:] or vy.shape[1:] != y.shape[1:]:
            raise UserCodeError(f"dataset = {ref!r}: validation arrays have shapes {vx.shape} and {vy.shape}, the "
                                f"training ones {x.shape} and {y.shape} (all but the first dimension must agree)")
        if num_classes is not None and _is_int(vy):
            _check_labels(ref, vy, num_classes, explicit, "validation")
        validation = (vx, vy)
    return UserData(x, y, validation, num_classes, call_text, tuple(done))


def _is_int(y: np.ndarray) -> bool:
    return np.issubdtype(y.dtype, np.integer)


def _check_labels(ref: str, y: np.ndarray, num_classes: int, explicit: int | None, split: str) -> None:
    lo, hi = int(y.min()), int(y.max())
    if lo < 0 or hi >= num_classes:
        where = f"num_classes = {explicit}" if explicit else "num_classes inferred as max(label) + 1"
        raise UserCodeError(f"dataset = {ref!r}: {split} labels out of range for {where}: found {lo}..{hi}, "
                            f"expected 0..{num_classes - 1}")


def _pair(ref: str, value: Any, split: str, done: list[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(features, labels) as numpy arrays from a tuple of arrays or a tf.data.Dataset (``common.workload.tfdata``:
    what it did is appended to ``done``)."""
    if tfdata.is_dataset(value):
        x, y, did = tfdata.read(sys.modules["tensorflow"], ref, value, split, UserCodeError)
        value = (x, y)
        if done is not None:
            done.append(did)
    if not isinstance(value, tuple | list) or len(value) != 2:
        raise UserCodeError(f"dataset = {ref!r}: {split} data is a {type(value).__name__}: expected a tuple "
                            "(features, labels) of numpy arrays or a tf.data.Dataset of (x, y)")
    x, y = (np.asarray(v) for v in value)
    found = [f"{split} {what} must be a numeric array with a first (sample) dimension, got {a.dtype} of shape "
             f"{a.shape}" for what, a in (("features", x), ("labels", y)) if a.ndim < 1 or a.dtype.kind not in "biuf"]
    if x.ndim and y.ndim and len(x) != len(y):
        found.append(f"{split} arrays of different lengths: {len(x)} features, {len(y)} labels")
    elif x.ndim and len(x) == 0:
        found.append(f"the {split} arrays are empty")
    if found:  # every problem at once
        raise UserCodeError(f"dataset = {ref!r}: {'; and '.join(found)}")
    return x, y
