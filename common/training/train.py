"""The one run driver: every run on a set-up backend, in named steps: plan, build, resume, drive (fit | ctl | the
backend's own loop), gather, record.

Training, parameter-server training (the backend's own loop, ``Backend.train_loop``) and the ``--diagnose breakdown``
run (a probe around the custom loop's one step, ``common.diagnostics.breakdown``, with its own record) all go through
``train``. The loops themselves, and when the host syncs, are in ``common.training.loops``; the step in
``common.training.step``; this module owns what happens before and after them: the plan, the model and optimizer, the
checkpoint (resume and preemption), the gathering of every rank's measurements, and the chief's results record.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from common.cluster import energy, machine, nccl, netif
from common.core import results as res
from common.core.contract import Backend, Capabilities, tuning_record
from common.core.errors import PeerLost, Preempted, UsageError
from common.core.privacy import public_env
from common.training import compiled as compiled_mod
from common.training import evaluate, inputwait, keras3, loops, objective, observe, outputs, streamed
from common.training import reliability as rel
from common.training.context import Plan, Recipe, RunContext
from common.training.hostsync import FirstStep, Liveness, Part, StepHooks, Validation
from common.training.optimizers import build_optimizer  # bench/ imports it from here too
from common.training.runconfig import RunOptions
from common.workload import data as data_mod
from common.workload import usercode
from common.workload.job import DEFAULT_LOSS, Job, job_from_dict


def weights_fingerprint(model: Any) -> list[list[float]]:
    """[sum, sum of squares] of every trainable variable in float64, in model order: final weights compared with a
    tolerance across runs (the digests compare bytes)."""
    import numpy as np

    out = []
    for w in model.trainable_weights:
        v = np.asarray(w.numpy(), dtype=np.float64)
        out.append([float(v.sum()), float(np.square(v).sum())])
    return out


def trainable_params(model: Any) -> int:
    """Trainable parameters: the gradient's size (what the records' ``gradient_bytes`` count)."""
    return int(sum(int(math.prod(v.shape)) for v in model.trainable_variables))


def weights_digest(model: Any, trainable_only: bool = False) -> str:
    """sha256 of the weights' bytes (all of them, or only the trainable ones)."""
    h = hashlib.sha256()
    for w in (model.trainable_weights if trainable_only else model.weights):
        h.update(w.numpy().tobytes())
    return h.hexdigest()


@dataclass
class Built:
    model: Any
    optimizer: Any
    checkpoint: Any
    recipe: Recipe  # what trains (compiled.recipe): the job's keys or the model function's compile()
    compiled: compiled_mod.Compiled | None = None  # what the model function compiled, if it did


@dataclass(frozen=True)
class Gathered:
    """Every rank's measurements after the loop (one allgather) and the losses they make, resumed steps included."""

    everyone: list[dict[str, Any]]  # one dict per rank, in rank order (``gather``)
    per_rank_losses: list[list[float]]  # each rank's loss of every step since step 0
    step_losses: list[float]  # their mean per step
    init_digest: str  # the weights the run started from (at step 0, through resumes)
    evaluations: list[dict[str, Any]]  # the chief's validation results since step 0 (common.training.evaluate)


@dataclass
class Resume:
    start_step: int  # global steps already done
    previous: dict[str, Any]  # the checkpoint's meta.json ({} for a fresh run)
    source: Path  # where the checkpoint was read from
    own_dir: Path  # where this run's checkpoint lives (written on preemption, deleted when complete)

    @classmethod
    def fresh(cls, ctx: RunContext) -> Resume:
        """From step 0, reading no checkpoint (a probed run: ``Probe``)."""
        own = own_checkpoint_dir(ctx)
        return cls(0, {}, own, own)


class Probe(loops.StepProbe, Part, Protocol):
    """A diagnostic run through this driver (``common.diagnostics.breakdown``): its checks, its step (``StepProbe``),
    a part of the host's syncs (``hostsync.Part``: its untimed steps, what each rank adds to the gathered
    measurements), and its own record instead of a benchmark's. A probed run
    neither resumes nor leaves a checkpoint: it is measured in one piece."""

    def check(self, ctx: RunContext) -> None:
        """UsageError (exit 2 on every rank) when the probe cannot run this plan on this backend."""

    def announce(self, ctx: RunContext) -> str:
        """The chief's first line."""

    def record(self, ctx: RunContext, built: Built, gathered: Gathered) -> Any:
        """The chief's record from every rank's measurements; written and returned."""


def train(job: Job, backend: Backend, opts: RunOptions, facts: data_mod.DataFacts | None = None,
          probe: Probe | None = None) -> Any:
    """Run the job on a set-up backend; the chief returns (and writes) the results record (a ``RunRecord``, or the
    probe's). ``facts``: the training data's, when the caller worked them out already (``common.cli``).

    Raises ``Preempted`` after writing a checkpoint on SIGTERM/SIGUSR1, ``UsageError`` when a checkpoint cannot
    resume this run, and ``PeerLost`` when a collective failed because a peer no longer answers.
    """
    ctx = RunContext(job, backend, opts, make_plan(job, backend, facts))
    if probe is not None:
        probe.check(ctx)
    announce(ctx, probe)
    preemption = rel.Preemption()  # SIGTERM/SIGUSR1 handlers first: from here on a signal means "checkpoint"
    heartbeat, watchdog = start_watchdog(backend, opts)
    with peer_loss_as_error(watchdog):
        return _train(ctx, preemption, watchdog, heartbeat, probe)


PEER_LOSS_GRACE = 10.0  # s: a failure that is not a lost peer is reported this much later, never misnamed


@contextlib.contextmanager
def peer_loss_as_error(watchdog: rel.Watchdog | None) -> Iterator[None]:
    """A failure while the watchdog knows a peer is lost becomes ``PeerLost`` naming it: the failed collective's
    own error rarely says which rank went away. Preemption and usage errors pass through unchanged."""
    try:
        yield
    except (Preempted, UsageError):
        raise
    except Exception as e:
        # a failed collective is the first sign of a dead peer: give its port PEER_LOSS_GRACE s to close
        lost = watchdog.lost_peers(PEER_LOSS_GRACE) if watchdog is not None and rel.from_collective(e) else []
        if not lost:
            raise
        watchdog.stop()
        raise PeerLost(lost, e) from e


def _train(ctx: RunContext, preemption: rel.Preemption, watchdog: rel.Watchdog | None,
           heartbeat: rel.Heartbeat | None, probe: Probe | None) -> Any:
    backend, opts, plan = ctx.backend, ctx.opts, ctx.plan
    built = build(ctx)
    ctx = dataclasses.replace(ctx, recipe=built.recipe)  # the one recipe, from here on read by all
    if ctx.verbose:  # the global batch, LR and optimizer: the model function may have compiled its own
        print(compiled_mod.banner(ctx, built.compiled), flush=True)
        line = metrics_line(ctx.trained_by) if probe is None else None  # a probed run evaluates nothing
        if line:
            print(line, flush=True)
    resume = find_resume(ctx, built) if probe is None else Resume.fresh(ctx)
    dataset = backend.make_dataset(training_input(ctx, resume.start_step))
    backend.before_training(built.model, built.optimizer)
    init_digest = resume.previous.get("initial_weights_digest") or weights_digest(built.model)
    hooks = make_hooks(ctx, built, resume.start_step, preemption, watchdog, probe)
    drive(ctx, built, dataset, hooks, probe)
    # Before anything reads the weights (digests, checkpoint): Horovod ranks hold per-rank BatchNorm statistics.
    backend.sync_model_state(built.model)
    gathered = gather(ctx, built, hooks, resume, init_digest)
    if hooks.stopped_at is not None:
        if probe is None:
            write_checkpoint(ctx, built.checkpoint, resume.own_dir, hooks, gathered)
        if watchdog is not None:
            watchdog.stop()
        where = f"checkpoint in {resume.own_dir}; run the same command again to resume" if probe is None else \
            "a diagnostic run leaves no checkpoint: run it again"
        raise Preempted(f"{preemption.signalled or 'a signal'} on some rank: stopped after step {hooks.stopped_at}"
                        f"/{plan.total_steps}, {where}")
    if watchdog is not None:
        watchdog.stop()  # peers may now exit at any time: their silence is no longer a failure
    if heartbeat is not None:
        heartbeat.close()
    if not backend.is_chief:
        return None
    if probe is not None:
        return probe.record(ctx, built, gathered)
    record = make_record(ctx, built, resume, gathered)
    publish(record, opts, resume, hooks.find(observe.Trace))
    return record


def drive(ctx: RunContext, built: Built, dataset: Any, hooks: StepHooks, probe: Probe | None) -> None:
    """The loop: the backend's own (parameter servers), a probe's around the custom loop's step, or the job's mode;
    validation (when the job has it) in the shared loops only, never in a probed run."""
    if probe is not None:
        loops.run_ctl(ctx, built.model, built.optimizer, dataset, hooks, probe)
        return
    own_loop = ctx.backend.train_loop()
    loop = own_loop or (loops.run_fit if ctx.job.mode == "fit" else loops.run_ctl)
    loop(ctx, built.model, built.optimizer, dataset, hooks)


def make_hooks(ctx: RunContext, built: Built, start_step: int, preemption: rel.Preemption,
               watchdog: rel.Watchdog | None, probe: Probe | None) -> StepHooks:
    """The host's side of the loop ``drive`` runs, with every part it has (``common.training.hostsync.Part``),
    each given here once, in the order they act at a sync (the trace before the clock mark, the rest after it)."""
    opts, plan, backend = ctx.opts, ctx.plan, ctx.backend
    # a collective (the trace's run id): every rank builds its hooks at the same point, before the first step
    trace, progress = observe.run_parts(ctx, start_step)
    own_loop = backend.train_loop() is not None
    if probe is not None:
        clock: Any = inputwait.NotMeasured(loops.PROBE_INPUT)
    elif own_loop:
        clock = inputwait.NotMeasured(inputwait.ASYNCHRONOUS if backend.capabilities().asynchronous else
                                      inputwait.OWN_LOOP)
    else:
        clock = inputwait.InputClock(loops.INPUT_METHOD[ctx.job.mode])
    evaluator = None  # validation in the shared loops only, never in a probed run
    if probe is None and not own_loop:
        evaluator = streamed.make_evaluator(ctx, built.model) if plan.pipeline else \
            evaluate.make_evaluator(ctx.job, built.model, backend, plan.steps_per_epoch, plan.total_steps,
                                    ctx.trained_by)
    return StepHooks(ctx, start_step, preemption, (
        trace,
        energy.rank_meter(),  # None without a GPU energy counter: the record's energy is then absent
        FirstStep(opts.t_process_start, ctx.verbose),
        Liveness(watchdog) if watchdog is not None else None,
        progress,
        Validation(evaluator, watchdog, clock.restart_gap, keep=backend.is_chief)
        if evaluator is not None else None,
        clock,
        probe,  # its untimed steps, and the host clock's marks it measures by
    ))


def metrics_line(recipe: Recipe) -> str | None:
    """The chief's line, before the first step, on what becomes of the recipe's metrics (None: it has none): the
    validation data's, never the training batches' (every step reports its loss only, the same math on both
    backends and both loops; Keras fit's running training metrics are not computed)."""
    if not recipe.metrics:
        return None
    whose = "the compiled model's" if recipe.source == "compiled" else "the job's"
    return (f"[twinbench] metrics {list(recipe.metrics)} ({whose}): reported on the validation data only (the "
            "record's evaluations and the summary line; none without a validation split); not on the training "
            "batches: every training step reports its loss only")


# -- the named steps ------------------------------------------------------------------------------------------
def make_plan(job: Job, backend: Backend, facts: data_mod.DataFacts | None = None) -> Plan:
    """The run's sizes and the data's facts, once: ``facts`` when the caller has them, else from the data (an input
    function's from its pipeline in every rank, ``streamed.plan``)."""
    replicas = backend.num_replicas
    pipeline = None
    if data_mod.streams(job):  # an input function: its steps from what it returns in every rank
        spe, total, pipeline = streamed.plan(job, backend, job.per_replica_batch_size)
        facts = None
    else:
        facts = facts or data_mod.facts(job)
        spe, total = job.resolve_steps(facts.samples, replicas)
    per_exec = job.steps_per_execution
    if spe % per_exec or total % per_exec:
        raise UsageError(f"{spe} steps per epoch and {total} steps at {replicas} replicas must be multiples of "
                         f"steps_per_execution = {per_exec} (the host sees the device only between executions)")
    plan = Plan(job.per_replica_batch_size, spe, total, replicas, pipeline, facts)
    # before the model is built (ResNet-50 takes a while): files-mode sharding needs a shard per input pipeline
    data_mod.check_sharding(job, plan.global_batch, backend.num_workers)
    return plan


def training_input(ctx: RunContext, start_step: int) -> Callable[[int, int, int], Any]:
    """The dataset function ``backend.make_dataset`` calls per input pipeline: the job's training data from global
    step ``start_step``, cut by the plan's batch sizes."""
    job, plan = ctx.job, ctx.plan
    if plan.pipeline is not None:
        return streamed.dataset_fn(ctx, start_step)

    def dataset_fn(index: int, count: int, per: int) -> Any:
        return data_mod.make_train_dataset(job, plan.global_batch, index, count, per, start_step,
                                           per_replica_batch=plan.per_replica_batch)

    return dataset_fn


def announce(ctx: RunContext, probe: Probe | None = None) -> None:
    """The chief prints the job, backend and replicas before anything else happens (the global batch and learning
    rate once the model is built: ``compiled.banner``); a probe its own line."""
    job, backend, plan, opts = ctx.job, ctx.backend, ctx.plan, ctx.opts
    reason = observe.check_profile_steps(opts.profile_steps, plan.total_steps)
    if reason:  # on every rank: all of them exit 2
        raise UsageError(reason)
    if not ctx.verbose:
        return
    if probe is not None:
        print(probe.announce(ctx), flush=True)
        return
    info, replicas = backend.info, plan.replicas
    data = "input function" if plan.data is None else f"{plan.data.samples} samples"
    print(f"[twinbench] job {job.name!r} hash {job.job_hash} | backend {backend.name} | mode {job.mode} | "
          f"{info.num_workers} worker(s) x {info.replicas_per_worker} replica(s) = {replicas} replicas; "
          f"{plan.total_steps} steps, {plan.steps_per_epoch} steps/epoch, dataset {job.dataset} ({data}); "
          f"host syncs every {job.sync_interval} steps", flush=True)
    for item in job.not_carried:  # what the job's Horovod script did that this run does not (common.port)
        print(f"[twinbench] not carried from the Horovod script: {item}", flush=True)


def start_watchdog(backend: Backend, opts: RunOptions) -> tuple[rel.Heartbeat | None, rel.Watchdog | None]:
    """With peers: a heartbeat port per rank and a watchdog probing the others' (a collective: all ranks call)."""
    if backend.num_workers == 1:
        return None, None
    heartbeat = rel.Heartbeat()
    peers = backend.allgather({"rank": backend.rank, "host": res.hostname(), "address": netif.reach_address(opts.iface),
                               "port": heartbeat.port, "pid": os.getpid()})
    return heartbeat, rel.Watchdog(backend.rank, peers, opts.peer_timeout, opts.stall_timeout).start()


def build(ctx: RunContext) -> Built:
    """Model and optimizer under the backend's scope, with optimizer slots created (so a checkpoint can load)."""
    import tensorflow as tf

    job, backend, plan = ctx.job, ctx.backend, ctx.plan
    from common.workload import models as models_mod

    pipeline = plan.pipeline
    if pipeline is not None:
        input_shape, num_classes = streamed.model_inputs(job, pipeline)
    else:
        input_shape, num_classes = plan.data.input_shape, plan.data.num_classes
    tf.keras.utils.set_random_seed(job.seed)  # weights, dropout: identical on every rank and backend
    if job.keras == 3:
        keras3.seed(job)
    if job.mixed_precision:
        tf.keras.mixed_precision.set_global_policy("mixed_float16")
    with backend.scope():
        inner = streamed.build_model(job, input_shape, num_classes) if pipeline else \
            models_mod.build_model(job, input_shape, num_classes)
        compiled = compiled_mod.from_model(tf, job, inner)  # None unless the model function compiled it
        recipe = compiled_mod.recipe(job, compiled, ctx.opts.lr_replicas or plan.replicas)
        if usercode.refs(job) or recipe.loss != DEFAULT_LOSS or recipe.loss_per_output:  # do they fit together?
            labels = pipeline["labels"] if pipeline else plan.data.labels(job)
            outputs.check(job, inner, labels, num_classes, recipe)
        optimizer = build_optimizer(job, recipe.learning_rate, compiled)
        if job.mode == "fit":
            model = loops.fit_model(job, recipe, backend, inner, optimizer)
        else:
            model = inner
            if job.mixed_precision:
                optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
        # Slots and the iteration counter now, so a checkpoint can be restored (and broadcast) before step 1.
        if job.keras == 3:
            keras3.create_slots(optimizer, model)
        else:
            getattr(optimizer, "inner_optimizer", optimizer)._create_all_weights(model.trainable_variables)
    return Built(model, optimizer, tf.train.Checkpoint(model=model, optimizer=optimizer), recipe, compiled)


def own_checkpoint_dir(ctx: RunContext) -> Path:
    """Where this run's checkpoint lives: by backend, replicas, job hash and variant, in the results dir."""
    return rel.ckpt_dir(ctx.opts.results_dir or ".", ctx.backend.name, ctx.plan.replicas, ctx.job.job_hash,
                        ctx.backend.capabilities().variant)


def find_resume(ctx: RunContext, built: Built) -> Resume:
    """Resume from a checkpoint when there is one: the chief decides (its view of the results dir), all follow."""
    job, backend, plan, opts = ctx.job, ctx.backend, ctx.plan, ctx.opts
    own_dir = own_checkpoint_dir(ctx)
    source = Path(opts.resume_from) if opts.resume_from else own_dir
    meta = backend.allgather(rel.read_meta(source) if backend.is_chief else None)[0]
    if opts.resume_from and meta is None:
        raise UsageError(f"--resume-from {opts.resume_from!r} holds no complete checkpoint (meta.json missing)")
    if meta is None:
        return Resume(0, {}, source, own_dir)
    reason = rel.check_resume(meta, job.job_hash, job.name, plan.replicas, source)
    lr, had = built.recipe.learning_rate, meta.get("learning_rate")
    if not reason and had is not None and had != lr:  # --lr-replicas is no part of the hash the check compares
        reason = (f"the checkpoint in {source} trained at learning rate {had:g} and this run would train at {lr:g} "
                  "(another --lr-replicas?): run it as it was started, or from step 0")
    if reason:
        raise UsageError(reason)
    backend.restore(built.checkpoint, str(source / "ckpt"), built.model, built.optimizer)
    if ctx.verbose:
        print(f"[twinbench] resuming from {source} at step {int(meta['step'])}/{plan.total_steps}", flush=True)
    return Resume(int(meta["step"]), meta, source, own_dir)


def gather(ctx: RunContext, built: Built, hooks: StepHooks, resume: Resume, init_digest: str) -> Gathered:
    """Every rank's measurements on every rank (one collective, after the timed loop), and the global losses; the
    hooks' parts' (a probe's too) gathered in the same collective."""
    backend, opts = ctx.backend, ctx.opts
    mine = {
        "host": res.hostname(),
        "local_rank": backend.info.local_rank,
        "local_size": backend.info.local_size,
        "cpus": list(backend.info.cpus), "cpu_bind": backend.info.cpu_bind,  # --cpu-bind: where it ran, who bound it
        "endpoint": netif.own_endpoint(opts.iface),  # the interface and address this rank's peers reach it at
        "device": backend.info.device,
        "clock_marks": hooks.clock_marks(),
        "warm": hooks.warm,
        "losses": hooks.losses,
        "final_digest": weights_digest(built.model),
        "trainable_digest": weights_digest(built.model, trainable_only=True),
        "fingerprint": weights_fingerprint(built.model) if backend.is_chief else None,
        "evaluations": [],  # a run without validation; the chief's Validation part's are identical on every rank
        "machine": machine.rank_machine(opts.iface),  # after the last step: the peak RSS is the run's
        "nccl": nccl.own_finding(),  # the network NCCL chose, from its log file (common.cluster.nccl); None: no file
        # every part's (hostsync.Part.measured), after the loop: the time to first step, the input wait (reads the
        # device once), the energy (absent without a meter), the chief's evaluations
        **hooks.measured(),
    }
    # Every rank must take part in this collective, chief or not.
    everyone = backend.allgather(mine)
    prev_rank_losses = resume.previous.get("per_rank_step_losses") or [[] for _ in everyone]
    per_rank_losses = [p + r["losses"] for p, r in zip(prev_rank_losses, everyone)]
    steps_done = min(len(r) for r in per_rank_losses)
    step_losses = [objective.mean_over_ranks([r[i] for r in per_rank_losses]) for i in range(steps_done)]
    evaluations = list(resume.previous.get("evaluations") or []) + everyone[0]["evaluations"]
    return Gathered(everyone, per_rank_losses, step_losses, init_digest, evaluations)


def make_record(ctx: RunContext, built: Built, resume: Resume, gathered: Gathered) -> res.RunRecord:
    """The chief's results record (schema in ``common.core.results``)."""
    job, backend, opts, plan = ctx.job, ctx.backend, ctx.opts, ctx.plan
    everyone = gathered.everyone
    stats = res.throughput_stats([r["clock_marks"] for r in everyone], plan.global_batch, everyone[0]["warm"],
                                 job.sync_interval)
    n_params = trainable_params(built.model)
    caps: Capabilities = backend.capabilities()
    return res.RunRecord(
        backend=backend.name,
        backend_info=backend.describe(),
        world_size=plan.replicas,
        num_workers=backend.num_workers,
        mode=job.mode,
        job_hash=job.job_hash,
        job=job.to_dict(),
        global_batch_size=plan.global_batch,
        learning_rate=built.recipe.learning_rate,
        steps=plan.total_steps,
        steps_per_epoch=plan.steps_per_epoch,
        step_losses=gathered.step_losses,
        per_rank_step_losses=gathered.per_rank_losses,
        **stats,
        per_rank_sync_marks=[r["clock_marks"] for r in everyone],
        time_to_first_step=max(r["time_to_first_step"] for r in everyone),
        resumed_from_step=resume.start_step,  # > 0: times and throughput cover only the steps after the resume
        versions={**res.versions(), **keras3.versions(job)},  # Keras 3's version when it trained the model
        hosts=[r["host"] for r in everyone],
        **machine.step_facts(),  # slurm_job, slurm_step, nodelist: the job step the ranks ran in
        nccl_transport=nccl.per_rank([r.get("nccl") for r in everyone]),
        devices=[r["device"] for r in everyone],
        command=list(opts.command),
        started_at=res.now_iso_from(opts.t_process_start),
        finished_at=res.now_iso(),
        run_id=res.new_run_id(),
        trainable_params=n_params,
        gradient_bytes=caps.gradient_bytes(n_params),  # bytes allreduced per step: the scaling model's S
        initial_weights_digest=gathered.init_digest,
        weights_digest=everyone[0]["final_digest"],
        trainable_weights_digest=everyone[0]["trainable_digest"],  # without BatchNorm statistics
        # The replicas trained in lockstep: identical trainable weights on every rank.
        weights_consistent=len({r["trainable_digest"] for r in everyone}) == 1,
        # Non-trainable state too (BatchNorm moving statistics: MWMS reads them as the mean over replicas, Horovod
        # ranks keep their own until backend.sync_model_state averages them after the last step).
        all_weights_consistent=len({r["final_digest"] for r in everyone}) == 1,
        network=netif.network(opts.iface, everyone),
        asynchronous=caps.asynchronous,  # parameter-server training: never in a parity claim
        input={**inputwait.summarise([r["input"] for r in everyone], stats["per_rank_timed_wall"]),
               "path": caps.input_path, **({"pipeline": plan.pipeline["record"]} if plan.pipeline else {}),
               **({"dataset": plan.data.record()} if plan.data is not None and plan.data.record() else {})},
        topology=netif.topology(everyone),
        collective=caps.collective.to_dict(),
        tuning=tuning_record(list(caps.knobs), nccl.users_env(public_env())),
        capabilities=caps.record(),
        machine=machine.combine([r["machine"] for r in everyone]),
        energy=energy.combine([r.get("energy") for r in everyone], [r["host"] for r in everyone],
                              plan.global_batch * stats["step_time"]["timed_steps"]),
        trainable_weights_fingerprint=everyone[0]["fingerprint"],
        evaluations=gathered.evaluations,
        # wall time is measured within one process' life: none across a resume
        time_to_target_s=None if resume.start_step else evaluate.time_to_target(
            gathered.evaluations, job.target_metric, job.target_value),
        compiled=built.compiled.record() if built.compiled is not None else None,
        recipe=built.recipe.record(),
    )


def publish(record: res.RunRecord, opts: RunOptions, resume: Resume, trace: observe.Trace | None = None) -> None:
    """Print the headline and the summary lines, write the TensorBoard logs and the record (atomically), and delete
    the checkpoint of the now complete run."""
    st = record.step_time
    if opts.verbose:
        print(f"[twinbench] {record.images_per_sec:.1f} images/s over {st['timed_steps']} timed "
              f"steps (median step {st['median'] * 1e3:.1f} ms, p95 "
              f"{st['p95'] * 1e3:.1f} ms); final loss {record.step_losses[-1]:.5f}", flush=True)
    # Results, not progress: printed under --quiet too, for the parsers that read Horovod's benchmark output.
    print("\n".join(observe.summary_lines(record.to_dict())), flush=True)
    metrics = (record.recipe or {}).get("metrics")  # the recipe's: a compiled model's, or the job's
    line = evaluate.summary_line(record.evaluations, job_from_dict(record.job), record.time_to_target_s, metrics)
    if line:
        print(line, flush=True)
    # After the headline, which marks the end of training for a clock outside the process (bench.clock): the
    # TensorBoard logs take about 0.3 ms per step here (one eager summary op each), no part of the run's work.
    record = observe.finish(record, opts.results_dir, trace)
    if opts.results_dir is None:
        return
    path = res.write_record(opts.results_dir, record)
    print(f"[twinbench] results: {path}", flush=True)
    if resume.source == resume.own_dir and resume.previous:
        shutil.rmtree(resume.own_dir, ignore_errors=True)  # the run is complete: nothing left to resume
        with contextlib.suppress(OSError):
            resume.own_dir.parent.rmdir()  # only if no other run's checkpoint is there


def write_checkpoint(ctx: RunContext, ckpt: Any, final: Path, hooks: StepHooks, gathered: Gathered) -> None:
    """Weights + optimizer state + where the data stream stands, published atomically by the chief."""
    job, backend = ctx.job, ctx.backend
    tmp = final.parent / f".{final.name}.tmp-rank{backend.rank}"
    writes = backend.is_chief or backend.capabilities().every_rank_writes_checkpoint
    if writes:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        # Under MWMS every worker must write (reading sync-on-read variables is a collective); only the chief's
        # copy is kept, as TensorFlow's multi-worker guide prescribes.
        ckpt.write(str(tmp / "ckpt"))
    if backend.is_chief:
        meta = {
            "job_hash": job.job_hash, "job_name": job.name, "backend": backend.name, "world_size": ctx.plan.replicas,
            "step": hooks.stopped_at, "step_losses": gathered.step_losses,
            "per_rank_step_losses": gathered.per_rank_losses, "initial_weights_digest": gathered.init_digest,
            "learning_rate": ctx.trained_by.learning_rate,  # the recipe's: a resume must train at the same
            "evaluations": gathered.evaluations,
            "signal": hooks.preemption.signalled, "created": res.now_iso(),
        }
        (tmp / "meta.json").write_text(json.dumps(meta))  # written last: its presence marks a complete checkpoint
        rel.publish_dir(tmp, final)
    elif writes:
        shutil.rmtree(tmp, ignore_errors=True)
    backend.barrier()  # nobody exits before the checkpoint is published
