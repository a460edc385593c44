"""The ReFrame check's reference rule (jobs/reframe/baseline.py) on fake results JSONs: the median of the baseline's
runs of the same job hash, backend and layout; the tolerance as ReFrame's bounds; final losses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jobs.reframe import baseline


def _rec(backend: str, ips: float, hosts: list[str], job_hash: str = "h1", losses: list[float] | None = None,
         **extra: Any) -> dict[str, Any]:
    return {"kind": "train", "backend": backend, "job_hash": job_hash, "images_per_sec": ips, "hosts": hosts,
            "step_losses": losses or [1.0, 0.5], **extra}


def _write(root: Path, name: str, data: Any) -> None:
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(json.dumps(data))


@pytest.fixture
def base(tmp_path: Path) -> Path:
    one, two = ["n1"], ["n1", "n2"]
    _write(tmp_path, "a/native.json", _rec("native", 100.0, one))
    _write(tmp_path, "b/native.json", _rec("native", 300.0, one))
    _write(tmp_path, "c/native.json", _rec("native", 200.0, one))
    _write(tmp_path, "c/native-2x1.json", _rec("native", 999.0, two))  # another layout
    _write(tmp_path, "d/native-other-job.json", _rec("native", 5.0, one, job_hash="h2"))  # another job
    _write(tmp_path, "e/horovod.json", _rec("horovod", 150.0, one))
    _write(tmp_path, "e/breakdown.json", _rec("horovod", 1e9, one, kind="breakdown"))  # not a training run
    _write(tmp_path, "f/manifest.json", {"cells": []})  # another JSON
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "broken.json").write_text("{not json")
    _write(tmp_path, "h/.hidden.json", _rec("horovod", 1e9, one))
    return tmp_path


def test_median_of_same_job_backend_and_layout(base):
    found = baseline.baseline_records(base)
    assert len(found) == 6
    assert baseline.median_throughput(found, "h1", "native", (1, 1)) == 200.0  # 100, 200, 300
    assert baseline.median_throughput(found, "h1", "native", (2, 1)) == 999.0
    assert baseline.median_throughput(found, "h1", "horovod", (1, 1)) == 150.0
    assert baseline.median_throughput(found, "h2", "native", (1, 1)) == 5.0
    assert baseline.median_throughput(found, "h1", "horovod", (2, 1)) is None
    assert baseline.median_throughput(found, "h3", "native", (1, 1)) is None


def test_even_count_median_and_bool_throughput_rejected(tmp_path):
    _write(tmp_path, "a.json", _rec("native", 100.0, ["x"]))
    _write(tmp_path, "b.json", _rec("native", 200.0, ["x"]))
    _write(tmp_path, "c.json", _rec("native", True, ["x"]))
    found = baseline.baseline_records(tmp_path)
    assert baseline.median_throughput(found, "h1", "native", (1, 1)) == 150.0


def test_references_as_reframe_bounds():
    assert baseline.throughput_reference(200.0, 0.1) == (200.0, -0.1, None)
    assert baseline.throughput_reference(None, 0.1) == (0, None, None)  # recorded, never failing
    assert baseline.ratio_reference(1.2, 0.1) == (1.2, -0.1, 0.1)
    assert baseline.ratio_reference(None, 0.1) == (0, None, None)


def test_layout_and_final_loss():
    assert baseline.layout(_rec("native", 1, ["a", "a", "b", "b"])) == (2, 2)
    assert baseline.layout(_rec("native", 1, ["a", "a", "b"])) is None
    assert baseline.final_loss(_rec("native", 1, ["a"], losses=[3.0, 2.5])) == 2.5
    assert baseline.final_loss({"step_losses": []}) is None
    assert baseline.relative_difference(1.0, 1.0 + 1e-6) < 1e-5 < baseline.relative_difference(1.0, 1.0001)


def test_run_record_takes_the_newest(tmp_path):
    _write(tmp_path, "old.json", _rec("native", 1.0, ["a"], finished_at="2026-01-01T00:00:00+00:00"))
    _write(tmp_path, "new.json", _rec("native", 2.0, ["a"], finished_at="2026-02-01T00:00:00+00:00"))
    assert baseline.run_record(tmp_path)["images_per_sec"] == 2.0
    assert baseline.run_record(tmp_path / "none") is None


def test_missing_baseline_directory_is_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"^baseline=.*nope: no such directory \(give the results directory"):
        baseline.baseline_records(tmp_path / "nope")


# -- the tolerance a baseline supports ------------------------------------------------------------------------------
def test_median_ranks_are_the_reports():
    """The same order-statistic interval as the report's (scipy there, exact binomial sums here)."""
    from common.report.stats import median_ranks

    for n in range(1, 61):
        assert baseline.median_ranks(n) == median_ranks(n), n
    assert baseline.median_ranks(5) is None and baseline.median_ranks(6) == (1, 6)


def test_the_tolerance_is_the_baselines_interval():
    runs = [100.0, 98.0, 97.0, 102.0, 101.0, 99.0]  # 6 runs: the interval is [min, max] = [97, 102], median 99.5
    assert baseline.interval_tolerance(runs) == pytest.approx(2.5 / 99.5)
    assert baseline.spread(runs) == pytest.approx(2.5 / 99.5)  # max(99.5 - 97, 102 - 99.5)
    assert baseline.interval_tolerance(runs[:5]) is None and baseline.spread(runs[:5]) is None  # no interval
    assert baseline.interval_tolerance([100.0] * 8) == baseline.MIN_TOLERANCE  # never tighter than 1%
    noisy = [100.0, 60.0, 101.0, 99.0, 100.5, 99.5, 100.2]  # one disturbed run of 7: j = 1, the minimum
    assert baseline.interval_tolerance(noisy) == pytest.approx(40 / 100)  # median 100: a 7-run baseline is wide
