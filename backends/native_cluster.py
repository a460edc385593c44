"""Where the native backend's workers are: TF_CONFIG checks, the Slurm preflight and the Slurm cluster resolver,
and for parameter-server training the roles (chief, worker, ps) and the server tasks.

Cluster discovery, in order: ``TF_CONFIG`` if set; Slurm (``SlurmClusterResolver``) when the step has more than one
task; otherwise a single worker. Everything before ``slurm_resolver`` (and ``ps_role``) runs before TensorFlow starts.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from common.cli import env_int
from common.cluster import localcluster, netif, slurm_layout
from common.core.contract import Launch, Launcher
from common.core.errors import EXIT_PEER_LOST, UsageError, exit_now
from common.workload.job import Job

# How native's workers start, and what each reads to know its place on its host (``local_place`` reads its place
# from TF_CONFIG's layout or Slurm's first; these variables where neither says it).
LAUNCH = Launch((
    Launcher("nproc", ("local",), "python -m backends.native --nproc N: N workers on loopback with a generated "
             "TF_CONFIG", local_rank=("TWINBENCH_LOCAL_RANK",), local_size=("TWINBENCH_LOCAL_SIZE",)),
    Launcher("tf_config", ("hosts",), "one process per worker with its own TF_CONFIG (cluster and task index), "
             "started by hand, ssh or mpirun", local_rank=("OMPI_COMM_WORLD_LOCAL_RANK",),
             local_size=("OMPI_COMM_WORLD_LOCAL_SIZE",)),
    Launcher("srun", ("slurm",), "srun: one job-step task per worker, the cluster from SlurmClusterResolver",
             rank=("SLURM_PROCID",), local_rank=("SLURM_LOCALID",),
             local_size=("SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"), job_step=True),
))


def check_tf_config() -> None:
    """A set TF_CONFIG has the shape MultiWorkerMirroredStrategy reads."""
    try:
        tfc = json.loads(os.environ["TF_CONFIG"])
        assert isinstance(tfc["cluster"]["worker"], list) and isinstance(tfc["task"]["index"], int)
    except (ValueError, KeyError, TypeError, AssertionError):
        raise UsageError('TF_CONFIG is malformed: expected {"cluster": {"worker": ["host:port", ...]}, '
                         '"task": {"type": "worker", "index": N}}') from None
    if "ps" in tfc["cluster"]:
        raise UsageError("TF_CONFIG lists ps tasks: parameter-server training needs --strategy parameter_server")
    iface = netif.selected()
    if iface:
        # MWMS reads TF_CONFIG when the strategy is made: give it the workers' addresses on the data interface
        # (this task's own entry checked to be this host's address there).
        tfc["cluster"]["worker"] = netif.workers_on(tfc["cluster"]["worker"], iface)
        index = tfc["task"]["index"]
        own = str(netif.ipv4(iface).ip)
        if not 0 <= index < len(tfc["cluster"]["worker"]) \
                or tfc["cluster"]["worker"][index].rpartition(":")[0] != own:
            raise UsageError(f"TF_CONFIG makes this process worker {index}, but that entry is not on this host's "
                             f"{iface} address {own}: workers {tfc['cluster']['worker']}")
        os.environ["TF_CONFIG"] = json.dumps(tfc)


def local_place() -> tuple[int, int]:
    """(local rank, local size) of this worker on its host: a local launcher's variables, else the TF_CONFIG
    layout (workers sharing this task's host), else Slurm's layout of the step, else the launchers' variables."""
    if os.environ.get("TWINBENCH_LOCAL_RANK"):
        return env_int("TWINBENCH_LOCAL_RANK", default=0), env_int("TWINBENCH_LOCAL_SIZE", default=1)
    hosts: list[str] = []
    index = 0
    try:
        if os.environ.get("TF_CONFIG"):
            tfc = json.loads(os.environ["TF_CONFIG"])
            if tfc["task"].get("type", "worker") != "worker":
                raise KeyError("not an MWMS worker")  # a parameter-server role: its launcher's variables count
            hosts = [str(w).rpartition(":")[0] for w in tfc["cluster"]["worker"]]
            index = int(tfc["task"]["index"])
        elif multi_task_slurm_step():
            hosts = [w.rpartition(":")[0] for w in slurm_layout.step_workers(0)]
            index = env_int("SLURM_PROCID", default=0)
    except (ValueError, KeyError, TypeError, slurm_layout.LayoutError):
        hosts = []  # checked (and reported) by the preflight; fall back to the variables
    if 0 <= index < len(hosts):
        return hosts[:index].count(hosts[index]), hosts.count(hosts[index])
    return LAUNCH.local_place(os.environ) or (0, 1)  # the launchers' own variables, a nested launcher's first


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
        workers = slurm_layout.step_workers(port_base)  # this task's place in the layout MWMS will be given
    except slurm_layout.LayoutError as e:
        raise UsageError(str(e)) from None
    if netif.selected():
        netif.workers_on(workers, netif.selected() or "")  # every node has an address on the interface's subnet
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
    iface = netif.selected()
    if iface:
        # the resolver's addresses are host names: each may resolve to another network than the data one
        spec = tf.train.ClusterSpec({"worker": netif.workers_on(spec.as_dict()["worker"], iface)})
        source += f", addresses on {iface}"
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        cluster_spec=spec, task_type="worker", task_id=int(os.environ.get("SLURM_PROCID", "0")),
        num_accelerators={"GPU": min(visible_gpus, 1)}, rpc_layer="grpc")
    return resolver, source


# -- parameter-server training: roles, and the worker / ps tasks ----------------------------------------------
PS_TASK_TYPES = ("chief", "worker", "ps")  # the names ParameterServerStrategy requires (chief = coordinator)
CHIEF_PROBE_S = 0.5  # s between probes of the chief's port: servers exit about 2 s after the chief
CHIEF_GONE_MISSES = 3  # failed probes in a row that mean the chief has exited (a listening port never refuses)
NO_PS = ("--strategy parameter_server needs parameter servers: pass --ps N (local launcher, with --nproc W "
         "workers), or a TF_CONFIG / an srun step holding chief, ps and worker tasks")


@dataclass(frozen=True)
class PSRole:
    """This task's place in a parameter-server cluster: chief (coordinator), worker (computes) or ps (variables)."""

    cluster: dict[str, list[str]]  # task type -> host:port addresses
    task_type: str
    task_index: int
    source: str  # where the cluster came from: "tf_config" or "slurm"

    @property
    def chief(self) -> str:
        return self.cluster["chief"][0]


def ps_role(num_ps: int, port_base: int) -> PSRole:
    """The parameter-server cluster and this task's role, from TF_CONFIG or a multi-task srun step (no TF).

    Raises UsageError (one line) when there is no such cluster, or it lacks a chief, a ps or a worker.
    """
    if os.environ.get("TF_CONFIG"):
        return _ps_role_from_tf_config()
    if multi_task_slurm_step():
        return _ps_role_from_slurm(num_ps, port_base)
    raise UsageError(NO_PS)


def _ps_role_from_tf_config() -> PSRole:
    try:
        tfc = json.loads(os.environ["TF_CONFIG"])
        cluster = {str(k): [str(a) for a in v] for k, v in tfc["cluster"].items()}
        task_type, index = tfc["task"]["type"], tfc["task"]["index"]
        assert isinstance(index, int) and isinstance(task_type, str)
    except (ValueError, KeyError, TypeError, AttributeError, AssertionError):
        raise UsageError('TF_CONFIG is malformed: expected {"cluster": {"chief": [...], "worker": [...], "ps": '
                         '[...]}, "task": {"type": "chief|worker|ps", "index": N}}') from None
    return _checked_role(cluster, task_type, index, "tf_config")


def _ps_role_from_slurm(num_ps: int, port_base: int) -> PSRole:
    """Roles from the task index: task 0 is the chief, tasks 1..N the parameter servers, the rest the workers."""
    if num_ps < 1:
        raise UsageError("--strategy parameter_server under srun needs --ps N: tasks 1..N of the step become "
                         "parameter servers (task 0 is the chief, the others are workers)")
    check_slurm_env(port_base)  # the same variable and port checks as for MWMS
    try:
        addresses = slurm_layout.step_workers(port_base)
    except slurm_layout.LayoutError as e:
        raise UsageError(str(e)) from None
    if len(addresses) < num_ps + 2:
        raise UsageError(f"--ps {num_ps} leaves no worker among the step's {len(addresses)} tasks: parameter_server "
                         f"needs 1 chief + {num_ps} ps + at least 1 worker")
    cluster = {"chief": addresses[:1], "ps": addresses[1:1 + num_ps], "worker": addresses[1 + num_ps:]}
    procid = env_int("SLURM_PROCID", default=0)
    if procid == 0:
        return _checked_role(cluster, "chief", 0, "slurm")
    if procid <= num_ps:
        return _checked_role(cluster, "ps", procid - 1, "slurm")
    return _checked_role(cluster, "worker", procid - 1 - num_ps, "slurm")


def _checked_role(cluster: dict[str, list[str]], task_type: str, index: int, source: str) -> PSRole:
    unknown = sorted(set(cluster) - set(PS_TASK_TYPES))
    if unknown:
        raise UsageError(f"parameter_server: the cluster has task type(s) {', '.join(unknown)}; only chief, worker "
                         "and ps are allowed")
    if len(cluster.get("chief", [])) != 1:
        raise UsageError(f"parameter_server needs exactly one chief (the coordinator); the cluster lists "
                         f"{len(cluster.get('chief', []))}")
    if not cluster.get("ps"):
        raise UsageError("parameter_server needs at least one ps task; the cluster has none")
    if not cluster.get("worker"):
        raise UsageError(f"parameter_server needs at least one worker; the cluster has {len(cluster['ps'])} ps "
                         "but no worker")
    if task_type not in PS_TASK_TYPES or not 0 <= index < len(cluster[task_type]):
        raise UsageError(f"this task ({task_type} {index}) is not in the cluster "
                         f"({', '.join(f'{len(v)} {k}' for k, v in cluster.items())})")
    return PSRole(cluster, task_type, index, source)


def ps_preflight(args: argparse.Namespace) -> None:
    """--strategy parameter_server: the launch makes sense (each failure: one line, exit 2, no TF)."""
    if args.bench:
        raise UsageError("--bench allreduce measures collectives; parameter-server training has none (workers push "
                         "their updates to the ps): benchmark mwms instead")
    if os.environ.get("TF_CONFIG") and (args.ps or args.nproc > 1):
        raise UsageError("--nproc and --ps make a local cluster with its own TF_CONFIG: unset TF_CONFIG or drop them")
    if multi_task_slurm_step() and args.nproc > 1:
        raise UsageError("under srun, Slurm starts every task: drop --nproc (--ps N makes tasks 1..N the parameter "
                         "servers, the tasks after them the workers)")
    if not launches_ps_locally(args):
        ps_role(args.ps, args.port_base)  # a chief, ps and workers, and this task among them


def launches_ps_locally(args: argparse.Namespace) -> bool:
    """--ps N outside TF_CONFIG and srun: this process is the local launcher of chief, workers and ps."""
    return bool(args.ps) and not os.environ.get("TF_CONFIG") and not multi_task_slurm_step()


def check_ps_job(job: Job) -> None:
    """Job settings the parameter-server loop cannot run (one line, exit 2, before TensorFlow starts)."""
    if job.warmup_epochs:
        raise UsageError("warmup_epochs sets one learning rate per global step, but parameter-server workers "
                         "update at their own pace: use warmup_epochs=0 with --strategy parameter_server")
    if job.steps_per_execution != 1:
        raise UsageError("--strategy parameter_server schedules one worker step per function call: use "
                         "steps_per_execution=1")
    if job.lr_schedule != "constant":
        raise UsageError(f"lr_schedule = {job.lr_schedule!r} sets one learning rate per global step, but "
                         "parameter-server workers update at their own pace: use lr_schedule = \"constant\"")
    if job.keras == 3:
        raise UsageError("keras = 3 is not supported with --strategy parameter_server (its loops are tf_keras'): "
                         "use keras = 2 or another strategy")
    unsupported = [k for k, on in (("mixed_precision", job.mixed_precision), ("xla", job.xla)) if on]
    if unsupported:
        raise UsageError(f"{' and '.join(unsupported)} {'are' if len(unsupported) > 1 else 'is'} not supported "
                         "with --strategy parameter_server (not in its loop): set to false")


def serve_unless_chief(args: argparse.Namespace, prog: str) -> None:
    """Return on the chief; a worker or ps task serves the chief until it has gone, then exits (never returns)."""
    role = ps_role(args.ps, args.port_base)
    if role.task_type == "chief":
        return
    local_rank = env_int("TWINBENCH_LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", default=0)
    local_size = env_int("TWINBENCH_LOCAL_SIZE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", default=1)
    # common.cluster.placement.configure_threads' share of the cores, without touching this process's eager context
    threads = args.threads or max(1, len(os.sched_getaffinity(0)) // max(local_size, 1))
    # The chief may take as long to come up as a stalled run to make progress (TF import, tracing): same limit.
    serve(role, local_rank, threads, args.stall_timeout, prog)


def chief_reachable(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        # 1 s: far above a connect on a live network, short enough to notice a vanished host within seconds
        with socket.create_connection((host, int(port)), timeout=1.0):
            return True
    except OSError:
        return False


def wait_for_chief(address: str, wait_for: float) -> int:
    """Return 0 once the chief, seen up, has gone; EXIT_PEER_LOST if it never came up within ``wait_for`` s (0 =
    wait forever). The chief's gRPC port is open from the moment it connects to the cluster until it exits."""
    seen, misses, t0 = False, 0, time.monotonic()
    while True:
        if chief_reachable(address):
            seen, misses = True, 0
        elif seen:
            misses += 1
            if misses >= CHIEF_GONE_MISSES:
                return 0
        elif wait_for > 0 and time.monotonic() - t0 > wait_for:
            return EXIT_PEER_LOST
        time.sleep(CHIEF_PROBE_S)


def serve(role: PSRole, local_rank: int, threads: int, wait_for: float, prog: str) -> NoReturn:
    """Run this worker or ps task's TensorFlow server until the chief has gone, then exit (0, or 3 if the chief
    never came). ParameterServerStrategy's servers are meant to ``join()`` forever; watching the chief instead
    means that no task outlives the run, under srun as under the local launcher."""
    import signal

    for sig in (signal.SIGTERM, signal.SIGUSR1):
        # The chief alone reacts to a preemption (it checkpoints, reading the variables from the servers); its
        # exit then ends this task.
        signal.signal(sig, signal.SIG_IGN)
    import tensorflow as tf

    # intra-op only: servers given 1 inter-op thread hung the run before its first step (observed, TF 2.21)
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads)
    gpus = tf.config.list_physical_devices("GPU")
    if role.task_type == "worker" and gpus:
        config.gpu_options.visible_device_list = str(local_rank % len(gpus))  # the documented pinning rule
        config.gpu_options.allow_growth = True
    else:
        config.device_count["GPU"] = 0  # parameter servers hold variables on the host
    tf.distribute.Server(tf.train.ClusterSpec(role.cluster), job_name=role.task_type, task_index=role.task_index,
                         protocol="grpc", config=config, start=True)
    status = wait_for_chief(role.chief, wait_for)
    if status:
        print(f"[{prog}] {role.task_type} {role.task_index}: the chief {role.chief} never came up within "
              f"{wait_for:.0f} s; exiting", file=sys.stderr, flush=True)
    exit_now(status)  # a TF server cannot be stopped; an interpreter exit could wait on its threads


SERVER_LINGER_S = 20.0  # s the local launcher gives ps/worker servers to exit after the chief (they need about 2)


# -- local launcher (--nproc, --ps) ----------------------------------------------------------------
def strip_launcher_flags(argv: list[str], flags: tuple[str, ...] = ("--nproc", "--ps")) -> list[str]:
    """``argv`` without the launcher's own ``flags`` (and their values): what each launched process runs."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in flags:
            skip = True
            continue
        if a.startswith(tuple(f"{f}=" for f in flags)):
            continue
        out.append(a)
    return out


def launch_local(prog: str, n: int, argv: list[str], ps: int = 0) -> int:
    """Start n workers of this module with TF_CONFIG on loopback; the first failure stops the others.

    With ``ps`` > 0 (parameter_server): a chief, n workers and ``ps`` parameter servers; the servers exit once the
    chief has (and are killed SERVER_LINGER_S later if they have not). SIGTERM/SIGUSR1 sent to the launcher
    (Slurm, scancel) are forwarded to every process; the workers (the chief) then checkpoint and exit 75, and the
    launcher exits 75 too.
    """
    env = dict(os.environ, TWINBENCH_LAUNCH_COMMAND=json.dumps(list(sys.orig_argv)))
    command = [sys.executable, "-m", prog, *strip_launcher_flags(argv)]
    if ps:
        return localcluster.supervise(localcluster.start_ps_cluster(n, ps, command, env), prog,
                                      linger=SERVER_LINGER_S)
    return localcluster.supervise(localcluster.start_tf_config_workers(n, command, env), prog)


# -- a plain MWMS script as N local workers (--script) -------------------------------------------------------
SCRIPT_USAGE = "--nproc N --script FILE.py [-- ARGS...]"


def wants_script(argv: list[str]) -> bool:
    """``--script`` among the launcher's own flags (before any ``--``): run a plain script, not a twinbench job."""
    own = argv[:argv.index("--")] if "--" in argv else argv
    return any(a == "--script" or a.startswith("--script=") for a in own)


def launch_script(prog: str, argv: list[str]) -> int:
    """``--nproc N --script FILE [-- ARGS]``: FILE (any MultiWorkerMirroredStrategy script, e.g. a port's
    ``<stem>_mwms.py``) as N local workers, each with its TF_CONFIG on loopback, supervised as ``--nproc``'s
    twinbench workers are (the first failure stops the others, SIGTERM/SIGUSR1 forwarded, one exit status); their
    output goes to this terminal as theirs does. Bad input: one line, exit 2, nothing started."""
    from common.cli import OneLineParser
    from common.core.errors import fail

    own, rest = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = OneLineParser(prog=prog, description="Run a plain MultiWorkerMirroredStrategy script as N local workers.")
    p.add_argument("--nproc", type=int, default=None, help="local workers (required; one worker: python FILE)")
    p.add_argument("--script", required=True, help="the script, run as `python FILE ARGS` by every worker")
    args, unknown = p.parse_known_args(own)
    script = Path(args.script)
    if unknown:
        fail(prog, f"--script runs a plain script: {' '.join(unknown)} is not for it (its own arguments go after "
                   f"--: {SCRIPT_USAGE})")
    if args.nproc is None:
        fail(prog, f"--script needs --nproc N, the number of local workers ({SCRIPT_USAGE})")
    if args.nproc < 1:
        fail(prog, f"--nproc must be >= 1, got {args.nproc}")
    if script.suffix != ".py":
        fail(prog, f"--script {script}: not a Python file (.py)")
    if not script.is_file():
        fail(prog, f"--script {script}: no such file")
    if os.environ.get("TF_CONFIG"):
        fail(prog, "--script generates each worker's TF_CONFIG itself: unset TF_CONFIG")
    env = dict(os.environ, TWINBENCH_LAUNCH_COMMAND=json.dumps(list(sys.orig_argv)))
    command = [sys.executable, str(script), *rest]
    return localcluster.supervise(localcluster.start_tf_config_workers(args.nproc, command, env), prog)
