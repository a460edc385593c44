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

import contextlib
import hashlib
import json
import math
import os
import shutil
import signal
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backends.base import Backend
from common import data as data_mod
from common import reliability as rel
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


def weights_digest(model: Any, trainable_only: bool = False) -> str:
    """sha256 of the weights' bytes (all of them, or only the trainable ones)."""
    h = hashlib.sha256()
    for w in (model.trainable_weights if trainable_only else model.weights):
        h.update(w.numpy().tobytes())
    return h.hexdigest()


def _callbacks_module() -> Any:
    import tensorflow as tf

    class StepRecorder(tf.keras.callbacks.Callback):
        """Feeds Keras' batches to the shared ``StepHooks`` (timing, loss, watchdog, preemption agreement)."""

        def __init__(self, hooks: StepHooks) -> None:
            super().__init__()
            self.hooks = hooks

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self.hooks.begin()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            # float() waits for the step: the timing below covers the whole step.
            if self.hooks.end(float(logs["step_loss"])):
                self.model.stop_training = True  # `steps` may end mid-epoch; preemption ends it anywhere

    class WarmupLR(tf.keras.callbacks.Callback):
        """Horovod's LearningRateWarmupCallback rule, by global step (momentum correction off)."""

        def __init__(self, hooks: StepHooks, lr: float, steps_per_epoch: int, replicas: int, warmup: int) -> None:
            super().__init__()
            self.hooks, self.args = hooks, (lr, steps_per_epoch, replicas, warmup)

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            lr, spe, replicas, warm = self.args
            new = lr_at_step(self.hooks.global_step, lr, spe, replicas, warm)
            if new is not None:
                tf.keras.backend.set_value(self.model.optimizer.lr, new)

    return StepRecorder, WarmupLR


def _twin_model_class() -> Any:
    import tensorflow as tf

    class TwinModel(tf.keras.Model):
        """Keras' own train step, plus ``step_loss``: this replica's mean loss of this step (not a running mean)."""

        local_replicas = 1
        xla_forward = None  # a holder (not tracked by Keras) whose .fn is the jit-compiled forward pass, or None

        def train_step(self, data: Any) -> dict[str, Any]:
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self.xla_forward.fn(x) if self.xla_forward is not None else self(x, training=True)
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


class Preempted(Exception):
    """The run stopped on a signal after writing a checkpoint; relaunching the same command resumes it."""


@dataclass
class RunOptions:
    t_process_start: float  # time.time() at process start (time to first step includes TF import)
    command: list[str]  # the exact command line, for the record
    results_dir: str | None = None  # where the chief writes the results JSON (None: nowhere)
    verbose: bool = True  # progress on the chief
    peer_timeout: float = rel.PEER_TIMEOUT  # see common.reliability
    stall_timeout: float = rel.STALL_TIMEOUT  # see common.reliability
    preempt_check_steps: int = 10  # agree on a pending SIGTERM/SIGUSR1 every N steps (one scalar collective)
    signal_at_step: int = 0  # testing aid: the chief sends itself SIGTERM after this global step (0 = never)
    resume_from: str | None = None  # explicit checkpoint dir (default: this run's own in the results dir)


@dataclass
class StepHooks:
    """What happens around every training step in both modes: timing, loss record, watchdog, preemption."""

    backend: Backend
    opts: RunOptions
    start_step: int  # global steps already done (a resumed run)
    total: int  # global steps the job runs
    preemption: rel.Preemption
    watchdog: rel.Watchdog | None
    begins: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    first_step_done: float | None = None
    stopped_at: int | None = None

    @property
    def global_step(self) -> int:
        """0-based index of the step about to run (or running)."""
        return self.start_step + len(self.losses)

    def begin(self) -> None:
        self.begins.append(time.perf_counter())

    def end(self, loss: float) -> bool:
        """Record a finished step; True when training must stop now (done or preempted)."""
        self.ends.append(time.perf_counter())
        self.losses.append(loss)
        done = self.global_step  # steps completed
        if self.first_step_done is None:
            self.first_step_done = time.time()
            if self.opts.verbose and self.backend.is_chief:
                print(f"[twinbench] first step done {self.first_step_done - self.opts.t_process_start:.1f} s after "
                      "process start", flush=True)
        if self.watchdog is not None:
            self.watchdog.progress(f"step {done}")
        if self.opts.signal_at_step == done and self.backend.is_chief:
            os.kill(os.getpid(), signal.SIGTERM)
        if done >= self.total:
            return True
        if done % self.opts.preempt_check_steps == 0:
            # Every rank asks at the same steps, so all stop after the same step even if only some got the
            # signal. Outside the step's timed interval (begin/end above).
            if self.backend.any_flag(self.preemption.signalled is not None):
                self.stopped_at = done
                return True
        return False

    def step_times(self) -> list[float]:
        return [e - b for b, e in zip(self.begins, self.ends)]


def _optimizer_slots(optimizer: Any, model: Any) -> None:
    """Create slots and the iteration counter now, so a checkpoint can be restored (and broadcast) before step 1."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    inner._create_all_weights(model.trainable_variables)


def train(job: Job, backend: Backend, opts: RunOptions) -> dict[str, Any] | None:
    """Run the job on an already set-up backend; the chief returns (and writes) the results record.

    Raises ``Preempted`` after writing a checkpoint on SIGTERM/SIGUSR1, and ``cli.UsageError`` when a checkpoint
    cannot resume this run.
    """
    import tensorflow as tf

    from common import models as models_mod
    from common.cli import UsageError

    chief = backend.is_chief
    replicas = backend.num_replicas
    verbose = opts.verbose and chief
    n_samples, input_shape, num_classes = data_mod.dataset_info(job)
    gb = job.global_batch_size(replicas)
    lr = job.scaled_learning_rate(replicas)
    spe, total = job.resolve_steps(n_samples, replicas)
    if verbose:
        print(f"[twinbench] job {job.name!r} hash {job.job_hash} | backend {backend.name} | mode {job.mode} | "
              f"{backend.num_workers} worker(s) x {backend.replicas_per_worker} replica(s) = {replicas} replicas",
              flush=True)
        warm = f", warm-up {job.warmup_epochs} epoch(s) from {lr / replicas:g}" if job.warmup_epochs else ""
        print(f"[twinbench] global batch {gb} = {job.per_replica_batch_size} per replica x {replicas}; "
              f"LR {lr:g} (base {job.learning_rate:g}, scaling {job.lr_scaling}{warm}); "
              f"{total} steps, {spe} steps/epoch, dataset {job.dataset} ({n_samples} samples)", flush=True)

    preemption = rel.Preemption()
    watchdog = None
    heartbeat = None
    if backend.num_workers > 1:
        heartbeat = rel.Heartbeat()
        peers = backend.allgather({"rank": backend.rank, "host": res.hostname(), "port": heartbeat.port,
                                   "pid": os.getpid()})
        watchdog = rel.Watchdog(backend.rank, peers, opts.peer_timeout, opts.stall_timeout).start()
    backend.watchdog = watchdog  # for cli: name the lost peer when a collective fails instead of hanging

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
            if job.xla:
                # Not compile(jit_compile=True): that compiles the whole step, collectives included, which XLA
                # cannot do on CPU (MWMS) and Horovod only with its optional XLA ops. As in the custom loop, the
                # collective-free part (here the model's forward pass, and so its gradient) is compiled.
                model.xla_forward = types.SimpleNamespace(
                    fn=tf.function(lambda x: model(x, training=True), jit_compile=True))
            model.compile(
                optimizer=optimizer,
                loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            )
        else:
            model = inner
            if job.mixed_precision:
                optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
        _optimizer_slots(optimizer, model)
    ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer)

    # Resume: the chief decides (its view of the results dir), everyone follows.
    own_dir = rel.ckpt_dir(opts.results_dir or ".", backend.name, replicas, job.job_hash)
    source = Path(opts.resume_from) if opts.resume_from else own_dir
    meta = backend.allgather(rel.read_meta(source) if chief else None)[0]
    if opts.resume_from and meta is None:
        raise UsageError(f"--resume-from {opts.resume_from!r} holds no complete checkpoint (meta.json missing)")
    start_step = 0
    previous: dict[str, Any] = {}
    if meta is not None:
        reason = rel.check_resume(meta, job.job_hash, job.name, replicas, source)
        if reason:
            raise UsageError(reason)
        backend.restore(ckpt, str(source / "ckpt"), model, optimizer)
        start_step, previous = int(meta["step"]), meta
        if verbose:
            print(f"[twinbench] resuming from {source} at step {start_step}/{total}", flush=True)

    dataset = backend.make_dataset(
        lambda index, count, per: data_mod.make_train_dataset(job, gb, index, count, per, start_step)
    )
    backend.before_training(model)
    init_digest = previous.get("initial_weights_digest") or weights_digest(model)

    hooks = StepHooks(backend, opts, start_step, total, preemption, watchdog)
    if job.mode == "fit":
        StepRecorder, WarmupLR = _callbacks_module()
        # Horovod's own warm-up callback counts Keras epochs from 0: only valid for a run that starts at step 0.
        callbacks = backend.fit_callbacks(job, spe, lr, fresh=start_step == 0)
        if job.warmup_epochs and not any(getattr(c, "provides_warmup", False) for c in callbacks):
            callbacks.append(WarmupLR(hooks, lr, spe, replicas, job.warmup_epochs))
        callbacks.append(StepRecorder(hooks))
        model.fit(dataset, epochs=math.ceil((total - start_step) / spe), steps_per_epoch=spe, callbacks=callbacks,
                  verbose=2 if verbose else 0)
    else:
        _custom_loop(job, backend, model, optimizer, dataset, hooks, gb, lr, spe, replicas, verbose)

    # Before anything reads the weights (digests, checkpoint): Horovod ranks hold per-rank BatchNorm statistics.
    backend.sync_model_state(model)
    mine = {
        "host": res.hostname(),
        "device": backend.describe().get("device", "cpu"),
        "step_times": hooks.step_times(),
        "losses": hooks.losses,
        "time_to_first_step": (hooks.first_step_done or time.time()) - opts.t_process_start,
        "final_digest": weights_digest(model),
        "trainable_digest": weights_digest(model, trainable_only=True),
    }
    # Every rank must take part in this collective, chief or not.
    everyone = backend.allgather(mine)
    prev_rank_losses = previous.get("per_rank_step_losses") or [[] for _ in everyone]
    per_rank_losses = [p + r["losses"] for p, r in zip(prev_rank_losses, everyone)]
    steps_done = min(len(r) for r in per_rank_losses)
    step_losses = [sum(r[i] for r in per_rank_losses) / len(per_rank_losses) for i in range(steps_done)]

    if hooks.stopped_at is not None:
        _write_checkpoint(job, backend, ckpt, own_dir, replicas, hooks, per_rank_losses, step_losses, init_digest)
        if watchdog is not None:
            watchdog.stop()
        raise Preempted(f"{preemption.signalled or 'a signal'} on some rank: stopped after step {hooks.stopped_at}"
                        f"/{total}, checkpoint in {own_dir}; run the same command again to resume")
    if watchdog is not None:
        watchdog.stop()  # peers may now exit at any time: their silence is no longer a failure
    if heartbeat is not None:
        heartbeat.close()
    if not chief:
        return None

    stats = res.throughput_stats([r["step_times"] for r in everyone], gb, job.timing_warmup_steps)
    n_params = int(sum(int(math.prod(v.shape)) for v in model.trainable_variables))
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
        "per_rank_step_losses": per_rank_losses,
        **stats,
        "per_rank_step_times": [r["step_times"] for r in everyone],
        "time_to_first_step": max(r["time_to_first_step"] for r in everyone),
        "resumed_from_step": start_step,  # > 0: times and throughput cover only the steps after the resume
        "versions": res.versions(),
        "hosts": [r["host"] for r in everyone],
        "devices": [r["device"] for r in everyone],
        "command": opts.command,
        "started_at": res.now_iso_from(opts.t_process_start),
        "finished_at": res.now_iso(),
        "run_id": res.new_run_id(),
        "trainable_params": n_params,
        # bytes allreduced per step (float32 gradients; half with Horovod's fp16 compression): the scaling model's S
        "gradient_bytes": n_params * (2 if backend.describe().get("compression") == "fp16" else 4),
        "initial_weights_digest": init_digest,
        "weights_digest": everyone[0]["final_digest"],
        "trainable_weights_digest": everyone[0]["trainable_digest"],  # without BatchNorm statistics
        # The replicas trained in lockstep: identical trainable weights on every rank.
        "weights_consistent": len({r["trainable_digest"] for r in everyone}) == 1,
        # Non-trainable state too (BatchNorm moving statistics: MWMS reads them as the mean over replicas, Horovod
        # ranks keep their own until backend.sync_model_state averages them after the last step).
        "all_weights_consistent": len({r["final_digest"] for r in everyone}) == 1,
    }
    if opts.verbose:
        print(f"[twinbench] {record['images_per_sec']:.1f} images/s over {stats['step_time']['timed_steps']} timed "
              f"steps (median step {stats['step_time']['median'] * 1e3:.1f} ms, p95 "
              f"{stats['step_time']['p95'] * 1e3:.1f} ms); final loss {step_losses[-1]:.5f}", flush=True)
    if opts.results_dir is not None:
        path = res.write_json_atomic(Path(opts.results_dir) / res.result_filename(record), record)
        print(f"[twinbench] results: {path}", flush=True)
        if source == own_dir and meta is not None:
            shutil.rmtree(own_dir, ignore_errors=True)  # the run is complete: nothing left to resume
            with contextlib.suppress(OSError):
                own_dir.parent.rmdir()  # only if no other run's checkpoint is there
    return record


def _write_checkpoint(job: Job, backend: Backend, ckpt: Any, final: Path, replicas: int, hooks: StepHooks,
                      per_rank_losses: list[list[float]], step_losses: list[float], init_digest: str) -> None:
    """Weights + optimizer state + where the data stream stands, published atomically by the chief."""
    tmp = final.parent / f".{final.name}.tmp-rank{backend.rank}"
    if backend.writes_checkpoint:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        # Under MWMS every worker must write (reading sync-on-read variables is a collective); only the chief's
        # copy is kept, as TensorFlow's multi-worker guide prescribes.
        ckpt.write(str(tmp / "ckpt"))
    if backend.is_chief:
        meta = {
            "job_hash": job.job_hash, "job_name": job.name, "backend": backend.name, "world_size": replicas,
            "step": hooks.stopped_at, "step_losses": step_losses, "per_rank_step_losses": per_rank_losses,
            "initial_weights_digest": init_digest, "signal": hooks.preemption.signalled,
            "created": res.now_iso(),
        }
        (tmp / "meta.json").write_text(json.dumps(meta))  # written last: its presence marks a complete checkpoint
        rel.publish_dir(tmp, final)
    elif backend.writes_checkpoint:
        shutil.rmtree(tmp, ignore_errors=True)
    backend.barrier()  # nobody exits before the checkpoint is published


def _custom_loop(job: Job, backend: Backend, model: Any, optimizer: Any, dataset: Any, hooks: StepHooks,
                 gb: int, lr: float, spe: int, replicas: int, verbose: bool) -> None:
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
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss * replicas  # this replica's own mean loss (+ regularisation)

    iterator = iter(dataset)

    @tf.function
    def train_step() -> Any:
        # The iterator is captured, not passed: a (distributed) iterator argument costs a structure check per call.
        return backend.run(step_fn, next(iterator))

    lr_var = optimizer.lr
    first = True
    while hooks.global_step < hooks.total:
        step = hooks.global_step
        new_lr = lr_at_step(step, lr, spe, replicas, job.warmup_epochs)
        if new_lr is not None:
            tf.keras.backend.set_value(lr_var, new_lr)
        hooks.begin()
        local = train_step()
        loss = sum(float(v) for v in local) / len(local)  # reading the value waits for the step
        stop = hooks.end(loss)
        if first:
            backend.after_first_step(model, optimizer)
            first = False
        if verbose and (step % max(1, spe // 4) == 0 or hooks.global_step == hooks.total):
            print(f"step {step + 1}/{hooks.total} rank-0 loss {loss:.5f}", flush=True)
        if stop:
            break
