"""Did the input pipeline keep up? Time spent waiting for the next batch, measured on the device during the run.

Two methods, each measured inside the step function (``tf.timestamp``, float64 seconds accumulated in a
``tf.Variable``), so the timed loop gains no host <-> device sync; the host reads the total once, after the loop:
- ``fetch`` (custom loop): a timestamp right before ``next(iterator)`` and one once every tensor of the batch is
  available; their difference is the time this step waited for its batch, nothing else.
- ``gap`` (Keras fit): Keras fetches the batch before ``train_step``, out of reach; the measure is the time from
  the end of the previous step (update applied, loss computed) to the moment this step's batch is available. That
  is the input wait *plus* whatever ran between the two steps (Keras' per-step host work, callbacks, the host
  dispatching the next step): an upper bound of the input wait, labelled "input + between steps".
Only the timed steps count (run step >= the untimed warm-up), so the total is comparable with the rank's timed
wall time; ``summarise`` turns every rank's total into the record's ``input`` field. No TensorFlow at import.
"""

from __future__ import annotations

from typing import Any

from common.training.hostsync import Quiet

# Shares of the timed wall time spent waiting for input: below the first the input kept up, from the second on a
# run is highly input-bound, in between moderately. TensorFlow Profiler's own lines (its input-pipeline analysis:
# kModeratelyInfeedBoundThresholdInPercent = 5, kHighlyInfeedBoundThresholdInPercent = 20).
KEPT_UP_FRACTION = 0.05
HIGHLY_INPUT_BOUND_FRACTION = 0.20
MEASURES = {  # what each method's seconds are, as the record and the report name it
    "fetch": "time waiting for the next batch",
    "gap": "input + between steps",
}


class _Part(Quiet):
    """A part of the host's syncs (``common.training.hostsync.Part``): given to ``StepHooks`` at its construction,
    read once after the loop (``measured``: the rank's ``input``); the other members are ``Quiet``'s."""

    def measured(self) -> dict[str, Any]:
        return {"input": rank_measure(self)}  # type: ignore[arg-type]


class InputClock(_Part):
    """The device-side accumulator of one rank (create it outside any ``tf.function``, use it inside one). ``warm``:
    the untimed first steps, known when the clock starts (``start``), before the loop traces its step function."""

    def __init__(self, method: str, warm: int | None = None) -> None:
        import tensorflow as tf

        if method not in MEASURES:
            raise ValueError(f"unknown input-wait method {method!r}")
        self.method, self.warm = method, warm
        # Not model attributes (Keras would track and checkpoint them): held by the loops only.
        self.total = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="twinbench_input_wait")
        # gap: when the previous step ended (seconds since the epoch; 0 = no step yet)
        self.prev_end = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="twinbench_prev_step_end")

    def start(self, at: Any) -> None:
        self.warm = at.warm  # before the first step: the step function is traced after this

    def _count(self, seconds: Any, step: Any) -> Any:
        """Add ``seconds`` if run step ``step`` (0-based) is timed; returns the update."""
        import tensorflow as tf

        if self.warm is None:
            raise RuntimeError("InputClock used in a step before the clock started (StepHooks.start_clock)")
        timed = tf.cast(step, tf.int64) >= self.warm
        return self.total.assign_add(tf.where(timed, seconds, tf.constant(0.0, tf.float64)))

    def fetch(self, get_next: Any, step: Any) -> Any:
        """In the step function (``fetch``): ``get_next()``'s batch, timing how long it took to be available."""
        import tensorflow as tf

        start = tf.timestamp()
        # Explicit orders: a timestamp has no data dependency on the iterator, so nothing else would keep the
        # first before the fetch and the second after the batch's tensors exist.
        with tf.control_dependencies([start]):
            batch = get_next()
        with tf.control_dependencies(tf.nest.flatten(batch, expand_composites=True)):
            waited = tf.timestamp() - start
        self._count(waited, step)
        return batch

    def batch_ready(self, data: Any, step: Any) -> Any:
        """In ``train_step`` (``gap``): count the time since the previous step ended, once ``data`` is available."""
        import tensorflow as tf

        with tf.control_dependencies(tf.nest.flatten(data, expand_composites=True)):
            now = tf.timestamp()
        prev = self.prev_end.read_value()
        gap = tf.where(prev > 0, now - prev, tf.constant(0.0, tf.float64))  # the first step has no previous one
        return self._count(gap, step)

    def step_done(self, after: list[Any]) -> Any:
        """In ``train_step`` (``gap``): the step ends once everything in ``after`` (update, loss record) ran."""
        import tensorflow as tf

        with tf.control_dependencies(after):
            return self.prev_end.assign(tf.timestamp())

    def restart_gap(self) -> None:
        """On the host, between two steps (``gap``): the next gap counts from now, not from the previous step's end
        (an evaluation ran in between, common.training.evaluate). No-op for ``fetch``, which times the fetch only."""
        import tensorflow as tf

        if self.method == "gap":
            self.prev_end.assign(tf.timestamp())

    def seconds(self) -> float:
        """The timed steps' total (reads the device: call after the loop)."""
        return float(self.total.numpy())


class NotMeasured(_Part):
    """What a loop that cannot measure the input wait has instead of a clock: the reason, for the record."""

    method = None

    def __init__(self, reason: str) -> None:
        self.reason = reason


# Why a loop of the backend's own does not measure it (``common.training.train.make_hooks``): asynchronous
# (parameter servers) or another.
ASYNCHRONOUS = ("parameter-server training: each worker fetches its own batches, asynchronously, in steps the chief "
                "only schedules; their waits are not measured")
OWN_LOOP = "the backend's own training loop does not measure it"


def rank_measure(clock: InputClock | NotMeasured | None) -> dict[str, Any]:
    """This rank's part of ``summarise``'s input (JSON, gathered from every rank after the loop)."""
    if isinstance(clock, InputClock):
        return {"method": clock.method, "seconds": clock.seconds()}
    reason = clock.reason if isinstance(clock, NotMeasured) else "this training loop does not measure it"
    return {"method": None, "reason": reason}


def summarise(per_rank: list[dict[str, Any]], timed_walls: list[float],
              threshold: float = KEPT_UP_FRACTION) -> dict[str, Any]:
    """The record's ``input`` field from every rank's ``rank_measure`` and timed wall time (same rank order).

    ``wait_fraction``: the largest over ranks of its wait / its own timed wall time. ``kept_up``: below
    ``threshold``; with ``gap`` (an upper bound of the input wait) a larger value cannot tell input from the
    host's work between steps, so ``kept_up`` is then None (undecided), never a false "input-bound".
    ``input_bound``: "no", "moderately" or "highly" (``fetch`` only; None otherwise), TensorFlow Profiler's terms.
    """
    methods = {r.get("method") for r in per_rank}
    if None in methods or len(methods) != 1:
        reasons = sorted({str(r.get("reason", "ranks measured differently")) for r in per_rank})
        return {"method": None, "measures": None, "kept_up": None, "reason": "; ".join(reasons)}
    method = methods.pop()
    waits = [float(r["seconds"]) for r in per_rank]
    fraction = max(w / t for w, t in zip(waits, timed_walls, strict=True)) \
        if timed_walls and all(t > 0 for t in timed_walls) else None
    if fraction is None:
        kept_up = None  # no timed wall time to compare with
    elif fraction < threshold:
        kept_up = True
    else:
        kept_up = False if method == "fetch" else None
    bound = None
    if kept_up is not None:
        bound = "no" if kept_up else "highly" if fraction >= HIGHLY_INPUT_BOUND_FRACTION else "moderately"
    return {"method": method, "measures": MEASURES[method], "wait_seconds_per_rank": waits,
            "wait_fraction": fraction, "threshold": threshold, "kept_up": kept_up, "input_bound": bound}
