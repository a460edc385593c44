"""What a run shows besides its results JSON: progress lines, profiler traces, TensorBoard scalars, summary lines.

- **Progress** (chief, at host syncs only): step/total, images/s so far and ETA, every ``--progress-every`` seconds.
- **Traces** (``--profile-steps A:B``, every rank): a TensorFlow profiler trace of global steps A..B (1-based,
  inclusive) into ``RESULTS/profile/<backend>-<mode>-n<N>-<run id>/rank<k>/``, and for Horovod its timeline
  (written by rank 0 only, Horovod's rule) next to them. The profiled steps end the untimed warm-up: the timed
  window starts after step B (and after every rank stopped its profiler), so the throughput stays a benchmark figure.
- **TensorBoard** (chief, after the run, from the record only: the clock is untouched): loss per step, images/s and
  step time per sync window, in ``RESULTS/tensorboard/<backend>-<mode>-n<N>-<run id>/``.
- **Summary lines** in the format of Horovod's synthetic benchmark, which ReFrame's Horovod checks parse; measured
  (wall clock, every rank), never rank 0 x N.

No TensorFlow import at module level: ``common.cli`` uses the parsers before TensorFlow starts.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from common.workload.job import job_from_dict

PROFILE_DIR = "profile"
TENSORBOARD_DIR = "tensorboard"
TIMELINE_FILE = "horovod_timeline.json"
CONF_Z = 1.96  # Horovod's synthetic benchmark: +- 1.96 x the standard deviation over its iterations


# -- flags --------------------------------------------------------------------------------------------------------
def parse_profile_steps(text: str) -> tuple[int, int]:
    """``A:B`` -> (A, B): global steps, 1-based and inclusive (Keras' ``profile_batch`` convention), 1 <= A <= B."""
    parts = text.split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        first, last = int(parts[0]), int(parts[1])
    except ValueError:
        raise ValueError(f"--profile-steps must be A:B (global steps, 1-based, inclusive), got {text!r}") from None
    if first < 1 or last < first:
        raise ValueError(f"--profile-steps {text}: need 1 <= A <= B (global steps, 1-based, inclusive)")
    return first, last


def check_profile_steps(steps: tuple[int, int] | None, total: int) -> str | None:
    """Why ``steps`` cannot be profiled in a run of ``total`` steps (None: it can). At least one step after the
    profiled ones must remain: it is the timed window."""
    if steps is not None and steps[1] >= total:
        return (f"--profile-steps {steps[0]}:{steps[1]}: the run has {total} steps; B must be < {total} (the "
                "steps after B are the timed window: profiled steps are never timed)")
    return None


# -- progress -----------------------------------------------------------------------------------------------------
def _clock(seconds: float) -> str:
    s = max(int(round(seconds)), 0)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


@dataclass
class Progress:
    """The chief's progress line, decided at host syncs only (no extra device sync): the first time a rate is
    known (the second sync), then whenever ``every`` seconds passed since the last line."""

    every: float  # seconds between lines
    global_batch: int  # images per step (0: no images/s)
    total: int  # global steps of the job
    start_step: int  # global steps done before this run (a resumed run)
    _origin: tuple[int, float] | None = None  # (steps done in this run, time) at the first sync
    _last: float | None = None  # time of the last line
    # A StepHooks part (common.training.hostsync.Part): acts after the sync's mark, asks for no sync, measures nothing.
    before_mark: ClassVar[bool] = False
    untimed: ClassVar[int] = 0

    def start(self, at: Any) -> None:
        pass

    def wants_sync(self, last: int, done: int, global_step: int) -> bool:
        return False

    def at_sync(self, at: Any) -> None:
        """At a sync (``hostsync.At``, after its mark): print the line when one is due."""
        text = self.line(at.done, at.clock.marks[-1][1], at.loss)
        if text:
            print(text, flush=True)

    def measured(self) -> dict[str, Any]:
        return {}

    def line(self, done: int, now: float, loss: float | None = None) -> str | None:
        """``done``: steps of this run the host has seen; ``now``: the sync's clock mark. A line, or None."""
        if self._origin is None:
            self._origin = (done, now)  # the first step (tracing, compilation) stays out of the rate
            return None
        if self._last is not None and now - self._last < self.every:
            return None
        d0, t0 = self._origin
        if done <= d0 or now <= t0:
            return None
        self._last = now
        steps_per_s = (done - d0) / (now - t0)
        left = self.total - self.start_step - done
        step = self.start_step + done
        rate = f" | {self.global_batch * steps_per_s:.1f} images/s so far" if self.global_batch else ""
        lossed = f" | rank-0 loss {loss:.5f}" if loss is not None else ""
        return (f"[twinbench] step {step}/{self.total} ({100.0 * step / self.total:.0f}%){rate} | "
                f"{steps_per_s:.2f} steps/s | ETA {_clock(left / steps_per_s)}{lossed}")


# -- traces -------------------------------------------------------------------------------------------------------
@dataclass
class Trace:
    """This rank's profiler session over run steps (begin, end]: started when ``begin`` steps of this run are done,
    stopped (files written) when ``end`` are, both at host syncs, before the sync's clock mark."""

    backend: Any
    root: Path  # RESULTS/profile/<label>-<run id>
    run_id: str  # the run's id, shared by every rank (the chief's)
    steps: tuple[int, int]  # global steps A..B asked for
    start_step: int  # global steps done before this run (a resumed run)
    begin: int  # run steps done before the first profiled step
    end: int  # run steps done after the last profiled step (<= 0: all of them were before a resume)
    started: bool = False
    done: bool = False
    traced: tuple[int, int] | None = None  # global steps actually traced (1-based, inclusive)
    timeline: str | None = None  # the Horovod timeline path, when this rank wrote one
    # A StepHooks part (common.training.hostsync.Part): it starts and stops before the sync's mark, so its work
    # (and the collective ending it) is in an untimed window; the steps up to its last one are untimed.
    before_mark: ClassVar[bool] = True

    @classmethod
    def create(cls, backend: Any, results_dir: str, label: str, steps: tuple[int, int], start_step: int) -> Trace:
        """One id for every rank (the chief's, by one allgather before the first step)."""
        from common.core import results as res

        run_id = res.new_run_id()
        if backend.num_workers > 1:
            run_id = backend.allgather(run_id)[0]  # every rank takes part, in the same place
        root = Path(results_dir) / PROFILE_DIR / f"{label}-{run_id}"
        return cls(backend, root, run_id, steps, start_step, max(steps[0] - 1 - start_step, 0),
                   steps[1] - start_step)

    @property
    def untimed(self) -> int:
        return self.end

    def start(self, at: Any) -> None:
        self.update(0)  # --profile-steps 1:B: the trace covers the first step too

    def wants_sync(self, last: int, done: int, global_step: int) -> bool:
        return self.due(last, done)

    def at_sync(self, at: Any) -> None:
        self.update(at.done)

    def measured(self) -> dict[str, Any]:
        return {}  # its files: named in the chief's record by ``finish`` (``artifacts``)

    @property
    def rank_dir(self) -> Path:
        return self.root / f"rank{self.backend.rank}"

    def due(self, last: int, done: int) -> bool:
        """Is a sync needed at ``done`` (previous sync at ``last``) to start or stop the trace on time?"""
        return any(last < s <= done for s in (self.begin, self.end) if s > 0)

    def update(self, done: int) -> None:
        """At a host sync (the device finished ``done`` run steps): start or stop the trace when due."""
        if self.done or self.end <= 0:
            return
        if not self.started and done >= self.begin:
            self._start(done)
        elif self.started and done >= self.end:
            self._stop(done)

    def _start(self, done: int) -> None:
        import tensorflow as tf

        self.rank_dir.mkdir(parents=True, exist_ok=True)
        self.started, self.traced = True, (self.start_step + done + 1, self.steps[1])
        tf.profiler.experimental.start(str(self.rank_dir))
        path = self.root / TIMELINE_FILE
        self.timeline = str(path) if self.backend.start_timeline(str(path)) else None

    def _stop(self, done: int) -> None:
        import tensorflow as tf

        if self.traced is not None:
            self.traced = (self.traced[0], self.start_step + done)
        self.backend.stop_timeline()
        tf.profiler.experimental.stop()  # writes this rank's trace files
        self.done = True
        if self.backend.num_workers > 1:
            # The timed window starts at this sync's mark: every rank starts it after all traces are written.
            self.backend.allsum([0.0])

    def artifacts(self, results_dir: str, num_workers: int) -> dict[str, Any]:
        """Paths relative to the results dir (each rank writes into its own host's results dir)."""
        def rel(p: Path | str) -> str:
            return os.path.relpath(p, results_dir)

        out: dict[str, Any] = {
            "profile_steps": list(self.steps),
            "profiled_steps": list(self.traced) if self.traced else None,  # global, 1-based, inclusive
            "profile_dir": rel(self.root),
            "profile_ranks": [rel(self.root / f"rank{k}") for k in range(num_workers)],
        }
        if self.timeline:
            out["horovod_timeline"] = rel(self.timeline)
        return out


def run_parts(ctx: Any, start_step: int) -> tuple[Trace | None, Progress | None]:
    """This run's trace (``--profile-steps`` with a results dir) and the chief's progress line (verbose, with
    ``--progress-every`` > 0), each None when not asked for: parts of its ``StepHooks`` (``ctx``: its RunContext).
    A collective (the trace's run id): every rank calls it at the same point, before the first step."""
    opts, plan = ctx.opts, ctx.plan
    trace = None
    if opts.profile_steps is not None and opts.results_dir:
        trace = Trace.create(ctx.backend, opts.results_dir, ctx.label, opts.profile_steps, start_step)
    progress = None
    if ctx.verbose and opts.progress_seconds > 0:
        progress = Progress(opts.progress_seconds, plan.global_batch, plan.total_steps, start_step)
    return trace, progress


# -- windows, summary lines, TensorBoard --------------------------------------------------------------------------
def timed_windows(per_rank_marks: list[list[list[float]]], warm: int) -> list[tuple[int, int, float]]:
    """(run steps done at the window's end, steps in it, seconds per step) of each sync window after the warm-up;
    a window lasts as long as its slowest rank (a synchronous step ends when the slowest rank's does)."""
    out = []
    first = per_rank_marks[0]
    for i in range(1, len(first)):
        lo, hi = int(first[i - 1][0]), int(first[i][0])
        if lo >= warm and hi > lo:
            out.append((hi, hi - lo, max(m[i][1] - m[i - 1][1] for m in per_rank_marks) / (hi - lo)))
    return out


def device_word(devices: list[str] | None) -> str:
    """GPU when any rank trained on a GPU, CPU otherwise (what Horovod's benchmark prints, with --no-cuda: CPU)."""
    return "GPU" if any("gpu" in str(d).lower() for d in devices or []) else "CPU"


def summary_lines(rec: Mapping[str, Any]) -> list[str]:
    """Horovod synthetic benchmark's result lines, measured: the total is the record's wall-clock throughput (all
    ranks, slowest rank's clock), per device = total / replicas, and the +- is 1.96 x the standard deviation of
    the per-window throughputs (windows weighted by their steps), as Horovod's is over its iterations."""
    n, gb = int(rec["world_size"]), int(rec["global_batch_size"])
    total = float(rec["images_per_sec"])
    wins = timed_windows(rec["per_rank_sync_marks"], int(rec["step_time"]["warmup_steps"]))
    rates = [(k, gb / s) for _, k, s in wins if s > 0]
    weight = sum(k for k, _ in rates)
    mean = sum(k * r for k, r in rates) / weight if weight else total
    std = math.sqrt(sum(k * (r - mean) ** 2 for k, r in rates) / weight) if weight else 0.0
    conf = CONF_Z * std
    dev = device_word(rec.get("devices"))
    batch = job_from_dict(rec.get("job") or {}).per_replica_batch_size  # the job defines it (its default if unset)
    return [
        f"Model: {(rec.get('job') or {}).get('model', '?')}",
        f"Batch size: {batch}",
        f"Number of {dev}s: {n}",
        f"Img/sec per {dev}: {total / n:.1f} +-{conf / n:.1f}",
        f"Total img/sec on {n} {dev}(s): {total:.1f} +-{conf:.1f}",
    ]


def tensorboard_dir(results_dir: str, rec: Mapping[str, Any]) -> Path:
    return Path(results_dir) / TENSORBOARD_DIR / f"{rec['backend']}-{rec['mode']}-n{rec['world_size']}-{rec['run_id']}"


def write_tensorboard(results_dir: str, rec: Mapping[str, Any]) -> Path:
    """The chief's scalars, from the finished record: ``loss`` at every global step (1-based), ``images_per_sec``
    and ``step_time_ms`` at the end step of every timed sync window. Returns the run's log dir."""
    import tensorflow as tf

    path = tensorboard_dir(results_dir, rec)
    start, gb = int(rec.get("resumed_from_step") or 0), int(rec["global_batch_size"])
    writer = tf.summary.create_file_writer(str(path))
    with writer.as_default():
        for i, loss in enumerate(rec["step_losses"] or []):
            tf.summary.scalar("loss", loss, step=i + 1)
        for done, _, seconds in timed_windows(rec["per_rank_sync_marks"], int(rec["step_time"]["warmup_steps"])):
            tf.summary.scalar("images_per_sec", gb / seconds if seconds > 0 else float("nan"), step=start + done)
            tf.summary.scalar("step_time_ms", seconds * 1e3, step=start + done)
    writer.close()
    return path


def tensorboard_installed() -> bool:
    """TensorFlow 2.21 no longer depends on TensorBoard, and ``tf.summary.scalar`` raises ``TBNotInstalledError``
    without it (tensorflow/python/summary/tb_summary.py): a stack may well lack it."""
    return importlib.util.find_spec("tensorboard") is not None


def finish(rec: Any, results_dir: str | None, trace: Trace | None) -> Any:
    """The chief's record with its artifacts (and, when traced, the traces' run id); writes the TensorBoard logs,
    or says in one line that it skips them when TensorBoard is not installed (the record holds the same figures)."""
    if not results_dir:
        return rec
    if trace is not None:
        rec = dataclasses.replace(rec, run_id=trace.run_id)  # one id names the JSON, the traces and the logs
    artifacts = dict(rec.artifacts or {})
    if tensorboard_installed():
        artifacts["tensorboard"] = os.path.relpath(write_tensorboard(results_dir, rec.to_dict()), results_dir)
    else:
        print("[twinbench] TensorBoard is not installed: no TensorBoard logs for this run (the results JSON has the "
              "same figures; pip install tensorboard to get them)", file=sys.stderr, flush=True)
    if trace is not None:
        artifacts.update(trace.artifacts(results_dir, rec.num_workers))
    return dataclasses.replace(rec, artifacts=artifacts)


# -- nccl-tests' table (the allreduce microbenchmark) -------------------------------------------------------------
def _float_str(value: float, width: int) -> str:
    """nccl-tests' getFloatStr: 2 decimals if it fits the width, else 1, else 0, else exponent."""
    for decimals in (2, 1, 0):
        text = f"{value:{width}.{decimals}f}"
        if len(text) <= width:
            return text
    return f"{value:{width}.{1 if width >= 7 else 0}e}"


def _columns(*cells: str) -> str:
    """nccl-tests' column widths: size, count, type, redop, root, then time, algbw, busbw, #wrong."""
    widths = (12, 12, 8, 6, 6, 7, 6, 6, 6)
    return "  ".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=False))


def nccl_table(rows: list[Mapping[str, Any]], heading: str) -> list[str]:
    """nccl-tests' all_reduce_perf table (out-of-place columns only: a TensorFlow allreduce is never in place), its
    ``Out of bounds values`` and ``Avg bus bandwidth`` lines (mean busbw over the rows, as nccl-tests averages)."""
    header = ["#" + _columns("", "", "", "", "")[1:] + "           out-of-place",
              "#" + _columns("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong")[1:],
              "#" + _columns("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "")[1:]]
    lines = [f"# {heading}", "#", *header]
    wrong = 0
    for r in rows:
        bad = int(r.get("wrong", 0))
        wrong += bad
        lines.append(_columns(str(r["bytes"]), str(r["bytes"] // 4), "float", "sum", "-1",
                              _float_str(r["time_median"] * 1e6, 7), _float_str(r["algbw_GBps"], 6),
                              _float_str(r["busbw_GBps"], 6), f"{bad:g}"))
    avg = sum(r["busbw_GBps"] for r in rows) / len(rows) if rows else 0.0
    lines += [f"# {'Out of bounds values':<20} : {wrong} {'FAILED' if wrong else 'OK'}",
              f"# {'Avg bus bandwidth':<20} : {avg:g} ", "#"]
    return lines
