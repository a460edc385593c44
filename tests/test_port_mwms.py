"""The MultiWorkerMirroredStrategy port of a Horovod script (``common.port_mwms.write_mwms``) and the plain-script
launcher (``python -m backends.native --nproc N --script FILE [-- ARGS]``).

Pure Python: each fixture's port (tests/fixtures/horovod/) parses, imports no Horovod and uses no Horovod name, makes
its strategy from SlurmClusterResolver or TF_CONFIG, builds the model under ``strategy.scope()``, scales what
``hvd.size()`` scaled by ``num_replicas_in_sync``, prints where ``hvd.rank() == 0`` printed only on the chief, and
every Horovod line is rewritten, commented out with a reason, or named; the launcher's bad input (one line, exit 2,
nothing started), TF_CONFIG per worker, arguments after ``--``, and a failing worker stopping the others.

Heavy (one module fixture, the ports run one after the other): each runnable port that writes a checkpoint at 2
local workers through ``--script`` exits 0, prints once (on the chief) and leaves only the chief's checkpoint.
keras_benchmark's port (no checkpoint) runs at 2 workers in tests/test_slurm.py::
test_srun_runs_a_horovod_scripts_mwms_port (srun -n 2: exit 0, printed once, by the chief of 2 workers).
"""

from __future__ import annotations

import ast
import io
import json
import subprocess
import tokenize
from pathlib import Path
from typing import Any

import pytest

from common.port_mwms import write_mwms
from tests.aids.refusals import batch
from tests.conftest import PY, REPO, RUN_TIMEOUT, base_env

FIXTURES = REPO / "tests" / "fixtures" / "horovod"
SCRIPTS = ("keras_mnist", "tape_mnist", "keras_benchmark", "keras_accum", "elastic_mnist")
# the ports run here (elastic_mnist's is left by hand: hvd.elastic is not ported; keras_benchmark's 2-worker run,
# which writes no checkpoint, is tests/test_slurm.py's)
RUN_HERE = ("keras_mnist", "tape_mnist", "keras_accum")
# what each port names as not ported: (text on the source line, words of the reason)
NOT_PORTED = {
    "keras_accum": [("hvd.broadcast(resume_from_epoch", "hvd.broadcast"),
                    ("backward_passes_per_step=2", "backward_passes_per_step=2")],
    "elastic_mnist": [("hvd.elastic.KerasState", "elastic"), ("hvd.elastic.UpdateEpochStateCallback", "elastic"),
                      ("@hvd.elastic.run", "elastic")],
}


def port(name: str, out: Path) -> tuple[str, str, list[str]]:
    """(source, its port's text, the names of what was not ported)."""
    script = FIXTURES / f"{name}.py"
    source = script.read_text()
    left = write_mwms(source, ast.parse(source), script, out)
    return source, (out / f"{name}_mwms.py").read_text(), left


def code_lines(text: str) -> dict[int, str]:
    """Line -> its code without the comment (lines of comments only left out)."""
    out: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                            tokenize.ENDMARKER):
            out.setdefault(tok.start[0], text.splitlines()[tok.start[0] - 1].split("  # ")[0].strip())
    return out


def undistributed(line: str) -> str:
    """The line without the port's ``strategy.experimental_distribute_dataset(...)`` around a loop's dataset."""
    wrapper = "strategy.experimental_distribute_dataset("
    if wrapper not in line:
        return line
    line = line.replace(wrapper, "", 1)
    last = line.rfind(")")
    return line[:last] + line[last + 1:]


def hvd_lines(source: str) -> dict[int, set[str]]:
    """Line -> the Horovod names it uses (``hvd.size``, ``hvd.callbacks.MetricAverageCallback``...)."""
    tree = ast.parse(source)
    aliases = {a.asname or a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)
               for a in n.names if "horovod" in (a.name if isinstance(n, ast.Import) else n.module or "")}
    parents = {id(c): n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
    out: dict[int, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in aliases:
            top: ast.AST = node
            while isinstance(parents.get(id(top)), ast.Attribute):
                top = parents[id(top)]
            out.setdefault(node.lineno, set()).add(ast.unparse(top))
    return out


@pytest.fixture(scope="module")
def ports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str, list[str]]]:
    out = tmp_path_factory.mktemp("ports")
    return {name: port(name, out) for name in SCRIPTS} | {"dir": out}  # type: ignore[dict-item]


@pytest.mark.parametrize("name", SCRIPTS)
def test_port_parses_without_horovod_and_makes_the_strategy(name, ports):
    source, text, _ = ports[name]
    tree = ast.parse(text)
    imported = [a.name if isinstance(n, ast.Import) else n.module for n in ast.walk(tree)
                if isinstance(n, ast.Import | ast.ImportFrom) for a in n.names]
    assert not [m for m in imported if m and m.split(".")[0] == "horovod"], imported
    assert not [n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in ("hvd", "horovod")]
    assert "tf.distribute.cluster_resolver.SlurmClusterResolver(" in text
    assert "tf.distribute.cluster_resolver.TFConfigClusterResolver()" in text
    assert "tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)" in text
    made = [n for n in ast.walk(tree) if isinstance(n, ast.Assign) and ast.unparse(n) == "strategy = make_strategy()"]
    assert len(made) == 1, "one strategy, where hvd.init() was"


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_model_is_compiled_under_the_strategy_scope(name, ports):
    tree = ast.parse(ports[name][1])
    scopes = [n for n in ast.walk(tree) if isinstance(n, ast.With)
              and ast.unparse(n.items[0].context_expr) == "strategy.scope()"]
    assert len(scopes) == 1
    inside = {ast.unparse(n.func) for n in ast.walk(scopes[0]) if isinstance(n, ast.Call)}
    assert any(f.endswith(".compile") for f in inside) or name == "tape_mnist", inside
    assert any("optimizers" in f for f in inside), "the optimizer is made under the scope too"


@pytest.mark.parametrize("name", SCRIPTS)
def test_size_and_rank_zero_map_to_replicas_and_the_chief(name, ports):
    """Each source line that scaled by hvd.size() (the LR, the steps, the take) now scales by num_replicas_in_sync,
    the rest of the line kept; each hvd.rank() == 0 test (printing, verbose) is the chief's."""
    source, text, _ = ports[name]
    code = {undistributed(c) for c in code_lines(text).values()}
    lines = [ln.strip() for ln in source.splitlines() if not ln.strip().startswith("#")]
    for ln in [ln for ln in lines if "hvd.size()" in ln and "shard(" not in ln and "elastic" not in ln]:
        assert ln.replace("hvd.size()", "strategy.num_replicas_in_sync") in code, ln
    for ln in [ln for ln in lines if "hvd.rank() == 0" in ln and ln.startswith(("verbose", "if batch"))]:
        assert ln.replace("hvd.rank() == 0", "is_chief(strategy)") in code, ln
    if name == "keras_mnist":
        assert "scaled_lr = 0.001 * strategy.num_replicas_in_sync" in code


def test_prints_of_the_benchmark_are_the_chiefs(ports):
    tree = ast.parse(ports["keras_benchmark"][1])
    guarded = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "is_chief(strategy)"]
    assert [ast.unparse(s.value.func) for s in guarded[0].body] == ["print", "print"]
    assert "callbacks.append(TimingCallback())" in [ast.unparse(s) for s in guarded[1].body]


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_horovod_line_is_rewritten_commented_or_named(name, ports):
    """Each source line using Horovod is commented out verbatim, named as not ported, or rewritten: then a comment
    of the port names its Horovod call (``# was hvd.size()``), one such comment per rewritten line at least."""
    source, text, left = ports[name]
    src = source.splitlines()
    commented = {ln.strip()[2:].strip() for ln in text.splitlines() if ln.strip().startswith("# ")}
    named = {int(line.split(":")[1]) for line in left}
    comments = [ln.split("#", 1)[1] for ln in text.splitlines() if "  # " in ln or ln.strip().startswith("# MWMS")]
    needs: dict[str, int] = {}
    for n, calls in sorted(hvd_lines(source).items()):
        if src[n - 1].strip() not in commented and n not in named:
            for call in calls:
                needs[call] = needs.get(call, 0) + 1
    assert needs, "a rewritten line at least"
    for call, count in needs.items():
        assert sum(call in c for c in comments) >= count, (call, count)


@pytest.mark.parametrize("name", SCRIPTS)
def test_what_cannot_be_ported_is_named_by_line(name, ports):
    source, _, left = ports[name]
    want = NOT_PORTED.get(name, [])
    assert len(left) == len(want), left
    for (text, why), line in zip(want, left, strict=True):
        number = next(i for i, ln in enumerate(source.splitlines(), 1) if text in ln)
        assert line.startswith(f"{name}.py:{number}: ") and why in line, line


def test_custom_step_runs_on_the_distributed_dataset(ports):
    tree = ast.parse(ports["tape_mnist"][1])
    calls = {ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert "strategy.experimental_distribute_dataset(dataset.take(24 // strategy.num_replicas_in_sync))" in calls
    assert ("strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(training_step, args=(images, labels, "
            "batch == 0)), axis=None)") in calls
    assert "tf.nn.compute_average_loss(loss(labels, probs))" in calls
    assert "tf.losses.SparseCategoricalCrossentropy(reduction=tf.keras.losses.Reduction.NONE)" in calls
    assert "checkpoint.save(write_filepath(checkpoint_dir, strategy))" in calls
    assert "remove_worker_copy(checkpoint_dir, strategy)" in calls


def test_batches_are_global_and_hvd_shards_left_to_the_strategy(ports):
    for name, batch_call in (("keras_mnist", "batch(32 * strategy.num_replicas_in_sync)"),
                             ("keras_benchmark", "batch(args.batch_size * strategy.num_replicas_in_sync)"),
                             ("keras_accum", "batch(batch_size * strategy.num_replicas_in_sync)")):
        text = ports[name][1]
        assert batch_call in text, name
        assert not any(".shard(" in c for c in code_lines(text).values()), name


# -- the launcher ------------------------------------------------------------------------------------------------
def test_script_bad_input_is_one_line_exit_2(tmp_path):
    plain = tmp_path / "plain.py"
    plain.write_text("raise SystemExit('must not run')\n")
    cases = [["--script", str(plain)], ["--nproc", "0", "--script", str(plain)],
             ["--nproc", "2", "--script", str(tmp_path / "missing.py")],
             ["--nproc", "2", "--script", str(REPO / "README.md")],
             ["--nproc", "2", "--script", str(plain), "--job", "jobs/smoke.toml"]]
    env = base_env()
    runs = batch([{"module": "backends.native", "argv": argv} for argv in cases]
                 + [{"module": "backends.native", "argv": ["--nproc", "2", "--script", str(plain)],
                     "env": {**env, "TF_CONFIG": "{}"}}], env)
    for argv, r in zip([*cases, ["TF_CONFIG set"]], runs, strict=True):
        lines = r["stderr"].strip().splitlines()
        assert r["rc"] == 2 and len(lines) == 1 and lines[0].startswith("backends.native: error: --"), (argv, r)
        assert not r["tensorflow"] and "must not run" not in r["stderr"] + r["stdout"], argv


PLAIN = """import json, os, sys, time
tfc = json.loads(os.environ["TF_CONFIG"])
seen = {"index": tfc["task"]["index"], "workers": tfc["cluster"]["worker"], "args": sys.argv[1:]}
os.write(1, (json.dumps(seen) + "\\n").encode())  # one write: the workers share the launcher's stdout
if "--fail" in sys.argv:
    if tfc["task"]["index"] == 1:
        sys.exit(4)
    time.sleep(60)  # a peer waiting forever for the one that failed: the launcher stops it
"""


def launch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "plain.py"
    script.write_text(PLAIN)
    return subprocess.run([PY, "-m", "backends.native", "--nproc", "2", "--script", str(script), "--", *args],
                          cwd=REPO, env=base_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT)


def test_script_workers_get_tf_config_on_loopback_and_the_arguments(tmp_path):
    proc = launch(tmp_path, "--epochs", "1")
    seen = sorted((json.loads(ln) for ln in proc.stdout.splitlines()), key=lambda d: d["index"])
    assert proc.returncode == 0, proc.stderr
    assert [d["index"] for d in seen] == [0, 1] and seen[0]["workers"] == seen[1]["workers"]
    assert len(set(seen[0]["workers"])) == 2 and all(w.startswith("127.0.0.1:") for w in seen[0]["workers"])
    assert all(d["args"] == ["--epochs", "1"] for d in seen)


def test_script_first_failure_stops_the_others_and_is_the_status(tmp_path):
    proc = launch(tmp_path, "--fail")
    assert proc.returncode == 4, proc.stderr
    assert "worker 1" in proc.stderr and "exited with status 4 first; stopping the others" in proc.stderr


# -- heavy: each runnable port at 2 local workers --------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(ports, tmp_path_factory) -> dict[str, dict[str, Any]]:
    """Each port of RUN_HERE through ``--nproc 2 --script``, one after the other, each in a directory of its own."""
    out = {}
    for name in RUN_HERE:
        cwd = tmp_path_factory.mktemp(f"run-{name}")
        proc = subprocess.run([PY, "-m", "backends.native", "--nproc", "2", "--script",
                               str(ports["dir"] / f"{name}_mwms.py")], cwd=cwd,
                              env=base_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT)
        out[name] = {"proc": proc, "files": sorted(p.name for p in cwd.iterdir())}
    return out


CHIEF_PRINTS = {"keras_mnist": "finished gradual learning rate warmup", "tape_mnist": "Step #0\t",
                "keras_accum": "Train loss:"}
KEPT = {"keras_mnist": ["checkpoint-1.h5", "checkpoint-2.h5"], "tape_mnist": ["checkpoint", "checkpoints-1.data-"
        "00000-of-00001", "checkpoints-1.index"], "keras_accum": ["checkpoint-1.h5", "checkpoint-2.h5"]}


@pytest.mark.distributed
@pytest.mark.parametrize("name", RUN_HERE)
def test_port_runs_at_two_workers(name, runs):
    proc = runs[name]["proc"]
    assert proc.returncode == 0, f"{name}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    # printed once: by the chief only (each worker prints to the same terminal)
    assert (proc.stdout + proc.stderr).count(CHIEF_PRINTS[name]) == 1, proc.stdout[-2000:]
    # the chief's checkpoint kept, worker 1's temporary copy removed
    assert runs[name]["files"] == KEPT[name]
