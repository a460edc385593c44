"""Measurement arithmetic and atomic writes (no TensorFlow)."""

from __future__ import annotations

import json

import pytest

from common.core import results as res


def test_throughput_is_wall_clock_of_the_slowest_rank_after_warmup():
    # marks: [steps done, seconds] at each host sync; warm-up ends at step 1 (rank 0 at 5.0 s, rank 1 at 4.0 s)
    marks = [[[0, 0.0], [1, 5.0], [3, 5.2], [5, 5.4]],
             [[0, 0.0], [1, 4.0], [3, 4.3], [5, 4.6]]]
    s = res.throughput_stats(marks, global_batch=32, warm=1, window_steps=2)
    assert s["per_rank_timed_wall"] == pytest.approx([0.4, 0.6])
    assert s["timed_wall_time"] == pytest.approx(0.6)
    assert s["images_per_sec"] == pytest.approx(32 * 4 / 0.6)
    st = s["step_time"]
    # per-step time of each window = the slower rank's window / its steps: 0.15, 0.15 (each weighted by 2 steps)
    assert st["median"] == pytest.approx(0.15) and st["p95"] == pytest.approx(0.15)
    assert st["mean"] == pytest.approx(0.6 / 4)
    assert (st["timed_steps"], st["warmup_steps"], st["window_steps"], st["windows"]) == (4, 1, 2, 2)


def test_time_between_steps_counts():
    """The clock is mark to mark: a pause between two steps (no mark inside it) is in the wall time."""
    steady = res.throughput_stats([[[0, 0.0], [1, 1.0], [2, 1.1], [3, 1.2]]], 8, 1, 1)
    paused = res.throughput_stats([[[0, 0.0], [1, 1.0], [2, 1.1], [3, 1.7]]], 8, 1, 1)
    assert paused["images_per_sec"] == pytest.approx(8 * 2 / 0.7)
    assert steady["images_per_sec"] == pytest.approx(8 * 2 / 0.2)
    assert paused["step_time"]["p95"] == pytest.approx(0.1 + 0.95 * 0.5)


def test_windows_are_weighted_by_their_steps():
    # one window of 3 steps at 0.1 s/step, one of 1 step at 1.0 s: the median step is 0.1 s
    s = res.throughput_stats([[[0, 0.0], [3, 0.3], [4, 1.3]]], 8, 0, 3)
    assert s["step_time"]["median"] == pytest.approx(0.1)
    assert s["step_time"]["windows"] == 2 and s["images_per_sec"] == pytest.approx(8 * 4 / 1.3)


def test_ranks_must_sync_at_the_same_steps():
    with pytest.raises(ValueError, match="different steps"):
        res.throughput_stats([[[0, 0.0], [2, 1.0]], [[0, 0.0], [3, 1.0]]], 8, 0, 2)


def test_a_mark_must_end_the_warmup():
    with pytest.raises(ValueError, match="warm-up"):
        res.throughput_stats([[[0, 0.0], [4, 1.0]]], 8, 2, 4)


def test_percentile_matches_linear_interpolation():
    assert res.percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)
    assert res.percentile([1, 2, 3, 4, 5], 95) == pytest.approx(4.8)


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
    "images_per_sec", "timed_wall_time", "step_time", "per_rank_timed_wall", "per_rank_sync_marks",
    "time_to_first_step",
    "resumed_from_step", "versions", "hosts", "devices", "command", "started_at", "finished_at", "run_id",
    "trainable_params", "gradient_bytes", "initial_weights_digest", "weights_digest", "trainable_weights_digest",
    "weights_consistent", "all_weights_consistent", "asynchronous", "input", "network", "topology",
    "collective", "tuning", "capabilities", "machine", "artifacts", "trainable_weights_fingerprint", "evaluations",
    "time_to_target_s", "energy", "slurm_job", "slurm_step", "nodelist",
    "nccl_transport", "compiled", "recipe",
]


def full_record() -> res.RunRecord:
    marks = [[[0, 0.0], [1, 0.2], [3, 0.4]], [[0, 0.0], [1, 0.2], [3, 0.5]]]
    stats = res.throughput_stats(marks, global_batch=32, warm=1, window_steps=25)
    return res.RunRecord(
        backend="native", backend_info={"strategy": "mwms"}, world_size=2, num_workers=2, mode="fit",
        job_hash="0123456789abcdef", job={"name": "smoke", "steps": 3}, global_batch_size=32, learning_rate=0.05,
        steps=3, steps_per_epoch=32, step_losses=[2.3, 1.1, 0.7], per_rank_step_losses=[[2.3, 1.1, 0.7]] * 2,
        **stats, per_rank_sync_marks=marks, time_to_first_step=3.5,
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


def test_older_schemas_are_upgraded_by_their_version_and_others_refused():
    """A schema-2 file is read as schema 3 says it (what it said only in backend_info fills ``capabilities``); a
    schema-3 file is read as written (no backend_info fallback); schema 1 and a newer schema are refused, naming the
    schemas this reader reads."""
    d = full_record().to_dict()
    old = {**d, "schema": 2, "backend_info": {"strategy": "MirroredStrategy", "compression": "fp16"}}
    for k in ("capabilities", "asynchronous", "evaluations"):
        del old[k]  # fields schema-2 writers added as they went
    rec = res.RunRecord.from_dict(old)
    assert (rec.schema, rec.strategy, rec.compression, rec.asynchronous, rec.evaluations) == (
        3, "mirrored", "fp16", False, [])
    ps = res.RunRecord.from_dict({**old, "backend_info": {"strategy": "parameter_server", "asynchronous": True}})
    assert (ps.strategy, ps.asynchronous) == ("parameter_server", True)
    assert res.RunRecord.from_dict({**old, "backend_info": {"strategy": "CollectiveAllReduceStrategy"}}).strategy \
        is None  # MWMS: native's default
    kept = res.RunRecord.from_dict({**old, "capabilities": {"variant": None}, "asynchronous": True})
    assert (kept.strategy, kept.asynchronous) == (None, True)  # a schema-2 file's own fields win
    assert res.RunRecord.from_dict({**d, "backend_info": old["backend_info"]}).strategy is None  # schema 3
    for schema in (1, 4):
        with pytest.raises(res.RecordError, match=rf"schema {schema} is not supported \(this report reads results "
                                                  r"files of schema 2 and 3\)"):
            res.RunRecord.from_dict({**d, "schema": schema})


def test_allreduce_record_keeps_the_writers_json():
    from common.core.results import AllreduceRecord

    rec = AllreduceRecord(backend="native", world_size=2, num_workers=2, rows=[{"bytes": 4, "time_median": 1e-5}],
                          run_id="r", collective={"used": "ring"})
    d = rec.to_dict()
    assert set(d) == {"schema", "kind", "backend", "backend_info", "collective", "capabilities", "world_size",
                      "num_workers", "dtype", "op", "warmup_iters", "rows", "bus_factor", "versions", "hosts",
                      "command", "finished_at", "run_id", "link", "machine"}  # the keys the dict writer wrote
    assert (d["schema"], d["kind"], d["dtype"], d["op"]) == (3, "allreduce", "float32", "sum")
    assert AllreduceRecord.from_dict(json.loads(json.dumps(d))) == rec and rec.collective_used == "ring"
    assert rec.filename() == "allreduce-native-n2-r.json"
    assert AllreduceRecord.from_dict({**d, "schema": 1}) == rec  # schema 1: the same benchmark (no collective yet)
    with pytest.raises(res.RecordError, match="missing field 'rows'"):
        AllreduceRecord.from_dict({k: v for k, v in d.items() if k != "rows"})


def test_input_record_names_what_it_measured_and_decides_kept_up():
    """RunRecord.input from every rank's input wait: the slowest rank's share of its own timed wall time decides."""
    from common.training import inputwait as iw

    fetch = [{"method": "fetch", "seconds": 0.01}, {"method": "fetch", "seconds": 0.3}]
    rec = iw.summarise(fetch, [1.0, 2.0])
    assert rec["method"] == "fetch" and rec["measures"] == "time waiting for the next batch"
    assert rec["wait_seconds_per_rank"] == [0.01, 0.3] and rec["wait_fraction"] == pytest.approx(0.15)
    assert (rec["kept_up"], rec["input_bound"], rec["threshold"]) == (False, "moderately", iw.KEPT_UP_FRACTION)
    assert iw.summarise(fetch, [1.0, 10.0])["kept_up"] is True  # 3% and 1%
    assert iw.summarise(fetch, [1.0, 1.0])["input_bound"] == "highly"  # 30%
    # gap: an upper bound of the input wait; a large one cannot tell input from the host's work between steps
    gap = [{"method": "gap", "seconds": 0.5}]
    assert iw.summarise(gap, [1.0])["kept_up"] is None and iw.summarise(gap, [1.0])["input_bound"] is None
    assert iw.summarise(gap, [1.0])["measures"] == "input + between steps"
    assert iw.summarise([{"method": "gap", "seconds": 0.01}], [1.0])["kept_up"] is True
    # not measured: the loop's reason, never a verdict
    ps = iw.summarise([iw.rank_measure(iw.NotMeasured("asynchronous workers"))], [1.0])
    assert ps == {"method": None, "measures": None, "kept_up": None, "reason": "asynchronous workers"}
    assert iw.summarise([iw.rank_measure(None)], [1.0])["reason"] == "this training loop does not measure it"
    assert iw.summarise(fetch, [0.0, 1.0])["kept_up"] is None  # no timed wall time to compare with
    assert json.loads(json.dumps(rec)) == rec


def test_versions_name_twinbench_s_commit_and_the_loaded_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """What --baseline compares of a stack update that is twinbench's own or the site's modules: the checkout's
    commit (this repository's HEAD, "+modified" when tracked files differ) and LOADEDMODULES as `module list` says."""
    import subprocess

    from common.core import buildinfo, results

    head = subprocess.run(["git", "-C", str(buildinfo.REPO), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    monkeypatch.setenv("LOADEDMODULES", "gcc/12.2.0:openmpi/4.1.5:tensorflow-gpu/py3/2.15.0")
    v = results.versions()
    assert v["twinbench"].split("+")[0] == head and v["twinbench"] in (head, head + "+modified")
    assert v["modules"] == "gcc/12.2.0 openmpi/4.1.5 tensorflow-gpu/py3/2.15.0"
    monkeypatch.delenv("LOADEDMODULES")
    assert "modules" not in results.versions()  # no module system: nothing said, not an empty value
    assert buildinfo.loaded_modules({"LOADEDMODULES": ""}) is None


def test_a_breakdown_carries_the_recipe_and_an_older_one_reads_without_it():
    """The recipe is an optional field (files before it have none: read as None, no schema step needed)."""
    rec = res.BreakdownRecord(backend="native", world_size=1, num_workers=1, job_hash="h", job={"name": "j"},
                              steps=3, timed_steps=2, warmup_steps=1,
                              phases={p: 0.001 for p in res.BREAKDOWN_PHASES}, step_time=0.005,
                              host_step_time=0.005, recipe={"source": "compiled", "learning_rate": 0.002})
    d = rec.to_dict()
    assert res.BreakdownRecord.from_dict(d).recipe == {"source": "compiled", "learning_rate": 0.002}
    assert res.BreakdownRecord.from_dict({k: v for k, v in d.items() if k != "recipe"}).recipe is None
    run = full_record().to_dict()
    assert res.RunRecord.from_dict({**run, "recipe": {"lr_replicas": 2}}).recipe == {"lr_replicas": 2}
    assert res.RunRecord.from_dict(run).recipe is None
