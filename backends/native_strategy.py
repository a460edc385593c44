"""The native backend's tf.distribute strategy: one per ``--strategy``, made before any other TensorFlow op, with
what the backend records of it (the collective, the cluster, rank, workers, replicas per worker, the device).

- mwms: MultiWorkerMirroredStrategy, one worker per device, its collective chosen here (``resolve_comm``) with the
  ``CommunicationOptions`` knobs; the cluster from TF_CONFIG, Slurm (``backends.native_cluster``) or one worker;
- mirrored, central_storage: one process driving every local device (variables on the host for central_storage);
- one_device: the 1-GPU baseline;
- parameter_server: the chief of a parameter-server cluster (its role from ``backends.native_cluster``), which
  computes nothing and schedules the workers' steps (``backends.native_ps``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from backends import native_cluster
from common.cluster.placement import Pinning
from common.core.contract import Collective

STRATEGIES = ("mwms", "mirrored", "one_device", "central_storage", "parameter_server")
ALL_LOCAL_DEVICES = ("mirrored", "central_storage")  # one process driving every local device (nothing to pin)
COMMS = ("auto", "ring", "nccl")
CENTRAL_VARIABLES = "/cpu:0"  # central_storage keeps the variables on the host, whatever the GPU count (see below)
BREAKDOWN_STRATEGIES = ("mwms", "one_device")  # one replica per process: the phases are that process's


class StrategyOptions(Protocol):
    """The flags a strategy is made from: a ``backends.native.Options`` (not imported here, ``backends.native``
    imports this module)."""

    @property
    def strategy(self) -> str: ...
    @property
    def comm(self) -> str: ...
    @property
    def bytes_per_pack(self) -> int: ...
    @property
    def comm_timeout(self) -> float: ...
    @property
    def port_base(self) -> int: ...
    @property
    def gpus_per_node(self) -> int: ...
    @property
    def ps(self) -> int: ...


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


def make_strategy(tf: Any, o: StrategyOptions, gpus: list[Any], pin: Pinning, prog: str) -> Made:
    """Create ``o.strategy`` (before any other TF op) on this worker's ``gpus``, ``pin`` being its GPU binding."""
    if o.strategy == "mwms":
        collective = resolve_comm(o.comm, bool(gpus))
        strategy, source = mwms(tf, o, gpus, collective, prog)
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


def parameter_server_chief(tf: Any, o: StrategyOptions, pin: Pinning) -> Made:
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


def mwms(tf: Any, o: StrategyOptions, gpus: list[Any], collective: Collective, prog: str) -> tuple[Any, str | None]:
    """MultiWorkerMirroredStrategy with ``collective``'s implementation and the CommunicationOptions knobs, and
    where its cluster came from when Slurm gave it (None: TF_CONFIG or a single worker)."""
    impl = tf.distribute.experimental.CommunicationImplementation
    if o.comm == "nccl" and collective.used != "nccl":
        print(f"[{prog}] warning: --comm nccl needs GPUs and none is visible; using RING (gRPC) collectives",
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
        resolver, source = native_cluster.slurm_resolver(tf, o.port_base, o.gpus_per_node, len(gpus), prog)
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
