"""``python -m common.port``: a Horovod TensorFlow 2 script read (never run) into a twinbench job, its model and data
code moved verbatim, MIGRATION.md with a row per Horovod call, bad input refused in one line with nothing written.

The fixtures (tests/fixtures/horovod/) are the project's own scripts in the shapes of Horovod's examples. Everything
here is pure Python but the last test, which runs ``common.check`` on one port (TensorFlow, distributed).
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import tomllib

from common import port
from common.training import train
from common.workload import argcheck
from common.workload.job import Job, JobError, load_job
from tests.conftest import PY, REPO, base_env

FIXTURES = REPO / "tests" / "fixtures" / "horovod"
# each fixture and the exit status its shape calls for: 3 where the script has parts the port names as by hand
EXPECTED_EXIT = {"keras_mnist": 0, "tape_mnist": 0, "keras_benchmark": 3, "keras_accum": 3, "elastic_mnist": 3}
BAD = sorted((FIXTURES / "bad").iterdir())


def hvd_aliases(tree: ast.Module) -> set[str]:
    return {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
            if a.name.startswith(("horovod.tensorflow", "horovod.keras"))}


def hvd_call_lines(source: str) -> dict[int, set[str]]:
    """Line -> the Horovod calls on it (``hvd.size``...), read from the fixture's syntax tree."""
    tree = ast.parse(source)
    aliases = hvd_aliases(tree)
    out: dict[int, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = port.dotted(node.func)
            if name.split(".")[0] in aliases and "." in name:
                out.setdefault(node.lineno, set()).add("hvd." + name.split(".", 1)[1])
    return out


def line_of(source: str, needle: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if needle in line)


def run_port(script: Path, out: Path | None, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    argv = [str(script)] + (["--out", str(out)] if out is not None else [])
    code = port.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def ported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, Path, str]]:
    """Every fixture ported once: name -> (exit status, the directory written, stderr)."""
    base = tmp_path_factory.mktemp("ported")
    out = {}
    for name in EXPECTED_EXIT:
        proc = subprocess.run([PY, "-m", "common.port", str(FIXTURES / f"{name}.py"), "--out", str(base / name)],
                              cwd=REPO, capture_output=True, text=True, env=base_env(), timeout=60)
        out[name] = (proc.returncode, base / name, proc.stderr)
    return out


@pytest.mark.parametrize("name", sorted(EXPECTED_EXIT))
def test_each_fixture_ports_with_its_exit_status_and_files(ported, name):
    code, out, err = ported[name]
    assert code == EXPECTED_EXIT[name], err
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["job.toml", f"{name}_code.py", f"{name}_mwms.py", "MIGRATION.md"])
    assert not list(out.parent.glob(f".{name}.*")), "the temporary directory is left behind"


@pytest.mark.parametrize("name", sorted(EXPECTED_EXIT))
def test_the_written_job_loads_and_passes_argcheck(ported, name):
    _, out, _ = ported[name]
    job = load_job(out / "job.toml")
    assert argcheck.problems(job) == []
    assert job.model == f"{name}_code:{'ported_build_model' if name == 'keras_accum' else 'build_model'}"
    assert str(FIXTURES) in job.pythonpath and str(out) in job.pythonpath  # the script's folder and the port's


@pytest.mark.parametrize("name", sorted(EXPECTED_EXIT))
def test_migration_has_a_row_for_every_horovod_call_line(ported, name):
    _, out, _ = ported[name]
    table = (out / "MIGRATION.md").read_text()
    rows = {(int(m.group(1)), m.group(2)) for m in re.finditer(r"^\| (\d+) \| `([^`]+)` \|", table, re.M)}
    expected = hvd_call_lines((FIXTURES / f"{name}.py").read_text())
    assert expected, "a fixture without Horovod calls tests nothing"
    for line, names in expected.items():
        for call in names:
            assert (line, call) in rows, f"{name}.py:{line}: no row for {call}"


@pytest.mark.parametrize("name", sorted(EXPECTED_EXIT))
def test_moved_code_is_the_scripts_own_lines(ported, name):
    """Every line of the moved functions is a line of the script, but for hvd.size() -> 1 and hvd.rank() -> 0."""
    _, out, _ = ported[name]
    source = (FIXTURES / f"{name}.py").read_text()
    variants = set()
    for line in source.splitlines():
        s = line.strip()
        variants |= {s, re.sub(r"hvd\.(local_)?rank\(\)", "0", re.sub(r"hvd\.(local_)?size\(\)", "1", s))}
    code = (out / f"{name}_code.py").read_text()
    tree = ast.parse(code)
    assert "hvd." not in "".join(ln for ln in code.splitlines() if not ln.lstrip().startswith("#"))
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        lines = code.splitlines()[fn.lineno:fn.end_lineno]
        body = [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith(("#", '"""', "return "))]
        for ln in body:
            assert ln in variants, f"{name}_code.py: {ln!r} is not the script's"
    assert re.search(rf"# {name}\.py:\d+(-\d+)?$", code, re.M), "no comment names the source lines"


def test_keras_fit_script_keys(ported):
    _, out, _ = ported["keras_mnist"]
    keys = tomllib.loads((out / "job.toml").read_text())
    source = (FIXTURES / "keras_mnist.py").read_text()
    # the fixture's batch(32), 16 // hvd.size() steps per epoch, epochs=2, 0.001 * hvd.size(), warmup_epochs=1
    assert keys["mode"] == "fit" and keys["per_replica_batch_size"] == 32 and keys["steps_per_epoch"] == 16
    assert keys["epochs"] == 2 and keys["lr_scaling"] == "linear" and keys["warmup_epochs"] == 1
    checkpoint = line_of(source, "ModelCheckpoint(")
    assert any("ModelCheckpoint" in t and f"keras_mnist.py:{checkpoint}" in t for t in keys["not_carried"])
    assert any("accuracy" in t for t in keys["not_carried"])  # training metrics the loop does not report
    table = (out / "MIGRATION.md").read_text()
    assert re.search(rf"^\| {checkpoint} \| `ModelCheckpoint` \| .*every worker saves", table, re.M)
    rank_file = line_of(source, "mnist-%d.npz")
    assert re.search(rf"^\| {rank_file} \| `hvd.rank` .*per-rank file name", (out / "MIGRATION.md").read_text(),
                     re.M)


def test_gradient_tape_script_keys(ported):
    _, out, err = ported["tape_mnist"]
    keys = tomllib.loads((out / "job.toml").read_text())
    # take(24 // hvd.size()), Adam(0.001 * hvd.size()), SparseCategoricalCrossentropy() on softmax outputs
    assert keys["mode"] == "ctl" and keys["steps"] == 24 and keys["optimizer"] == "adam"
    assert keys["learning_rate"] == 0.001 and keys["lr_scaling"] == "linear"
    assert keys["loss"] == "SparseCategoricalCrossentropy"
    assert any("checkpoint.save" in t for t in keys["not_carried"])
    table = (out / "MIGRATION.md").read_text()
    assert "| `hvd.DistributedGradientTape` |" in table and "strategy.run" in table


def test_fp16_and_accumulation_are_named_not_carried(ported):
    code, out, err = ported["keras_accum"]
    keys = tomllib.loads((out / "job.toml").read_text())
    text = " ".join(keys["not_carried"])
    assert "Compression.fp16" in text and "--fp16-allreduce" in text
    assert "backward_passes_per_step=2" in text
    source = (FIXTURES / "keras_accum.py").read_text()
    for needle in ("hvd.broadcast(", "hvd.allreduce("):  # the parts left by hand, named by file:line
        assert f"keras_accum.py:{line_of(source, needle)}:" in err


def test_an_unknown_callback_is_named_by_hand(ported):
    code, out, err = ported["keras_benchmark"]
    source = (FIXTURES / "keras_benchmark.py").read_text()
    where = f"keras_benchmark.py:{line_of(source, 'callbacks.append(TimingCallback())')}"
    assert f"by hand: {where}: callback TimingCallback()" in err
    assert where in (out / "MIGRATION.md").read_text()
    keys = tomllib.loads((out / "job.toml").read_text())
    assert keys["per_replica_batch_size"] == 16 and keys["epochs"] == 2  # argparse's defaults


def test_elastic_is_named_as_not_ported(ported):
    code, out, err = ported["elastic_mnist"]
    source = (FIXTURES / "elastic_mnist.py").read_text()
    assert f"elastic_mnist.py:{line_of(source, 'hvd.elastic.KerasState')}: hvd.elastic.KerasState: not ported" in err
    assert "MWMS has no elastic counterpart" in (out / "MIGRATION.md").read_text()


@pytest.mark.parametrize("bad", BAD, ids=[p.name for p in BAD])
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, capsys, bad):
    code, out, err = run_port(bad, tmp_path / "out", capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and bad.name in err
    assert list(tmp_path.iterdir()) == []


def test_a_non_empty_out_is_refused(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("keep")
    code, _, err = run_port(FIXTURES / "keras_mnist.py", tmp_path / "out", capsys)
    assert code == 2 and "exists and is not empty" in err and len(err.strip().splitlines()) == 1
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["mine.txt"]


def test_default_out_is_beside_the_script_and_pythonpath_relative(tmp_path, capsys):
    script = tmp_path / "scripts" / "train.py"
    script.parent.mkdir()
    shutil.copy(FIXTURES / "tape_mnist.py", script)
    code, out, _ = run_port(script, None, capsys)
    assert code == 0 and "train.port" in out
    keys = tomllib.loads((tmp_path / "scripts" / "train.port" / "job.toml").read_text())
    assert sorted(keys["pythonpath"]) == [".", ".."]


def test_not_carried_is_validated_and_never_hashed():
    with pytest.raises(JobError, match="not_carried"):
        Job(not_carried=("two\nlines",))
    assert Job(not_carried=("ModelCheckpoint (train.py:80)",)).job_hash == Job().job_hash


def test_announce_prints_each_not_carried_line(capsys):
    job = Job(not_carried=("ModelCheckpoint (train.py:80): not written", "Compression.fp16 (train.py:12)"))
    info = SimpleNamespace(num_workers=2, replicas_per_worker=1)
    plan = SimpleNamespace(replicas=2, data=None, total_steps=4, steps_per_epoch=2)
    ctx = SimpleNamespace(job=job, backend=SimpleNamespace(info=info, name="native"), plan=plan,
                          opts=SimpleNamespace(profile_steps=None), verbose=True)
    train.announce(ctx)  # type: ignore[arg-type]
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:] == [f"[twinbench] not carried from the Horovod script: {t}" for t in job.not_carried]


def test_port_reads_the_script_without_importing_it_or_tensorflow(tmp_path):
    """The script would exit if imported (the port names that line as not moved); the port's process never imports
    TensorFlow."""
    script = tmp_path / "boom.py"
    script.write_text("raise SystemExit('imported!')\n" + (FIXTURES / "tape_mnist.py").read_text())
    code = ("import sys, runpy; sys.argv = ['p', sys.argv[1], '--out', sys.argv[2]]\n"
            "try:\n    runpy.run_module('common.port', run_name='__main__')\n"
            "except SystemExit as e:\n    assert 'tensorflow' not in sys.modules; sys.exit(e.code)\n")
    proc = subprocess.run([PY, "-c", code, str(script), str(tmp_path / "out")], cwd=REPO, capture_output=True,
                          text=True, env=base_env(), timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert "boom.py:1: not moved: `raise SystemExit('imported!')`" in proc.stderr
    assert (tmp_path / "out" / "job.toml").is_file()


@pytest.mark.distributed
@pytest.mark.parametrize("name, mode", [("tape_mnist", "ctl"), ("keras_benchmark", "fit")])
def test_a_port_passes_common_check(ported, name, mode):
    """The port's job computes the same math on both backends at 1 and 2 workers: the GradientTape fixture in the
    custom loop, the Keras fit fixture (compiled model, sharded pipeline, argparse defaults) in fit."""
    _, out, _ = ported[name]
    proc = subprocess.run([PY, "-m", "common.check", "--job", str(out / "job.toml"), "--steps", "4",
                           "--modes", mode], cwd=REPO, capture_output=True, text=True, env=base_env(), timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "all 4 pairs agree" in proc.stdout


VARIANTS = {
    # an inline DistributedOptimizer around an optimizer scaled by hvd.size(), arrays given to fit
    "inline.py": ("""import numpy as np
import tensorflow as tf
import horovod.tensorflow.keras as hvd

hvd.init()
x_train = np.zeros((256, 8), np.float32)
y_train = np.zeros((256,), np.int64)
model = tf.keras.Sequential([tf.keras.layers.Dense(3)])
model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01 * hvd.size(), momentum=0.9)),
              loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x_train, y_train, batch_size=16, epochs=3, verbose=2 if hvd.rank() == 0 else 0,
          callbacks=[hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.01 * hvd.size(), warmup_epochs=2)])
""", 0, {"lr_scaling": "linear", "per_replica_batch_size": 16, "epochs": 3, "warmup_epochs": 2},
        "optimizer=tf.keras.optimizers.SGD(0.01 * 1, momentum=0.9)"),
    # epochs around the loop, the model call inside the loss, gradient clipping (a step of the script's own)
    "clipped.py": ("""import tensorflow as tf
import horovod.tensorflow as hvd


def main():
    hvd.init()
    dataset = tf.data.Dataset.from_tensor_slices((tf.zeros([128, 4]), tf.zeros([128], tf.int64))).batch(16)
    model = tf.keras.Sequential([tf.keras.layers.Dense(2)])
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = tf.keras.optimizers.SGD(0.1)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = [tf.clip_by_norm(g, 1.0) for g in tape.gradient(loss, model.trainable_variables)]
        opt.apply_gradients(zip(grads, model.trainable_variables))

    for epoch in range(3):
        for x, y in dataset:
            step(x, y)


main()
""", 3, {"mode": "ctl", "epochs": 3, "optimizer": "sgd", "learning_rate": 0.1,
         "loss": "sparse_categorical_crossentropy", "per_replica_batch_size": 16}, "clipped.py:17: a statement"),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variants_users_write(tmp_path, capsys, name):
    source, status, keys, needle = VARIANTS[name]
    (tmp_path / name).write_text(source)
    code, _, err = run_port(tmp_path / name, tmp_path / "out", capsys)
    assert code == status, err
    job = tomllib.loads((tmp_path / "out" / "job.toml").read_text())
    assert {k: job.get(k) for k in keys} == keys
    stem = name.removesuffix(".py")
    assert needle in (tmp_path / "out" / f"{stem}_code.py").read_text() + err


def test_every_construct_the_table_knows_has_all_four_texts():
    for name, texts in port.KNOWLEDGE.items():
        assert len(texts) == 4 and all(t.strip() for t in texts), name
