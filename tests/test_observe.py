"""What a run shows besides its JSON: progress lines (fake clock), profiler traces and Horovod's timeline, TensorBoard
scalars read back, and Horovod-benchmark summary lines parsed with the regular expressions ReFrame's checks use."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from common.training import hostsync, observe
from common.training.reliability import Preemption
from common.training.runconfig import RunOptions
from tests.conftest import PY, SMOKE, backend_cmd, base_env, only_result, run
from tests.test_clock import FakeBackend, FakeClock, run_context

# ReFrame's hpctestlib/ml/tensorflow/horovod.py (tensorflow_cnn_check), with its literal "GPU" as the device word
# Horovod's benchmark prints: "CPU" on a CPU (as Horovod's own benchmark does with --no-cuda).
PER_DEVICE_RE = r"Img/sec per {dev}: (\S+) \S+"
TOTAL_RE = r"Total img/sec on {n} {dev}\(s\): (\S+) \S+"
HOROVODRUN_PREFIX = re.compile(r"^\[\d+\]<std(?:out|err)>:", re.M)  # horovodrun --gloo tags each rank's lines


def parse_summary(stdout: str, n: int, dev: str) -> tuple[list[float], float]:
    per = [float(v) for v in re.findall(PER_DEVICE_RE.format(dev=dev), stdout)]
    total = re.findall(TOTAL_RE.format(n=n, dev=dev), stdout)
    assert len(total) == 1, stdout
    return per, float(total[0])


# -- flags -----------------------------------------------------------------------------------------------------
def test_profile_steps_parsing():
    assert observe.parse_profile_steps("3:4") == (3, 4) and observe.parse_profile_steps("5:5") == (5, 5)
    for bad in ("3", "4:3", "0:2", "a:b", "1:2:3", ""):
        with pytest.raises(ValueError, match="--profile-steps"):
            observe.parse_profile_steps(bad)
    assert observe.check_profile_steps((3, 11), 12) is None
    assert "B must be < 12" in observe.check_profile_steps((3, 12), 12)


@pytest.mark.parametrize("flags, message", [
    (["--profile-steps", "4:3"], "need 1 <= A <= B"),
    (["--profile-steps", "3:12"], "B must be < 12"),  # smoke.toml has 12 steps: known before TensorFlow starts
    (["--profile-steps", "1:2", "--bench", "allreduce"], "has none"),
    (["--progress-every", "-1"], "--progress-every must be >= 0"),
])
def test_bad_observation_flags_exit_2_before_tensorflow(tmp_path, flags, message):
    proc = subprocess.run([PY, "-m", "backends.native", "--job", SMOKE, "--results", str(tmp_path), *flags],
                          env=base_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "tensorflow" not in proc.stderr.lower()


# -- progress (fake clock) --------------------------------------------------------------------------------------
def drive(monkeypatch, steps: int, step_s: float, *, every: float, verbose: bool = True,
          profile: tuple[int, int] | None = None, results: str | None = None,
          backend: FakeBackend | None = None) -> hostsync.StepHooks:
    """Fake steps of ``step_s`` seconds each, syncs every 25 steps, 64 images per step (tests.test_clock's driver,
    with the progress and trace options)."""
    clock = FakeClock()
    monkeypatch.setattr(hostsync.time, "perf_counter", clock)
    backend = backend or FakeBackend()
    opts = RunOptions(t_process_start=0.0, command=(), verbose=verbose, progress_seconds=every,
                      profile_steps=profile, results_dir=results)
    ctx = run_context(backend, opts, steps, 25, 2, images_per_step=64)
    hooks = hostsync.StepHooks(ctx, 0, Preemption(), observe.run_parts(ctx, 0))
    backend.hooks = hooks
    hooks.start_clock()
    while hooks.global_step < steps:
        clock.now += step_s
        hooks.dispatched += 1
        if hooks.sync_due() and hooks.sync([1.0] * (hooks.dispatched - hooks.synced)):
            break
    return hooks


def progress_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("[twinbench] step ")]


def test_progress_every_30_seconds_at_syncs_with_rate_and_eta(monkeypatch, capsys):
    drive(monkeypatch, 1000, 0.1, every=30.0)  # 10 steps/s: syncs every 2.5 s
    lines = progress_lines(capsys.readouterr().out)
    # first as soon as a rate is known (the sync after the first step), then the first sync >= 30 s later
    assert [int(re.search(r"step (\d+)/1000", x).group(1)) for x in lines] == [2, 325, 650, 975], lines
    assert all("640.0 images/s so far" in x and "10.00 steps/s" in x for x in lines), lines
    assert "ETA 0:00:35" in lines[2] and "ETA 0:00:02" in lines[3], lines  # 350 and 25 steps left at 10 steps/s


def test_progress_interval_flag_and_quiet(monkeypatch, capsys):
    drive(monkeypatch, 1000, 0.1, every=12.0)  # --progress-every 12: the first sync at least 120 steps later
    lines = progress_lines(capsys.readouterr().out)
    assert [int(re.search(r"step (\d+)/", x).group(1)) for x in lines] == [2, 125, 250, 375, 500, 625, 750, 875,
                                                                            1000]
    drive(monkeypatch, 1000, 0.1, every=30.0, verbose=False)  # --quiet
    drive(monkeypatch, 1000, 0.1, every=0.0)  # --progress-every 0
    assert progress_lines(capsys.readouterr().out) == []


class TracingBackend(FakeBackend):
    """A fake rank 0 of 2 whose profiler calls are recorded with the fake clock's time (no TensorFlow)."""

    name, rank = "fake", 0

    def allgather(self, obj: object) -> list[object]:
        return [obj, obj]


def test_profiled_steps_are_synced_and_never_timed(monkeypatch, tmp_path):
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(observe.Trace, "_start", lambda self, done: (calls.append(("start", done)),
                                                                     setattr(self, "started", True)))
    monkeypatch.setattr(observe.Trace, "_stop", lambda self, done: (calls.append(("stop", done)),
                                                                    setattr(self, "done", True)))
    hooks = drive(monkeypatch, 100, 0.01, every=0.0, profile=(5, 8), results=str(tmp_path),
                  backend=TracingBackend())
    assert calls == [("start", 4), ("stop", 8)]  # before step 5 is handed over, after step 8 is done
    assert [d for d, _ in hooks.marks] == [0, 1, 4, 8, 25, 50, 75, 100]  # no sync at step 2: still untimed
    assert hooks.warm == 8  # the timed window starts at the sync after the last profiled step
    assert hooks.find(observe.Trace).root.parent == tmp_path / "profile"


# -- real runs: traces, timeline, TensorBoard, summary lines -----------------------------------------------------
def read_scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"tensors": 0})
    acc.Reload()
    import numpy as np

    return {tag: [(e.step, float(np.asarray(tensor_value(e)))) for e in acc.Tensors(tag)]
            for tag in acc.Tags()["tensors"]}


def tensor_value(event: object) -> object:
    from tensorboard.util import tensor_util

    return tensor_util.make_ndarray(event.tensor_proto)


@pytest.mark.distributed
# native at 1 worker: with 2 MWMS workers TensorFlow 2.21's profiler aborted worker 1 ("double free or corruption")
# in about 1 run of 5 here, and once hung in stop() (docs/observing.md, Traces): not a test that can pass
# reliably. Horovod at 2 ranks (8 runs out of 8 clean).
@pytest.mark.parametrize("kind, mode, n", [("native", "fit", 1), ("horovod", "ctl", 2)])
def test_profiled_run_traces_tensorboard_and_summary_lines(tmp_path, kind, mode, n):
    proc = run(backend_cmd(kind, tmp_path, "--set", f"mode={mode}", "--profile-steps", "3:4", workers=n))
    rec = only_result(tmp_path)
    art = rec["artifacts"]
    # traces: one per rank, non-empty; the Horovod timeline from rank 0 only
    assert art["profile_steps"] == [3, 4] and art["profiled_steps"] == [3, 4]
    assert art["profile_dir"].endswith(rec["run_id"]) and len(art["profile_ranks"]) == n
    for rank_dir in art["profile_ranks"]:
        traces = list((tmp_path / rank_dir).glob("plugins/profile/*/*.xplane.pb"))
        assert len(traces) == 1 and traces[0].stat().st_size > 0, rank_dir
    if kind == "horovod":
        timeline = (tmp_path / art["horovod_timeline"]).read_text()
        assert timeline.startswith("[") and '"ph"' in timeline and "allreduce" in timeline.lower()
    else:
        assert "horovod_timeline" not in art
    # the profiled steps are not timed
    assert rec["step_time"]["warmup_steps"] == 4 and rec["step_time"]["timed_steps"] == rec["steps"] - 4
    # TensorBoard: a loss per step, images/s and step time per timed window
    logdir = tmp_path / art["tensorboard"]
    assert logdir.name == f"{kind}-{mode}-n{n}-{rec['run_id']}"
    scalars = read_scalars(logdir)
    assert [s for s, _ in scalars["loss"]] == list(range(1, rec["steps"] + 1))
    assert [v for _, v in scalars["loss"]] == pytest.approx(rec["step_losses"])
    assert len(scalars["images_per_sec"]) == len(scalars["step_time_ms"]) == rec["step_time"]["windows"]
    # Horovod-benchmark summary lines, measured: total = the record's wall-clock throughput, per CPU = total / n
    out = HOROVODRUN_PREFIX.sub("", proc.stdout)
    per, total = parse_summary(out, n, "CPU")
    assert total == pytest.approx(rec["images_per_sec"], abs=0.05) and per == [pytest.approx(total / n, abs=0.1)]
    assert re.search(r"Model: mlp", out) and re.search(r"Batch size: 16", out)
    assert not re.search(r"^\[twinbench\] step ", out, re.M)  # --quiet: no progress lines


def test_summary_lines_are_measured_not_rank0_times_n():
    """Two timed windows of 0.1 and 0.3 s per step at 32 images per step; the total is the record's own figure."""
    marks = [[0, 0.0], [1, 1.0], [2, 1.1], [12, 2.1], [22, 5.1]]
    rec = {"world_size": 2, "global_batch_size": 32, "images_per_sec": 123.4, "devices": ["cpu", "cpu"],
           "per_rank_sync_marks": [marks, marks], "step_time": {"warmup_steps": 2}, "job": {"model": "mlp"}}
    out = "\n".join(observe.summary_lines(rec))
    per, total = parse_summary(out, 2, "CPU")
    assert total == 123.4 and per == [61.7]
    conf = float(re.search(r"Total img/sec on 2 CPU\(s\): \S+ \+-(\S+)", out).group(1))
    assert conf == pytest.approx(1.96 * (320 - 320 / 3) / 2, abs=0.05)  # two equal windows: std = half the spread
    rec["devices"] = ["/physical_device:GPU:0", "/physical_device:GPU:0"]
    assert parse_summary("\n".join(observe.summary_lines(rec)), 2, "GPU")[1] == 123.4  # ReFrame's regex as is
