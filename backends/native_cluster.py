"""Where the native backend's workers are: TF_CONFIG checks, the Slurm preflight and the Slurm cluster resolver.

Cluster discovery, in order: ``TF_CONFIG`` if set; Slurm (``SlurmClusterResolver``) when the step has more than one
task; otherwise a single worker. Everything before ``slurm_resolver`` runs before TensorFlow starts.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any

from common import slurm_layout
from common.cli import env_int
from common.errors import UsageError


def check_tf_config() -> None:
    """A set TF_CONFIG has the shape MultiWorkerMirroredStrategy reads."""
    try:
        tfc = json.loads(os.environ["TF_CONFIG"])
        assert isinstance(tfc["cluster"]["worker"], list) and isinstance(tfc["task"]["index"], int)
    except (ValueError, KeyError, TypeError, AssertionError):
        raise UsageError('TF_CONFIG is malformed: expected {"cluster": {"worker": ["host:port", ...]}, '
                         '"task": {"type": "worker", "index": N}}') from None


def multi_task_slurm_step() -> bool:
    return not os.environ.get("TF_CONFIG") and env_int("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", default=1) > 1


def check_slurm_env(port_base: int) -> None:
    """Under a multi-task Slurm step: the variables SlurmClusterResolver needs agree, and our port is free."""
    ntasks = env_int("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", default=1)
    if ntasks <= 1:
        return
    if not os.environ.get("SLURM_STEP_NUM_TASKS"):
        # The batch script itself (not an srun step): one process, but the resolver would expect SLURM_NTASKS.
        raise UsageError(f"SLURM_NTASKS={ntasks} but this process is not an srun step: launch with "
                         "`srun python -m backends.native ...` (one task per GPU), or use --nproc / TF_CONFIG")
    if not 1024 <= port_base <= 65535 - ntasks:
        raise UsageError(f"--port-base {port_base} is out of range: use 1024..{65535 - ntasks} "
                         "(IDRIS allows 10000-20000)")
    missing = [v for v in ("SLURM_PROCID", "SLURM_LOCALID") if not os.environ.get(v)]
    if not (os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST")
            or os.environ.get("SLURM_NODELIST")):
        missing.append("SLURM_STEP_NODELIST")
    if not (os.environ.get("SLURM_STEP_TASKS_PER_NODE") or os.environ.get("SLURM_TASKS_PER_NODE")):
        missing.append("SLURM_STEP_TASKS_PER_NODE")
    if missing:
        raise UsageError(f"SLURM_NTASKS={ntasks} but {', '.join(missing)} unset: launch with srun inside the "
                         "allocation (or unset SLURM_NTASKS / set TF_CONFIG)")
    procid = env_int("SLURM_PROCID", default=0)
    localid = env_int("SLURM_LOCALID", default=0)
    if not 0 <= procid < ntasks:
        raise UsageError(f"inconsistent Slurm environment: SLURM_PROCID={procid} with {ntasks} tasks")
    try:
        slurm_layout.step_workers(port_base)  # this task's place in the layout MWMS will be given
    except slurm_layout.LayoutError as e:
        raise UsageError(str(e)) from None
    port = port_base + localid  # the n-th task on a node listens on port_base + n
    with socket.socket() as s:
        # SO_REUSEADDR as gRPC binds: a port in TIME_WAIT from a previous run is free to use, not "in use".
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            raise UsageError(f"port {port} (--port-base {port_base} + SLURM_LOCALID {localid}) is already in use "
                             "on this node; pass another --port-base") from None


def slurm_resolver(tf: Any, port_base: int, gpus_per_node: int, visible_gpus: int, prog: str) -> tuple[Any, str]:
    """Cluster from Slurm's variables without nvidia-smi: SlurmClusterResolver only for the spec.

    Returns the resolver MWMS is given and where its layout came from ("slurm" or "slurm (twinbench layout)").
    """
    gpn = gpus_per_node if gpus_per_node >= 0 else visible_gpus
    # The resolver lists only gpus_per_node // gpus_per_task tasks per node (and fails on a zero step when a
    # task sees one GPU or none): one GPU per task, and at least as many "GPUs" as tasks on the busiest node,
    # so every task is in the spec. With auto_set_gpu=False these numbers assign no device: the resolver would
    # overwrite the CUDA_VISIBLE_DEVICES Slurm set per task; the backend pins from what this task sees.
    per_node = os.environ.get("SLURM_STEP_TASKS_PER_NODE") or os.environ.get("SLURM_TASKS_PER_NODE") or "1"
    most_tasks = max(int(p.split("(")[0]) for p in per_node.split(","))
    slurm = tf.distribute.cluster_resolver.SlurmClusterResolver(
        port_base=port_base, gpus_per_node=max(gpn, most_tasks, 1), gpus_per_task=1, auto_set_gpu=False)
    spec = slurm.cluster_spec()
    source = "slurm"
    # The resolver sorts hostnames as strings and packs tasks in block order; Slurm's own layout (checked by
    # every task against its SLURMD_NODENAME/SLURM_LOCALID before TF started) wins when they differ, or
    # ranks would be looked for at addresses where other ranks listen.
    ours = slurm_layout.step_workers(port_base)
    if spec.as_dict().get("worker") != ours:
        if int(os.environ.get("SLURM_PROCID", "0")) == 0:
            print(f"[{prog}] note: SlurmClusterResolver's worker order {spec.as_dict().get('worker')} is not "
                  f"Slurm's task layout ({slurm_layout.node_distribution(os.environ)} over the step's nodes); "
                  f"using Slurm's: {ours}", file=sys.stderr, flush=True)
        spec = tf.train.ClusterSpec({"worker": ours})
        source = "slurm (twinbench layout)"
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        cluster_spec=spec, task_type="worker", task_id=int(os.environ.get("SLURM_PROCID", "0")),
        num_accelerators={"GPU": min(visible_gpus, 1)}, rpc_layer="grpc")
    return resolver, source
