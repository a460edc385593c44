"""The report compares a list of backend pairs from the registry: today's one pair (horovod / native) by default,
others when asked (``--pair NUM,DEN``), a third backend's with no edit outside its module and its registry line;
and a compiled model's job header names the recipe that trained it.

Fast (no TensorFlow): results JSONs written by hand, as in tests/test_report.py.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from common.core import registry
from common.core.registry import BackendEntry
from common.report import render
from common.report.build import ReportOptions, build_report
from common.report.cli import main
from common.report.document import Heading, Para
from common.report.summary import summarize
from common.report.verdict import verdict_texts, verdict_title
from tests.test_report import make_run, put

# images/s of each backend's repeats per world size; the toy runs one process (tests/toy_backend.py: no launcher)
IPS = {"native": {1: [100.0, 104.0], 2: [190.0, 194.0]}, "horovod": {1: [110.0, 112.0], 2: [200.0, 204.0]},
       "toy": {1: [150.0, 154.0]}}
TOY_NATIVE = 152.0 / 102.0  # toy / native median images/s at 1 replica


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The toy backend's one registry line, as tests/test_registry.py adds it."""
    monkeypatch.setitem(registry.REGISTRY, "toy", BackendEntry(
        "toy", "tests.toy_backend", "one process, no communication", "tab:green", "jobs/slurm/native.sbatch"))


@pytest.fixture
def results(tmp_path: Path) -> Path:
    d = tmp_path / "results"
    for backend, sizes in IPS.items():
        for ws, ips in sizes.items():
            for i, x in enumerate(ips):
                put(d, make_run(backend, ws, x, run_id=f"{backend}-{ws}-{i}"))
    return d


def _report(results: Path, tmp_path: Path, pairs: tuple[tuple[str, str], ...] = registry.PAIRS) -> Any:
    return build_report(results, tmp_path / "out", ReportOptions(plots=False, pairs=pairs))


def _headings(rep: Any) -> list[str]:
    return [b.text for b in rep.blocks if isinstance(b, Heading)]


def _csv(rep: Any) -> list[dict[str, str]]:
    return list(csv.DictReader((rep.paths[2]).read_text().splitlines()))


def test_the_default_is_the_registrys_pair_and_the_toy_has_its_scaling_rows(toy: None, results: Path,
                                                                           tmp_path: Path) -> None:
    rep = _report(results, tmp_path)
    [s] = rep.summaries
    assert s.pairs == registry.PAIRS == (("horovod", "native"),)
    assert s.backends == ["native", "horovod", "toy"]  # the registry's order, the toy's line last
    table = render.format_table(s)
    assert "| toy | 1 | 1x1 | 1 | 2 | 152.0 |" in table  # its scaling row: label, replicas, layout, workers, repeats
    assert "horovod / native throughput" in _headings(rep) and "toy / native throughput" not in _headings(rep)
    assert {(q.num, q.den) for q in s.ratios} == {("horovod", "native")}
    assert verdict_title(s).endswith("horovod vs native:")
    rows = _csv(rep)
    assert "horovod_native_ratio" in rows[0] and "toy_native_ratio" not in rows[0]
    toy_row = next(r for r in rows if r["backend"] == "toy")
    assert toy_row["horovod_native_ratio"] == ""  # in no asked pair: no ratio


def test_a_toy_native_pair_when_asked(toy: None, results: Path, tmp_path: Path) -> None:
    rep = _report(results, tmp_path, (("toy", "native"),))
    [s] = rep.summaries
    q, alone = s.ratios  # the toy ran at 1 replica only: native alone at 2 has no ratio
    assert (q.num, q.den, q.world_size) == ("toy", "native", 1) and q.ratio == pytest.approx(TOY_NATIVE)
    assert (alone.world_size, alone.ratio, alone.num_row, alone.den_row is not None) == (2, None, None, True)
    assert "toy / native throughput" in _headings(rep) and "horovod / native throughput" not in _headings(rep)
    assert "| 1 | 1x1 | 102.0 | 152.0 | 1.490 (needs 6 runs per cell) |" in render.format_ratio_table(s)
    line, lone = [t for t in verdict_texts(s) if not t.startswith("CPUs only")]
    assert "toy is 49% faster than native, not a verdict" in line and "2 runs each" in line
    assert lone == "2 nodes x 1 rank: only native ran, no comparison"
    assert any(n == "toy/native ratio is n/a at world size 2: only native ran there" for n in s.notes)
    rows = {(r["backend"], r["world_size"]): r for r in _csv(rep)}
    assert float(rows[("toy", "1")]["toy_native_ratio"]) == pytest.approx(TOY_NATIVE)
    assert rows[("horovod", "1")]["toy_native_ratio"] == ""
    # the migration question stays Horovod -> native, whatever pair was asked
    assert "Can this job leave horovod for native MultiWorkerMirroredStrategy?" in _headings(rep)
    assert "| images/s, 2 replicas (2x1) | 192.0" in (tmp_path / "out" / "report.md").read_text()


def test_several_pairs_each_in_the_tables_and_the_verdict(toy: None, results: Path, tmp_path: Path) -> None:
    pairs = (("horovod", "native"), ("toy", "native"))
    [s] = summarize([make_run(b, ws, x) for b, sizes in IPS.items() for ws, xs in sizes.items() for x in xs], pairs)
    assert [(q.num, q.den, q.world_size) for q in s.ratios] == [
        ("horovod", "native", 1), ("horovod", "native", 2), ("toy", "native", 1), ("toy", "native", 2)]
    native_1 = next(r for r in s.rows if r.identity.label == "native" and r.identity.world_size == 1)
    assert native_1.scaling.ratio == pytest.approx(111.0 / 102.0)  # the headline pair's, not the toy's
    assert verdict_title(s).endswith("horovod vs native, toy vs native:")
    lines = [t for t in verdict_texts(s) if not t.startswith("CPUs only")]  # the scope line: these runs' CPUs
    assert [t.split(":")[0] for t in lines] == [
        "horovod vs native, 1 node x 1 rank", "horovod vs native, 2 nodes x 1 rank",
        "toy vs native, 1 node x 1 rank", "toy vs native, 2 nodes x 1 rank"]
    assert lines[-1].endswith("only native ran, no comparison")
    tables = render.format_ratio_table(s).split("\n\n")
    assert len(tables) == 2 and "| toy images/s |" not in tables[0] and "| toy images/s |" in tables[1]


def test_the_cli_takes_pairs_and_refuses_bad_ones_in_one_line(toy: None, results: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(results), "--out", str(tmp_path / "o"), "--no-plots", "--pair", "toy,native"]) == 0
    out = capsys.readouterr().out
    assert "Verdict (toy vs native):" in out and "| native images/s | toy images/s | toy/native [95% CI] |" in out
    for bad, why in (("toy,toy", "two different backends"), ("nope,native", "unknown backend 'nope'"),
                     ("toy", "a pair is NUM,DEN")):
        with pytest.raises(SystemExit) as e:
            main([str(results), "--out", str(tmp_path / "bad"), "--pair", bad])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and why in err[-1], err
    assert not (tmp_path / "bad").exists()  # refused before anything is written


def _job_fields(rep: Any) -> str:
    return next(b.text for b in rep.blocks if isinstance(b, Para) and b.text.startswith("Key job fields"))


COMPILED = {"source": "compiled", "optimizer": "tf_keras.src.optimizers.legacy.gradient_descent.SGD",
            "compiled_class": "tf_keras.src.optimizers.sgd.SGD", "base_learning_rate": 0.001, "learning_rate": 0.002,
            "lr_replicas": 2, "loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"]}


def test_a_compiled_models_header_shows_the_recipe_that_trained(tmp_path: Path) -> None:
    d = tmp_path / "compiled"
    for backend in ("native", "horovod"):
        put(d, make_run(backend, 2, 100.0, recipe=COMPILED))
    fields = _job_fields(build_report(d, tmp_path / "out", ReportOptions(plots=False)))
    assert ("epochs = 1, trained by the compiled model's SGD (base learning rate 0.001; loss "
            "sparse_categorical_crossentropy; metrics accuracy), lr_scaling") in fields, fields
    assert "optimizer =" not in fields and "learning_rate =" not in fields  # the job file's keys did not train
    # a recipe from the job's keys: the job's fields, as they trained
    put(d2 := tmp_path / "job", make_run("native", 1, 100.0, recipe={**COMPILED, "source": "job", "optimizer": "sgd"}))
    fields = _job_fields(build_report(d2, tmp_path / "out2", ReportOptions(plots=False)))
    assert "optimizer = sgd" in fields and "learning_rate = 0.01" in fields and "trained by" not in fields
