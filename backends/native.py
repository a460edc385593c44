"""Native backend: tf.distribute. ``python -m backends.native --job jobs/smoke.toml [--nproc N]``.

Cluster discovery (``backends.native_cluster``), in order: ``TF_CONFIG`` if set; Slurm (``SlurmClusterResolver``)
when the step has more than one task; otherwise a single worker. ``--nproc N`` starts N local workers with a
generated ``TF_CONFIG`` on free loopback ports (like ``torchrun --standalone``); with ``--strategy parameter_server
--ps P`` it starts a chief, N workers and P parameter servers instead. In parameter-server training only the chief
trains (``backends.native_ps``, the loop ``NativeBackend.train_loop`` supplies); workers and parameter servers run
TensorFlow servers until the chief has gone. Each strategy is made in ``backends.native_strategy``.
"""

from __future__ import annotations

import time

T0 = time.time()  # process start, for time-to-first-step (TF import counts: users pay it too)

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

from backends import entrypoint, native_cluster, native_strategy  # noqa: E402
from backends.native_input import coordinator_dataset_fn, per_worker_dataset  # noqa: E402
from backends.native_strategy import (  # noqa: E402
    ALL_LOCAL_DEVICES,
    CENTRAL_VARIABLES,
    COMMS,
    STRATEGIES,
    breakdown_problem,
)
from common import cli  # noqa: E402
from common.cluster.placement import configure_threads, pin_one_gpu  # noqa: E402
from common.core.contract import (  # noqa: E402
    Backend,
    BaseOptions,
    Capabilities,
    Collective,
    Diagnosis,
    Knob,
    RankInfo,
    TrainLoop,
    size_text,
)
from common.core.errors import UsageError  # noqa: E402
from common.training import keras3  # noqa: E402

PROG = "backends.native"
EXIT_BARRIER_MS = 30_000  # ms to wait for peers at exit: they are all past their last collective within a second


@dataclass(frozen=True)
class Options(BaseOptions):
    strategy: str = "mwms"  # one worker per device; "mirrored" = one process, all local devices
    comm: str = "auto"  # MWMS collectives; auto = NCCL when this worker has a GPU, else RING (resolve_comm)
    bytes_per_pack: int = 0  # CommunicationOptions.bytes_per_pack; 0 = TF's default, all gradients in one pack
    comm_timeout: float = 0.0  # CommunicationOptions.timeout_seconds; 0 = TF's default, no timeout
    port_base: int = 12345  # first port for SlurmClusterResolver (IDRIS allows 10000-20000)
    gpus_per_node: int = -1  # for SlurmClusterResolver; -1 = what TensorFlow sees
    logical_cpus: int = 0  # split the CPU into N logical devices (CPU testing of mirrored, central_storage); 0 = off
    ps: int = 0  # parameter servers (parameter_server only: local launcher, or how many srun tasks); 0 = none


class Parser(cli.OneLineParser):
    """Refuses bad CommunicationOptions values while parsing (one line, exit 2), before the job is read, and alike
    for whoever parses a native command line (this entry point, the sweep's --variant check)."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        ns, rest = super().parse_known_args(args, namespace)
        if ns.bytes_per_pack < 0:
            self.error(f"--bytes-per-pack must be >= 0 (0 = one pack), got {ns.bytes_per_pack}")
        if not ns.comm_timeout >= 0:
            self.error(f"--comm-timeout must be >= 0 seconds (0 = none), got {ns.comm_timeout}")
        return ns, rest


def parser() -> argparse.ArgumentParser:
    """The flags; their defaults are ``Options``' (``cli.with_defaults``), but for --nproc, a launcher's flag."""
    p = cli.base_parser(PROG, "Run a twinbench job with native tf.distribute.", Parser)
    p.add_argument("--nproc", type=int, default=1,
                   help="start N local workers on loopback with a generated TF_CONFIG (default 1 = this process)")
    p.add_argument("--strategy", choices=STRATEGIES,
                   help="mwms = MultiWorkerMirrored, one worker per device (default); mirrored = one process, "
                        "all local devices; one_device = the 1-GPU baseline; central_storage = one process, "
                        "variables on the CPU, compute on all local devices; parameter_server = asynchronous "
                        "chief + workers + parameter servers")
    p.add_argument("--ps", type=int,
                   help="parameter_server: start N local parameter servers (with a chief and --nproc workers), or "
                        "under srun make tasks 1..N parameter servers (default 0 = none)")
    p.add_argument("--comm", choices=COMMS,
                   help="MWMS collectives: nccl (GPUs), ring (gRPC) or auto (default: NCCL when the worker has a "
                        "GPU, else RING; TensorFlow's own AUTO would pick RING on GPUs too)")
    p.add_argument("--bytes-per-pack", type=int, metavar="BYTES",
                   help="MWMS CommunicationOptions.bytes_per_pack: all-reduce the gradients in packs of about this "
                        "size (default 0 = TensorFlow's default: one pack)")
    p.add_argument("--comm-timeout", type=float, metavar="SECONDS",
                   help="MWMS CommunicationOptions.timeout_seconds: a collective slower than this fails (default 0 = "
                        "TensorFlow's default: no timeout; TF adds a thread per collective when set)")
    p.add_argument("--port-base", type=int,
                   help="first port for SlurmClusterResolver (default 12345; IDRIS allows 10000-20000)")
    p.add_argument("--gpus-per-node", type=int,
                   help="GPUs per node for SlurmClusterResolver (default -1 = what TensorFlow sees)")
    p.add_argument("--logical-cpus", type=int,
                   help="split the CPU into N logical devices (CPU testing of mirrored / central_storage; "
                        "default off)")
    return cli.with_defaults(p, Options)


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
        self._collective = Collective(opts.comm, "n/a", "no collective: one device, no peer")
        self.cluster: dict[str, Any] = {}
        self.cluster_source = "tf_config" if os.environ.get("TF_CONFIG") else "single"
        self.visible_gpus: str | None = None

    # -- setup ---------------------------------------------------------------------------------
    def _connect(self) -> RankInfo:
        import tensorflow as tf

        o = self.opts
        local_rank, local_size = native_cluster.local_place()  # from the launcher's layout (TF_CONFIG, Slurm)
        self.threads, cpus, bound = configure_threads(local_size, o.threads, local_rank, o.cpu_bind)
        gpus = tf.config.list_physical_devices("GPU")
        self.visible_gpus = os.environ.get("CUDA_VISIBLE_DEVICES")
        # One process driving every local device, or the chief of parameter-server training (it computes
        # nothing): nothing to pin (the binding is still recorded).
        pinned = o.strategy not in (*ALL_LOCAL_DEVICES, "parameter_server")
        pin = pin_one_gpu(local_rank, PROG, gpus if pinned else [])
        if o.strategy not in ALL_LOCAL_DEVICES:
            gpus = gpus[:1]  # this worker now sees one GPU (only the count matters below)
        if o.logical_cpus > 1:
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(o.logical_cpus)])
        made = native_strategy.make_strategy(tf, o, gpus, pin, PROG)
        self.strategy, self.cluster = made.strategy, made.cluster
        self._collective = made.collective or self._collective
        self.cluster_source = made.cluster_source or self.cluster_source
        return RankInfo(rank=made.rank, num_workers=made.num_workers, local_rank=local_rank, local_size=local_size,
                        replicas_per_worker=made.replicas_per_worker, device=made.device, threads=self.threads,
                        cpus=tuple(cpus), cpu_bind=bound)

    @property
    def _coordinated(self) -> bool:
        """Parameter-server training: the chief schedules the workers' steps through a ClusterCoordinator; only it
        trains, asynchronously, and its collectives involve no other rank."""
        return self.opts.strategy == "parameter_server"

    def capabilities(self) -> Capabilities:
        o = self.opts
        knobs = () if o.strategy != "mwms" else (  # CommunicationOptions reach MWMS only
            Knob("bytes_per_pack", o.bytes_per_pack, 0, f"packs {size_text(o.bytes_per_pack)}"),
            Knob("comm_timeout_seconds", o.comm_timeout, 0.0, f"timeout {o.comm_timeout:g} s"))
        return Capabilities(
            collective=self._collective, input_path=self._input_path(), knobs=knobs,
            variant=None if o.strategy == "mwms" else o.strategy,  # mwms keeps the plain checkpoint name
            asynchronous=self._coordinated,  # workers update the variables without waiting for each other
            optimizer_reduces=o.strategy in ("parameter_server", "central_storage"))

    def train_loop(self) -> TrainLoop | None:
        if not self._coordinated:
            return None
        from backends.native_ps import run_ps

        return run_ps

    def start_timeline(self, path: str) -> bool:
        # No timeline of its own (the collectives show in the profiler's trace); the chief warns as tracing starts.
        if self.is_chief and self.opts.strategy == "mwms" and self.num_workers > 1:
            print("[twinbench] note: TensorFlow's profiler with several MWMS workers aborted a worker (double free) "
                  "or hung in stop() in about 1 run of 6 on TF 2.21 CPU: rerun if that happens (docs/observing.md, "
                  "Traces)", flush=True)
        return False

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "strategy": type(self.strategy).__name__ if self.strategy is not None else None,
            "communication": self._collective.used,
            "replicas_per_worker": self.info.replicas_per_worker,
            "threads_per_process": self.info.threads,
            "cluster": self.cluster,
            "cluster_source": self.cluster_source,
            "device": self.info.device,
            "cuda_visible_devices": self.visible_gpus,
        }
        if self.opts.strategy == "central_storage":
            out["variables_on"] = CENTRAL_VARIABLES
        if self._coordinated:
            out.update({
                "strategy": "parameter_server",  # the flag's name: the report labels these runs by it
                "strategy_class": type(self.strategy).__name__,
                "asynchronous": True,  # workers update the variables without waiting for each other
                "num_ps": len(self.cluster["ps"]),
                "num_workers": len(self.cluster["worker"]),
                "worker_steps_per_step": self.num_workers,  # one global batch = one worker step per worker
            })
        return out

    # -- training hooks ------------------------------------------------------------------------
    def scope(self) -> Any:
        return self.strategy.scope()

    def _input_path(self) -> str:
        if self._coordinated:
            return "per-worker (coordinator)"  # native_ps: each worker's own dataset, made through the chief
        return "per-worker" if self.info.replicas_per_worker == 1 else "distributed"

    def make_dataset(self, dataset_fn: Callable[[int, int, int], Any]) -> Any:
        """The input of this worker's replicas; for parameter-server training the per-worker dataset *function*,
        which ``backends.native_ps`` creates on every worker through the coordinator.

        One replica per worker (mwms, one_device): this worker's own tf.data pipeline, whose tensors go straight
        into ``strategy.run``, as Horovod ranks are fed. TensorFlow's distributed input
        (``distribute_datasets_from_function``) always goes through a MultiDeviceIterator under MWMS, and on CPU
        that halved the throughput of a real CNN here (docs/findings.md, 2026-11-23); it stays for several local
        replicas (mirrored, central_storage), which need a batch per replica. Same samples either way:
        ``common.workload.data`` shards by pipeline index, and the worker's index among ``num_workers`` pipelines is the
        ``input_pipeline_id`` tf.distribute would give it.
        """
        per = self.info.replicas_per_worker
        if self._coordinated:
            return coordinator_dataset_fn(dataset_fn, self.num_workers, self.info.replicas_per_worker)
        if self._input_path() == "per-worker":
            return per_worker_dataset(dataset_fn(self.rank, self.num_workers, 1))
        # distribute_datasets_from_function does no auto-sharding: common.workload.data shards by pipeline index, the
        # same rule Horovod ranks use, so both backends feed every replica the same samples.
        return self.strategy.distribute_datasets_from_function(
            lambda ctx: dataset_fn(ctx.input_pipeline_id, ctx.num_input_pipelines, per))

    def run_step(self, step_fn: Callable[..., Any], batch: Any) -> Any:
        out = self.strategy.run(step_fn, args=tuple(batch))
        return list(self.strategy.experimental_local_results(out))

    @staticmethod
    def reduce_gradients(grads: list[Any]) -> list[Any]:
        import tensorflow as tf

        # What the optimizer's apply_gradients does by itself under MWMS (tf_keras' all_reduce_sum_gradients, Keras
        # 3's _all_reduce_sum_gradients): one batched SUM all-reduce of the gradient list in the replica context,
        # with the strategy's CommunicationOptions; common.training.step then tells the optimizer not to reduce.
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, list(grads))

    def sync_model_state(self, model: Any) -> None:
        # Keras 3's BatchNorm statistics: one copy per worker (keras3.per_worker_state); their mean over workers is
        # what tf_keras' ON_READ variables give and what Horovod's sync_model_state computes.
        state = keras3.per_worker_state(model)
        if self._alone or not state:
            return
        import tensorflow as tf

        def mean() -> Any:
            ctx = tf.distribute.get_replica_context()
            return ctx.all_reduce(tf.distribute.ReduceOp.MEAN, [tf.identity(v) for v in state])

        averaged = self.strategy.experimental_local_results(tf.function(lambda: self.strategy.run(mean))())[0]
        for v, a in zip(state, averaged):
            v.assign(a)

    @property
    def _alone(self) -> bool:
        """No peer to agree with: one worker, or the chief of parameter-server training (the only one training)."""
        return self.num_workers == 1 or self._coordinated

    def allsum(self, values: list[float]) -> list[float]:
        if self._alone:
            return list(values)
        import tensorflow as tf

        return [float(v) for v in self._allsum(tf.constant(values, dtype=tf.float64)).numpy()]

    def allgather(self, obj: Any) -> list[Any]:
        if self._alone:
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
        if self._alone:
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


def _preflight(args: argparse.Namespace) -> None:
    """Launch-mode checks before TensorFlow starts (each failure: one line, exit 2)."""
    problem = breakdown_problem(args.strategy) if args.diagnose else None
    if problem:
        raise UsageError(problem)
    if args.nproc < 1:
        raise UsageError(f"--nproc must be >= 1, got {args.nproc}")
    if args.ps < 0:
        raise UsageError(f"--ps must be >= 0, got {args.ps}")
    if args.strategy == "parameter_server":
        return native_cluster.ps_preflight(args)
    if args.ps:
        raise UsageError(f"--ps starts parameter servers: it needs --strategy parameter_server, not {args.strategy}")
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


def make_backend(args: argparse.Namespace, argv: list[str], job: Any) -> NativeBackend | int:
    """This process's backend, or the exit status of the local launcher (--nproc, --ps) that ran the ranks."""
    _preflight(args)
    if job.keras == 3 and args.strategy in ("mirrored", "central_storage"):
        # Keras 3's per-worker BatchNorm statistics are averaged over workers, not over local replicas
        raise UsageError(f"keras = 3 runs with --strategy mwms or one_device (one replica per process), not "
                         f"{args.strategy}")
    if args.strategy == "parameter_server":
        native_cluster.check_ps_job(job)
        if native_cluster.launches_ps_locally(args):
            return native_cluster.launch_local(PROG, args.nproc, argv, ps=args.ps)
        native_cluster.serve_unless_chief(args, PROG)  # a worker or ps task ends there
    elif args.nproc > 1:
        return native_cluster.launch_local(PROG, args.nproc, argv)
    return NativeBackend(Options.from_args(args))


def main(argv: list[str] | None = None) -> int:
    return entrypoint.run_main(PROG, T0, parser, make_backend, argv)


if __name__ == "__main__":
    sys.exit(main())
