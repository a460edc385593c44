"""The job's arguments against the functions that take them, and the job's paths, before anything runs or is queued.

``model_args``, ``dataset_args``, ``optimizer_args`` and ``lr_schedule_args`` are keyword arguments of the user's
functions (``"package.module:function"``), and ``loss`` (and each of ``loss_per_output``) is called as
``fn(y_true, y_pred)``. A misspelt argument or a missing one fails only when a rank calls the function: on a cluster,
after the queue. ``problems`` reads each function's parameters from its module's source (``ast``, as
``common.workload.inputfn`` detects an input function), without importing the user's code or TensorFlow, and says
what the call twinbench makes would refuse:

- a keyword the function has no parameter for (unless it takes ``**kwargs``: then it accepts anything);
- a parameter without a default that nothing gives;
- fewer positional parameters than twinbench passes (``input_shape, num_classes`` to a model with positional
  parameters besides model_args', nothing to one without: ``usercode.takes_model_inputs``; ``input_context`` to an
  input function, ``learning_rate`` to an optimizer, ``learning_rate, decay_steps`` to a schedule, ``y_true,
  y_pred`` to a loss), unless it takes ``*args``.

A function the source does not show plainly (decorated, assigned, imported from elsewhere, defined under an ``if``)
is not checked: no refusal without certainty. Builtin models and datasets take no arguments (``common.workload.job``
refuses them); a builtin optimizer's arguments are checked against its constructor's keyword arguments
(``BUILTIN_OPTIMIZER_ARGS``, tests/test_argcheck.py compares them with the installed Keras).

``missing_paths``: ``data_dir`` and every path-like ``dataset_args`` value (an absolute, ``~`` or ``./`` path, or
any string value of a key named like ``*dir``, ``*path``, ``*file(s)``, ``*pattern``, ``*glob``) must exist, a glob
must match something. Relative paths are taken from ``cwd``, the directory the runs start in.
"""

from __future__ import annotations

import ast
import difflib
import glob
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.workload import inputfn, usercode
from common.workload.job import JobError

# What twinbench passes positionally to each kind of user function, before the job's keyword arguments
POSITIONAL = {"model": ("input_shape", "num_classes"), "dataset": (), "optimizer": ("learning_rate",),
              "lr_schedule": ("learning_rate", "decay_steps"), "loss": ("y_true", "y_pred")}
ARGS_KEY = {"model": "model_args", "dataset": "dataset_args", "optimizer": "optimizer_args",
            "lr_schedule": "lr_schedule_args"}
# The legacy tf_keras optimizers' base class accepts these keyword arguments besides its constructor's
# (tf_keras/src/optimizers/legacy/optimizer_v2.py, allowed_kwargs; anything else is a TypeError).
_LEGACY_BASE = frozenset({"clipnorm", "clipvalue", "lr", "decay", "global_clipnorm"})
_KERAS3_BASE = frozenset({"weight_decay", "clipnorm", "clipvalue", "global_clipnorm", "use_ema", "ema_momentum",
                          "ema_overwrite_frequency", "loss_scale_factor", "gradient_accumulation_steps", "name",
                          "decay"})  # decay: popped with a warning (keras/src/optimizers/base_optimizer.py)
# (keras family, builtin optimizer name) -> the keyword arguments its constructor takes (learning_rate is twinbench's)
BUILTIN_OPTIMIZER_ARGS: dict[tuple[int, str], frozenset[str]] = {
    (2, "sgd"): frozenset({"momentum", "nesterov", "name"}) | _LEGACY_BASE,
    (2, "momentum"): frozenset({"momentum", "nesterov", "name"}) | _LEGACY_BASE,
    (2, "adam"): frozenset({"beta_1", "beta_2", "epsilon", "amsgrad", "name"}) | _LEGACY_BASE,
    (2, "adamw"): frozenset({"weight_decay", "beta_1", "beta_2", "epsilon", "amsgrad", "name"}) | _LEGACY_BASE,
    (3, "sgd"): frozenset({"momentum", "nesterov"}) | _KERAS3_BASE,
    (3, "momentum"): frozenset({"momentum", "nesterov"}) | _KERAS3_BASE,
    (3, "adam"): frozenset({"beta_1", "beta_2", "epsilon", "amsgrad"}) | _KERAS3_BASE,
    (3, "adamw"): frozenset({"beta_1", "beta_2", "epsilon", "amsgrad"}) | _KERAS3_BASE,
}
PATH_KEY_ENDINGS = ("dir", "path", "file", "files", "pattern", "glob")  # dataset_args keys that hold paths


@dataclass(frozen=True)
class Params:
    """A function's parameters as its source declares them."""

    positional: tuple[str, ...]  # positional-only and positional-or-keyword, in order
    positional_only: int  # how many of ``positional`` cannot be given by keyword
    keyword_only: tuple[str, ...]
    required: frozenset[str]  # parameters without a default
    var_args: bool  # *args
    var_kwargs: bool  # **kwargs

    def text(self, name: str) -> str:
        parts = [*self.positional, *(["*args"] if self.var_args else ["*"] if self.keyword_only else []),
                 *self.keyword_only, *(["**kwargs"] if self.var_kwargs else [])]
        return f"{name}({', '.join(parts)})"


def _params(args: ast.arguments, drop_self: bool) -> Params:
    positional = [a.arg for a in [*args.posonlyargs, *args.args]]
    n_defaults = len(args.defaults)
    with_default = set(positional[len(positional) - n_defaults:]) if n_defaults else set()
    required = {p for p in positional if p not in with_default}
    required |= {a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is None}
    posonly = len(args.posonlyargs)
    if drop_self and positional:
        required.discard(positional[0])
        positional, posonly = positional[1:], max(posonly - 1, 0)
    return Params(tuple(positional), posonly, tuple(a.arg for a in args.kwonlyargs), frozenset(required),
                  args.vararg is not None, args.kwarg is not None)


def source_params(key: str, ref: str) -> Params | None:
    """The parameters of the function (or class, by its own ``__init__``) ``ref`` names, read from its module's
    source; None when the source does not show them plainly. UserCodeError naming ``key`` when the module is
    missing or plainly has no such name."""
    _, files = usercode._locate(key, ref)
    try:
        tree = ast.parse(files[-1].read_text())
    except (OSError, SyntaxError, UnicodeDecodeError, IndexError):
        return None  # a compiled module, or one its own import will report
    name = ref.split(":")[1]
    found: ast.AST | None = None
    bound = False  # the name is bound some other way at the top level (assigned, imported, star-imported)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
            found = node
        elif isinstance(node, ast.Import | ast.ImportFrom | ast.Assign | ast.AnnAssign | ast.If | ast.Try
                        | ast.With | ast.For | ast.While):
            bound = bound or _may_bind(node, name)
    if found is None:
        if bound or _has_getattr(tree):
            return None
        raise usercode.UserCodeError(f"{key} = {ref!r}: module {ref.split(':')[0]!r} ({files[-1]}) has no function "
                                     f"{name!r}")
    if bound or getattr(found, "decorator_list", []):
        return None  # rebound or wrapped: its signature is not the one written
    if isinstance(found, ast.ClassDef):
        init = [n for n in found.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
        return _params(init[-1].args, drop_self=True) if init and not init[-1].decorator_list else None
    return _params(found.args, drop_self=False)  # type: ignore[attr-defined]


def _may_bind(node: ast.AST, name: str) -> bool:
    """Could ``node`` (a top-level statement) bind ``name``? Conservative: any mention counts."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.alias) and (sub.name == "*" or (sub.asname or sub.name.split(".")[0]) == name):
            return True
        if isinstance(sub, ast.Name) and sub.id == name and isinstance(sub.ctx, ast.Store):
            return True
        if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and sub.name == name:
            return True
    return False


def _has_getattr(tree: ast.Module) -> bool:
    """A module-level ``__getattr__`` can supply any name."""
    return any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body)


def call_problem(key: str, ref: str, params: Params, passed: tuple[str, ...], args_key: str | None,
                 args: Mapping[str, Any], supplied: frozenset[str] = frozenset()) -> str | None:
    """Why ``fn(*passed, **args)`` (plus the keywords twinbench supplies itself when the function has them,
    ``supplied``) would be refused by a function of ``params``, as one line naming the job key; or None."""
    name = ref.split(":")[1]
    sig = params.text(name)
    if len(params.positional) < len(passed) and not params.var_args:
        return (f"{key} = {ref!r}: {sig} takes {len(params.positional)} positional argument(s), twinbench passes "
                f"{len(passed)} ({', '.join(passed)})")
    taken = set(params.positional[:len(passed)])
    by_keyword = set(params.positional[max(len(passed), params.positional_only):]) | set(params.keyword_only)
    for arg in args:
        if arg in taken:
            return (f"{args_key}: {arg!r} is already passed to {ref} as a positional argument "
                    f"({', '.join(passed)}) by twinbench: {sig}")
        if arg not in by_keyword and not params.var_kwargs:
            close = difflib.get_close_matches(arg, sorted(by_keyword), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            return f"{args_key}: {arg!r} is not a parameter of {ref}{hint}: {sig}"
    given = taken | set(args) | (supplied & by_keyword)
    missing = [p for p in [*params.positional, *params.keyword_only] if p in params.required and p not in given]
    if missing:
        where = f"{args_key} does not give it" if args_key else "twinbench does not pass it"
        return f"{args_key or key}: {ref} needs {missing[0]!r} (no default) and {where}: {sig}"
    return None


def problems(job: Any) -> list[str]:
    """Every argument problem of the job's user functions and builtin optimizer, one line each (read from the
    sources, nothing imported or called). UserCodeError for a module that is missing or lacks the function."""
    out = []
    for key, ref in usercode.refs(job).items():
        kind = key if key in POSITIONAL else "loss"  # loss_per_output[...] entries are losses
        params = source_params(key, ref)
        if params is None:
            continue
        passed, supplied = POSITIONAL[kind], frozenset()
        if kind == "dataset" and params.positional[:1] == (inputfn.PARAM,):
            passed, supplied = (inputfn.PARAM,), frozenset({inputfn.GLOBAL_BATCH})
        elif kind == "dataset":  # a batch-size parameter the job does not give gets the global batch
            supplied = frozenset(usercode.BATCH_PARAMS)
        if kind == "model" and not usercode.model_inputs_rule(params.positional, params.var_args, job.model_args):
            passed = ()  # a model function without positional parameters is called with model_args only
        args_key = ARGS_KEY.get(kind)
        problem = call_problem(key, ref, params, passed, args_key, getattr(job, args_key) if args_key else {},
                               supplied)
        if problem:
            out.append(problem)
    known = BUILTIN_OPTIMIZER_ARGS.get((job.keras, job.optimizer))
    for arg in job.optimizer_args if known is not None else ():
        if arg not in known:
            close = difflib.get_close_matches(arg, sorted(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            out.append(f"optimizer_args: {arg!r} is not an argument of the {job.optimizer} optimizer "
                       f"(keras = {job.keras}){hint}: it takes {', '.join(sorted(known))}")
    return out


def _path_like(key: str, value: Any) -> bool:
    if not isinstance(value, str) or not value or "\n" in value:
        return False
    return value.startswith(("/", "~", "./", "../")) or key.lower().endswith(PATH_KEY_ENDINGS)


def missing_paths(job: Any, cwd: Path) -> list[str]:
    """A line per job path that does not exist here (``data_dir``, path-like ``dataset_args`` values, lists of
    them too), relative ones taken from ``cwd``; a glob must match at least one file."""
    out = []
    candidates: list[tuple[str, str]] = [("data_dir", job.data_dir)] if job.data_dir else []
    for k, v in sorted(job.dataset_args.items()):
        for item in v if isinstance(v, list) else [v]:
            if _path_like(k, item):
                candidates.append((f"dataset_args.{k}", item))
    for key, value in candidates:
        p = Path(os.path.expanduser(value))
        p = p if p.is_absolute() else cwd / p
        if glob.has_magic(str(p)):
            if not glob.glob(str(p)):
                out.append(f"{key} = {value!r}: no file matches {str(p)!r} here")
        elif not p.exists():
            out.append(f"{key} = {value!r}: {str(p)!r} does not exist here")
    return out


def refuse(job: Any, cwd: Path, *, paths: bool = True, path_hint: str = "") -> None:
    """JobError with the first argument problem (and, with ``paths``, the first missing path, followed by
    ``path_hint``), else nothing."""
    try:
        found = problems(job)
    except usercode.UserCodeError as e:
        raise JobError(str(e)) from None
    if found:
        raise JobError(found[0])
    missing = missing_paths(job, cwd) if paths else []
    if missing:
        raise JobError(missing[0] + path_hint)
