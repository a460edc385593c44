"""``--diagnose breakdown``: where a custom-loop step's time goes, measured on the device, on either backend.

A diagnostic run (its own ``kind: "breakdown"`` record, never a benchmark figure), through the one run driver
(``common.training.train``) and the custom loop (``common.training.loops.run_ctl``) with a probe, ``Breakdown``,
around the step that trains (``common.training.step``, tf_keras or Keras 3): each step is ONE ``tf.function`` whose
phases are serialized by data and control dependencies, with a ``tf.timestamp()`` at every boundary, written into the
loop's ring with the step's loss:

    t0  function start             -> next(iterator)                       -> t1  the batch is there
    t1  forward + backward, this replica's own gradients (ReplicaStep.gradients) -> t2
    t2  SUM all-reduce of the gradients (ReplicaStep.reduce: Backend.reduce_gradients) -> t3  (includes waiting)
    t3  the optimizer's update, not reducing again (ReplicaStep.apply)          -> t4

``rest`` = t0 of this step - t4 of the previous one: everything between two steps' device work (the function's
return and dispatch, the Python loop, the host syncs). So input + compute + comm + apply + rest is the step time
end to end on the device clock, and every part is measured, none is a residual. The host syncs where every run
syncs (``StepHooks``: after the first step, at the warm-up's end, every ``sync_every_steps``, after the last; a
preemption agreement rides on some of these) and keeps its clock marks: ``host_step_time`` (the slowest rank's
wall clock over the timed steps, a benchmark's ``step_time.mean``) checks the device-side parts against an
independent clock. Serializing removes the overlap a backend may have (Horovod starts allreducing gradients while
the backward pass runs): the breakdown shows where the time goes WITHOUT overlap.

Waiting: every rank leaves the all-reduce at about the same time, so the rank arriving last spends the least time
in it; a rank's ``wait`` is its comm time minus the smallest comm time of that step over ranks (no clock
synchronisation between hosts needed).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.cluster import machine
from common.core import results as res
from common.core.contract import Backend
from common.core.errors import UsageError
from common.core.privacy import public
from common.core.results import BREAKDOWN_PHASES, BreakdownRecord
from common.training import keras3
from common.training.context import RunContext
from common.training.runconfig import RunOptions
from common.workload.data import DataFacts
from common.workload.job import Job

if TYPE_CHECKING:
    from common.training.hostsync import At
    from common.training.step import ReplicaStep
    from common.training.train import Built, Gathered

STAMPS = 5  # t0..t4 per step
METHOD = ("phases serialized inside one tf.function per step, tf.timestamp() at each boundary; no overlap of "
          "communication with the backward pass; a diagnostic run, not a benchmark figure")


# -- can it run? (no TensorFlow) -----------------------------------------------------------------------------
def breakdown_refusal(job: Job, backend_name: str | None = None) -> str | None:
    """Why ``--diagnose breakdown`` cannot run ``job`` on the backend ``backend_name`` with its default flags (one
    line), or None: what a script asks before queueing the run (``python -m common.diagnostics.breakdown``). Cheap:
    reads the job and the registry, starts no TensorFlow. A backend's own flags may refuse more (native: a --strategy
    other than mwms or one_device), in one line at its start."""
    from common.core import registry

    if backend_name is not None and backend_name not in registry.names():
        return f"unknown backend {backend_name!r}: use one of {', '.join(registry.names())}"
    if job.mode != "ctl":
        return ("--diagnose breakdown splits the custom loop's step into phases: use --set mode=ctl (the job has "
                f"mode {job.mode})")
    return None


# -- pure arithmetic (no TensorFlow): per-step phases and their summary --------------------------------------
def step_phases(stamps: list[list[float]], warm: int) -> list[list[float]]:
    """Per timed step (index >= ``warm`` >= 1), the durations in BREAKDOWN_PHASES order from [t0..t4] stamps."""
    out = []
    for i in range(max(warm, 1), len(stamps)):
        t0, t1, t2, t3, t4 = stamps[i][:STAMPS]
        out.append([t1 - t0, t2 - t1, t3 - t2, t4 - t3, t0 - stamps[i - 1][4]])
    return out


def summarize(per_rank: list[list[list[float]]], per_rank_wall: list[float]) -> dict[str, Any]:
    """The record's figures from every rank's per-step phases and its host wall clock over the same steps."""
    ranks, steps = len(per_rank), len(per_rank[0])
    if steps == 0 or any(len(r) != steps for r in per_rank):
        raise ValueError(f"ranks timed different numbers of steps: {[len(r) for r in per_rank]}")
    names = BREAKDOWN_PHASES
    comm = names.index("comm")
    rank_mean = [[sum(r[i][p] for r in per_rank) / ranks for p in range(len(names))] for i in range(steps)]
    waits = [[r[i][comm] - min(q[i][comm] for q in per_rank) for i in range(steps)] for r in per_rank]
    phases = {n: sum(s[p] for s in rank_mean) / steps for p, n in enumerate(names)}
    rows = []
    for k, r in enumerate(per_rank):
        rows.append({
            "rank": k,
            "mean": {n: sum(s[p] for s in r) / steps for p, n in enumerate(names)},
            "median": {n: statistics.median(s[p] for s in r) for p, n in enumerate(names)},
            "wait": sum(waits[k]) / steps,
        })
    return {
        "phases": phases,
        "phases_median": {n: statistics.median(s[p] for s in rank_mean) for p, n in enumerate(names)},
        "wait": sum(sum(w) for w in waits) / (ranks * steps),
        "step_time": sum(phases.values()),
        "host_step_time": max(per_rank_wall) / steps,
        # the rank the others wait for: it arrives last at the all-reduce, so it spends the least time in it
        "slowest_rank": min(range(ranks), key=lambda k: rows[k]["mean"]["comm"]),
        "per_rank": rows,
    }


def describe_line(rec: BreakdownRecord) -> str:
    """One line: each phase in ms, the step on the device clock, and what the host clock measured."""
    ph = rec.phases
    parts = " | ".join(f"{p} {ph[p] * 1e3:.3f}" for p in BREAKDOWN_PHASES)
    wait = f" (comm includes {rec.wait * 1e3:.3f} waiting for the slowest rank)" if rec.wait is not None else ""
    return (f"{parts} ms per step{wait}; sum {rec.step_time * 1e3:.3f} ms, host clock {rec.host_step_time * 1e3:.3f}"
            f" ms ({100 * rec.step_time / rec.host_step_time:.1f}%)")


# -- the diagnostic run: a probe around the one step, through the one run driver -----------------------------------
def run_breakdown(job: Job, backend: Backend, opts: RunOptions,
                  facts: DataFacts | None = None) -> BreakdownRecord | None:
    """Train ``job`` with its step split into timed phases (``common.training.train``'s driver with the
    ``Breakdown`` probe); the chief writes (and returns) the record."""
    from common.training import train

    return train.train(job, backend, opts, facts, probe=Breakdown())


class Breakdown:
    """The probe (``common.training.train.Probe``): the custom loop's step, each phase between two timestamps; the
    ring's row of a step is [t0, t1, t2, t3, t4, loss] in float64."""

    columns = STAMPS + 1
    # Also a part of the host's syncs (common.training.hostsync.Part, given to the run's StepHooks once): it keeps the
    # host clock's marks at the warm-up's end and at the last sync, after each mark.
    before_mark = False
    untimed = 1  # step `warm - 1` ends the untimed part: the first timed step's gap (``rest``) needs a step before

    def __init__(self) -> None:
        import tensorflow as tf

        self.dtype = tf.float64
        self.stamps: list[list[float]] = []
        self.warm = 0  # the run's untimed steps (StepHooks.warm), known as the clock starts
        self.wall: list[float] = []  # the host clock's marks at the warm-up's end and at the last sync so far

    def check(self, ctx: RunContext) -> None:
        backend, plan = ctx.backend, ctx.plan
        if backend.info.replicas_per_worker != 1:
            raise UsageError("--diagnose breakdown times one replica per process; this run drives "
                             f"{backend.info.replicas_per_worker}")
        if backend.train_loop() is not None:
            raise UsageError("--diagnose breakdown times the custom loop's step; this backend trains in a loop of "
                             "its own (parameter servers)")
        if plan.total_steps < 2:
            raise UsageError(f"--diagnose breakdown needs at least 2 steps (one untimed), got {plan.total_steps}")

    def announce(self, ctx: RunContext) -> str:
        job, backend, plan = ctx.job, ctx.backend, ctx.plan
        return (f"[twinbench] DIAGNOSTIC run (not a benchmark): step breakdown of job {job.name!r} hash "
                f"{job.job_hash}, backend {backend.name}, {plan.replicas} replica(s), {plan.total_steps} steps; "
                "phases serialized, no overlap")

    def device_step(self, fetch: Callable[[], Any], one: ReplicaStep, backend: Backend) -> Any:
        import tensorflow as tf

        variables = keras3.tf_variables(one.variables)

        def replica(x: Any, y: Any) -> Any:
            t1 = _stamp_after([x, y])
            x, y = _after(t1, [x, y])  # the forward pass starts once t1 is taken
            loss, grads, _ = one.gradients(x, y)
            t2 = _stamp_after([g for g in grads if g is not None])
            reduced = one.reduce(_after(t2, grads))
            t3 = _stamp_after([g for g in reduced if g is not None])
            update = one.apply(_after(t3, reduced))
            with tf.control_dependencies(_ops(update)):
                t4 = _stamp_after([tf.identity(v) for v in variables])  # the updated values, read back
            return tf.stack([t1, t2, t3, t4, one.record(tf.cast(loss, tf.float64))])

        t0 = tf.timestamp()
        with tf.control_dependencies([t0]):  # the batch is asked for after t0
            batch = fetch()
        return tf.concat([[t0], backend.run_step(replica, batch)[0]], 0)  # one replica per process (checked)

    def losses(self, rows: list[list[float]]) -> list[float]:
        self.stamps += [row[:STAMPS] for row in rows]
        return [row[STAMPS] for row in rows]

    def start(self, at: At) -> None:
        self.warm = at.warm

    def wants_sync(self, last: int, done: int, global_step: int) -> bool:
        return False  # the warm-up's end and the last step are syncs anyway

    def at_sync(self, at: At) -> None:
        mark = at.clock.marks[-1][1]  # this sync's
        if at.done == self.warm:
            self.wall = [mark, mark]
        elif self.wall:
            self.wall[1] = mark

    def measured(self) -> dict[str, Any]:
        """The phases of the timed steps, and the host clock over them (from the warm-up's end to the last mark)."""
        return {"phases": step_phases(self.stamps, self.warm), "wall": self.wall[1] - self.wall[0]}

    def record(self, ctx: RunContext, built: Built, gathered: Gathered) -> BreakdownRecord:
        from common.training.train import trainable_params

        job, backend, plan, opts = ctx.job, ctx.backend, ctx.plan, ctx.opts
        everyone = gathered.everyone
        warm = everyone[0]["warm"]
        n_params = trainable_params(built.model)
        figures = summarize([r["phases"] for r in everyone], [r["wall"] for r in everyone])
        for row, r in zip(figures["per_rank"], everyone):
            row["host"] = r["host"]
        rec = BreakdownRecord(
            backend=backend.name, backend_info=backend.describe(), world_size=plan.replicas,
            num_workers=backend.num_workers, job_hash=job.job_hash, job=job.to_dict(),
            global_batch_size=plan.global_batch, steps=plan.total_steps, timed_steps=plan.total_steps - warm,
            warmup_steps=warm, **figures, per_rank_step_phases=[r["phases"] for r in everyone],
            step_losses=gathered.step_losses,
            trainable_params=n_params, gradient_bytes=backend.capabilities().gradient_bytes(n_params),
            versions=res.versions(),
            hosts=[r["host"] for r in everyone], command=list(opts.command),
            started_at=res.now_iso_from(opts.t_process_start), finished_at=res.now_iso(), run_id=res.new_run_id(),
            machine=machine.combine([r["machine"] for r in everyone]),
            recipe=ctx.trained_by.record(),  # the job's identity above (the file's hash), what trained here
        )
        if opts.verbose:
            print(f"[twinbench] breakdown ({METHOD}): {describe_line(rec)}", flush=True)
        if opts.results_dir is not None:
            path = res.write_json_atomic(Path(opts.results_dir) / rec.filename(), public(rec.to_dict()))
            print(f"[twinbench] results: {path}", flush=True)
        return rec


def _stamp_after(tensors: list[Any]) -> Any:
    """tf.timestamp() once ``tensors`` are computed. With a GPU, a data dependency on one element of each, read on
    the host, so the stamp waits for the kernels themselves (a control dependency waits only for their launch);
    on a CPU a control dependency is enough, and costs less."""
    import tensorflow as tf

    # a batch's features may be a dict (several inputs) and a gradient sparse: every component tensor counts
    tensors = [t for t in tf.nest.flatten(tensors, expand_composites=True) if t is not None]
    if not tf.config.list_logical_devices("GPU"):
        with tf.control_dependencies(tensors):
            return tf.timestamp()
    with tf.device("/device:CPU:0"):
        probe = tf.add_n([tf.cast(tf.reshape(t, [-1])[0], tf.float64) for t in tensors])
        with tf.control_dependencies([probe]):
            return tf.timestamp()


def _after(stamp: Any, tensors: list[Any]) -> list[Any]:
    """``tensors`` passed through identities that wait for ``stamp``: what consumes them starts after it (a None
    gradient stays None)."""
    import tensorflow as tf

    with tf.control_dependencies([stamp]):  # each element as it is: a tensor, or a dict of a batch's inputs
        return [None if t is None else tf.nest.map_structure(tf.identity, t) for t in tensors]


def _ops(update: Any) -> list[Any]:
    """What apply_gradients returned, as a list usable in control_dependencies (the backend's update op)."""
    import tensorflow as tf

    return [u for u in tf.nest.flatten(update, expand_composites=True) if u is not None]


def main(argv: list[str] | None = None) -> int:
    """``python -m common.diagnostics.breakdown JOB BACKEND [--set KEY=VALUE ...]``: exit 0 when the breakdown can run,
    1 with its refusal on one line (stdout), 2 on bad input (stderr)."""
    import argparse
    import sys

    from common.workload.job import JobError, load_job

    p = argparse.ArgumentParser(prog="python -m common.diagnostics.breakdown",
                                description="Can --diagnose breakdown run this job on this backend? (no TensorFlow)")
    p.add_argument("job")
    p.add_argument("backend")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a job key, as the backends take")
    args = p.parse_args(argv)
    from common.core import registry

    if args.backend not in registry.names():
        p.error(f"unknown backend {args.backend!r}: use one of {', '.join(registry.names())}")
    try:
        job = load_job(args.job, args.set)
    except JobError as e:
        print(f"{p.prog}: {e}", file=sys.stderr)
        return 2
    problem = breakdown_refusal(job, args.backend)
    if problem:
        print(problem)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
