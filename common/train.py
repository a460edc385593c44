"""The one training module: Keras ``fit`` and a custom loop, for every backend.

Same math on both backends (the loss-scaling rules of the tf.distribute tutorial):
- each replica's objective is sum(per-example loss) / GLOBAL batch + regularisation / replicas, and the
  backends SUM gradients across replicas (MWMS ``apply_gradients``; Horovod ``op=Sum``), which equals the
  gradient of the global-batch mean loss plus the regularisation counted once;
- in ``fit`` Keras applies the same rule itself under a strategy; under Horovod each rank's Keras loss is its
  local mean and ``DistributedOptimizer`` averages, which is the same quantity;
- the LR warm-up is Horovod's ``LearningRateWarmupCallback`` rule, re-implemented for the native backend and
  the custom loop (``warmup_multiplier``), momentum correction off on both sides.
Per-step losses are recorded locally (no extra collective inside the timed loop) and averaged across ranks
once at the end: every replica has the same batch size, so the mean of replica means is the global mean.
"""

from __future__ import annotations

import hashlib
import math
import os
import sys
import time
from typing import Any

from backends.base import Backend
from common import data as data_mod
from common import results as res
from common.job import Job


def warmup_multiplier(epoch: float, steps_per_epoch: int, replicas: int, warmup_epochs: int) -> float:
    """Horovod's warm-up multiplier (horovod/_keras/callbacks.py) at fractional ``epoch`` = e + batch/spe.

    Goes from ~1/replicas at the first batch to exactly 1 at the last batch of epoch ``warmup_epochs - 1``.
    """
    epoch += 1.0 / steps_per_epoch
    return 1.0 / replicas * (epoch * (replicas - 1) / warmup_epochs + 1)


def lr_at_step(step: int, lr: float, steps_per_epoch: int, replicas: int, warmup_epochs: int) -> float | None:
    """LR to set before 0-based global ``step``; None after warm-up (the LR then stays where warm-up left it)."""
    epoch, batch = divmod(step, steps_per_epoch)
    if warmup_epochs <= 0 or epoch >= warmup_epochs:
        return None
    return lr * warmup_multiplier(epoch + batch / steps_per_epoch, steps_per_epoch, replicas, warmup_epochs)


def configure_threads(local_size: int, threads: int) -> int:
    """Give each local process an equal share of the cores (TF otherwise sizes pools for all cores per process)."""
    import tensorflow as tf

    if threads <= 0:
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover - non-Linux
            cores = os.cpu_count() or 1
        threads = max(1, cores // max(local_size, 1))
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, threads)))
    return threads


def build_optimizer(job: Job, lr: float) -> Any:
    """tf_keras *legacy* optimizers in both backends (Horovod's LR callbacks need them)."""
    import tensorflow as tf

    legacy = tf.keras.optimizers.legacy
    if job.optimizer == "sgd":
        return legacy.SGD(learning_rate=lr)
    if job.optimizer == "momentum":
        return legacy.SGD(learning_rate=lr, momentum=job.momentum)
    return legacy.Adam(learning_rate=lr)


def weights_digest(model: Any) -> str:
    h = hashlib.sha256()
    for w in model.get_weights():
        h.update(w.tobytes())
    return h.hexdigest()


def _callbacks_module() -> Any:
    import tensorflow as tf

    class StepRecorder(tf.keras.callbacks.Callback):
        """Per-step end timestamps and this rank's per-step loss (``step_loss`` from the train step)."""

        def __init__(self, rec: dict[str, Any], total: int) -> None:
            super().__init__()
            self.rec, self.total, self.step = rec, total, 0

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            if self.rec["start"] is None:
                self.rec["start"] = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.rec["losses"].append(float(logs["step_loss"]))  # reading the value waits for the step
            self.rec["ends"].append(time.perf_counter())
            self.step += 1
            if self.step == 1:
                self.rec["first_step_done"] = time.time()
            if self.step >= self.total:
                self.model.stop_training = True  # `steps` may end mid-epoch

    class WarmupLR(tf.keras.callbacks.Callback):
        """Horovod's LearningRateWarmupCallback rule for backends without it (momentum correction off)."""

        def __init__(self, lr: float, steps_per_epoch: int, replicas: int, warmup_epochs: int) -> None:
            super().__init__()
            self.args = (lr, steps_per_epoch, replicas, warmup_epochs)
            self.epoch = 0

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.epoch = epoch

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            lr, spe, replicas, warm = self.args
            new = lr_at_step(self.epoch * spe + batch, lr, spe, replicas, warm)
            if new is not None:
                tf.keras.backend.set_value(self.model.optimizer.lr, new)

    return StepRecorder, WarmupLR


def _twin_model_class() -> Any:
    import tensorflow as tf

    class TwinModel(tf.keras.Model):
        """Keras' own train step, plus ``step_loss``: this replica's mean loss of this step (not a running mean)."""

        local_replicas = 1

        def train_step(self, data: Any) -> dict[str, Any]:
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(x, y, y_pred, None)
            self.optimizer.minimize(loss, self.trainable_variables, tape=tape)
            logs = self.compute_metrics(x, y, y_pred, None)
            # Under a strategy Keras divided this replica's loss by the replica count; undo it for the record.
            step_loss = loss * tf.cast(tf.distribute.get_strategy().num_replicas_in_sync, loss.dtype)
            if self.local_replicas > 1:
                # Keras returns only the first local replica's value; average them (in-process) first.
                step_loss = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.MEAN, step_loss)
            logs["step_loss"] = step_loss
            return logs

    return TwinModel


def train(job: Job, backend: Backend, *, t_process_start: float, command: list[str],
          results_dir: str | None, verbose: bool = True) -> dict[str, Any] | None:
    """Run the job on an already set-up backend; the chief returns (and writes) the results record."""
    import tensorflow as tf

    from common import models as models_mod

    chief = backend.is_chief
    replicas = backend.num_replicas
    n_samples, input_shape, num_classes = data_mod.dataset_info(job)
    gb = job.global_batch_size(replicas)
    lr = job.scaled_learning_rate(replicas)
    spe, total = job.resolve_steps(n_samples, replicas)
    if chief and verbose:
        print(f"[twinbench] job {job.name!r} hash {job.job_hash} | backend {backend.name} | mode {job.mode} | "
              f"{backend.num_workers} worker(s) x {backend.replicas_per_worker} replica(s) = {replicas} replicas",
              flush=True)
        warm = f", warm-up {job.warmup_epochs} epoch(s) from {lr / replicas:g}" if job.warmup_epochs else ""
        print(f"[twinbench] global batch {gb} = {job.per_replica_batch_size} per replica x {replicas}; "
              f"LR {lr:g} (base {job.learning_rate:g}, scaling {job.lr_scaling}{warm}); "
              f"{total} steps, {spe} steps/epoch, dataset {job.dataset} ({n_samples} samples)", flush=True)

    tf.keras.utils.set_random_seed(job.seed)  # weights, dropout: identical on every rank and backend
    if job.mixed_precision:
        tf.keras.mixed_precision.set_global_policy("mixed_float16")

    with backend.scope():
        inner = models_mod.build_model(job, input_shape, num_classes)
        optimizer = backend.wrap_optimizer(build_optimizer(job, lr), job.mode)
        if job.mode == "fit":
            model = _twin_model_class()(inputs=inner.inputs, outputs=inner.outputs, name=inner.name)
            model.local_replicas = backend.replicas_per_worker
            # tf_keras' default ("auto" = "sum" under MWMS) all-reduces every returned log across workers each
            # step, on top of the metrics' own sync, and so shows N x the loss. "first" keeps the synced metric
            # values as they are and adds no collective that Horovod runs do not have.
            model.distribute_reduction_method = "first"
            model.compile(
                optimizer=optimizer,
                loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                jit_compile=job.xla,
            )
        else:
            model = inner
            if job.mixed_precision:
                optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)

    dataset = backend.make_dataset(
        lambda index, count, per: data_mod.make_train_dataset(job, gb, index, count, per)
    )
    backend.before_training(model)
    init_digest = weights_digest(model)

    rec: dict[str, Any] = {"start": None, "ends": [], "losses": [], "first_step_done": None}
    if job.mode == "fit":
        StepRecorder, WarmupLR = _callbacks_module()
        callbacks = backend.fit_callbacks(job, spe, lr)
        if job.warmup_epochs and not any(getattr(c, "provides_warmup", False) for c in callbacks):
            callbacks.append(WarmupLR(lr, spe, replicas, job.warmup_epochs))
        callbacks.append(StepRecorder(rec, total))
        model.fit(dataset, epochs=math.ceil(total / spe), steps_per_epoch=spe, callbacks=callbacks,
                  verbose=2 if (chief and verbose) else 0)
    else:
        _custom_loop(job, backend, model, optimizer, dataset, rec, gb, lr, spe, total, replicas, chief and verbose)

    final_digest = weights_digest(model)
    mine = {
        "host": res.hostname(),
        "device": backend.describe().get("device", "cpu"),
        "step_times": res.step_times_from_ends(rec["start"], rec["ends"]),
        "losses": rec["losses"],
        "time_to_first_step": rec["first_step_done"] - t_process_start,
        "init_digest": init_digest,
        "final_digest": final_digest,
    }
    # Every rank must take part in this collective, chief or not; it is the only one outside the training loop.
    everyone = backend.allgather(mine)
    if not chief:
        return None
    steps = min(len(r["losses"]) for r in everyone)
    step_losses = [sum(r["losses"][i] for r in everyone) / len(everyone) for i in range(steps)]
    stats = res.throughput_stats([r["step_times"] for r in everyone], gb, job.timing_warmup_steps)
    record: dict[str, Any] = {
        "schema": res.SCHEMA,
        "kind": "train",
        "backend": backend.name,
        "backend_info": backend.describe(),
        "world_size": replicas,
        "num_workers": backend.num_workers,
        "mode": job.mode,
        "job_hash": job.job_hash,
        "job": job.to_dict(),
        "global_batch_size": gb,
        "learning_rate": lr,
        "steps": total,
        "steps_per_epoch": spe,
        "step_losses": step_losses,
        "per_rank_step_losses": [r["losses"] for r in everyone],
        **stats,
        "per_rank_step_times": [r["step_times"] for r in everyone],
        "time_to_first_step": max(r["time_to_first_step"] for r in everyone),
        "versions": res.versions(),
        "hosts": [r["host"] for r in everyone],
        "devices": [r["device"] for r in everyone],
        "command": command,
        "started_at": res.now_iso_from(t_process_start),
        "finished_at": res.now_iso(),
        "run_id": res.new_run_id(),
        "initial_weights_digest": init_digest,
        "weights_digest": final_digest,
        "weights_consistent": len({r["final_digest"] for r in everyone}) == 1,
    }
    if verbose:
        print(f"[twinbench] {record['images_per_sec']:.1f} images/s over {stats['step_time']['timed_steps']} timed "
              f"steps (median step {stats['step_time']['median'] * 1e3:.1f} ms, p95 "
              f"{stats['step_time']['p95'] * 1e3:.1f} ms); final loss {step_losses[-1]:.5f}", flush=True)
    if results_dir is not None:
        path = res.write_json_atomic(res.Path(results_dir) / res.result_filename(record), record)
        print(f"[twinbench] results: {path}", flush=True)
    sys.stdout.flush()
    return record


def _custom_loop(job: Job, backend: Backend, model: Any, optimizer: Any, dataset: Any, rec: dict[str, Any],
                 gb: int, lr: float, spe: int, total: int, replicas: int, verbose: bool) -> None:
    import tensorflow as tf

    loss_obj = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=tf.keras.losses.Reduction.NONE)
    mixed = job.mixed_precision

    def forward(x: Any, y: Any) -> Any:
        per_example = loss_obj(y, model(x, training=True))
        # Divide by the GLOBAL batch: the backends then SUM gradients across replicas.
        loss = tf.nn.compute_average_loss(per_example, global_batch_size=gb)
        if model.losses:
            # Regularisation counted once in total, not once per replica (tf.nn.scale_regularization_loss
            # only knows tf.distribute's replica count, not Horovod's, so divide explicitly).
            loss += tf.add_n(model.losses) / replicas
        return loss

    if job.xla:  # compile the collective-free part only: Horovod's allreduce is not an XLA op
        forward = tf.function(forward, jit_compile=True)

    def step_fn(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = forward(x, y)
            target = optimizer.get_scaled_loss(loss) if mixed else loss
        grads = backend.wrap_tape(tape).gradient(target, model.trainable_variables)
        if mixed:
            grads = optimizer.get_unscaled_gradients(grads)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=False))
        return loss * replicas  # this replica's own mean loss (+ regularisation)

    @tf.function
    def train_step(iterator: Any) -> Any:
        return backend.run(step_fn, next(iterator))

    iterator = iter(dataset)
    lr_var = optimizer.lr
    for step in range(total):
        new_lr = lr_at_step(step, lr, spe, replicas, job.warmup_epochs)
        if new_lr is not None:
            tf.keras.backend.set_value(lr_var, new_lr)
        if rec["start"] is None:
            rec["start"] = time.perf_counter()
        local = train_step(iterator)
        loss = sum(float(v) for v in local) / len(local)  # reading the value waits for the step
        rec["ends"].append(time.perf_counter())
        rec["losses"].append(loss)
        if step == 0:
            rec["first_step_done"] = time.time()
            backend.after_first_step(model, optimizer)
        if verbose and (step % max(1, spe // 4) == 0 or step == total - 1):
            print(f"step {step + 1}/{total} loss {loss:.5f}", flush=True)
