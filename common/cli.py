"""Command-line handling shared by every entry point. No TensorFlow import: bad input exits 2 before TF starts."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from common.cluster import netif
from common.cluster.placement import CPU_BIND
from common.core.contract import BaseOptions
from common.core.errors import UsageError, fail
from common.training import reliability as rel
from common.training.runconfig import PREEMPT_CHECK_STEPS, PROGRESS_SECONDS, BenchOptions, RunOptions
from common.workload.job import Job, JobError, load_job

if TYPE_CHECKING:
    from common.workload.data import DataFacts

REPO = Path(__file__).resolve().parent.parent
DEFAULT_JOB = REPO / "jobs" / "smoke.toml"
PROXY_VARS = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")
DIAGNOSES = ("breakdown",)  # --diagnose choices (common.diagnostics.breakdown)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is a single line on stderr (and exit 2), not a usage dump."""

    def error(self, message: str) -> NoReturn:
        fail(self.prog, f"{message} (see --help)")


def base_parser(prog: str, description: str, parser_class: type[OneLineParser] = OneLineParser) -> OneLineParser:
    """The flags every entry point takes; ``parser_class``: a backend's subclass checking its flags together."""
    p = parser_class(prog=prog, description=description)
    p.add_argument("--job", default=str(DEFAULT_JOB), help="job TOML file (default: jobs/smoke.toml)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a job key (repeatable); type-checked, unknown keys are an error")
    p.add_argument("--results", default="results", help="directory for the run's results JSON (default: results)")
    p.add_argument("--threads", type=int,
                   help="intra-op threads per process (default 0 = cores / processes on this host)")
    p.add_argument("--cpu-bind", choices=CPU_BIND,
                   help="none (default): processes run where the launcher put them; cores: local ranks no launcher "
                        "bound (horovodrun --gloo, --nproc) each bind to their own share of the cores, like srun "
                        "--cpu-bind=cores (the record says who bound what)")
    p.add_argument("--quiet", action="store_true", help="no progress output (results are still written)")
    p.add_argument("--lr-replicas", type=int, default=None, metavar="N",
                   help="scale the learning rate as if N replicas trained (the job's or the compiled model's base LR "
                        "x N under lr_scaling = \"linear\", the warm-up from LR / N), not the run's replica count: "
                        "1 worker with N x the batch then takes N workers' steps; recorded in the record's recipe, "
                        "not part of the job hash (default: the run's replicas)")
    p.add_argument("--iface", default=os.environ.get("TWINBENCH_IFACE") or None, metavar="NAME",
                   help="data network interface for every launcher: Gloo, Open MPI, NCCL, and the addresses MWMS "
                        "workers get (default $TWINBENCH_IFACE, else each launcher picks its own)")
    b = p.add_argument_group("benchmarks")
    b.add_argument("--bench", choices=("allreduce",), default=None,
                   help="run a microbenchmark instead of the job: allreduce of float32 tensors")
    b.add_argument("--sizes", default=None, metavar="LIST",
                   help="allreduce message sizes, e.g. 4K,1M,256M (default 4K..256M in steps of x4)")
    b.add_argument("--iters", type=int, default=20, help="timed allreduces per size (default 20)")
    b.add_argument("--warmup-iters", type=int, default=5,
                   help="untimed allreduces per size first (default 5: connection set-up, buffers)")
    d = p.add_argument_group("diagnostics")
    d.add_argument("--diagnose", choices=DIAGNOSES, default=None,
                   help="a separate diagnostic run instead of a benchmark: breakdown = the custom loop's step split "
                        "into input, compute, gradient all-reduce, apply and the rest, each timed on the device "
                        "(phases serialized: no overlap; never mixed into the benchmark figures)")
    o = p.add_argument_group("observation")
    o.add_argument("--profile-steps", default=None, metavar="A:B",
                   help="TensorFlow profiler trace of global steps A..B (1-based, inclusive) on every rank, plus "
                        "Horovod's timeline, into RESULTS/profile/; the timed window starts after step B")
    o.add_argument("--progress-every", type=float, default=PROGRESS_SECONDS, metavar="SECONDS",
                   help=f"seconds between the chief's progress lines, taken at host syncs (default "
                        f"{PROGRESS_SECONDS:g}; 0 = none; --quiet prints none)")
    r = p.add_argument_group("reliability")
    r.add_argument("--peer-timeout", type=float, default=rel.PEER_TIMEOUT,
                   help=f"seconds before a silent peer rank counts as lost and every rank exits {rel.EXIT_PEER_LOST} "
                        f"(default {rel.PEER_TIMEOUT:g}: well under a minute, far above a healthy answer)")
    r.add_argument("--stall-timeout", type=float, default=rel.STALL_TIMEOUT,
                   help=f"seconds without a finished step before the run is declared hung (default "
                        f"{rel.STALL_TIMEOUT:g}, covers first-step tracing; 0 = off)")
    r.add_argument("--preempt-check-steps", type=int, default=None,
                   help="every N steps all ranks agree whether SIGTERM/SIGUSR1 arrived (default: about once a "
                        "second, at a host sync that happens anyway: the interval in steps follows the measured step "
                        f"time; every {PREEMPT_CHECK_STEPS} steps until it is known)")
    r.add_argument("--resume-from", default=None, metavar="DIR",
                   help="resume from this checkpoint dir (default: the run's own in RESULTS/checkpoints, if any)")
    return with_defaults(p, BaseOptions)


def with_defaults(p: argparse.ArgumentParser, options: type[BaseOptions]) -> argparse.ArgumentParser:
    """Give each flag of ``p`` that sets a field of ``options`` (argparse's ``dest``) that field's default: the
    Options dataclass is the one place a backend's defaults are written. Call it once every flag is added."""
    defaults = {f.name: f.default for f in dataclasses.fields(options) if f.default is not dataclasses.MISSING}
    p.set_defaults(**{a.dest: defaults[a.dest] for a in p._actions if a.dest in defaults})
    return p


def _bench_options(prog: str, args: argparse.Namespace) -> BenchOptions | None:
    if not args.bench:
        return None
    from common.diagnostics.allreduce import DEFAULT_SIZES, parse_sizes

    try:
        sizes = parse_sizes(args.sizes or DEFAULT_SIZES)
    except ValueError as e:
        fail(prog, str(e))
    if args.iters < 1 or args.warmup_iters < 0:
        fail(prog, f"--iters must be >= 1 and --warmup-iters >= 0, got {args.iters} and {args.warmup_iters}")
    return BenchOptions(tuple(sizes), args.iters, args.warmup_iters)


def _check_diagnose(prog: str, args: argparse.Namespace, job: Job) -> None:
    """--diagnose runs the custom loop's math, alone: one line and exit 2 for what it cannot be combined with."""
    if not args.diagnose:
        return
    from common.diagnostics.breakdown import breakdown_refusal

    problem = breakdown_refusal(job)
    if problem:
        fail(prog, problem)
    if args.bench:
        fail(prog, f"--diagnose {args.diagnose} and --bench {args.bench} are two different runs: pick one")
    if args.resume_from:
        fail(prog, f"--diagnose {args.diagnose} always starts from step 0: drop --resume-from")


def _observe_options(prog: str, args: argparse.Namespace, job: Job) -> tuple[int, int] | None:
    """--profile-steps and --progress-every: one line and exit 2 before TensorFlow starts."""
    from common.training import observe

    if args.progress_every < 0:
        fail(prog, f"--progress-every must be >= 0 seconds (0 = no progress lines), got {args.progress_every}")
    if args.profile_steps is None:
        return None
    try:
        steps = observe.parse_profile_steps(args.profile_steps)
    except ValueError as e:
        fail(prog, str(e))
    if args.bench:
        fail(prog, f"--profile-steps traces training steps; --bench {args.bench} has none")
    if not args.results:
        fail(prog, "--profile-steps writes into the results dir: give --results DIR")
    # the total is known here only when the job fixes it; otherwise once the plan is (common.training.train.announce)
    reason = observe.check_profile_steps(steps, job.steps) if job.steps > 0 else None
    if reason:
        fail(prog, reason)
    return steps


def _check_numbers(prog: str, args: argparse.Namespace) -> None:
    if args.threads < 0:
        fail(prog, f"--threads must be >= 0, got {args.threads}")
    if not args.peer_timeout > 0:
        fail(prog, f"--peer-timeout must be > 0 seconds, got {args.peer_timeout}")
    if args.stall_timeout < 0:
        fail(prog, f"--stall-timeout must be >= 0 seconds (0 = off), got {args.stall_timeout}")
    if args.preempt_check_steps is not None and args.preempt_check_steps < 1:
        fail(prog, f"--preempt-check-steps must be >= 1, got {args.preempt_check_steps}")
    if args.lr_replicas is not None and args.lr_replicas < 1:
        fail(prog, f"--lr-replicas must be >= 1, got {args.lr_replicas}")


def prepare(prog: str, args: argparse.Namespace, t0: float) -> tuple[Job, RunOptions, DataFacts | None]:
    """Everything that can be checked before TensorFlow starts: job, data files, results dir, flags; and the data's
    facts when they can be had before it (``early_facts``: the run's plan carries them)."""
    from common.core import results as res
    from common.workload import data as data_mod
    from common.workload import usercode

    facts = None
    _check_numbers(prog, args)  # before the job's code is imported (it may import TensorFlow)
    try:
        job = load_job(args.job, args.sets)
        usercode.check_functions(job)  # the user's modules import and hold their functions
        if not data_mod.streams(job):  # an input function is called only in the ranks
            facts = early_facts(job)  # None: a user dataset read in the ranks, once TensorFlow is configured
            if facts is not None:
                job.resolve_steps(facts.samples, 1)  # cheapest check that the data fills at least one batch
        if args.results:
            res.check_results_dir(args.results)
    except (JobError, data_mod.DataError, usercode.UserCodeError, OSError) as e:
        fail(prog, str(e))
    try:
        iface = netif.select(args.iface)  # before any launcher library reads its interface variable
    except UsageError as e:
        fail(prog, str(e))
    bench = _bench_options(prog, args)
    _check_diagnose(prog, args, job)
    profile_steps = _observe_options(prog, args, job)
    if args.resume_from:
        meta = rel.read_meta(Path(args.resume_from))
        if meta is None:
            fail(prog, f"--resume-from {args.resume_from!r} holds no complete checkpoint (no readable meta.json)")
        reason = rel.check_resume(meta, job.job_hash, job.name, None, Path(args.resume_from))
        if reason:  # the world size is checked once the backend knows it (common.training.train)
            fail(prog, reason)
    opts = RunOptions(
        t_process_start=t0, command=tuple(command_line()), results_dir=args.results, verbose=not args.quiet,
        peer_timeout=args.peer_timeout, stall_timeout=args.stall_timeout,
        preempt_check_steps=args.preempt_check_steps or 0,
        resume_from=args.resume_from, bench=bench, iface=iface, diagnose=args.diagnose,
        profile_steps=profile_steps, progress_seconds=args.progress_every, lr_replicas=args.lr_replicas,
    )
    return job, opts, facts


def early_facts(job: Job) -> DataFacts | None:
    """The data's facts when they can be had before the backend configures TensorFlow: a builtin dataset's headers,
    or a user function's arrays (called in a throwaway graph: ``usercode.load_before_tf``). None for a user function
    that needs the ranks (a batch-size parameter, a ``tf.data.Dataset`` returned): ``load_user_data``."""
    from common.workload import data as data_mod
    from common.workload import usercode

    if not usercode.is_ref(job.dataset):
        return data_mod.facts(job)
    data = usercode.load_before_tf(job)
    return None if data is None else data_mod.DataFacts.of(data)


def load_user_data(prog: str, job: Job, replicas: int, chief_speaks: bool) -> DataFacts | None:
    """In a rank, once the backend has configured TensorFlow: the user dataset function's data for this world size
    (its batch-size parameter gets the global batch), checked (one line and exit 2), and what twinbench did to it
    said once, by the chief; its facts (None: not a user dataset function)."""
    from common.workload import data as data_mod
    from common.workload import usercode

    if not usercode.is_ref(job.dataset) or data_mod.streams(job):
        return None
    usercode.set_replicas(replicas)
    try:
        data = usercode.load_data(job)
        job.resolve_steps(len(data.x), replicas)
    except (JobError, data_mod.DataError, usercode.UserCodeError) as e:
        fail(prog, str(e))
    param = usercode.batch_param(job)
    if chief_speaks and (param or data.done):
        given = f" ({param} = the global batch, {job.per_replica_batch_size} per replica x {replicas})" if param \
            else ""
        did = "; ".join(data.done) if data.done else "arrays"
        print(f"[twinbench] dataset: {data.call}{given}: {did}; twinbench shuffles them with the job's seed "
              f"{job.seed}, batches and shards them exactly (the function ran with TensorFlow's global seed set to "
              "it)", flush=True)
    return data_mod.DataFacts.of(data)


def unset_proxies() -> None:
    """gRPC (MWMS) and Gloo rendezvous would otherwise try to reach peers through a site HTTP proxy."""
    for v in PROXY_VARS:
        os.environ.pop(v, None)


def legacy_keras() -> None:
    """``tf.keras`` is tf_keras in both backends (Keras 3's fit fails under MWMS, and Horovod's Keras module does not
    average Keras 3 gradients); a ``keras = 3`` job imports Keras 3 itself (common/training/keras3.py)."""
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # hide TF's INFO banner; warnings and errors stay


def command_line() -> list[str]:
    """The exact command line: the launcher's under --nproc (it passes it down), else this process's."""
    launched = os.environ.get("TWINBENCH_LAUNCH_COMMAND")
    return json.loads(launched) if launched else list(sys.orig_argv)


def env_int(*names: str, default: int) -> int:
    """First of ``names`` set in the environment, as an int; a malformed value is a usage error."""
    for n in names:
        v = os.environ.get(n)
        if v not in (None, ""):
            try:
                return int(v.split("(")[0].split(",")[0])
            except ValueError:
                raise UsageError(f"environment variable {n}={v!r} is not an integer") from None
    return default
