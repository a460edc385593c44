"""Native backend: tf.distribute. ``python -m backends.native --job jobs/smoke.toml [--nproc N]``.

Cluster discovery (``backends.native_cluster``), in order: ``TF_CONFIG`` if set; Slurm (``SlurmClusterResolver``)
when the step has more than one task; otherwise a single worker. ``--nproc N`` starts N local workers with a
generated ``TF_CONFIG`` on free loopback ports (like ``torchrun --standalone``); with ``--strategy parameter_server
--ps P`` it starts a chief, N workers and P parameter servers instead. In parameter-server training only the chief
trains (``backends.native_ps``, the loop ``NativeBackend.train_loop`` supplies); workers and parameter servers run
TensorFlow servers until the chief has gone.

The strategy, one per ``--strategy``, made before any other TensorFlow op (``make_strategy``), with what the backend
records of it (the collective, the cluster, rank, workers, replicas per worker, the device):

- mwms: MultiWorkerMirroredStrategy, one worker per device, its collective chosen here (``resolve_comm``) with the
  ``CommunicationOptions`` knobs; the cluster from TF_CONFIG, Slurm (``backends.native_cluster``) or one worker;
- mirrored, central_storage: one process driving every local device (variables on the host for central_storage);
- one_device: the 1-GPU baseline;
- parameter_server: the chief of a parameter-server cluster (its role from ``backends.native_cluster``), which
  computes nothing and schedules the workers' steps (``backends.native_ps``).

The input (``NativeBackend.make_dataset``): a one-replica worker's own pipeline (``per_worker_dataset``), the
distributed input for several local replicas, and each parameter-server worker's slots (``coordinator_dataset_fn``).
"""

from __future__ import annotations

import time

T0 = time.time()  # process start, for time-to-first-step (TF import counts: users pay it too)

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, field, replace  # noqa: E402
from typing import Any  # noqa: E402

from backends import entrypoint, native_cluster  # noqa: E402
from common import cli  # noqa: E402
from common.cluster.placement import Pinning, configure_threads, pin_one_gpu  # noqa: E402
from common.core.contract import (  # noqa: E402
    Backend,
    BaseOptions,
    Capabilities,
    Collective,
    Diagnosis,
    Knob,
    RankInfo,
    StackCheck,
    TrainLoop,
    size_text,
)
from common.core.errors import UsageError  # noqa: E402
from common.training import keras3  # noqa: E402

STRATEGIES = ("mwms", "mirrored", "one_device", "central_storage", "parameter_server")
ALL_LOCAL_DEVICES = ("mirrored", "central_storage")  # one process driving every local device (nothing to pin)
COMMS = ("auto", "ring", "nccl")
CENTRAL_VARIABLES = "/cpu:0"  # central_storage keeps the variables on the host, whatever the GPU count (see below)
BREAKDOWN_STRATEGIES = ("mwms", "one_device")  # one replica per process: the phases are that process's
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


# How native's workers start: backends/native_cluster.py, where its workers find their place.
LAUNCH = native_cluster.LAUNCH


def stack(shared_ok: bool) -> StackCheck:
    """tf.distribute comes with TensorFlow: native runs wherever the shared stack (TensorFlow, tf-keras) can."""
    return StackCheck(shared_ok)


# -- the strategy -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Made:
    """A strategy just created, and what the backend records of it."""

    strategy: Any
    rank: int
    num_workers: int
    replicas_per_worker: int
    device: str  # the record's device label
    collective: Collective | None = None  # None: no collective of its own (one device, no peer)
    cluster: dict[str, Any] = field(default_factory=dict)
    cluster_source: str | None = None  # None: where the backend found its cluster (TF_CONFIG, or a single worker)


def make_strategy(tf: Any, o: Options, gpus: list[Any], pin: Pinning) -> Made:
    """Create ``o.strategy`` (before any other TF op) on this worker's ``gpus``, ``pin`` being its GPU binding."""
    if o.strategy == "mwms":
        collective = resolve_comm(o.comm, bool(gpus))
        strategy, source = mwms(tf, o, gpus, collective)
        workers = strategy.cluster_resolver.cluster_spec().as_dict().get("worker", [])
        num_workers = max(len(workers), 1)
        return Made(strategy, int(strategy.cluster_resolver.task_id or 0), num_workers,
                    strategy.num_replicas_in_sync // num_workers, pin.label(), collective, {"workers": workers},
                    source)
    if o.strategy == "parameter_server":
        return parameter_server_chief(tf, o, pin)
    if o.strategy in ALL_LOCAL_DEVICES:
        devices = [d.name for d in tf.config.list_logical_devices("GPU")] or \
                  [d.name for d in tf.config.list_logical_devices("CPU")]
        if o.strategy == "mirrored":
            strategy = tf.distribute.MirroredStrategy(devices=devices)
        else:
            # One copy of each variable, on the host; every local device computes with it. Pinned here because
            # TF's own default (tensorflow/python/distribute/central_storage_strategy.py, CentralStorageStrategy
            # .__init__) is the GPU itself when there is only one, which would make a 1-GPU run another strategy.
            strategy = tf.distribute.experimental.CentralStorageStrategy(
                compute_devices=devices, parameter_device=CENTRAL_VARIABLES)
        collective = Collective(o.comm, "in-process", f"{o.strategy}: one process reduces across its local devices")
        return Made(strategy, 0, 1, strategy.num_replicas_in_sync, replace(pin, device=",".join(devices)).label(),
                    collective)
    one = "/gpu:0" if gpus else "/cpu:0"
    return Made(tf.distribute.OneDeviceStrategy(one), 0, 1, 1, replace(pin, device=one).label())


def parameter_server_chief(tf: Any, o: Options, pin: Pinning) -> Made:
    """The chief of a parameter-server cluster: it creates the variables on the ps and schedules the steps."""
    role = native_cluster.ps_role(o.ps, o.port_base)
    collective = Collective(o.comm, "parameter servers (gRPC)",
                            "parameter-server training: variables live on the parameter servers")
    tf.config.set_visible_devices([], "GPU")  # the chief computes nothing: leave its node's GPUs to workers
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(role.cluster), task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    # num_replicas_in_sync: the GPUs of one worker (1 on CPU workers); the workers step independently
    return Made(strategy, 0, len(role.cluster["worker"]), strategy.num_replicas_in_sync,
                replace(pin, device="coordinator (no compute)").label(), collective, role.cluster, role.source)


def mwms(tf: Any, o: Options, gpus: list[Any], collective: Collective) -> tuple[Any, str | None]:
    """MultiWorkerMirroredStrategy with ``collective``'s implementation and the CommunicationOptions knobs, and
    where its cluster came from when Slurm gave it (None: TF_CONFIG or a single worker)."""
    impl = tf.distribute.experimental.CommunicationImplementation
    if o.comm == "nccl" and collective.used != "nccl":
        print(f"[{PROG}] warning: --comm nccl needs GPUs and none is visible; using RING (gRPC) collectives",
              file=sys.stderr, flush=True)
    # Never impl.AUTO: in TF 2.21 it reaches the runtime as the hint "auto", and the runtime then picks NCCL
    # only if ConfigProto.experimental.collective_nccl is set, which MWMS sets for impl.NCCL alone
    # (collective_param_resolver_local.cc AssignCollectiveType; collective_all_reduce_strategy.py
    # _update_config_proto): AUTO is RING on GPUs. So twinbench decides, before the strategy exists.
    choice = impl.NCCL if collective.used == "nccl" else impl.RING
    options = tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=o.bytes_per_pack, timeout_seconds=o.comm_timeout or None, implementation=choice)
    resolver, source = None, None
    if native_cluster.multi_task_slurm_step():
        resolver, source = native_cluster.slurm_resolver(tf, o.port_base, o.gpus_per_node, len(gpus), PROG)
    # Must come before any other TF op: MWMS configures the runtime's collective ops when created.
    return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver, communication_options=options), source


def resolve_comm(requested: str, has_gpu: bool) -> Collective:
    """The MWMS collective implementation for ``--comm``: ``auto`` is NCCL when this worker has a GPU, else RING;
    ``nccl`` without a GPU falls back to RING (NCCL cannot reduce host tensors)."""
    if requested == "ring":
        return Collective(requested, "ring", "--comm ring")
    if has_gpu:
        why = "--comm nccl" if requested == "nccl" else "--comm auto and this worker has a GPU"
        return Collective(requested, "nccl", why)
    why = "--comm nccl but no GPU is visible" if requested == "nccl" else "--comm auto and no GPU is visible"
    return Collective(requested, "ring", why)


def breakdown_problem(strategy: str) -> str | None:
    """Why ``--diagnose breakdown`` cannot run with ``strategy`` (one line), or None."""
    if strategy in BREAKDOWN_STRATEGIES:
        return None
    return (f"--diagnose breakdown splits the synchronous all-reduce step into phases: --strategy "
            f"{' or '.join(BREAKDOWN_STRATEGIES)}, not {strategy}")


# -- the input --------------------------------------------------------------------------------------------------------
@functools.cache
def _per_worker_dataset_class() -> type:
    import tensorflow as tf

    class PerWorkerDataset(tf.distribute.DistributedDataset):
        """This worker's own ``tf.data.Dataset`` (a worker with one replica), presented as a
        ``tf.distribute.DistributedDataset`` so that Keras ``fit`` takes it as already distributed: it would
        otherwise distribute it again, through the MultiDeviceIterator. Iterating it iterates the dataset: ``next``
        gives plain tensors, which ``strategy.run`` hands to the worker's single replica as they are."""

        def __init__(self, dataset: Any) -> None:
            self.dataset = dataset

        def __iter__(self) -> Any:
            return iter(self.dataset)

        @property
        def element_spec(self) -> Any:
            return self.dataset.element_spec

    return PerWorkerDataset


def per_worker_dataset(dataset: Any) -> Any:
    """``dataset`` as the input of a one-replica worker (``PerWorkerDataset``)."""
    return _per_worker_dataset_class()(dataset)


def worker_slots(ds: Any, workers: int, per: int, index: Any) -> Any:
    """From every replica slot of each global batch (in slot order), worker ``index``'s ``per`` slots: what
    ``common.workload.data`` gives pipeline ``index`` of ``workers`` pipelines with ``per`` replicas each."""
    if per == 1:
        return ds.shard(workers, index)
    return ds.batch(per, drop_remainder=True).shard(workers, index).unbatch()


def coordinator_dataset_fn(dataset_fn: Callable[[int, int, int], Any], workers: int, per: int) -> Callable[[Any], Any]:
    """``input_context -> tf.data.Dataset`` run on each worker of parameter-server training: its slots of every
    global batch (``backends.native_ps`` creates it on every worker through the coordinator).

    The coordinator traces it once for all workers, so the worker's index is a tensor known only when it
    runs there: build every slot of each global batch (``common.workload.data``'s order), keep the worker's share.
    The cost: each worker prepares the whole global batch and keeps 1/W of it.
    """
    import tensorflow as tf

    def fn(input_context: Any) -> Any:
        ds = dataset_fn(0, 1, workers * per)  # one pipeline feeding every replica slot, in slot order
        return worker_slots(ds, workers, per, tf.distribute.coordinator.experimental_get_current_worker_index())

    return fn


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
        made = make_strategy(tf, o, gpus, pin)
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
    argv = sys.argv[1:] if argv is None else argv
    if native_cluster.wants_script(argv):  # --nproc N --script FILE: a plain MWMS script's local launcher
        return native_cluster.launch_script(PROG, argv)
    return entrypoint.run_main(PROG, T0, parser, make_backend, argv)


if __name__ == "__main__":
    sys.exit(main())
