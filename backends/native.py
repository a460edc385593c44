"""Native backend: tf.distribute. ``python -m backends.native --job jobs/smoke.toml [--nproc N]``.

Cluster discovery, in order: ``TF_CONFIG`` if set; Slurm (``SlurmClusterResolver``) when the step has more than
one task; otherwise a single worker. ``--nproc N`` starts N local workers with a generated ``TF_CONFIG`` on
free loopback ports (like ``torchrun --standalone``).
"""

from __future__ import annotations

import time

T0 = time.time()  # process start, for time-to-first-step (TF import counts: users pay it too)

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

from backends.base import Backend  # noqa: E402
from common import cli, slurm_layout  # noqa: E402
from common.reliability import EXIT_PREEMPTED  # noqa: E402

PROG = "backends.native"
STRATEGIES = ("mwms", "mirrored", "one_device")
COMMS = ("auto", "ring", "nccl")
EXIT_BARRIER_MS = 30_000  # ms to wait for peers at exit: they are all past their last collective within a second


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


class NativeBackend(Backend):
    name = "native"

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.strategy: Any = None
        self.comm_used = "n/a"
        self.device = "cpu"
        self.cluster: dict[str, Any] = {}

    # -- setup ---------------------------------------------------------------------------------
    def setup(self) -> None:
        import tensorflow as tf

        from common.train import configure_threads

        a = self.args
        self.local_rank = cli.env_int("TWINBENCH_LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", default=0)
        # the step's own task count per node first: an srun step may use fewer tasks than the job
        self.local_size = cli.env_int("TWINBENCH_LOCAL_SIZE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE",
                                      "OMPI_COMM_WORLD_LOCAL_SIZE", default=1)
        self.threads = configure_threads(self.local_size, a.threads)
        gpus = tf.config.list_physical_devices("GPU")
        # The physical GPU ids the launcher gave this task (Slurm sets them per task); recorded with the device,
        # since without a GPU behind them (fake gres, CPU runs) they are the only trace of the binding.
        self.visible_gpus = os.environ.get("CUDA_VISIBLE_DEVICES")
        self.physical_gpu = self.visible_gpus
        if gpus and a.strategy != "mirrored":
            # One device per worker, never the resolver's auto_set_gpu (it would overwrite what Slurm set):
            # - Slurm gave this task exactly one GPU (--gpus-per-task=1, --gpu-bind=single:1): that one;
            # - the task sees all the node's GPUs (--gres=gpu:N alone, mpirun): the local_rank-th
            #   (SLURM_LOCALID under srun), the rule Horovod ranks use.
            index = 0 if len(gpus) == 1 else self.local_rank % len(gpus)
            if len(gpus) > 1 and self.local_rank >= len(gpus):
                print(f"[{PROG}] warning: local rank {self.local_rank} but only {len(gpus)} GPUs visible; "
                      f"sharing GPU {index}", file=sys.stderr, flush=True)
            mine = gpus[index]
            tf.config.set_visible_devices(mine, "GPU")
            tf.config.experimental.set_memory_growth(mine, True)
            self.device = mine.name
            ids = (self.visible_gpus or "").split(",")
            self.physical_gpu = ids[index] if len(ids) == len(gpus) else str(index)
            gpus = [mine]
        if a.logical_cpus > 1:
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(a.logical_cpus)])

        if a.strategy == "mwms":
            self.strategy = self._mwms(tf, gpus)
            spec = self.strategy.cluster_resolver.cluster_spec().as_dict()
            workers = spec.get("worker", [])
            self.num_workers = max(len(workers), 1)
            self.rank = int(self.strategy.cluster_resolver.task_id or 0)
            self.cluster = {"workers": workers}
        elif a.strategy == "mirrored":
            devices = [d.name for d in tf.config.list_logical_devices("GPU")] or \
                      [d.name for d in tf.config.list_logical_devices("CPU")]
            self.strategy = tf.distribute.MirroredStrategy(devices=devices)
            self.device = ",".join(devices)
        else:
            dev = "/gpu:0" if gpus else "/cpu:0"
            self.strategy = tf.distribute.OneDeviceStrategy(dev)
            self.device = dev
        self.replicas_per_worker = self.strategy.num_replicas_in_sync // self.num_workers

    def _mwms(self, tf: Any, gpus: list[Any]) -> Any:
        a = self.args
        impl = tf.distribute.experimental.CommunicationImplementation
        choice = {"auto": impl.AUTO, "ring": impl.RING, "nccl": impl.NCCL}[a.comm]
        self.comm_used = a.comm
        if a.comm == "nccl" and not gpus:
            print(f"[{PROG}] warning: --comm nccl needs GPUs and none is visible; using RING (gRPC) collectives",
                  file=sys.stderr, flush=True)
            choice, self.comm_used = impl.RING, "ring"
        options = tf.distribute.experimental.CommunicationOptions(implementation=choice)
        resolver = None
        if not os.environ.get("TF_CONFIG") and cli.env_int("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", default=1) > 1:
            resolver = self._slurm_resolver(tf, len(gpus))
        # Must come before any other TF op: MWMS configures the runtime's collective ops when created.
        return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver, communication_options=options)

    def _slurm_resolver(self, tf: Any, visible_gpus: int) -> Any:
        """Cluster from Slurm's variables without nvidia-smi: SlurmClusterResolver only for the spec."""
        a = self.args
        gpn = a.gpus_per_node if a.gpus_per_node >= 0 else visible_gpus
        # The resolver lists only gpus_per_node // gpus_per_task tasks per node (and fails on a zero step when a
        # task sees one GPU or none): one GPU per task, and at least as many "GPUs" as tasks on the busiest node,
        # so every task is in the spec. With auto_set_gpu=False these numbers assign no device: the resolver would
        # overwrite the CUDA_VISIBLE_DEVICES Slurm set per task; setup() pins from what this task sees.
        per_node = os.environ.get("SLURM_STEP_TASKS_PER_NODE") or os.environ.get("SLURM_TASKS_PER_NODE") or "1"
        most_tasks = max(int(p.split("(")[0]) for p in per_node.split(","))
        slurm = tf.distribute.cluster_resolver.SlurmClusterResolver(
            port_base=a.port_base, gpus_per_node=max(gpn, most_tasks, 1), gpus_per_task=1, auto_set_gpu=False)
        spec = slurm.cluster_spec()
        self.cluster_source = "slurm"
        # The resolver sorts hostnames as strings and packs tasks in block order; Slurm's own layout (checked by
        # every task against its SLURMD_NODENAME/SLURM_LOCALID before TF started) wins when they differ, or
        # ranks would be looked for at addresses where other ranks listen.
        ours = slurm_layout.step_workers(a.port_base)
        if spec.as_dict().get("worker") != ours:
            if int(os.environ.get("SLURM_PROCID", "0")) == 0:
                print(f"[{PROG}] note: SlurmClusterResolver's worker order {spec.as_dict().get('worker')} is not "
                      f"Slurm's task layout ({slurm_layout.node_distribution(os.environ)} over the step's nodes); "
                      f"using Slurm's: {ours}", file=sys.stderr, flush=True)
            spec = tf.train.ClusterSpec({"worker": ours})
            self.cluster_source = "slurm (twinbench layout)"
        return tf.distribute.cluster_resolver.SimpleClusterResolver(
            cluster_spec=spec, task_type="worker", task_id=int(os.environ.get("SLURM_PROCID", "0")),
            num_accelerators={"GPU": min(visible_gpus, 1)}, rpc_layer="grpc")

    def describe(self) -> dict[str, Any]:
        device, visible = self.device, getattr(self, "visible_gpus", None)
        if visible is not None:  # "cpu (CUDA_VISIBLE_DEVICES=1)", ".../GPU:2 (CUDA_VISIBLE_DEVICES=0,1,2,3, GPU 2)"
            pick = f", GPU {self.physical_gpu}" if self.physical_gpu != visible else ""
            device = f"{device} (CUDA_VISIBLE_DEVICES={visible}{pick})"
        return {
            "strategy": type(self.strategy).__name__ if self.strategy is not None else None,
            "communication": self.comm_used,
            "replicas_per_worker": self.replicas_per_worker,
            "threads_per_process": getattr(self, "threads", None),
            "cluster": self.cluster,
            "cluster_source": getattr(self, "cluster_source",
                                      "tf_config" if os.environ.get("TF_CONFIG") else "single"),
            "device": device,
            "cuda_visible_devices": visible,
        }

    # -- training hooks ------------------------------------------------------------------------
    def scope(self) -> Any:
        return self.strategy.scope()

    def make_dataset(self, dataset_fn: Callable[[int, int, int], Any]) -> Any:
        per = self.replicas_per_worker
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
            per = self.replicas_per_worker

            def contribute(v: Any) -> Any:
                ctx = tf.distribute.get_replica_context()
                keep = tf.cast(tf.equal(ctx.replica_id_in_sync_group % per, 0), v.dtype)
                # identity: place the input on this replica's device (a collective needs a device to reduce to)
                return ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.identity(v) * keep)

            # One function for every shape (reduce_retracing): it is called at agreed steps and at the end.
            self._allsum_fn = tf.function(lambda v: self.strategy.run(contribute, args=(v,)), reduce_retracing=True)
        return self.strategy.experimental_local_results(self._allsum_fn(value))[0]


# -- local launcher (--nproc) ----------------------------------------------------------------------
def free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


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
    ports = free_ports(n)
    workers = [f"127.0.0.1:{p}" for p in ports]
    child_argv = [sys.executable, "-m", "backends.native", *strip_nproc(argv)]
    procs: list[subprocess.Popen[bytes]] = []
    for i in range(n):
        env = dict(os.environ)
        env["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})
        env["TWINBENCH_LOCAL_RANK"] = str(i)
        env["TWINBENCH_LOCAL_SIZE"] = str(n)
        env["TWINBENCH_LAUNCH_COMMAND"] = json.dumps(list(sys.orig_argv))
        procs.append(subprocess.Popen(child_argv, env=env))

    def forward(signum: int, frame: Any) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, forward)
    status = 0
    try:
        pending = set(range(n))
        while pending:
            for i in sorted(pending):
                rc = procs[i].poll()
                if rc is None:
                    continue
                pending.discard(i)
                if rc == EXIT_PREEMPTED and status in (0, EXIT_PREEMPTED):
                    status = EXIT_PREEMPTED  # the others checkpointed with it and are exiting too
                    continue
                if rc != 0 and status in (0, EXIT_PREEMPTED):
                    how = f"was killed by {signal.Signals(-rc).name}" if rc < 0 else f"exited with status {rc}"
                    status = rc if rc > 0 else 128 - rc
                    print(f"[{PROG}] worker {i} (pid {procs[i].pid}) {how} first; stopping the others",
                          file=sys.stderr, flush=True)
                    for j in pending:
                        procs[j].kill()  # not SIGTERM: that would ask them to checkpoint with a peer missing
            time.sleep(0.2)
    except KeyboardInterrupt:
        for p in procs:
            p.kill()
        status = 130
    return status


def check_slurm_env(port_base: int) -> None:
    """Under a multi-task Slurm step: the variables SlurmClusterResolver needs agree, and our port is free."""
    ntasks = cli.env_int("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", default=1)
    if ntasks <= 1:
        return
    if not os.environ.get("SLURM_STEP_NUM_TASKS"):
        # The batch script itself (not an srun step): one process, but the resolver would expect SLURM_NTASKS.
        raise cli.UsageError(f"SLURM_NTASKS={ntasks} but this process is not an srun step: launch with "
                             "`srun python -m backends.native ...` (one task per GPU), or use --nproc / TF_CONFIG")
    if not 1024 <= port_base <= 65535 - ntasks:
        raise cli.UsageError(f"--port-base {port_base} is out of range: use 1024..{65535 - ntasks} "
                             "(IDRIS allows 10000-20000)")
    missing = [v for v in ("SLURM_PROCID", "SLURM_LOCALID") if not os.environ.get(v)]
    if not (os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST")
            or os.environ.get("SLURM_NODELIST")):
        missing.append("SLURM_STEP_NODELIST")
    if not (os.environ.get("SLURM_STEP_TASKS_PER_NODE") or os.environ.get("SLURM_TASKS_PER_NODE")):
        missing.append("SLURM_STEP_TASKS_PER_NODE")
    if missing:
        raise cli.UsageError(f"SLURM_NTASKS={ntasks} but {', '.join(missing)} unset: launch with srun inside the "
                             "allocation (or unset SLURM_NTASKS / set TF_CONFIG)")
    procid = cli.env_int("SLURM_PROCID", default=0)
    localid = cli.env_int("SLURM_LOCALID", default=0)
    if not 0 <= procid < ntasks:
        raise cli.UsageError(f"inconsistent Slurm environment: SLURM_PROCID={procid} with {ntasks} tasks")
    try:
        slurm_layout.step_workers(port_base)  # this task's place in the layout MWMS will be given
    except slurm_layout.LayoutError as e:
        raise cli.UsageError(str(e)) from None
    port = port_base + localid  # the n-th task on a node listens on port_base + n
    with socket.socket() as s:
        # SO_REUSEADDR as gRPC binds: a port in TIME_WAIT from a previous run is free to use, not "in use".
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            raise cli.UsageError(f"port {port} (--port-base {port_base} + SLURM_LOCALID {localid}) is already in use "
                                 "on this node; pass another --port-base") from None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    cli.legacy_keras()
    cli.unset_proxies()
    job = cli.prepare(PROG, args)
    if args.nproc < 1:
        cli.fail(PROG, f"--nproc must be >= 1, got {args.nproc}")
    if args.nproc > 1:
        if os.environ.get("TF_CONFIG"):
            cli.fail(PROG, "--nproc generates TF_CONFIG itself: unset TF_CONFIG or drop --nproc")
        if args.strategy != "mwms":
            cli.fail(PROG, f"--nproc starts MultiWorkerMirrored workers; it cannot be combined with --strategy "
                           f"{args.strategy}")
        return launch_local(args.nproc, argv)
    if os.environ.get("TF_CONFIG"):
        try:
            tfc = json.loads(os.environ["TF_CONFIG"])
            assert isinstance(tfc["cluster"]["worker"], list) and isinstance(tfc["task"]["index"], int)
        except (ValueError, KeyError, TypeError, AssertionError):
            cli.fail(PROG, 'TF_CONFIG is malformed: expected {"cluster": {"worker": ["host:port", ...]}, '
                           '"task": {"type": "worker", "index": N}}')
    if not os.environ.get("TF_CONFIG") and args.strategy == "mwms":
        try:
            check_slurm_env(args.port_base)
        except cli.UsageError as e:
            cli.fail(PROG, str(e))
    try:
        backend = NativeBackend(args)
        backend.setup()
    except cli.UsageError as e:
        cli.fail(PROG, str(e))
    return cli.run_training(PROG, backend, job, args, T0)


if __name__ == "__main__":
    sys.exit(main())
