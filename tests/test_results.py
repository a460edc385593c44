"""Measurement arithmetic and atomic writes (no TensorFlow)."""

from __future__ import annotations

import json

import pytest

from common import results as res


def test_throughput_uses_slowest_rank_and_skips_warmup():
    times = [[5.0, 0.1, 0.1, 0.1, 0.1], [4.0, 0.1, 0.2, 0.1, 0.2]]
    s = res.throughput_stats(times, global_batch=32, warmup=1)
    assert s["timed_wall_time"] == pytest.approx(0.6)
    assert s["images_per_sec"] == pytest.approx(32 * 4 / 0.6)
    # per-step time = the slower rank at each step: 0.1, 0.2, 0.1, 0.2
    assert s["step_time"]["median"] == pytest.approx(0.15)
    assert s["step_time"]["p95"] == pytest.approx(0.2)
    assert s["step_time"]["timed_steps"] == 4 and s["step_time"]["warmup_steps"] == 1


def test_warmup_never_leaves_zero_timed_steps():
    s = res.throughput_stats([[1.0, 2.0]], global_batch=8, warmup=5)
    assert s["step_time"]["timed_steps"] == 1 and s["images_per_sec"] == pytest.approx(4.0)


def test_percentile_matches_linear_interpolation():
    assert res.percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)
    assert res.percentile([1, 2, 3, 4, 5], 95) == pytest.approx(4.8)


def test_step_times_from_ends():
    assert res.step_times_from_ends(1.0, [1.5, 2.5, 2.75]) == pytest.approx([0.5, 1.0, 0.25])


def test_atomic_write_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "run.json"
    with pytest.raises(TypeError):
        res.write_json_atomic(target, {"bad": object()})
    assert list(tmp_path.iterdir()) == []
    res.write_json_atomic(target, {"ok": 1})
    assert json.loads(target.read_text()) == {"ok": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_results_dir_must_be_writable(tmp_path):
    f = tmp_path / "f"
    f.write_text("")
    with pytest.raises(OSError, match="not writable"):
        res.check_results_dir(f / "sub")
