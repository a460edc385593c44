"""Structure rules the project keeps (run by ``make test`` and so by CI); exit 1 naming every breach.

- no function longer than 80 lines (a module has no line limit: its borders follow its concept, not a count);
- no import cycle among the project's modules (imports inside functions count: a lazy cycle is still a cycle);
- the backends are listed only in ``common/core/registry.py``: outside it and ``backends/`` (and outside the tests
  of named backends; the shared test helpers in tests/conftest.py count), no list, tuple, set or dict literal names
  two or more registered backends (or their modules); code iterates ``registry.REGISTRY`` instead;
- the layers (``LAYERS``): core (the contract and the registry), workload, cluster, training, diagnostics, report,
  then the entry modules; no module imports one of a higher layer;
- ``backends/`` stands on ``common/``: no module of ``common/`` imports ``backends`` or anything in it (not even an
  entry module, not even inside a function, not by ``importlib`` with a literal name). The one way down-up is
  ``common.core.registry.load``, which imports a backend by the module name of its registry entry, at run time;
- the objective has one home: in ``backends/`` and ``common/`` only ``common/training/objective.py`` constructs a
  Keras loss or scales a loss to the global batch (the benchmarks' plain loops and the tests write their own on
  purpose);
- the step has one home: in ``backends/`` and ``common/`` only ``common/training/step.py`` opens a gradient tape or
  applies and removes mixed precision's loss scale, so every loop (fit, the custom loop, the breakdown's probe,
  parameter-server training) takes its gradients from the one ``ReplicaStep``;
- a ``StepHooks`` is built whole: in ``backends/`` and ``common/`` no code outside ``common/training/hostsync.py``
  assigns an attribute of one (``hooks.<part> = ...``): its parts are given to its constructor once.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from common.core import registry  # noqa: E402

PACKAGES = ("backends", "common", "bench", "scripts", "tests", "jobs")
MAX_FUNCTION_LINES = 80


def project_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def long_functions(tree: ast.AST, where: str) -> list[str]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            n = node.end_lineno - first + 1
            if n > MAX_FUNCTION_LINES:
                out.append(f"{where}:{node.lineno}: function {node.name} has {n} lines (max {MAX_FUNCTION_LINES})")
    return out


def imports_of(tree: ast.AST, name: str, is_package: bool, known: set[str]) -> set[str]:
    """Project modules imported anywhere in ``tree`` (``from pkg import mod`` counts as importing ``pkg.mod``)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_package else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join([*pkg, base] if base else pkg)
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for t in targets:
            # the longest known module that t is or lies inside
            parts = t.split(".")
            for i in range(len(parts), 0, -1):
                cand = ".".join(parts[:i])
                if cand in known and cand != name:
                    found.add(cand)
                    break
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def backend_listings(tree: ast.AST, where: str) -> list[str]:
    names = set(registry.names()) | {e.module for e in registry.REGISTRY.values()}
    out = []
    for node in ast.walk(tree):
        elts: list[ast.AST] = []
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            elts = list(node.elts)
        elif isinstance(node, ast.Dict):
            elts = [k for k in node.keys if k is not None]
        hits = {e.value for e in elts if isinstance(e, ast.Constant) and e.value in names}
        if len(hits) >= 2:
            out.append(f"{where}:{node.lineno}: lists backends {sorted(hits)}: iterate registry.REGISTRY instead")
    return out


# The layers, lowest first: a module never imports one of a higher layer. A "common.X" name covers its package and
# everything in it; common.core holds the contract (common.core.contract) and the registry (common.core.registry).
# Every module named by none (the entry modules common.cli, common.runner, common.sweep.*, common.doctor; the backends;
# bench, scripts and tests) stands above them all.
LAYERS = (
    ("core", ("common.core",)),
    ("workload", ("common.workload",)),
    ("cluster", ("common.cluster",)),
    ("training", ("common.training",)),
    ("diagnostics", ("common.diagnostics",)),
    ("report", ("common.report",)),
)
TOP = len(LAYERS)


def layer_of(module: str) -> int:
    for rank, (_, names) in enumerate(LAYERS):
        for n in names:
            if module == n or module.startswith(n + "."):
                return rank
    return TOP


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for src in sorted(graph):
        for dst in sorted(graph[src]):
            if layer_of(dst) > layer_of(src):
                out.append(f"{src} ({LAYERS[layer_of(src)][0]}) imports {dst} "
                           f"({LAYERS[layer_of(dst)][0] if layer_of(dst) < TOP else 'entry'}): a lower layer imports a "
                           "higher one")
    return out


REGISTRY_HOME = "common/core/registry.py"  # the one module of common/ that reaches backends/, by name at run time


def is_backend_module(name: str) -> bool:
    return name == "backends" or name.startswith("backends.")


def common_imports_backends(graph: dict[str, set[str]]) -> list[str]:
    """Static imports of ``backends`` (or a module in it) by a module of ``common/``."""
    return [f"{src} imports {dst}: common/ never imports backends/ (ask common.core.registry.load for a backend)"
            for src in sorted(graph) if src.startswith("common.") or src == "common"
            for dst in sorted(graph[src]) if is_backend_module(dst)]


def backend_by_name(tree: ast.AST, where: str) -> list[str]:
    """``importlib.import_module("backends...")`` / ``__import__("backends...")`` in common/, outside the registry."""
    if not where.startswith("common/") or where == REGISTRY_HOME:
        return []
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and ast.unparse(node.func).endswith(("import_module", "__import__"))
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                and is_backend_module(node.args[0].value)):
            out.append(f"{where}:{node.lineno}: imports {node.args[0].value} by name: only {REGISTRY_HOME} may")
    return out


OBJECTIVE_HOME = "common/training/objective.py"
OBJECTIVE_NAMES = ("keras.losses", "nn.compute_average_loss", "nn.scale_regularization_loss")  # ...X, tf.nn.X


STEP_HOME = "common/training/step.py"
STEP_NAMES = ("GradientTape", "get_scaled_loss", "get_unscaled_gradients")  # tf.GradientTape, optimizer.X


def step_outside_home(tree: ast.AST, where: str) -> list[str]:
    """A gradient tape or the loss-scale pair outside STEP_HOME (in backends/ and common/)."""
    if not where.startswith(("backends/", "common/")) or where == STEP_HOME:
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in STEP_NAMES:
            out.append(f"{where}:{node.lineno}: {ast.unparse(node)}: the step lives in {STEP_HOME}")
    return out


def objective_outside_home(tree: ast.AST, where: str) -> list[str]:
    """Calls that build the loss or scale it, outside OBJECTIVE_HOME (in backends/ and common/)."""
    if not where.startswith(("backends/", "common/")) or where == OBJECTIVE_HOME:
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and ast.unparse(node).endswith(OBJECTIVE_NAMES):
            out.append(f"{where}:{node.lineno}: {ast.unparse(node)}: the objective lives in {OBJECTIVE_HOME}")
    return out


HOOKS_HOME = "common/training/hostsync.py"


def _is_hooks(node: ast.AST) -> bool:
    """``hooks`` or ``<anything>.hooks``: a StepHooks by the name every loop gives it."""
    return (isinstance(node, ast.Name) and node.id == "hooks") or (isinstance(node, ast.Attribute)
                                                                 and node.attr == "hooks")


def hooks_assigned_outside_home(tree: ast.AST, where: str) -> list[str]:
    """An assignment to an attribute of a StepHooks (``hooks.<part> = ...``, ``self.hooks.x += ...``,
    ``setattr(hooks, ...)``) in backends/ or common/ outside HOOKS_HOME: its parts are given to its constructor once
    (``common.training.train.make_hooks``), and what changes while it runs is its own."""
    if not where.startswith(("backends/", "common/")) or where == HOOKS_HOME:
        return []
    targets: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets += node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets.append(node.target)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
              and node.args and _is_hooks(node.args[0])):
            targets.append(ast.Attribute(value=node.args[0], attr="?", lineno=node.lineno))
    out = []
    for t in targets:
        for sub in ast.walk(t):  # tuple targets and chained ones
            if isinstance(sub, ast.Attribute) and _is_hooks(sub.value):
                out.append(f"{where}:{sub.lineno}: assigns {ast.unparse(sub)}: a StepHooks part is given to its "
                           f"constructor once ({HOOKS_HOME}, common.training.train.make_hooks)")
    return out


def main() -> int:
    files = project_files()
    known = {module_name(p) for p in files}
    problems: list[str] = []
    graph: dict[str, set[str]] = {}
    for path in files:
        where = str(path.relative_to(REPO))
        tree = ast.parse(path.read_text(), filename=where)
        problems += long_functions(tree, where)
        problems += objective_outside_home(tree, where)
        problems += step_outside_home(tree, where)
        problems += backend_by_name(tree, where)
        problems += hooks_assigned_outside_home(tree, where)
        name = module_name(path)
        graph[name] = imports_of(tree, name, path.name == "__init__.py", known)
        # Tests of named backends (parity: one against the other) may name them; shared test helpers may not.
        if (not where.startswith(("backends/", "tests/")) and where != REGISTRY_HOME) or where == "tests/conftest.py":
            problems += backend_listings(tree, where)
    problems += upward_imports(graph)
    problems += common_imports_backends(graph)
    for cyc in cycles(graph):
        problems.append(f"import cycle among {', '.join(cyc)}")
    for p in problems:
        print(p)
    print(f"structure: {len(files)} modules checked, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
