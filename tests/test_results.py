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


# the keys of the results JSON, in the order the chief has always written them
RECORD_KEYS = [
    "schema", "kind", "backend", "backend_info", "world_size", "num_workers", "mode", "job_hash", "job",
    "global_batch_size", "learning_rate", "steps", "steps_per_epoch", "step_losses", "per_rank_step_losses",
    "images_per_sec", "timed_wall_time", "step_time", "per_rank_step_times", "time_to_first_step",
    "resumed_from_step", "versions", "hosts", "devices", "command", "started_at", "finished_at", "run_id",
    "trainable_params", "gradient_bytes", "initial_weights_digest", "weights_digest", "trainable_weights_digest",
    "weights_consistent", "all_weights_consistent",
]


def full_record() -> res.RunRecord:
    stats = res.throughput_stats([[0.2, 0.1, 0.1], [0.2, 0.1, 0.2]], global_batch=32, warmup=1)
    return res.RunRecord(
        backend="native", backend_info={"strategy": "mwms"}, world_size=2, num_workers=2, mode="fit",
        job_hash="0123456789abcdef", job={"name": "smoke", "steps": 3}, global_batch_size=32, learning_rate=0.05,
        steps=3, steps_per_epoch=32, step_losses=[2.3, 1.1, 0.7], per_rank_step_losses=[[2.3, 1.1, 0.7]] * 2,
        **stats, per_rank_step_times=[[0.2, 0.1, 0.1], [0.2, 0.1, 0.2]], time_to_first_step=3.5,
        resumed_from_step=0, versions={"python": "3.11.9", "tensorflow": "2.18.1"}, hosts=["a", "b"],
        devices=["cpu", "cpu"], command=["python", "-m", "backends.native"], started_at="2025-01-01T00:00:00+00:00",
        finished_at="2025-01-01T00:01:00+00:00", run_id="20250101T000100Z-abcdef", trainable_params=10,
        gradient_bytes=40, initial_weights_digest="i", weights_digest="w", trainable_weights_digest="t",
        weights_consistent=True, all_weights_consistent=True,
    )


def test_run_record_round_trip(tmp_path):
    rec = full_record()
    d = rec.to_dict()
    assert list(d) == RECORD_KEYS == list(res.FIELDS)
    assert d["schema"] == res.SCHEMA and d["kind"] == "train"
    assert res.RunRecord.from_dict(d) == rec
    assert res.RunRecord.from_dict({**d, "added_by_a_newer_writer": 1}) == rec  # unknown keys tolerated
    path = res.write_record(tmp_path, rec)
    assert path.name == res.result_filename(rec) == res.result_filename(d)
    assert path.name == "native-fit-n2-0123456789abcdef-20250101T000100Z-abcdef.json"
    assert json.loads(path.read_text()) == d
    assert res.RunRecord.from_dict(json.loads(path.read_text())) == rec
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_run_record_optional_fields_default_and_required_ones_are_checked():
    d = full_record().to_dict()
    minimal = {k: d[k] for k in res.REQUIRED}
    rec = res.RunRecord.from_dict(minimal)
    assert rec.run_id is None and rec.hosts is None and rec.resumed_from_step == 0
    for name in res.REQUIRED:
        with pytest.raises(res.RecordError, match=f"missing field '{name}'"):
            res.RunRecord.from_dict({k: v for k, v in minimal.items() if k != name})
    with pytest.raises(res.RecordError, match=r"field 'world_size' has the wrong type \(bool\)"):
        res.RunRecord.from_dict({**minimal, "world_size": True})
    with pytest.raises(res.RecordError, match=r"field 'job' has the wrong type \(list\)"):
        res.RunRecord.from_dict({**minimal, "job": []})
    assert res.RunRecord.from_dict({**minimal, "images_per_sec": 100}).images_per_sec == 100  # an int is a number
    with pytest.raises(res.RecordError, match="top level is a JSON list"):
        res.RunRecord.from_dict([])
