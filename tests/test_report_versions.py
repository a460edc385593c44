"""common.report: what runs of one comparison must share (software versions, the record's required fields) and the
facts the report names when they differ (CPU binding, input path).

Fast (no TensorFlow): every fixture is a results JSON written by hand into tmp_path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from common.core.results import RunRecord
from common.report.cli import main
from common.report.load import load_runs, version_mix
from common.report.summary import summarize
from tests.test_report import JOB_A, make_run, put, record


# --------------------------------------------------------------------------------------------------------
# software versions: runs of one comparison must agree (python, tensorflow, tf_keras, horovod, horovod_patch)
def mixed_versions(tmp_path: Path) -> Path:
    d = tmp_path / "mixed-versions"
    put(d, make_run("native", 1, 100.0))  # python 3.11.9, tensorflow 2.18.1, no horovod (native never imports it)
    put(d, make_run("horovod", 1, 105.0, versions={"python": "3.11.9", "tensorflow": "2.21.0", "horovod": "0.28.1",
                                                   "numpy": "2.0"}))
    return d


def test_mixed_versions_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = mixed_versions(tmp_path)
    out = tmp_path / "out"
    assert main([str(d), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"report: error: runs of job 'small' ({JOB_A.job_hash}) mix versions: tensorflow 2.18.1 vs 2.21.0; "
        "pass --allow-mixed-versions to compare them anyway"]  # numpy and a horovod only horovod runs record: no
    assert captured.out == ""
    assert not out.exists() and not (d / "report").exists()  # nothing written


def test_allow_mixed_versions_warns_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = mixed_versions(tmp_path)
    out = tmp_path / "out"
    assert main([str(d), "--out", str(out), "--allow-mixed-versions", "--no-plots", "-q"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("report: warning: runs of job 'small'")
    assert "mix versions: tensorflow 2.18.1 vs 2.21.0" in err[0] and "--allow-mixed-versions" in err[0]
    md = (out / "report.md").read_text()
    mix = [line for line in md.splitlines() if "Mixed software versions" in line]
    assert len(mix) == 1 and "tensorflow 2.18.1 vs 2.21.0" in mix[0]
    assert (out / "report.csv").is_file()


def test_version_mix_rules() -> None:
    def run(backend: str, **versions: str) -> RunRecord:
        return record(backend, 1, 1.0, versions=versions or None)

    same = {"python": "3.11.9", "tensorflow": "2.18.1"}
    assert version_mix([run("native", **same, numpy="1.26"), run("native", **same, numpy="2.0")]) == []
    # a key one run of a backend lacks is "unknown"; a key no run records is no difference
    assert version_mix([run("horovod", **same, horovod="0.28.1", horovod_patch="p1"),
                               run("horovod", **same, horovod="0.28.1")]) == ["horovod_patch p1 vs unknown"]
    assert version_mix([run("native", **same), run("native")]) == [
        "python 3.11.9 vs unknown", "tensorflow 2.18.1 vs unknown"]
    assert version_mix([run("native", **same), run("horovod", python="3.11.9", tensorflow="2.9.0",
                                                          tf_keras="2.9.0")]) == ["tensorflow 2.9.0 vs 2.18.1"]


def test_required_fields_come_from_run_record(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import common.report.load as loader
    from common.core import results

    assert not hasattr(loader, "REQUIRED")  # no second list: the report asks RunRecord
    assert list(results.REQUIRED) == ["schema", "kind", "backend", "world_size", "num_workers", "job_hash", "job",
                                      "images_per_sec", "step_time", "time_to_first_step"]  # as before RunRecord
    d = tmp_path / "r"
    put(d, make_run("native", 1, 100.0, run_id="complete"))
    for name in results.REQUIRED:
        rec = make_run("native", 1, 100.0, run_id=f"without-{name}")
        del rec[name]
        put(d, rec, f"without-{name}.json")
    capsys.readouterr()
    assert [r.record.run_id for r in load_runs(d)] == ["complete"]
    err = capsys.readouterr().err
    for name in results.REQUIRED:
        assert f"without-{name}.json: missing field {name!r}" in err
    # a field RunRecord starts requiring is required by the report at once
    monkeypatch.setitem(results.REQUIRED, "gradient_bytes", (int,))
    assert load_runs(d, warn=lambda _m: None) == []


def test_mixed_cpu_binding_is_said_in_the_report(tmp_path: Path) -> None:
    """Runs of one job bound differently (topology.cpu_bind) get a line saying so; runs bound alike (or all from
    before the record) get none."""
    from common.report.machines import binding_mix

    def bound(how: str, ws: int = 2) -> dict[str, Any]:
        return {"topology": {"cpu_bind": [how] * ws}}

    d = tmp_path / "results"
    put(d, make_run("native", 2, 200.0, **bound("self")))
    put(d, make_run("horovod", 2, 190.0, **bound("none")))
    out = tmp_path / "out"
    assert main([str(d), "--out", str(out), "--no-plots", "-q"]) == 0
    line = [x for x in (out / "report.md").read_text().splitlines() if "Mixed CPU binding" in x]
    assert len(line) == 1 and "horovod: none; native: self" in line[0], line
    assert binding_mix([record("native", 2, 1.0, **bound("none")), record("horovod", 2, 1.0, **bound("none"))]) \
        is None
    assert binding_mix([record("native", 1, 1.0), record("horovod", 1, 1.0)]) is None  # no record: no claim
    assert binding_mix([record("native", 2, 1.0, **bound("self")), record("native", 2, 1.0)]) == \
        "native: self, unknown"


def test_backends_fed_differently_are_named() -> None:
    """A native run fed through tf.distribute's distributed input next to Horovod's per-worker input: said once;
    both per-worker: nothing said."""
    def note(native_path: str) -> list[str]:
        runs = [make_run("native", 1, 100.0, input={"path": native_path}),
                make_run("horovod", 1, 120.0, input={"path": "per-worker"})]
        return [n for n in summarize(runs)[0].notes if "fed differently" in n]

    assert note("per-worker") == []
    (line,) = note("distributed")
    assert "native: distributed" in line and "horovod: per-worker" in line


# --------------------------------------------------------------------------------------------------------
# another container image is another stack: rows of its own, never a mix, never pooled
IMAGE = "manifest-sha256:0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9"


def test_two_stacks_get_rows_of_their_own(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "stacks"
    for backend, ips in (("native", 100.0), ("horovod", 104.0)):
        put(d, make_run(backend, 1, ips))  # the host's stack: python 3.11.9
        put(d, make_run(backend, 1, ips / 2, run_id=f"{backend}-image",
                        versions={"python": "3.11.2", "tensorflow": "2.18.1", "container": "charliecloud 0.31",
                                  "container_image": IMAGE}))
    out = tmp_path / "out"
    assert main([str(d), "--out", str(out), "--no-plots", "-q"]) == 0, capsys.readouterr().err  # not a mix
    md = (out / "report.md").read_text()
    for backend in ("native", "horovod"):
        rows = [ln.split(" | ") for ln in md.splitlines() if ln.startswith(f"| {backend} [")]
        assert sorted(r[0] for r in rows) == [f"| {backend} [host stack]", f"| {backend} [image 0a1b2c3d]"]
        assert [r[4] for r in rows] == ["1", "1"]  # one run per row: the two stacks are never pooled
    # horovod/native within each stack, never across them
    ratios = [ln for ln in md.splitlines() if ln.startswith("| 1 | 1x1 |")]
    assert sorted((r.split(" | ")[2], r.split(" | ")[-1]) for r in ratios) == [("100.0", "host stack |"),
                                                                               ("50.0", "image 0a1b2c3d |")]
    summary = summarize(load_runs(d))[0]
    assert summary.version_mix == []
    # inside one stack, a mix is still one
    put(d, make_run("horovod", 1, 99.0, run_id="other-python", versions={"python": "3.11.7", "tensorflow": "2.18.1"}))
    assert summarize(load_runs(d))[0].version_mix == ["python 3.11.7 vs 3.11.9"]
