"""``python -m common.port SCRIPT [--out DIR]``: a Horovod TensorFlow 2 training script, read (never imported or run),
turned into a twinbench job, a line-by-line migration table and a MultiWorkerMirroredStrategy port.

It reads the script's syntax tree (``ast``) and writes to DIR (default ``<stem>.port/`` beside the script):

- ``job.toml`` and ``<stem>_code.py``: the script's own model and dataset code moved verbatim into the two
  functions the job names (``model = "<stem>_code:build_model"``, ``dataset = "<stem>_code:load_data"``), a comment
  naming each source line range; in moved code ``hvd.size()`` reads 1 and ``hvd.rank()`` / ``hvd.local_rank()`` 0
  (the functions describe the whole job: twinbench scales and shards), each such line commented. The Horovod parts
  become job keys (the LR x ``hvd.size()``: ``lr_scaling = "linear"``; ``LearningRateWarmupCallback``:
  ``warmup_epochs``; the batch; epochs and steps, those written ``N // hvd.size()`` at their 1-worker value), and
  what twinbench cannot honour is listed in ``not_carried`` (printed by every run at its start). The module is not
  ``code.py``: the standard library has a module ``code`` (pdb imports it), which a job could not shadow.
- ``MIGRATION.md``: a row per Horovod construct, by line: what it does under Horovod, its MultiWorkerMirroredStrategy
  counterpart, what this port did with it and what twinbench proved about that counterpart; the data order; what was
  left by hand.
- ``<stem>_mwms.py``: the script as a user would write it for MultiWorkerMirroredStrategy (``common.port_mwms``).

What it does not recognise (a training step of the script's own, a callback it does not know, a statement it cannot
place) is named by file:line in MIGRATION.md and on stderr, never guessed: exit 3. Exit 0 when everything was
recognised. Exit 2, one line and nothing written, for a file that is not Python, not TensorFlow 2 or not Horovod,
an ``--out`` that exists and is not empty, or a script whose model or dataset cannot be found. Everything is written
into a temporary directory beside DIR and renamed to DIR at the end. No TensorFlow in this process.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import os
import re
import shutil
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import port_mwms
from common.workload import argcheck
from common.workload.job import JobError, load_job

PROG = "common.port"
EXIT_OK, EXIT_USAGE, EXIT_BY_HAND = 0, 2, 3
HOROVOD_TF = ("horovod.tensorflow", "horovod.tensorflow.keras", "horovod.keras")  # the modules a TF2 script imports
# TensorFlow 1 names: a script using one is not TensorFlow 2 (Horovod's tensorflow_*.py, keras_*.py examples)
TF1_NAMES = ("Session", "placeholder", "ConfigProto", "compat.v1", "train.MonitoredTrainingSession",
             "train.GradientDescentOptimizer", "train.AdamOptimizer", "train.MomentumOptimizer",
             "enable_eager_execution", "get_default_graph", "global_variables_initializer")
OPTIMIZER_CLASSES = {"SGD": "sgd", "Adam": "adam"}  # tf.keras optimizer class -> the job's builtin optimizer


class PortError(Exception):
    """Bad input: one line, exit 2, nothing written."""


@dataclass
class Row:
    """One Horovod construct of the script, by line."""

    line: int
    construct: str
    horovod: str  # what it does under Horovod
    mwms: str  # its MultiWorkerMirroredStrategy counterpart (the TensorFlow API)
    here: str  # what this port did with it (a job key, moved code, not carried, by hand)
    proof: str  # what twinbench proved about the counterpart, or "not checked here" and why


@dataclass
class Port:
    """What the analysis found: the job's keys, the code moved, the table, what is left by hand."""

    script: Path
    source: str
    tree: ast.Module
    hvd: set[str]
    keys: dict[str, Any] = field(default_factory=dict)
    notes: dict[int, str] = field(default_factory=dict)  # id(hvd call node) -> what the port made of it
    by_hand: list[str] = field(default_factory=list)  # "file:line: what"
    not_carried: list[str] = field(default_factory=list)
    data_order: list[str] = field(default_factory=list)
    used: set[int] = field(default_factory=set)  # lines accounted for (moved, turned into keys, Horovod-only)
    helpers: dict[int, ast.stmt] = field(default_factory=dict)  # module-level code the functions need, by line
    functions: list[tuple[str, list[ast.stmt], str, str]] = field(default_factory=list)  # name, body, result, doc
    proofs: dict[int, str] = field(default_factory=dict)  # id(hvd call node) -> what proved it, where it differs
    flags: dict[str, Any] | None = None  # the script's argparse defaults, when the moved code reads its flags
    rows: list[Row] = field(default_factory=list)
    extra_rows: list[Row] = field(default_factory=list)  # constructs of the script that are not Horovod calls
    flags_name: str = ""  # the name argparse's parse_args() result is bound to (``args``)
    main_name: str = ""  # the function that calls hvd.init() (Horovod's ``main``), "" for module-level code
    code: str = ""  # the moved code's module

    def where(self, node: ast.AST) -> str:
        return f"{self.script.name}:{node.lineno}"

    def hand(self, node: ast.AST, what: str) -> None:
        line = f"{self.where(node)}: {what}"
        if line not in self.by_hand:
            self.by_hand.append(line)

    def text(self, node: ast.AST) -> str:
        return ast.get_source_segment(self.source, node) or ""

    def drop(self, node: ast.AST, what: str, row: str = "") -> None:
        """``what`` into the job's not_carried; ``row``: a construct without a Horovod call of its own (a Keras
        callback, a checkpoint, metrics), given a row of the table from KERAS_ROWS."""
        self.not_carried.append(f"{what} ({self.where(node)})")
        if row:
            horovod, mwms = KERAS_ROWS[row]
            self.extra_rows.append(Row(node.lineno, row, horovod, mwms, "not carried: the job's not_carried",
                                       P_NONE + "twinbench does not run the script's own " + row.split(" ")[0]))


# -- reading -------------------------------------------------------------------------------------------------------
def dotted(node: ast.AST) -> str:
    """``a.b.c`` for a Name/Attribute chain, else ""."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return ""
    return ".".join([node.id, *reversed(parts)])


def hvd_name(node: ast.AST, hvd: set[str]) -> str:
    """``DistributedOptimizer`` for a call of ``hvd.DistributedOptimizer`` (any alias of a Horovod module), else ""."""
    name = dotted(node.func) if isinstance(node, ast.Call) else ""
    head, _, rest = name.partition(".")
    return rest if head in hvd and rest else ""


def read_script(path: Path) -> tuple[str, ast.Module, set[str]]:
    """(source, tree, the names the Horovod TensorFlow module is bound to); PortError for what is not one."""
    if not path.is_file():
        raise PortError(f"{path}: no such file")
    try:
        source = path.read_text()
        tree = ast.parse(source, filename=str(path))
    except UnicodeDecodeError:
        raise PortError(f"{path}: not Python (not a text file)") from None
    except SyntaxError as e:
        raise PortError(f"{path}: not Python (line {e.lineno}: {e.msg})") from None
    hvd: set[str] = set()
    other: list[str] = []
    tf = False
    for node in ast.walk(tree):
        names = [(a.name, a.asname) for a in node.names] if isinstance(node, ast.Import) else \
            [(f"{node.module}.{a.name}", a.asname or a.name) for a in node.names] \
            if isinstance(node, ast.ImportFrom) and node.module else []
        for name, alias in names:
            tf = tf or name.split(".")[0] == "tensorflow" or name.startswith("horovod.tensorflow")
            if name in HOROVOD_TF:
                hvd.add(alias or name)
            elif name.startswith("horovod.") and not name.startswith(("horovod.tensorflow", "horovod.keras")):
                other.append(name)
    if not hvd:
        what = f"Horovod for {other[0].split('.')[1]}, not TensorFlow" if other else "not a Horovod script"
        raise PortError(f"{path}: {what} (it imports none of {', '.join(HOROVOD_TF)})")
    if not tf:
        raise PortError(f"{path}: not a TensorFlow script (it never imports tensorflow)")
    _refuse_tf1(path, tree)
    return source, tree, hvd


def _refuse_tf1(path: Path, tree: ast.Module) -> None:
    for node in ast.walk(tree):
        name = dotted(node) if isinstance(node, ast.Attribute) else ""
        for tf1 in TF1_NAMES:
            if name.endswith("." + tf1) and name.split(".")[0] in ("tf", "tensorflow", "K"):
                raise PortError(f"{path}: not TensorFlow 2 ({name} at line {node.lineno}): port it to TF 2 first")


# -- constants: module-level names and argparse defaults, evaluated at a world size --------------------------------
class NotConstant(Exception):
    pass


@dataclass
class Env:
    """What an expression of the script means without running it: constants, the flags' defaults, assignments."""

    hvd: set[str]
    values: dict[str, ast.expr]  # name -> its one assignment's value (names assigned twice are dropped)
    args_name: str = ""
    flags: dict[str, Any] = field(default_factory=dict)

    def ev(self, node: ast.AST, size: int, depth: int = 0) -> Any:
        """The value of ``node`` with ``hvd.size()`` = size, ``hvd.rank()`` = 0; NotConstant when it has none."""
        if depth > 20:
            raise NotConstant
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Call) and hvd_name(node, self.hvd) in ("size", "local_size"):
            return size
        if isinstance(node, ast.Call) and hvd_name(node, self.hvd) in ("rank", "local_rank"):
            return 0
        if isinstance(node, ast.Attribute) and dotted(node.value) == self.args_name and node.attr in self.flags:
            return self.flags[node.attr]
        if isinstance(node, ast.Name) and node.id in self.values:
            return self.ev(self.values[node.id], size, depth + 1)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -self.ev(node.operand, size, depth + 1)
        if isinstance(node, ast.BinOp):
            a, b = self.ev(node.left, size, depth + 1), self.ev(node.right, size, depth + 1)
            ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
                   ast.Div: lambda: a / b, ast.FloorDiv: lambda: a // b, ast.Mod: lambda: a % b}
            if type(node.op) in ops:
                try:
                    return ops[type(node.op)]()
                except (TypeError, ZeroDivisionError, ValueError):
                    raise NotConstant from None
        raise NotConstant

    def reached(self, node: ast.AST, depth: int = 0) -> Iterator[ast.AST]:
        """The nodes of ``node`` and of the assignments of the names it reads (``scaled_lr`` -> its value)."""
        for n in ast.walk(node):
            yield n
            if isinstance(n, ast.Name) and n.id in self.values and depth < 20:
                yield from self.reached(self.values[n.id], depth + 1)

    def value(self, node: ast.AST | None) -> Any:
        """The value at 1 worker, or None."""
        try:
            return None if node is None else self.ev(node, 1)
        except NotConstant:
            return None

    def scaling(self, node: ast.AST) -> str | None:
        """"linear" when the value doubles from 1 to 2 workers, "divided" when it halves, "none" when equal."""
        try:
            one, two = self.ev(node, 1), self.ev(node, 2)
        except NotConstant:
            return None
        if not isinstance(one, int | float) or isinstance(one, bool) or not one:
            return None
        return {1.0: "none", 2.0: "linear", 0.5: "divided"}.get(round(two / one, 6))


def make_env(tree: ast.Module, body: list[ast.stmt], hvd: set[str]) -> Env:
    counts: dict[str, int] = {}
    values: dict[str, ast.expr] = {}
    stmts = tree.body if body is tree.body else [*tree.body, *body]
    for stmt in tree.body if body is tree.body else [
            *(s for s in tree.body if not isinstance(s, ast.FunctionDef | ast.ClassDef)), *body]:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            counts[n.id] = counts.get(n.id, 0) + 1
                            if isinstance(node, ast.Assign) and t is n and node.value is not None:
                                values[n.id] = node.value
    env = Env(hvd, {k: v for k, v in values.items() if counts[k] == 1})
    _flags(stmts, env)
    return env


def _flags(stmts: list[ast.stmt], env: Env) -> None:
    """argparse's defaults: ``args.batch_size`` is what ``--batch-size`` defaults to."""
    parsers = set()
    for stmt in stmts:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call) and dotted(node.func).endswith("ArgumentParser"):
                parsers |= {p for p, v in env.values.items() if v is node}
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                    isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "parse_args" and \
                    isinstance(node.targets[0], ast.Name):
                env.args_name = node.targets[0].id
    for stmt in stmts:
        for node in ast.walk(stmt):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "add_argument" and dotted(node.func.value) in parsers):
                continue
            kw = {k.arg: k.value for k in node.keywords}
            flags = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            long = next((f for f in flags if f.startswith("--")), flags[0] if flags else "")
            dest = env.value(kw.get("dest")) or long.lstrip("-").replace("-", "_")
            action = env.value(kw.get("action"))
            default = env.value(kw["default"]) if "default" in kw else (action == "store_false"
                                                                         if action else None)
            env.flags[dest] = default


# -- where the training is -----------------------------------------------------------------------------------------
def training_body(port: Port) -> list[ast.stmt]:
    """The statements around ``hvd.init()``: the function that calls it (Horovod's ``main()``), or the module's."""
    for node in ast.walk(port.tree):
        if isinstance(node, ast.FunctionDef) and any(
                hvd_name(n, port.hvd) == "init" for s in node.body for n in ast.walk(s)):
            port.main_name = node.name
            return node.body
    if any(hvd_name(n, port.hvd) == "init" for n in ast.walk(port.tree)):
        return port.tree.body
    raise PortError(f"{port.script}: no hvd.init() call: not a Horovod training script")


def calls(nodes: list[ast.stmt]) -> Iterator[ast.Call]:
    for stmt in nodes:
        for n in ast.walk(stmt):
            if isinstance(n, ast.Call):
                yield n


def find_fit(port: Port, env: Env) -> ast.Call | None:
    found = [c for c in calls(port.tree.body) if isinstance(c.func, ast.Attribute)
             and c.func.attr in ("fit", "fit_generator") and (c.args or any(k.arg == "x" for k in c.keywords))]
    return found[-1] if found else None


def receiver(port: Port, env: Env, node: ast.expr) -> str:
    """The model variable a fit is called on: ``model``, or the model an ``hvd.elastic`` state holds."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and node.attr == "model" and isinstance(node.value, ast.Name):
        held = env.values.get(node.value.id)
        if isinstance(held, ast.Call) and held.args and isinstance(held.args[0], ast.Name):
            return held.args[0].id
    return ""


# -- moving code -----------------------------------------------------------------------------------------------------
def assigned(stmt: ast.stmt) -> set[str]:
    """Names a statement binds (assignments, loop and with targets), anywhere inside it."""
    out = set()
    for n in ast.walk(stmt):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
    return out


def reads(node: ast.AST) -> set[str]:
    """Names a statement or function reads that it does not bind itself (a function's parameters bind)."""
    loads = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    bound = assigned(node) if isinstance(node, ast.FunctionDef | ast.ClassDef) else set()
    if isinstance(node, ast.FunctionDef):
        a = node.args
        bound |= {p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if p}
    return loads - bound


def is_wrapper(port: Port, stmt: ast.stmt) -> bool:
    """``opt = hvd.DistributedOptimizer(opt, ...)``: a Horovod wrapper of a name around itself."""
    return (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
            and hvd_name(stmt.value, port.hvd) != "" and bool(stmt.value.args)
            and isinstance(stmt.value.args[0], ast.Name) and stmt.value.args[0].id == stmt.targets[0].id)


def backward_slice(port: Port, stmts: list[ast.stmt], before: int, needed: set[str]) -> tuple[list[ast.stmt], set[str]]:
    """The statements before line ``before`` that make the ``needed`` names (their assignments, the method calls on
    them such as ``model.compile(...)``, and what those read), in order; and the names still unresolved."""
    chosen: list[ast.stmt] = []
    needed = set(needed)
    flags: set[str] = set()
    for stmt in reversed([s for s in stmts if s.lineno < before]):
        if isinstance(stmt, ast.FunctionDef | ast.ClassDef | ast.Import | ast.ImportFrom) or _is_main_guard(stmt):
            continue
        if is_wrapper(port, stmt):
            if assigned(stmt) & needed:
                port.used.add(stmt.lineno)
            continue
        needed -= port.hvd  # Horovod's module is never moved: its calls are rewritten or named
        if port.flags_name in needed:  # the flags are read at their defaults (resolve_helpers), never parsed
            flags.add(port.flags_name)
            needed.discard(port.flags_name)
        binds = assigned(stmt)
        call = stmt.value if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) else None
        mutates = call is not None and isinstance(call.func, ast.Attribute) and \
            isinstance(call.func.value, ast.Name) and call.func.value.id in needed
        if binds & needed or mutates:
            chosen.insert(0, stmt)
            if isinstance(stmt, ast.Assign):  # binds every name of its targets (an augmented one reads it too)
                needed -= binds
            needed |= reads(stmt)
    return chosen, (needed | flags) - port.hvd


def _is_main_guard(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.If) and "__name__" in {n.id for n in ast.walk(stmt.test) if isinstance(n, ast.Name)}


def resolve_helpers(port: Port, env: Env, needed: set[str], body: list[ast.stmt]) -> set[str]:
    """Module-level functions, classes, constants and the flags the moved code reads, added to ``port.helpers``
    (once, in source order); returns the names nothing in the script defines."""
    top = {}
    for stmt in port.tree.body:
        if isinstance(stmt, ast.FunctionDef | ast.ClassDef):
            top[stmt.name] = stmt
        elif isinstance(stmt, ast.Assign) and body is not port.tree.body:
            for name in assigned(stmt):
                top[name] = stmt
    imported = {(a.asname or a.name).split(".")[0] for s in ast.walk(port.tree)
                if isinstance(s, ast.Import | ast.ImportFrom) for a in s.names}
    missing: set[str] = set()
    chosen: dict[int, ast.stmt] = {}
    todo = list(needed)
    while todo:
        name = todo.pop()
        if name == env.args_name and name:
            port.flags = env.flags
            continue
        if name in imported or hasattr(builtins, name):
            continue
        stmt = top.get(name)
        if stmt is None:
            missing.add(name)
        elif stmt.lineno not in chosen:
            chosen[stmt.lineno] = stmt
            todo.extend(reads(stmt))
    port.helpers.update(chosen)
    return missing


def moved(port: Port, stmts: list[ast.stmt], indent: str) -> str:
    """The statements' source as written, re-indented, each run of lines under a comment naming it; in them the
    Horovod calls that describe one worker read as the whole job's (``hvd.size()`` 1, ``hvd.rank()`` 0) and a
    ``hvd.DistributedOptimizer(opt, ...)`` is its ``opt``, each said in a comment above."""
    lines = port.source.splitlines()
    out: list[str] = []
    starts = [min([s.lineno, *(d.lineno for d in getattr(s, "decorator_list", []))]) for s in stmts]
    for i, (stmt, first) in enumerate(zip(stmts, starts)):
        if i == 0 or first != stmts[i - 1].end_lineno + 1:  # a new run of lines: name it
            j = i
            while j + 1 < len(stmts) and starts[j + 1] == stmts[j].end_lineno + 1:
                j += 1
            last = stmts[j].end_lineno
            out.append(f"{indent}# {port.script.name}:{first}" + (f"-{last}" if last != first else ""))
        text = lines[first - 1:stmt.end_lineno]
        text, said = _substitute(port, stmt, first, text)
        out.extend(f"{indent}# port: {line}" for s in said for line in textwrap.wrap(s, 100, subsequent_indent="  "))
        cut = len(text[0]) - len(text[0].lstrip())
        out.extend(indent + t[cut:] if t.strip() else "" for t in text)
        port.used.update(range(first, stmt.end_lineno + 1))
    return "\n".join(out)


SUBSTITUTE = {"size": "1", "local_size": "1", "rank": "0", "local_rank": "0"}


def _substitute(port: Port, stmt: ast.stmt, first: int, text: list[str]) -> tuple[list[str], list[str]]:
    edits = []
    said = []
    for node in ast.walk(stmt):
        name = hvd_name(node, port.hvd)
        if not name or node.lineno != node.end_lineno and name in SUBSTITUTE:
            continue
        if name in SUBSTITUTE:
            new = SUBSTITUTE[name]
            why = port.notes.get(id(node)) or ("the job is described for one worker; twinbench scales it"
                                                if new == "1" else "twinbench gives every rank the same data and "
                                                "shards it itself")
            said.append(f"line {node.lineno}: {port.text(node)} -> {new} ({why})")
            port.notes.setdefault(id(node), f"moved into the job's code as {new}: {why}")
            edits.append((node, new))
        elif name == "DistributedOptimizer" and node.args:
            said.append(f"line {node.lineno}: hvd.DistributedOptimizer(...) -> its optimizer (the strategy "
                        "all-reduces the gradients)")
            edits.append((node, port.text(node.args[0])))
        else:
            port.hand(node, f"{port.text(node.func)}(...) in code moved into the job: rewrite it by hand")
    wrappers = [n for n, _ in edits if hvd_name(n, port.hvd) == "DistributedOptimizer"]
    edits = [(n, _inner(port, n.args[0]) if n in wrappers else new) for n, new in edits
             if not any(w is not n and _within(n, w) for w in wrappers)]
    for node, new in sorted(edits, key=lambda e: (e[0].lineno, e[0].col_offset), reverse=True):
        i, j = node.lineno - first, node.end_lineno - first
        text = [*text[:i], text[i][:node.col_offset] + new + text[j][node.end_col_offset:], *text[j + 1:]]
    return text, sorted(said)


def _within(node: ast.AST, outer: ast.AST) -> bool:
    return (outer.lineno, outer.col_offset) <= (node.lineno, node.col_offset) and \
        (node.end_lineno, node.end_col_offset) <= (outer.end_lineno, outer.end_col_offset)


def _inner(port: Port, node: ast.AST) -> str:
    """``node``'s text with its one-worker Horovod calls read as _substitute reads them."""
    text = port.text(node)
    for alias in port.hvd:
        for name, new in SUBSTITUTE.items():
            text = re.sub(rf"\b{re.escape(alias)}\.{name}\(\)", new, text)
    return text


def function_text(port: Port, name: str, stmts: list[ast.stmt], result: str, doc: str) -> str:
    body = moved(port, stmts, indent="    ")
    return f"def {name}():\n    \"\"\"{doc}\"\"\"\n{body}\n    return {result}\n"


def definition(port: Port, body: list[ast.stmt], name: str, before: int) -> ast.expr | None:
    """The value of the last assignment of ``name`` before line ``before`` (a Horovod wrapper of it skipped)."""
    found = None
    for stmt in port.tree.body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Assign) and node.lineno < before and not is_wrapper(port, node) and any(
                    isinstance(t, ast.Name) and t.id == name for t in node.targets):
                if found is None or node.lineno > found.lineno:
                    found = node
    return None if found is None else found.value


# -- the job's keys --------------------------------------------------------------------------------------------------
def scaled_key(port: Port, env: Env, key: str, node: ast.AST, per_worker: str) -> None:
    """A count the script writes (``N`` or ``N // hvd.size()``) as the job key ``key`` at its 1-worker value."""
    value, scaling = env.value(node), env.scaling(node)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1 or scaling not in ("none", "divided"):
        port.hand(node, f"{key}: cannot read {port.text(node)!r} as a number of steps; set {key} in job.toml")
        return
    port.keys[key] = value
    port.used.add(node.lineno)
    if scaling == "divided":
        note = (f"{key} = {value}: {port.text(node)} at 1 worker. {per_worker} divides it by the workers (the same "
                f"examples in total); twinbench's {key} is the same at every size")
        for n in env.reached(node):
            if hvd_name(n, port.hvd) == "size":
                port.notes[id(n)] = note
                port.proofs[id(n)] = P_NONE + "a count of steps, not the math (common.check sets --steps)"


def optimizer_keys(port: Port, env: Env, call: ast.Call, compiled: bool) -> None:
    """The optimizer's LR scaling (and, for a model the job compiles, the optimizer keys)."""
    name = dotted(call.func).rsplit(".", 1)[-1]
    kw = {k.arg: k.value for k in call.keywords}
    lr = call.args[0] if call.args else kw.pop("learning_rate", None) or kw.pop("lr", None)
    kw.pop("learning_rate", None)
    if name not in OPTIMIZER_CLASSES or "optimizers" not in dotted(call.func) and not compiled:
        port.hand(call, f"optimizer {port.text(call.func)}: not a tf.keras SGD or Adam; set optimizer, "
                        "optimizer_args and learning_rate in job.toml (or compile it in the model function)")
        return
    scaling = env.scaling(lr) if lr is not None else "none"
    if scaling not in ("none", "linear"):
        port.hand(call, f"learning rate {port.text(lr)!r}: neither constant nor x hvd.size(); set learning_rate "
                        "and lr_scaling in job.toml")
        return
    port.keys["lr_scaling"] = scaling
    for n in env.reached(lr) if lr is not None else ():
        if hvd_name(n, port.hvd) == "size":
            port.notes[id(n)] = "LR x workers: lr_scaling = \"linear\" (LR x replicas)"
    if compiled:
        return
    port.keys["optimizer"] = OPTIMIZER_CLASSES[name]
    port.keys["learning_rate"] = float(env.value(lr) if lr is not None else (0.01 if name == "SGD" else 0.001))
    momentum = env.value(kw.pop("momentum", None))
    if momentum:
        port.keys["optimizer"], port.keys["momentum"] = "momentum", float(momentum)
    args = {k: env.value(v) for k, v in kw.items() if k != "name"}
    if any(v is None for v in args.values()) or kw.get("nesterov") is not None:
        port.hand(call, f"optimizer arguments {port.text(call)!r}: set optimizer_args in job.toml")
    elif args:
        port.keys["optimizer_args"] = args


LOSS_DEFAULTS = {"SparseCategoricalCrossentropy": "SparseCategoricalCrossentropy"}


def loss_key(port: Port, env: Env, node: ast.expr | None, at: ast.AST) -> None:
    """The job's loss for a ``tf.keras.losses`` object or function the step calls (the default takes logits)."""
    call = node if isinstance(node, ast.Call) else None
    name = dotted(call.func).rsplit(".", 1)[-1] if call else ""
    kw = {k.arg: env.value(k.value) for k in call.keywords} if call else {}
    if call is None or "losses" not in dotted(call.func) or call.args or set(kw) - {"from_logits"}:
        port.hand(at, f"loss {port.text(node) if node is not None else '?'}: not a tf.keras.losses class with its "
                      "defaults; set loss in job.toml (a tf.keras.losses name or \"package.module:function\")")
        return
    if name == "SparseCategoricalCrossentropy" and kw.get("from_logits") is True:
        port.keys["loss"] = "sparse_categorical_crossentropy"  # the job's default: from logits
    elif not kw.get("from_logits"):
        port.keys["loss"] = name
    else:
        port.hand(at, f"loss {port.text(node)}: from_logits=True other than SparseCategoricalCrossentropy; "
                      "set loss in job.toml")


def batch_key(port: Port, env: Env, stmts: list[ast.stmt]) -> None:
    """per_replica_batch_size from the pipeline's last ``.batch(N)`` (a helper's parameter through its call)."""
    found: list[tuple[ast.Call, list[ast.stmt]]] = []
    for stmt in stmts:
        for c in calls([stmt]):
            if isinstance(c.func, ast.Attribute) and c.func.attr == "batch" and c.args:
                found.append((c, [stmt]))
    if not found:
        return
    call, _ = found[-1]
    value = env.value(call.args[0])
    if value is None and isinstance(call.args[0], ast.Name):
        value = _through_call(port, env, call.args[0].id, stmts)
    if isinstance(value, int) and value >= 1:
        port.keys["per_replica_batch_size"] = value
    else:
        port.hand(call, f"batch size {port.text(call.args[0])!r}: set per_replica_batch_size in job.toml")


def _through_call(port: Port, env: Env, param: str, stmts: list[ast.stmt]) -> Any:
    """The value a helper's parameter ``param`` gets where the moved code calls the helper."""
    defs = {s.name: s for s in port.tree.body if isinstance(s, ast.FunctionDef)}
    for c in calls(stmts):
        fn = defs.get(dotted(c.func))
        if fn is None:
            continue
        names = [a.arg for a in fn.args.args]
        given = {**dict(zip(names, c.args)), **{k.arg: k.value for k in c.keywords}}
        if param in given:
            return env.value(given[param])
    return None


def data_order(port: Port, stmts: list[ast.stmt]) -> None:
    """What the script's pipeline does to the order of examples, and what twinbench does instead."""
    ops = [c for c in calls(stmts) if isinstance(c.func, ast.Attribute)
           and c.func.attr in ("shuffle", "shard", "repeat", "take", "batch")]
    where = {c.func.attr: c for c in ops}
    if "shuffle" in where:
        c = where["shuffle"]
        seeded = any(k.arg == "seed" for k in c.keywords) or len(c.args) > 1
        port.data_order.append(
            f"{port.where(c)}: `{port.text(c.func)}(...)` shuffles {'with its own seed' if seeded else 'unseeded'}"
            f"{'' if seeded else ' (each worker its own order, run to run different)'}. twinbench reads one pass of"
            " the function's examples in their order (TensorFlow's global seed set to the job's seed first), then "
            "shuffles them with the job's seed: the same order on every rank, backend and run")
    if "shard" in where:
        c = where["shard"]
        for n in ast.walk(c):
            if hvd_name(n, port.hvd) in ("size", "rank"):
                port.notes[id(n)] = "shard(hvd.size(), hvd.rank()) reads shard(1, 0): twinbench shards exactly"
                port.proofs[id(n)] = ("exact sharding: common.check runs 1 worker x 2b against 2 workers x b "
                                      "(the same examples in each global batch), native and horovod")
        port.data_order.append(
            f"{port.where(c)}: `{port.text(c)}` gives each worker every N-th example; in the moved code it reads "
            "shard(1, 0) (the whole set) and twinbench shards exactly: each global batch cut into the workers' "
            "slices, so 1 worker x 2b and 2 workers x b see the same examples")
    else:
        port.data_order.append(
            "the script never shards: under Horovod every worker reads the whole set in its own order, so a step's "
            "global batch can hold an example twice and an epoch is N passes. twinbench shards exactly: each "
            "example once per epoch across the workers. Per-step losses differ from the Horovod script's (its "
            "order cannot be reproduced); they equal the job's runs on both backends")
    if "repeat" in where:
        port.data_order.append(
            f"{port.where(where['repeat'])}: `repeat()` makes the script's stream endless (epochs are "
            "steps_per_epoch long); twinbench repeats its seeded pass itself")


# -- the two shapes of a Horovod training script -------------------------------------------------------------------
def analyse_fit(port: Port, env: Env, body: list[ast.stmt], fit: ast.Call) -> None:
    """A Keras ``model.fit(dataset, ...)`` script (tensorflow2_keras_mnist.py's shape)."""
    model = receiver(port, env, fit.func.value)  # type: ignore[attr-defined]
    if not model:
        raise PortError(f"{port.script}: cannot find the model: line {fit.lineno} calls "
                        f"{port.text(fit.func)} on something that is not a variable")
    kw = {k.arg: k.value for k in fit.keywords}
    x = fit.args[0] if fit.args else kw.get("x")
    y = fit.args[1] if len(fit.args) > 1 else kw.get("y")
    data = [n for n in (x, y) if n is not None]
    if not all(isinstance(n, ast.Name) for n in data):
        raise PortError(f"{port.script}: cannot find the dataset: line {fit.lineno} trains on "
                        f"{port.text(data[0])!r}, not a variable")
    port.keys["mode"] = "fit"
    port.used.update(range(fit.lineno, fit.end_lineno + 1))
    model_stmts = model_function(port, env, body, model, fit.lineno)
    compile_call = next((c for c in calls(model_stmts) if isinstance(c.func, ast.Attribute)
                         and c.func.attr == "compile" and dotted(c.func.value) == model), None)
    if compile_call is None:
        port.hand(fit, f"{model} is never compiled before fit: set optimizer, learning_rate and loss in job.toml")
    else:
        compiled_keys(port, env, body, compile_call)
    dataset_function(port, env, body, [n.id for n in data], fit.lineno)  # type: ignore[attr-defined]
    if "batch_size" in kw and "per_replica_batch_size" not in port.keys and env.value(kw["batch_size"]):
        port.keys["per_replica_batch_size"] = env.value(kw["batch_size"])
    if "epochs" in kw:
        scaled_key(port, env, "epochs", kw["epochs"], "the script")
    if "steps_per_epoch" in kw:
        scaled_key(port, env, "steps_per_epoch", kw["steps_per_epoch"], "Horovod's example")
    for arg in ("validation_data", "validation_split", "class_weight", "sample_weight"):
        if arg in kw:
            port.hand(kw[arg], f"fit({arg}=...): not moved; a dataset function may return {{'train': (x, y), "
                               "'validation': (x, y)}} (docs/jobs.md)")
    if "initial_epoch" in kw:
        port.drop(kw["initial_epoch"], "fit(initial_epoch=...): the script's resume from its own checkpoint; "
                                       "twinbench resumes from its own (--resume-from)", "fit(initial_epoch=...)")
    callbacks(port, env, body, kw.get("callbacks"))


def free_name(port: Port, name: str) -> str:
    """``name``, or ``ported_<name>`` when the script's module already defines ``name`` (moved with it)."""
    taken = {s.name for s in port.tree.body if isinstance(s, ast.FunctionDef | ast.ClassDef)} | {
        n for s in port.tree.body if isinstance(s, ast.Assign | ast.Import | ast.ImportFrom) for n in assigned(s)}
    return name if name not in taken else f"ported_{name}"


def model_function(port: Port, env: Env, body: list[ast.stmt], model: str, before: int) -> list[ast.stmt]:
    stmts, missing = backward_slice(port, body, before, {model})
    if not any(model in assigned(s) for s in stmts):
        raise PortError(f"{port.script}: cannot find the model: nothing before line {before} assigns {model!r}")
    missing = resolve_helpers(port, env, missing, body)
    for name in sorted(missing):
        port.hand(stmts[0], f"the model code reads {name!r}, which the script does not define where the port "
                            "can see it")
    port.functions.append((free_name(port, "build_model"), stmts, model,
                           f"The model of {port.script.name}, as the script builds it."))
    return stmts


def dataset_function(port: Port, env: Env, body: list[ast.stmt], names: list[str], before: int) -> None:
    stmts, missing = backward_slice(port, body, before, set(names))
    if not stmts:
        raise PortError(f"{port.script}: cannot find the dataset: nothing before line {before} assigns "
                        f"{' or '.join(names)}")
    missing = resolve_helpers(port, env, missing, body)
    for name in sorted(missing):
        port.hand(stmts[0], f"the dataset code reads {name!r}, which the script does not define where the port "
                            "can see it")
    port.functions.append((free_name(port, "load_data"), stmts, ", ".join(names),
                           f"The training data of {port.script.name}, as the script makes it."))
    helper_defs = [s for s in port.tree.body if isinstance(s, ast.FunctionDef)
                   and any(dotted(c.func) == s.name for c in calls(stmts))]
    batch_key(port, env, [*stmts, *helper_defs])
    data_order(port, [*stmts, *helper_defs])


def compiled_keys(port: Port, env: Env, body: list[ast.stmt], compile_call: ast.Call) -> None:
    kw = {k.arg: k.value for k in compile_call.keywords}
    opt = kw.get("optimizer")
    if isinstance(opt, ast.Call) and hvd_name(opt, port.hvd) == "DistributedOptimizer":
        opt = opt.args[0] if opt.args else None
    if isinstance(opt, ast.Name):
        opt = definition(port, body, opt.id, compile_call.lineno)
    if isinstance(opt, ast.Call) and hvd_name(opt, port.hvd) == "DistributedOptimizer" and opt.args:
        opt = opt.args[0]
    if isinstance(opt, ast.Call):
        optimizer_keys(port, env, opt, compiled=True)
    elif opt is not None and not isinstance(opt, ast.Constant):
        port.hand(compile_call, f"optimizer {port.text(kw['optimizer'])!r}: the port cannot see how it is made")
    metrics = kw.get("metrics")
    if metrics is not None:
        port.drop(metrics, f"training metrics {port.text(metrics)}: twinbench reports the per-step loss while "
                           "training and evaluates metrics on validation data only (none here)", "compile(metrics=...)")


def analyse_tape(port: Port, env: Env, body: list[ast.stmt]) -> None:
    """A ``tf.GradientTape`` loop (tensorflow2_mnist.py's shape): its step mapped onto twinbench's custom loop."""
    steps = [s for s in ast.walk(port.tree) if isinstance(s, ast.FunctionDef) and any(
        isinstance(w, ast.With) and dotted(w.items[0].context_expr.func if isinstance(
            w.items[0].context_expr, ast.Call) else w.items[0].context_expr).endswith("GradientTape")
        for w in s.body)]
    step = steps[0] if steps else None
    if step is None:
        raise PortError(f"{port.script}: cannot find the model: no model.fit(...) and no GradientTape step")
    port.keys["mode"] = "ctl"
    model, loss, opt = tape_step(port, env, step)
    loops = [s for s in ast.walk(port.tree) if isinstance(s, ast.For)
             and any(dotted(c.func) == step.name for c in calls(s.body))]
    loop = loops[-1] if loops else None  # the innermost (ast.walk goes breadth first)
    for outer in loops[:-1]:  # for epoch in range(E): for x, y in dataset: step(...)
        if isinstance(outer.iter, ast.Call) and dotted(outer.iter.func) == "range" and len(outer.iter.args) == 1:
            scaled_key(port, env, "epochs", outer.iter.args[0], "the script")
            port.used.update(range(outer.lineno, outer.end_lineno + 1))
        else:
            port.hand(outer, f"the loop over {port.text(outer.iter)!r} around the training loop: not mapped")
    if not model or loop is None:
        raise PortError(f"{port.script}: cannot find the "
                        f"{'model: the step at line ' + str(step.lineno) + ' calls no model' if not model else ''}"
                        f"{'dataset: no loop calls ' + step.name if loop is None and model else ''}")
    model_function(port, env, body, model, step.lineno)
    loss_node = definition(port, body, loss.func.id, step.lineno) if isinstance(loss, ast.Call) and \
        isinstance(loss.func, ast.Name) else loss.func if isinstance(loss, ast.Call) else None
    if isinstance(loss, ast.Call) and not isinstance(loss.func, ast.Name):  # tf.losses.some_function(y, p)
        name = dotted(loss.func).rsplit(".", 1)[-1]
        port.keys["loss"] = "SparseCategoricalCrossentropy" if name == "sparse_categorical_crossentropy" else name
    else:
        loss_key(port, env, loss_node, step)
    opt_node = definition(port, body, opt, step.lineno) if opt else None
    port.used.update(n.lineno for n in (loss_node, opt_node) if n is not None)
    if isinstance(opt_node, ast.Call) and hvd_name(opt_node, port.hvd) == "DistributedOptimizer" and opt_node.args:
        opt_node = opt_node.args[0]
    if isinstance(opt_node, ast.Call):
        optimizer_keys(port, env, opt_node, compiled=False)
    else:
        port.hand(step, f"optimizer {opt!r}: the port cannot see how it is made; set optimizer in job.toml")
    tape_loop(port, env, body, loop, step)


def tape_step(port: Port, env: Env, step: ast.FunctionDef) -> tuple[str, ast.expr | None, str]:
    """(model, loss call, optimizer) of a step written as Horovod's example writes it; the rest named by hand."""
    model, loss, opt = "", None, ""
    for stmt in step.body:
        port.used.update(range(stmt.lineno, stmt.end_lineno + 1))
        if isinstance(stmt, ast.With):
            for inner in stmt.body:
                value = inner.value if isinstance(inner, ast.Assign) else None
                called = [c for c in ast.walk(inner) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
                          and any(k.arg == "training" for k in c.keywords)]  # model(x, training=True)
                model = called[0].func.id if called else model  # type: ignore[attr-defined]
                if value is not None and called and value is called[0]:
                    continue
                if isinstance(value, ast.Call) and not model:
                    port.hand(inner, "the tape computes something before the model call: a step of the script's "
                                     "own, not mapped")
                elif isinstance(value, ast.Call):
                    loss = value  # loss(y, probs), or loss(y, model(x, training=True))
                else:
                    port.hand(inner, "a statement in the tape the port cannot map (twinbench's step is the model "
                                     "and the loss)")
            continue
        hvd_calls = [n for n in ast.walk(stmt) if hvd_name(n, port.hvd)]
        if isinstance(stmt, ast.Return) or hvd_calls and all(
                hvd_name(n, port.hvd) in ("DistributedGradientTape", "broadcast_variables", "Compression.fp16",
                                          "Compression.none") for n in hvd_calls):
            continue
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call) and \
                getattr(stmt.value.func, "attr", "") == "gradient":
            continue  # grads = tape.gradient(loss, model.trainable_variables), nothing done to them
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and \
                getattr(stmt.value.func, "attr", "") == "apply_gradients":
            opt = dotted(stmt.value.func.value)
            continue
        port.hand(stmt, "a statement of the script's own training step the port cannot map onto twinbench's "
                        "step (model, loss, all-reduced gradients, apply_gradients)")
    return model, loss, opt


def tape_loop(port: Port, env: Env, body: list[ast.stmt], loop: ast.For, step: ast.FunctionDef) -> None:
    """The loop over the dataset: ``for batch, (x, y) in enumerate(dataset.take(N // hvd.size()))``."""
    it = loop.iter
    if isinstance(it, ast.Call) and dotted(it.func) == "enumerate" and it.args:
        it = it.args[0]
    take = None
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and it.func.attr == "take" and it.args:
        take, it = it.args[0], it.func.value
    if not isinstance(it, ast.Name):
        raise PortError(f"{port.script}: cannot find the dataset: the loop at line {loop.lineno} iterates over "
                        f"{port.text(loop.iter)!r}")
    dataset_function(port, env, body, [it.id], loop.lineno)
    if take is not None:
        scaled_key(port, env, "steps" if "epochs" not in port.keys else "steps_per_epoch", take,
                   "Horovod's example")
    elif "epochs" not in port.keys:
        port.hand(loop, "the loop has no take(N): set steps (or epochs) in job.toml")
    port.used.update(range(loop.lineno, loop.end_lineno + 1))
    for stmt in loop.body:
        if any(dotted(c.func) == step.name for c in calls([stmt])) or _printing(stmt):
            continue
        port.hand(stmt, "a statement in the training loop the port cannot map (twinbench runs its own loop)")


# -- callbacks, checkpoints and the statements left over -------------------------------------------------------------
KNOWN_KERAS_CALLBACKS = {
    "ModelCheckpoint": "the script's ModelCheckpoint: twinbench writes no per-epoch model file (its own checkpoint "
                       "is for preemption, --resume-from)",
    "TensorBoard": "the script's TensorBoard logs: twinbench records its runs in its own JSON record",
    "BackupAndRestore": "the script's BackupAndRestore: twinbench checkpoints on SIGTERM/SIGUSR1 itself",
    "CSVLogger": "the script's CSVLogger: twinbench records the per-step losses in its JSON record",
}


def callbacks(port: Port, env: Env, body: list[ast.stmt], node: ast.expr | None) -> None:
    """Each callback fit gets: Horovod's mapped, Keras' checkpoint and logs named as not carried, others by hand."""
    if node is None:
        return
    items: list[ast.expr] = []
    if isinstance(node, ast.List):
        items = list(node.elts)
    elif isinstance(node, ast.Name):
        for stmt in port.tree.body:
            for n in ast.walk(stmt):
                if isinstance(n, ast.Assign) and any(dotted(t) == node.id for t in n.targets) and \
                        isinstance(n.value, ast.List):
                    items.extend(n.value.elts)
                    port.used.update(range(n.lineno, n.end_lineno + 1))
                elif isinstance(n, ast.Call) and dotted(n.func) in (f"{node.id}.append", f"{node.id}.extend"):
                    items.extend(n.args[0].elts if isinstance(n.args[0], ast.List) else n.args)
                    port.used.add(n.lineno)
    elif not (isinstance(node, ast.Constant) and node.value is None):
        port.hand(node, f"callbacks={port.text(node)}: the port cannot list them")
    for item in items:
        if isinstance(item, ast.Name):
            value = definition(port, body, item.id, 10**9)
            if value is not None:
                item = value
        callback(port, env, item)


def callback(port: Port, env: Env, item: ast.expr) -> None:
    name = hvd_name(item, port.hvd)
    if name == "callbacks.LearningRateWarmupCallback":
        kw = {k.arg: k.value for k in item.keywords}  # type: ignore[attr-defined]
        epochs = env.value(kw.get("warmup_epochs")) if "warmup_epochs" in kw else 5  # Horovod's default
        if isinstance(epochs, int | float) and float(epochs).is_integer() and epochs >= 0:
            port.keys["warmup_epochs"] = int(epochs)
        else:
            port.hand(item, "LearningRateWarmupCallback(warmup_epochs=...): not a whole number of epochs; set "
                            "warmup_epochs in job.toml")
    elif name in ("callbacks.BroadcastGlobalVariablesCallback", "callbacks.MetricAverageCallback") or \
            name.startswith("elastic."):
        pass  # rows of the table; elastic is named there and left by hand
    elif name:
        port.hand(item, f"hvd.{name}: a Horovod callback the port does not map (an LR schedule: lr_schedule in "
                        "job.toml)")
    elif isinstance(item, ast.Call) and dotted(item.func).rsplit(".", 1)[-1] in KNOWN_KERAS_CALLBACKS:
        kind = dotted(item.func).rsplit(".", 1)[-1]
        port.drop(item, KNOWN_KERAS_CALLBACKS[kind], kind if kind in KERAS_ROWS else "")
    else:
        port.hand(item, f"callback {port.text(item)}: not one the port knows; twinbench's fit runs no callbacks "
                        "of the script's own")


def checkpoints(port: Port) -> None:
    """``tf.train.Checkpoint(...)`` and its ``save``: the script's own checkpoint, not carried."""
    for c in calls(port.tree.body):
        if isinstance(c.func, ast.Attribute) and c.func.attr == "save" and \
                isinstance(definition(port, port.tree.body, dotted(c.func.value), 10**9)
                           or _body_def(port, dotted(c.func.value)), ast.Call):
            port.drop(c, f"{port.text(c)}: the script's tf.train.Checkpoint; twinbench writes its own checkpoint "
                         "for preemption only (--resume-from)", "checkpoint.save (tf.train.Checkpoint)")
            port.used.add(c.lineno)
            _body_def(port, dotted(c.func.value))


def _body_def(port: Port, name: str) -> ast.expr | None:
    for n in ast.walk(port.tree):
        if isinstance(n, ast.Assign) and any(dotted(t) == name for t in n.targets):
            port.used.add(n.lineno)
            return n.value
    return None


def _printing(stmt: ast.stmt) -> bool:
    """A statement that only prints (or an ``if`` holding only such statements): logging, which twinbench does."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        return dotted(stmt.value.func) in ("print", "log", "logging.info", "tf.print") or \
            dotted(stmt.value.func).endswith(("logger.info", ".write"))
    if isinstance(stmt, ast.If):
        return all(_printing(s) for s in [*stmt.body, *stmt.orelse])
    return False


def _gpu_setup(stmt: ast.stmt, hvd: set[str]) -> bool:
    """Horovod's GPU pinning block (``tf.config...``, the local rank) or ``CUDA_VISIBLE_DEVICES``: twinbench pins
    one GPU per rank itself."""
    names = [dotted(c.func) for c in calls([stmt]) if dotted(c.func).split(".")[0] not in hvd]
    text = ast.dump(stmt)
    return (bool(names) and all("config" in n for n in names)) or "CUDA_VISIBLE_DEVICES" in text or (
        isinstance(stmt, ast.For | ast.If) and all(_gpu_setup(s, hvd) for s in [*stmt.body, *stmt.orelse]))


def leftovers(port: Port, env: Env, body: list[ast.stmt]) -> None:
    """Every statement of the training code the port neither moved, nor turned into keys, nor knows: by hand."""
    stmts = body if body is port.tree.body else [*port.tree.body, *body]
    for stmt in stmts:
        lines = set(range(stmt.lineno, stmt.end_lineno + 1))
        if lines & port.used or isinstance(stmt, ast.Import | ast.ImportFrom | ast.FunctionDef | ast.ClassDef) \
                or _is_main_guard(stmt) or _printing(stmt) or _gpu_setup(stmt, port.hvd):
            continue
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # a docstring
        names = {hvd_name(c, port.hvd) for c in calls([stmt])}
        if names and names <= {"init", "shutdown"}:
            continue
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and port.main_name and \
                dotted(stmt.value.func) == port.main_name:
            continue  # main(): the training the port read
        if isinstance(stmt, ast.Assign) and any(dotted(n).split(".")[1:2] == ["Compression"] and dotted(n).split(
                ".")[0] in port.hvd for n in ast.walk(stmt.value)):
            continue  # the compression a DistributedOptimizer takes: its row says what became of it
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.IfExp) and any(
                hvd_name(c, port.hvd) == "rank" for c in calls([stmt])):
            continue  # verbosity on rank 0 (verbose = 1 if hvd.rank() == 0 else 0): twinbench prints on the chief
        is_flag = any(dotted(c.func).endswith(("ArgumentParser", "add_argument", "parse_args")) for c in calls([stmt]))
        value = stmt.value if isinstance(stmt, ast.Assign) else None
        constant = value is not None and env.value(value) is not None  # a constant the keys may have read
        if is_flag or constant or (isinstance(stmt, ast.Assign) and all(
                not (assigned(stmt) & reads(s)) for s in stmts if s is not stmt)):
            continue  # a value nothing else reads is not training
        first = port.source.splitlines()[stmt.lineno - 1].strip()
        if any(h.startswith(f"{port.where(stmt)}:") for h in port.by_hand):
            continue  # already named (a Horovod construct the port does not map)
        port.hand(stmt, f"not moved: `{first[:70]}`: the port does not know what it does for training")


# -- the migration table -----------------------------------------------------------------------------------------
P_GRAD = ("same math: common.check compares native (MWMS) and horovod per-step losses and final weights at 1 and 2 "
          "workers, fit and ctl, to 1e-5 (tests/test_parity.py)")
P_LR = ("LR x replicas: common.check runs 1 worker x 2b at LR x 2 against 2 workers x b, native and horovod "
        "(tests/test_parity.py)")
P_START = ("equal start: MWMS broadcasts each variable's initial value from the chief when it is created under "
           "scope() (collective_all_reduce_strategy.py); common.check's step-1 losses native = horovod show it")
P_NONE = "not checked here: "
# name after "hvd." -> (what it does under Horovod, the MWMS counterpart, what the port does, what twinbench proved)
KNOWLEDGE: dict[str, tuple[str, str, str, str]] = {
    "init": ("starts Horovod: one process per GPU, ranks from the launcher (horovodrun, mpirun, srun)",
             "strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=tf.distribute.cluster_resolver."
             "SlurmClusterResolver()) under srun, or from TF_CONFIG (the default resolver)",
             "dropped: the backend makes the strategy (python -m backends.native --nproc N, or srun)",
             "both backends run every check here (common.check, tests/test_parity.py)"),
    "size": ("the number of workers",
             "strategy.num_replicas_in_sync (replicas: workers x GPUs per worker)",
             "the job is written for one worker: twinbench scales by the replicas", P_LR),
    "local_size": ("workers on this node", "the resolver's per-node task count (SLURM_NTASKS_PER_NODE)",
                   "the job is written for one worker", P_NONE + "twinbench places ranks itself"),
    "rank": ("this worker's index (0 = the one that logs and saves)",
             "strategy.cluster_resolver.task_id (the chief: task_type 'chief', or task 0 of 'worker' when the "
             "cluster has no chief)", "twinbench's chief prints; no per-rank code in the job",
             P_NONE + "logging and file names are not the math"),
    "local_rank": ("this worker's index on its node: pins one GPU per process",
                   "not needed with one worker per GPU (srun --gpus-per-task=1, or CUDA_VISIBLE_DEVICES per "
                   "worker); MWMS uses every GPU it sees as a local replica",
                   "dropped: twinbench pins one GPU per rank itself (common/cluster/placement.py), on both backends",
                   P_NONE + "no GPU on the check's machine; the pinning rule is one function for both backends"),
    "DistributedOptimizer": ("averages the gradients over the workers (allreduce) before apply_gradients",
                             "create the model and optimizer under strategy.scope() and use the optimizer as it is: "
                             "MWMS all-reduces the gradients in apply_gradients (fit and strategy.run)",
                             "dropped: the optimizer inside it is the model's", P_GRAD),
    "DistributedGradientTape": ("averages the tape's gradients over the workers",
                                "strategy.run(step): a plain tf.GradientTape, the loss scaled by the global batch "
                                "(tf.nn.compute_average_loss), optimizer.apply_gradients all-reduces",
                                "mode = \"ctl\": twinbench's own custom loop (the same objective and all-reduce)",
                                P_GRAD),
    "broadcast_variables": ("copies rank 0's variables to every worker (after the first step, for the "
                            "optimizer's slots)",
                            "not needed: variables created under strategy.scope() are initialised identically",
                            "dropped", P_START),
    "callbacks.BroadcastGlobalVariablesCallback": (
        "copies rank 0's model and optimizer variables to every worker at the start of fit",
        "not needed: variables created under strategy.scope() are initialised identically", "dropped", P_START),
    "callbacks.MetricAverageCallback": (
        "averages the epoch's metrics over the workers",
        "not needed: Keras metrics under the strategy are aggregated across replicas",
        "dropped: twinbench's evaluation sums every worker's numbers",
        "the validation numbers of every evaluation native = horovod (common.check, tests/test_evaluate.py)"),
    "callbacks.LearningRateWarmupCallback": (
        "ramps the LR from LR / workers to LR over the first epochs",
        "a LearningRateSchedule (linear warm-up, then the scaled LR) or a Keras callback setting the LR each batch",
        "warmup_epochs (Horovod's rule, in both backends)",
        "Horovod's callback against twinbench's MWMS warm-up: equal per-step losses "
        "(tests/test_parity.py::test_warmup_and_linear_scaling_parity); 1 vs 2 workers cannot agree (the ramp "
        "starts at LR / workers)"),
    "callbacks.LearningRateScheduleCallback": (
        "multiplies the LR by a factor between two epochs", "tf.keras.optimizers.schedules (PiecewiseConstantDecay)",
        "left by hand: lr_schedule = \"package.module:function\" (docs/jobs.md)", P_NONE + "the port does not map it"),
    "broadcast": ("sends a value from a root rank to every worker", "not needed for a value every worker computes "
                  "alike (such as a resume epoch: tf.keras.callbacks.BackupAndRestore restores it on every worker)",
                  "left by hand", P_NONE + "the port does not map it"),
    "allreduce": ("averages a tensor over the workers",
                  "inside strategy.run: tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.MEAN, "
                  "x); a Keras evaluate under the strategy already returns the global numbers",
                  "left by hand", P_NONE + "the port does not map it"),
    "allgather": ("gathers a tensor from every worker", "tf.distribute.get_replica_context().all_gather(x, axis=0)",
                  "left by hand", P_NONE + "the port does not map it"),
    "load_model": ("loads a saved model, wrapping its optimizer in DistributedOptimizer",
                   "tf.keras.models.load_model(path) under strategy.scope()", "left by hand",
                   P_NONE + "the port does not map it"),
    "Compression.fp16": ("casts the gradients to float16 for the allreduce (half the bytes, less precise)",
                         "none for the all-reduce payload: tf.distribute.experimental.CommunicationOptions has "
                         "bytes_per_pack, timeout_seconds and implementation only (TF 2.21's collective_util.py)",
                         "not carried: python -m backends.horovod --fp16-allreduce does it on the Horovod side only",
                         "tests/test_backends.py::test_horovod_fp16_compression_stays_close (Horovod only: it "
                         "changes the math, so parity runs leave it off)"),
    "Compression.none": ("no compression (the default)", "the default", "nothing to carry", P_GRAD),
    "shutdown": ("stops Horovod", "nothing: the strategy ends with the process", "dropped", "-"),
}
# constructs of a Horovod script that are not Horovod calls: (what the script does with them, the MWMS counterpart)
KERAS_ROWS = {
    "ModelCheckpoint": ("saves the model each epoch, on rank 0 only (the others would corrupt the file)",
                        "every worker saves (saving runs collectives): the chief to the real path, the others to a "
                        "temporary directory they remove (TensorFlow's 'Multi-worker training with Keras'); "
                        "tf.keras.callbacks.BackupAndRestore for preemption"),
    "TensorBoard": ("writes TensorBoard logs, on rank 0", "the callback on every worker, the non-chief ones writing to "
                    "temporary directories"),
    "checkpoint.save (tf.train.Checkpoint)": (
        "saves the model and optimizer on rank 0",
        "every worker calls checkpoint.save (or a tf.train.CheckpointManager), the non-chief ones into a temporary "
        "directory they remove"),
    "compile(metrics=...)": ("training metrics per epoch (averaged by MetricAverageCallback)",
                             "compile(metrics=...) under strategy.scope(): aggregated across replicas"),
    "fit(initial_epoch=...)": ("resumes at an epoch found in the script's own checkpoints",
                               "tf.keras.callbacks.BackupAndRestore restores the model and the epoch on every worker"),
}
ELASTIC = ("elastic training: workers may join or leave, the state rolled back to its last commit",
           "none in MWMS (a fixed cluster); tf.keras.callbacks.BackupAndRestore resumes after a preemption",
           "not ported: left by hand", P_NONE + "MWMS has no elastic counterpart")


def rows(port: Port, env: Env) -> list[Row]:
    """A row per Horovod call and ``hvd.Compression`` value of the script, in line order."""
    out: list[Row] = []
    seen: set[tuple[int, str]] = set()
    decorators = [d for n in ast.walk(port.tree) if isinstance(n, ast.FunctionDef) for d in n.decorator_list]
    for node in ast.walk(port.tree):
        name = hvd_name(node, port.hvd)
        parts = dotted(node).split(".") if isinstance(node, ast.Attribute) else []
        if not name and parts and parts[0] in port.hvd and node in decorators:  # @hvd.elastic.run
            name = ".".join(parts[1:])
        if not name and len(parts) == 3 and parts[0] in port.hvd and parts[1] == "Compression":
            name = dotted(node).split(".", 1)[1]
        if not name or (node.lineno, name) in seen:
            continue
        seen.add((node.lineno, name))
        horovod, mwms, here, proof = ELASTIC if name.startswith("elastic.") else KNOWLEDGE.get(
            name, ("a Horovod call the port does not know", "-", "left by hand", P_NONE + "unknown to the port"))
        if name.startswith("elastic.") or name not in KNOWLEDGE:
            port.hand(node, f"hvd.{name}: {here}")
        here = port.notes.get(id(node), here)
        proof = port.proofs.get(id(node), proof)
        if name in ("DistributedOptimizer", "DistributedGradientTape") and isinstance(node, ast.Call):
            here = wrapper_options(port, env, node, here)
        out.append(Row(node.lineno, f"hvd.{name}", horovod, mwms, here, proof))
    return sorted([*out, *port.extra_rows], key=lambda r: (r.line, r.construct))


def wrapper_options(port: Port, env: Env, node: ast.Call, here: str) -> str:
    """What became of a DistributedOptimizer's or DistributedGradientTape's compression and accumulation."""
    kw = {k.arg: k.value for k in node.keywords}
    comp = kw.get("compression")
    if isinstance(comp, ast.Name):
        comp = definition(port, port.tree.body, comp.id, node.lineno) or _body_def(port, comp.id) or comp
    if isinstance(comp, ast.IfExp):  # fp16 if args.fp16_allreduce else none: the flag's default decides
        comp = comp.body if env.value(comp.test) else comp.orelse
    if comp is not None and dotted(comp).endswith("Compression.fp16"):
        port.drop(node, "Compression.fp16: gradients all-reduced in float16 under Horovod; MWMS has no counterpart "
                        "(CommunicationOptions: bytes_per_pack, timeout_seconds, implementation); twinbench's "
                        "Horovod backend does it with --fp16-allreduce, on that backend only")
        here += "; compression=fp16: not carried (python -m backends.horovod --fp16-allreduce, Horovod side only)"
    elif comp is not None and not dotted(comp).endswith("Compression.none"):
        port.hand(comp, f"compression={port.text(comp)}: the port cannot tell which")
    passes = env.value(kw.get("backward_passes_per_step"))
    if passes not in (None, 1):
        port.drop(node, f"backward_passes_per_step={passes}: Horovod sums the gradients of {passes} batches before "
                        "each update; no MWMS counterpart in tf_keras (its optimizers have no gradient accumulation; "
                        "Keras 3's gradient_accumulation_steps acts per replica, twinbench refuses it): every step "
                        "here is one batch")
        here += f"; backward_passes_per_step={passes}: not carried (no gradient accumulation in tf_keras)"
    return here


# -- writing ---------------------------------------------------------------------------------------------------------
def analyse(script: Path) -> Port:
    """Everything the port writes, from the script's syntax tree; PortError for bad input."""
    source, tree, hvd = read_script(script)
    port = Port(script, source, tree, hvd)
    body = training_body(port)
    env = make_env(tree, body, hvd)
    port.flags_name = env.args_name
    fit = find_fit(port, env)
    if fit is not None:
        analyse_fit(port, env, body, fit)
    else:
        analyse_tape(port, env, body)
    checkpoints(port)
    rank_notes(port)
    port.code = code_text(port)
    port.rows = rows(port, env)
    leftovers(port, env, body)
    return port


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        inner = ",\n".join(f"  {toml_value(v)}" for v in value)
        return f"[\n{inner},\n]" if value else "[]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    return repr(value)


KEY_WHY = {
    "mode": "fit: the script trains with model.fit; ctl: with its own GradientTape loop (twinbench's custom loop)",
    "per_replica_batch_size": "the script's batch, per worker",
    "lr_scaling": "linear: the script multiplies the LR by hvd.size()",
    "warmup_epochs": "hvd.callbacks.LearningRateWarmupCallback(warmup_epochs=...)",
    "steps": "the script's take(...) at 1 worker",
    "steps_per_epoch": "the script's steps_per_epoch at 1 worker",
    "epochs": "the script's epochs",
}


def job_text(port: Port, module: str, out: Path) -> str:
    model, data = (f[0] for f in port.functions)
    keys = {"name": port.script.stem, "model": f"{module}:{model}", "dataset": f"{module}:{data}", **port.keys}
    # the script's folder (its own imports) and this folder (the moved code), relative to the job file
    keys["pythonpath"] = sorted({os.path.relpath(port.script.resolve().parent, out.resolve()), "."})
    if port.not_carried:
        keys["not_carried"] = port.not_carried
    lines = [f"# Written by python -m {PROG} from {port.script.name}: MIGRATION.md says what each key replaces.",
             f"# python -m common.check --job {out.name}/job.toml ; make demo JOB={out.name}/job.toml"]
    for key, value in keys.items():
        if key == "lr_scaling" and value == "none":
            lines.append("# none: the script's learning rate does not depend on hvd.size()")
        elif key in KEY_WHY:
            lines.append(f"# {KEY_WHY[key]}")
        lines.append(f"{key} = {toml_value(value)}")
    return "\n".join(lines) + "\n"


def code_text(port: Port) -> str:
    imports = [ast.get_source_segment(port.source, s) or "" for s in ast.walk(port.tree)
               if isinstance(s, ast.Import | ast.ImportFrom) and not any(
                   (a.name if isinstance(s, ast.Import) else s.module or "").startswith("horovod") for a in s.names)]
    flags = ""
    if port.flags is not None:
        shown = ", ".join(f"{k}={v!r}" for k, v in port.flags.items())
        flags = (f"# the script's flags at their defaults (its argparse calls): pass others as job keys\n"
                 f"args = argparse.Namespace({shown})")
        imports.append("import argparse")
    head = (f'"""The model and the data of {port.script.name}, moved here as written by python -m {PROG}: each '
            "block names its source lines; the job (job.toml) names the two functions. twinbench imports this "
            'module before TensorFlow starts: the functions make the tensors, not the import."""\n')
    helpers = [moved(port, [port.helpers[line]], indent="") for line in sorted(port.helpers)]
    functions = [function_text(port, *f) for f in port.functions]
    parts = [head, "\n".join(dict.fromkeys(i for i in imports if i)), flags, *helpers, *functions]
    return "\n\n\n".join(p.rstrip("\n") for p in parts if p) + "\n"


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def migration_text(port: Port, module: str, mwms_name: str, out: Path) -> str:
    name = port.script.name
    lines = [f"# Leaving Horovod: {name}", "",
             f"Written by `python -m {PROG} {name}`, which read the script without running it.", "",
             "## What was written", "",
             f"- `job.toml`: the twinbench job; `{module}.py`: the script's model and data code, moved as written "
             f"into `{port.functions[0][0]}` and `{port.functions[1][0]}` (each block names its source lines).",
             "  `python -m common.check --job job.toml` proves it computes the same math on "
             "MultiWorkerMirroredStrategy and Horovod at 1 and 2 workers; `make demo JOB=job.toml` runs both and "
             "reports.",
             f"- `{mwms_name}`: the script ported to MultiWorkerMirroredStrategy (`srun python {mwms_name}` on a "
             f"cluster; `python -m backends.native --nproc 2 --script {mwms_name}` on one machine).", "",
             "## Horovod constructs, line by line", "",
             "| line | construct | under Horovod | MultiWorkerMirroredStrategy | in this port | "
             "what twinbench proved |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r.line} | `{cell(r.construct)}` | {cell(r.horovod)} | {cell(r.mwms)} | {cell(r.here)} | "
              f"{cell(r.proof)} |" for r in port.rows]
    lines += ["", "## Not carried", "",
              "What the script does that the job cannot: the job's `not_carried`, printed at the start of every run."
              if port.not_carried else "Nothing: every construct of the script has its counterpart in the job.", ""]
    lines += [f"- {t}" for t in port.not_carried]
    lines += ["", "## Data order", "",
              "Where the script's order of examples cannot be kept, and what that changes:", ""]
    lines += [f"- {t}" for t in port.data_order]
    lines += ["", "## Left by hand", ""]
    lines += [f"- {t}" for t in port.by_hand] or ["Nothing: the port recognised every statement it had to."]
    return "\n".join(lines) + "\n"


def validate(job_file: Path) -> None:
    """The written job loads and its functions take the arguments twinbench passes (nothing imported)."""
    try:
        job = load_job(job_file)
        argcheck.refuse(job, job_file.parent, paths=False)
    except JobError as e:
        raise PortError(f"the written job does not load: {e}") from None


def write(port: Port, out: Path) -> list[str]:
    """Write everything into a temporary directory beside ``out``, check the job, rename; the MWMS script's "not
    recognised" lines returned."""
    module = f"{port.script.stem}_code"
    mwms_name = f"{port.script.stem}_mwms.py"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        (tmp / f"{module}.py").write_text(port.code)
        (tmp / "job.toml").write_text(job_text(port, module, out))
        validate(tmp / "job.toml")
        try:
            mwms = port_mwms.write_mwms(port.source, port.tree, port.script, tmp / mwms_name)
        except ValueError as e:  # the MWMS port of this script failed its own checks: the job still stands
            mwms = [f"{port.script.name}:1: {mwms_name} not written: {e}"]
        port.by_hand.extend(line for line in mwms if line not in port.by_hand)
        (tmp / "MIGRATION.md").write_text(migration_text(port, module, mwms_name, out))
        if out.exists():
            out.rmdir()  # empty: checked before
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return mwms


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Port a Horovod TensorFlow 2 training script: a twinbench "
                                "job, a migration table and a MultiWorkerMirroredStrategy script (docs/porting.md).")
    p.add_argument("script", type=Path, help="the Horovod script (read, never run)")
    p.add_argument("--out", type=Path, default=None,
                   help="where to write (default: <stem>.port/ beside the script); must not exist or be empty")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    script: Path = args.script
    out: Path = args.out or script.with_name(f"{script.stem}.port")
    try:
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise PortError(f"--out {out}: exists and is not empty (the port writes a new directory)")
        port = analyse(script)
        write(port, out)
    except PortError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    for line in port.by_hand:
        print(f"{PROG}: by hand: {line}", file=sys.stderr)
    print(f"{PROG}: wrote {out}/ (job.toml, {script.stem}_code.py, {script.stem}_mwms.py, MIGRATION.md): "
          f"{len(port.rows)} constructs in MIGRATION.md, {len(port.not_carried)} not carried, "
          f"{len(port.by_hand)} left by hand")
    return EXIT_BY_HAND if port.by_hand else EXIT_OK


def rank_notes(port: Port) -> None:
    """What each ``hvd.rank()`` is for: a rank-0 guard, the verbosity, a per-rank file name."""
    for node in ast.walk(port.tree):
        if isinstance(node, ast.If | ast.IfExp):
            for n in ast.walk(node.test):
                if hvd_name(n, port.hvd) == "rank":
                    port.notes.setdefault(id(n), "a rank-0 guard (the chief): twinbench prints on its chief only; "
                                          "what the guard holds has its own row" if isinstance(node, ast.If) else
                                          "verbosity on rank 0: twinbench prints on its chief only")
        if isinstance(node, ast.Call) and dotted(node.func) in ("print", "log"):
            for n in ast.walk(node):
                if hvd_name(n, port.hvd) in ("size", "rank", "local_rank"):
                    port.notes.setdefault(id(n), "logging: twinbench's banner prints the workers and replicas")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant) \
                and isinstance(node.left.value, str) and "." in node.left.value:
            for n in ast.walk(node.right):
                if hvd_name(n, port.hvd) == "rank":
                    port.notes[id(n)] = ("a per-rank file name: dropped, the moved code reads rank 0's name (twinbench "
                                         "gives every rank the same data; Horovod's per-rank name kept ranks from "
                                         "racing to download one file)")


if __name__ == "__main__":
    sys.exit(main())
