"""Native backend: tf.distribute. ``python -m backends.native --job jobs/smoke.toml [--nproc N]``.

Cluster discovery (``backends.native_cluster``), in order: ``TF_CONFIG`` if set; Slurm (``SlurmClusterResolver``)
when the step has more than one task; otherwise a single worker. ``--nproc N`` starts N local workers with a
generated ``TF_CONFIG`` on free loopback ports (like ``torchrun --standalone``).
"""

from __future__ import annotations

import time

T0 = time.time()  # process start, for time-to-first-step (TF import counts: users pay it too)

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, replace  # noqa: E402
from typing import Any  # noqa: E402

from backends import native_cluster  # noqa: E402
from backends.base import Backend, BaseOptions, Diagnosis, RankInfo, configure_threads, pin_one_gpu  # noqa: E402
from common import cli, localcluster, runner  # noqa: E402
from common.errors import UsageError, fail  # noqa: E402

PROG = "backends.native"
STRATEGIES = ("mwms", "mirrored", "one_device")
COMMS = ("auto", "ring", "nccl")
EXIT_BARRIER_MS = 30_000  # ms to wait for peers at exit: they are all past their last collective within a second


@dataclass(frozen=True)
class Options(BaseOptions):
    strategy: str = "mwms"  # one worker per device; "mirrored" = one process, all local devices
    comm: str = "auto"  # MWMS collectives; auto lets TF pick (NCCL on GPUs, RING on CPU)
    port_base: int = 12345  # first port for SlurmClusterResolver (IDRIS allows 10000-20000)
    gpus_per_node: int = -1  # for SlurmClusterResolver; -1 = what TensorFlow sees
    logical_cpus: int = 0  # split the CPU into N logical devices (CPU testing of mirrored); 0 = off

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Options:
        return cls(threads=args.threads, strategy=args.strategy, comm=args.comm, port_base=args.port_base,
                   gpus_per_node=args.gpus_per_node, logical_cpus=args.logical_cpus)


def parser() -> argparse.ArgumentParser:
    p = cli.base_parser(PROG, "Run a twinbench job with native tf.distribute.")
    p.add_argument("--nproc", type=int, default=1,
                   help="start N local workers on loopback with a generated TF_CONFIG (default 1 = this process)")
    p.add_argument("--strategy", choices=STRATEGIES, default="mwms",
                   help="mwms = MultiWorkerMirrored, one worker per device (default); mirrored = one process, "
                        "all local devices; one_device = the 1-GPU baseline")
    p.add_argument("--comm", choices=COMMS, default="auto",
                   help="MWMS collectives: nccl (GPUs), ring (gRPC, CPU) or auto (default: TF picks)")
    p.add_argument("--port-base", type=int, default=12345,
                   help="first port for SlurmClusterResolver (default 12345; IDRIS allows 10000-20000)")
    p.add_argument("--gpus-per-node", type=int, default=-1,
                   help="GPUs per node for SlurmClusterResolver (default -1 = what TensorFlow sees)")
    p.add_argument("--logical-cpus", type=int, default=0,
                   help="split the CPU into N logical devices (CPU testing of --strategy mirrored; default off)")
    return p


def local_command(n: int, args: list[str], python: str = sys.executable) -> list[str]:
    """The command that runs ``n`` ranks of this backend on this host (``--nproc``: loopback TF_CONFIG)."""
    return [python, "-m", PROG, *(["--nproc", str(n)] if n > 1 else []), *args]


def doctor(tf_version: str | None) -> Diagnosis:
    """tf.distribute comes with TensorFlow: the native backend runs wherever TensorFlow imports."""
    if tf_version is None:
        return Diagnosis(False, "cannot run: TensorFlow is not importable", {}, [])
    return Diagnosis(True, "ok", {}, [])


class NativeBackend(Backend):
    name = "native"

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.strategy: Any = None
        self.comm_used = "n/a"
        self.cluster: dict[str, Any] = {}
        self.cluster_source = "tf_config" if os.environ.get("TF_CONFIG") else "single"
        self.visible_gpus: str | None = None

    # -- setup ---------------------------------------------------------------------------------
    def _connect(self) -> RankInfo:
        import tensorflow as tf

        o = self.opts
        local_rank = cli.env_int("TWINBENCH_LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", default=0)
        # the step's own task count per node first: an srun step may use fewer tasks than the job
        local_size = cli.env_int("TWINBENCH_LOCAL_SIZE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE",
                                 "OMPI_COMM_WORLD_LOCAL_SIZE", default=1)
        self.threads = configure_threads(local_size, o.threads)
        gpus = tf.config.list_physical_devices("GPU")
        self.visible_gpus = os.environ.get("CUDA_VISIBLE_DEVICES")
        # mirrored: one process drives every local device, nothing to pin (the binding is still recorded)
        pin = pin_one_gpu(local_rank, PROG, gpus if o.strategy != "mirrored" else [])
        if o.strategy != "mirrored":
            gpus = gpus[:1]  # this worker now sees one GPU (only the count matters below)
        device = pin.label()
        if o.logical_cpus > 1:
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(o.logical_cpus)])
        rank, num_workers = 0, 1
        if o.strategy == "mwms":
            self.strategy = self._mwms(tf, gpus)
            workers = self.strategy.cluster_resolver.cluster_spec().as_dict().get("worker", [])
            num_workers = max(len(workers), 1)
            rank = int(self.strategy.cluster_resolver.task_id or 0)
            self.cluster = {"workers": workers}
        elif o.strategy == "mirrored":
            devices = [d.name for d in tf.config.list_logical_devices("GPU")] or \
                      [d.name for d in tf.config.list_logical_devices("CPU")]
            self.strategy = tf.distribute.MirroredStrategy(devices=devices)
            device = replace(pin, device=",".join(devices)).label()
        else:
            one = "/gpu:0" if gpus else "/cpu:0"
            self.strategy = tf.distribute.OneDeviceStrategy(one)
            device = replace(pin, device=one).label()
        return RankInfo(rank=rank, num_workers=num_workers, local_rank=local_rank, local_size=local_size,
                        replicas_per_worker=self.strategy.num_replicas_in_sync // num_workers, device=device,
                        threads=self.threads)

    def _mwms(self, tf: Any, gpus: list[Any]) -> Any:
        o = self.opts
        impl = tf.distribute.experimental.CommunicationImplementation
        choice = {"auto": impl.AUTO, "ring": impl.RING, "nccl": impl.NCCL}[o.comm]
        self.comm_used = o.comm
        if o.comm == "nccl" and not gpus:
            print(f"[{PROG}] warning: --comm nccl needs GPUs and none is visible; using RING (gRPC) collectives",
                  file=sys.stderr, flush=True)
            choice, self.comm_used = impl.RING, "ring"
        options = tf.distribute.experimental.CommunicationOptions(implementation=choice)
        resolver = None
        if native_cluster.multi_task_slurm_step():
            resolver, self.cluster_source = native_cluster.slurm_resolver(tf, o.port_base, o.gpus_per_node,
                                                                          len(gpus), PROG)
        # Must come before any other TF op: MWMS configures the runtime's collective ops when created.
        return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver, communication_options=options)

    def describe(self) -> dict[str, Any]:
        return {
            "strategy": type(self.strategy).__name__ if self.strategy is not None else None,
            "communication": self.comm_used,
            "replicas_per_worker": self.info.replicas_per_worker,
            "threads_per_process": self.info.threads,
            "cluster": self.cluster,
            "cluster_source": self.cluster_source,
            "device": self.info.device,
            "cuda_visible_devices": self.visible_gpus,
        }

    # -- training hooks ------------------------------------------------------------------------
    def scope(self) -> Any:
        return self.strategy.scope()

    def make_dataset(self, dataset_fn: Callable[[int, int, int], Any]) -> Any:
        per = self.info.replicas_per_worker
        # distribute_datasets_from_function does no auto-sharding: common.data shards by pipeline index, the
        # same rule Horovod ranks use, so both backends feed every replica the same samples.
        return self.strategy.distribute_datasets_from_function(
            lambda ctx: dataset_fn(ctx.input_pipeline_id, ctx.num_input_pipelines, per))

    def run(self, step_fn: Callable[..., Any], batch: Any) -> Any:
        out = self.strategy.run(step_fn, args=tuple(batch))
        return list(self.strategy.experimental_local_results(out))

    def any_flag(self, flag: bool) -> bool:
        if self.num_workers == 1:
            return flag
        import tensorflow as tf

        out = self._allsum(tf.constant([1.0 if flag else 0.0], dtype=tf.float64))
        return float(out[0]) > 0

    def allgather(self, obj: Any) -> list[Any]:
        if self.num_workers == 1:
            return [obj]
        import numpy as np

        payload = np.frombuffer(json.dumps(obj).encode(), dtype=np.uint8)
        lengths = self._sum_rows(np.array([payload.size], dtype=np.float64))[:, 0].astype(int)
        padded = np.zeros(int(lengths.max()), dtype=np.float64)
        padded[: payload.size] = payload
        rows = self._sum_rows(padded)
        return [json.loads(bytes(rows[i, : lengths[i]].astype(np.uint8)).decode()) for i in range(self.num_workers)]

    def exit_barrier(self) -> None:
        # TF's collectives are pull-based (a worker fetches its peer's chunks with RecvBuf RPCs): a worker that has
        # finished the last collective and exits at once closes the socket a slower peer is still pulling from, and
        # that peer's collective fails ("Socket closed"). Meeting at a coordination-service barrier first means
        # everyone is past the last collective; the barrier itself moves no tensor data.
        if self.num_workers == 1:
            return
        from tensorflow.python.eager import context

        try:
            context.context().wait_at_barrier("twinbench_exit", EXIT_BARRIER_MS)
        except Exception as e:  # noqa: BLE001 - a peer already gone after its own barrier: nothing left to protect
            print(f"[{PROG}] rank {self.rank}: exit barrier not met ({type(e).__name__}); exiting anyway",
                  file=sys.stderr, flush=True)

    def allreduce_fn(self) -> Any:
        import tensorflow as tf

        def reduce(v: Any) -> Any:
            # the strategy's collective all-reduce with the chosen CommunicationOptions, as for gradients
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, tf.identity(v))

        fn = tf.function(lambda v: self.strategy.run(reduce, args=(v,)), reduce_retracing=True)
        return lambda v: self.strategy.experimental_local_results(fn(v))[0]

    def _sum_rows(self, vec: Any) -> Any:
        """All-gather by all-reduce: each worker writes its row of a zero matrix, SUM gives every row to all."""
        import numpy as np
        import tensorflow as tf

        placed = np.zeros((self.num_workers, *vec.shape), dtype=np.float64)
        placed[self.rank] = vec
        return self._allsum(tf.constant(placed)).numpy()

    def _allsum(self, value: Any) -> Any:
        """SUM of ``value`` over workers (one contribution per worker, whatever its local replica count)."""
        import tensorflow as tf

        if not hasattr(self, "_allsum_fn"):
            per = self.info.replicas_per_worker

            def contribute(v: Any) -> Any:
                ctx = tf.distribute.get_replica_context()
                keep = tf.cast(tf.equal(ctx.replica_id_in_sync_group % per, 0), v.dtype)
                # identity: place the input on this replica's device (a collective needs a device to reduce to)
                return ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.identity(v) * keep)

            # One function for every shape (reduce_retracing): it is called at agreed steps and at the end.
            self._allsum_fn = tf.function(lambda v: self.strategy.run(contribute, args=(v,)), reduce_retracing=True)
        return self.strategy.experimental_local_results(self._allsum_fn(value))[0]


# -- local launcher (--nproc) ----------------------------------------------------------------------
def strip_nproc(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--nproc":
            skip = True
            continue
        if a.startswith("--nproc="):
            continue
        out.append(a)
    return out


def launch_local(n: int, argv: list[str]) -> int:
    """Start n workers of this module with TF_CONFIG on loopback; the first failure stops the others.

    SIGTERM/SIGUSR1 sent to the launcher (Slurm, scancel) are forwarded to every worker, which then checkpoint
    together and exit 75; the launcher exits 75 too.
    """
    env = dict(os.environ, TWINBENCH_LAUNCH_COMMAND=json.dumps(list(sys.orig_argv)))
    procs = localcluster.start_tf_config_workers(n, [sys.executable, "-m", PROG, *strip_nproc(argv)], env)
    return localcluster.supervise(procs, PROG)


def _preflight(args: argparse.Namespace) -> None:
    """Launch-mode checks before TensorFlow starts (each failure: one line, exit 2)."""
    if args.nproc < 1:
        raise UsageError(f"--nproc must be >= 1, got {args.nproc}")
    if args.nproc > 1:
        if os.environ.get("TF_CONFIG"):
            raise UsageError("--nproc generates TF_CONFIG itself: unset TF_CONFIG or drop --nproc")
        if args.strategy != "mwms":
            raise UsageError(f"--nproc starts MultiWorkerMirrored workers; it cannot be combined with --strategy "
                             f"{args.strategy}")
        return
    if os.environ.get("TF_CONFIG"):
        native_cluster.check_tf_config()
    elif args.strategy == "mwms":
        native_cluster.check_slurm_env(args.port_base)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    cli.legacy_keras()
    cli.unset_proxies()
    job, run_opts = cli.prepare(PROG, args, T0)
    try:
        _preflight(args)
        if args.nproc > 1:
            return launch_local(args.nproc, argv)
        backend = NativeBackend(Options.from_args(args))
        backend.setup()
    except UsageError as e:
        fail(PROG, str(e))
    return runner.run(PROG, backend, job, run_opts)


if __name__ == "__main__":
    sys.exit(main())
