"""The structure rules (scripts/check_structure.py, run by `make test`) hold, and the checker can see a breach."""

from __future__ import annotations

import ast
import subprocess
import sys

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import check_structure as cs  # noqa: E402


def test_the_repository_keeps_its_structure_rules():
    proc = subprocess.run([sys.executable, "scripts/check_structure.py"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_checker_finds_a_long_function():
    body = "\n".join(f"    x{i} = {i}" for i in range(cs.MAX_FUNCTION_LINES))
    found = cs.long_functions(ast.parse(f"def f():\n{body}\n"), "m.py")
    assert found and "function f has 81 lines" in found[0]
    assert cs.long_functions(ast.parse("def g():\n    return 1\n"), "m.py") == []


def test_checker_finds_an_import_cycle_including_lazy_imports():
    known = {"common.a", "common.b", "common.c"}
    a = cs.imports_of(ast.parse("def f():\n    from common import b\n"), "common.a", False, known)
    b = cs.imports_of(ast.parse("from common.a import f\n"), "common.b", False, known)
    c = cs.imports_of(ast.parse("import common.a\n"), "common.c", False, known)
    assert a == {"common.b"} and b == {"common.a"} and c == {"common.a"}
    assert cs.cycles({"common.a": a, "common.b": b, "common.c": c}) == [["common.a", "common.b"]]


def test_checker_finds_a_list_of_backends_outside_backends():
    names = list(cs.registry.names())[:2]
    found = cs.backend_listings(ast.parse(f"B = {tuple(names)!r}\nX = ({names[0]!r},)\n"), "common/x.py")
    assert len(found) == 1 and "common/x.py:1" in found[0]


def test_checker_finds_a_lower_layer_importing_a_higher_one():
    graph = {
        "common.workload.job": {"common.training.loops"},  # workload -> training: up
        "common.training.loops": {"common.workload.job", "common.core.contract", "common.core.errors"},  # down: allowed
        "common.core.contract": {"common.training.train"},  # the contract importing training: up
        "common.sweep.cli": {"common.report.load", "common.training.train"},  # entry modules may import anything
        "backends.native": {"common.core.contract", "common.training.train"},  # backends stand on common/
    }
    found = cs.upward_imports(graph)
    assert len(found) == 2, found
    assert found[0].startswith("common.core.contract (core) imports common.training.train (training)")
    assert found[1].startswith("common.workload.job (workload) imports common.training.loops (training)")
    assert [cs.layer_of(m) for m in ("common.core.contract", "common.core.registry", "common.core.results",
                                     "common.workload", "common.report.cli", "common.cli", "common.sweep.plan",
                                     "backends", "backends.horovod")] == [0, 0, 0, 1, 5, 6, 6, 6, 6]


def test_checker_finds_common_importing_backends():
    """backends/ stands on common/: any import of backends from common/ is a breach, entry modules and lazy imports
    included; the registry's lookup by module name is the one way up, and only in common/core/registry.py."""
    known = {"backends", "backends.native", "backends.base", "common.doctor", "common.core.registry"}
    lazy = cs.imports_of(ast.parse("def f():\n    from backends import native\n"), "common.doctor", False, known)
    graph = {"common.doctor": lazy, "common.report.load": {"backends"}, "backends.native": {"common.doctor"}}
    found = cs.common_imports_backends(graph)
    assert {f.split()[0] for f in found} == {"common.doctor", "common.report.load"}, found  # not backends.native
    assert "common.doctor imports backends.native: common/ never imports backends/ (ask common.core.registry.load " \
        "for a backend)" in found
    by_name = "import importlib\nm = importlib.import_module('backends.native')\n"
    assert cs.backend_by_name(ast.parse(by_name), "common/doctor.py") == [
        "common/doctor.py:2: imports backends.native by name: only common/core/registry.py may"]
    assert cs.backend_by_name(ast.parse(by_name), "common/core/registry.py") == []
    assert cs.backend_by_name(ast.parse(by_name), "bench/clock.py") == []


def test_checker_finds_an_objective_outside_its_home():
    """Only common/training/objective.py builds a Keras loss or scales one to the global batch (in backends/ and
    common/); the benchmarks and the tests may write their own."""
    src = ("loss = tf.keras.losses.SparseCategoricalCrossentropy()\n"
           "x = tf.nn.compute_average_loss(per_example, global_batch_size=8)\n"
           "r = tf.nn.scale_regularization_loss(model.losses)\n"
           "y = tf.nn.relu(x)\n")
    found = cs.objective_outside_home(ast.parse(src), "backends/x.py")
    assert sorted(f.split(": ")[0] for f in found) == ["backends/x.py:1", "backends/x.py:2", "backends/x.py:3"], found
    assert all(f.endswith(": the objective lives in common/training/objective.py") for f in found)
    assert cs.objective_outside_home(ast.parse(src), "common/training/loops.py")  # common/ outside the home too
    for home_or_free in (cs.OBJECTIVE_HOME, "bench/plain_loops.py", "tests/test_x.py"):
        assert cs.objective_outside_home(ast.parse(src), home_or_free) == []


def test_checker_finds_a_gradient_tape_outside_the_step():
    """Only common/training/step.py opens a gradient tape or scales the loss for mixed precision (in backends/ and
    common/): fit's train_step, the custom loop and the probes all take the one ReplicaStep."""
    src = ("with tf.GradientTape() as tape:\n    s = opt.get_scaled_loss(loss)\n"
           "g = opt.get_unscaled_gradients(tape.gradient(s, v))\nh = tape.gradient(loss, v)\n")
    found = cs.step_outside_home(ast.parse(src), "common/training/loops.py")
    assert sorted(f.split(": ")[0] for f in found) == ["common/training/loops.py:1", "common/training/loops.py:2",
                                                        "common/training/loops.py:3"], found
    assert all(f.endswith(": the step lives in common/training/step.py") for f in found)
    for home_or_free in (cs.STEP_HOME, "bench/plain_loops.py", "tests/test_x.py"):
        assert cs.step_outside_home(ast.parse(src), home_or_free) == []


def _uses_slurm_fixture(fn: ast.FunctionDef) -> bool:
    """A test taking the session fixture ``cluster`` (not a parametrize argument of that name)."""
    params = {a.arg for a in fn.args.args}
    names = " ".join(str(d.args[0].value) for d in fn.decorator_list if isinstance(d, ast.Call) and d.args
                     and isinstance(d.args[0], ast.Constant) and ast.unparse(d.func).endswith("parametrize"))
    return "cluster" in params and "cluster" not in names.replace(",", " ").split()


def test_files_that_start_a_cluster_share_the_cluster_worker():
    """`make test` gives the files that start the Slurm or the emulated cluster one xdist worker (tests/conftest.py):
    a new such file outside CLUSTER_FILES would start its own copy of the Slurm cluster beside the other worker's.
    No file on that worker uses the runner fixture, whose shared runs the other worker makes."""
    from tests.conftest import CLUSTER_FILES, OWN_WORKER_FILES

    starts, shared = set(), set()
    for path in sorted((REPO / "tests").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        emulated = any(isinstance(n, ast.ImportFrom) and n.module == "tests.cluster.emulated" for n in tree.body)
        tests = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
        if emulated or any(_uses_slurm_fixture(n) for n in tests):
            starts.add(path.name)
        if any("runner" in {a.arg for a in n.args.args} for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            shared.add(path.name)
    assert {"test_slurm.py", "test_cluster_runs.py", "test_cluster.py", "test_reframe.py"} <= starts  # it sees them
    assert {"test_parity.py", "test_backends.py"} <= shared  # it sees them
    assert starts <= CLUSTER_FILES <= OWN_WORKER_FILES, sorted(starts - CLUSTER_FILES)
    assert not shared & OWN_WORKER_FILES, sorted(shared & OWN_WORKER_FILES)
