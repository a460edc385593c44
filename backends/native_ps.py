"""Parameter-server training on the chief: the custom loop and Keras ``fit`` through a ClusterCoordinator.

Asynchronous, so not the computation of the synchronous runs (the report labels these runs and keeps them out of
every parity claim; compare their throughput and final loss only):
- a *global step* is still one global batch of G = W x b samples (W workers, b per worker): the chief schedules W
  worker steps for it; a free worker runs each on its next batch of b samples and applies the update at once to
  the variables on the parameter servers (the mean loss over its b samples, regularisation counted once), without
  waiting for the other workers;
- each worker step returns its loss (a RemoteValue); the loss of a global step is the mean of its W worker steps'
  losses, in scheduling order;
- the chief waits for the workers (``coordinator.join``) only at syncs, where every loop syncs (``StepHooks``: after
  the first global step, at the end of the timing warm-up, every ``sync_every_steps`` global steps and after the
  last one). Losses are read and the clock marks taken there, so step times are means over a sync window.
Each worker gets its own slots of every global batch (``NativeBackend.make_dataset``): the samples are those of
the synchronous runs, though a fast worker may run ahead of a slow one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from common.training.objective import mean_over_ranks
from common.training.step import make_step

if TYPE_CHECKING:
    from common.training.context import RunContext
    from common.training.hostsync import StepHooks


class _Syncs:
    """Worker steps scheduled since the last sync; after each global step's ``fan`` of them, the ``StepHooks`` say
    whether the host syncs now (where every loop syncs: ``StepHooks.sync_due``); at a sync: join, read their losses,
    record them (``StepHooks.sync``)."""

    def __init__(self, coordinator: Any, hooks: StepHooks, fan: int, read: Callable[[Any], float],
                 progress: Callable[[int, float], None] | None) -> None:
        self.coordinator, self.hooks, self.fan = coordinator, hooks, fan
        self.read, self.progress = read, progress
        self.pending: list[Any] = []  # RemoteValues of the worker steps scheduled since the last sync

    def add(self, remote: Any) -> bool:
        """One more worker step scheduled; True when the loop must stop (all done, or a stop agreed at a sync)."""
        self.pending.append(remote)
        if len(self.pending) % self.fan:
            return False
        steps = len(self.pending) // self.fan
        # The chief hands steps over only here: a global step is dispatched once its worker steps are scheduled.
        if not self.hooks.step_ended(self.hooks.synced + steps):
            return False
        self.coordinator.join()  # every scheduled worker step has run (raises the first step error, if any)
        values = [self.read(v.fetch()) for v in self.pending]
        losses = [mean_over_ranks(values[i * self.fan:(i + 1) * self.fan]) for i in range(steps)]
        self.pending = []
        stop = self.hooks.sync(losses)
        if self.progress is not None:
            self.progress(self.hooks.synced, losses[-1])
        return stop


def _worker_step(ctx: RunContext, strategy: Any, model: Any, optimizer: Any, worker_batch: int, replicas: int) -> Any:
    """One worker step (a tf.function the coordinator schedules): next batch, update applied at once, mean loss."""
    import tensorflow as tf

    # The shared step (common.training.step) over this worker's own batch: its update is applied alone, the mean over
    # its batch (all its local replicas), the objective Keras fit uses under this strategy too; regularisation
    # counted once per worker step. Its optimizer reduces over the local replicas itself
    # (Capabilities.optimizer_reduces).
    replica_step = make_step(ctx, model, optimizer, worker_batch, replicas).run

    @tf.function
    def worker_step(iterator: Any) -> Any:
        x, y = next(iterator)
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, strategy.run(replica_step, args=(x, y)), axis=None)

    return worker_step


def _run_ctl(strategy: Any, coordinator: Any, step: Any, dataset_fn: Callable[[Any], Any], hooks: StepHooks,
             syncs: _Syncs) -> None:
    # Created on every worker through the coordinator; each worker then iterates its own dataset.
    per_worker = coordinator.create_per_worker_dataset(lambda: strategy.distribute_datasets_from_function(dataset_fn))
    iterator = iter(per_worker)
    hooks.start_clock()
    while not syncs.add(coordinator.schedule(step, args=(iterator,))):
        pass


def _run_fit(model: Any, dataset_fn: Callable[[Any], Any], worker_steps: int, hooks: StepHooks,
             syncs: _Syncs) -> None:
    import tensorflow as tf

    class Scheduled(tf.keras.callbacks.Callback):
        """Hands each worker step Keras scheduled (its logs: a RemoteValue) to the syncs."""

        def __init__(self) -> None:
            super().__init__()
            # Keras then passes the RemoteValue itself: converting it would wait for every worker step.
            self._supports_tf_logs = True
            self.started = False

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            if not self.started:
                hooks.start_clock()
                self.started = True

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if syncs.add(logs):
                self.model.stop_training = True

    # DatasetCreator: Keras creates the dataset on every worker through the coordinator (create_per_worker_dataset).
    model.fit(tf.keras.utils.experimental.DatasetCreator(dataset_fn), epochs=1, steps_per_epoch=worker_steps,
              callbacks=[Scheduled()], verbose=0)


def run_ps(ctx: RunContext, model: Any, optimizer: Any, dataset_fn: Callable[[Any], Any], hooks: StepHooks) -> None:
    """Train on the chief of a parameter-server cluster (``NativeBackend.train_loop``), in ``job.mode``.

    ``dataset_fn`` is the per-worker dataset function ``backend.make_dataset`` returned; ``hooks`` records the
    losses and clock marks at each sync, as in the synchronous loops.
    """
    import tensorflow as tf

    job, backend, plan = ctx.job, ctx.backend, ctx.plan
    strategy = model.distribute_strategy
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)  # one per strategy (Keras')
    fan = backend.num_workers  # worker steps per global step
    local = backend.info.replicas_per_worker
    worker_batch = plan.per_replica_batch * local  # one worker step's samples: a global step is `fan` of them
    run_steps = hooks.run_steps
    progress = None
    if ctx.verbose:
        print(f"[twinbench] parameter-server training (asynchronous): {fan} worker steps of "
              f"{worker_batch} samples per global step; the chief joins every {job.sync_every_steps} "
              "steps", flush=True)

        def progress(done: int, loss: float) -> None:
            print(f"step {hooks.start_step + done}/{plan.total_steps} loss {loss:.5f}", flush=True)

    if job.mode == "fit":
        syncs = _Syncs(coordinator, hooks, fan, lambda logs: float(logs["step_loss"]), progress)
        _run_fit(model, dataset_fn, run_steps * fan, hooks, syncs)
    else:
        syncs = _Syncs(coordinator, hooks, fan, float, progress)
        step = _worker_step(ctx, strategy, model, optimizer, worker_batch, local)
        _run_ctl(strategy, coordinator, step, dataset_fn, hooks, syncs)
