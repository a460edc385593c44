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
from common import cli  # noqa: E402

PROG = "backends.native"
STRATEGIES = ("mwms", "mirrored", "one_device")
COMMS = ("auto", "ring", "nccl")


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
        self.local_size = cli.env_int("TWINBENCH_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE",
                                      "OMPI_COMM_WORLD_LOCAL_SIZE", default=1)
        self.threads = configure_threads(self.local_size, a.threads)
        gpus = tf.config.list_physical_devices("GPU")
        if gpus and a.strategy != "mirrored":
            # One device per worker: if this process sees several GPUs, take the local_rank-th (what Horovod does).
            mine = gpus[self.local_rank % len(gpus)] if len(gpus) > 1 else gpus[0]
            tf.config.set_visible_devices(mine, "GPU")
            tf.config.experimental.set_memory_growth(mine, True)
            self.device = mine.name
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
        # auto_set_gpu=False: the resolver would overwrite CUDA_VISIBLE_DEVICES that Slurm already set per task;
        # pinning is done in setup() from the GPUs this task sees.
        slurm = tf.distribute.cluster_resolver.SlurmClusterResolver(
            port_base=a.port_base, gpus_per_node=max(gpn, 1), auto_set_gpu=False)
        self.cluster_source = "slurm"
        return tf.distribute.cluster_resolver.SimpleClusterResolver(
            cluster_spec=slurm.cluster_spec(), task_type=slurm.task_type, task_id=slurm.task_id,
            num_accelerators={"GPU": min(visible_gpus, 1)}, rpc_layer="grpc")

    def describe(self) -> dict[str, Any]:
        return {
            "strategy": type(self.strategy).__name__ if self.strategy is not None else None,
            "communication": self.comm_used,
            "replicas_per_worker": self.replicas_per_worker,
            "threads_per_process": getattr(self, "threads", None),
            "cluster": self.cluster,
            "cluster_source": getattr(self, "cluster_source",
                                      "tf_config" if os.environ.get("TF_CONFIG") else "single"),
            "device": self.device,
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

    def _sum_rows(self, vec: Any) -> Any:
        """All-gather by all-reduce: each worker writes its row of a zero matrix, SUM gives every row to all."""
        import numpy as np
        import tensorflow as tf

        placed = np.zeros((self.num_workers, *vec.shape), dtype=np.float64)
        placed[self.rank] = vec
        per = self.replicas_per_worker

        def contribute() -> Any:
            ctx = tf.distribute.get_replica_context()
            keep = tf.cast(tf.equal(ctx.replica_id_in_sync_group % per, 0), tf.float64)  # one replica per worker
            return ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.constant(placed) * keep)

        out = self.strategy.run(tf.function(contribute))
        return self.strategy.experimental_local_results(out)[0].numpy()


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
    """Start n workers of this module with TF_CONFIG on loopback; the first failure stops the others."""
    ports = free_ports(n)
    workers = [f"127.0.0.1:{p}" for p in ports]
    child_argv = [sys.executable, "-m", "backends.native", *strip_nproc(argv)]
    procs = []
    for i in range(n):
        env = dict(os.environ)
        env["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})
        env["TWINBENCH_LOCAL_RANK"] = str(i)
        env["TWINBENCH_LOCAL_SIZE"] = str(n)
        env["TWINBENCH_LAUNCH_COMMAND"] = json.dumps(list(sys.orig_argv))
        procs.append(subprocess.Popen(child_argv, env=env))
    status = 0
    try:
        pending = set(range(n))
        while pending:
            for i in sorted(pending):
                rc = procs[i].poll()
                if rc is None:
                    continue
                pending.discard(i)
                if rc != 0 and status == 0:
                    status = rc if rc > 0 else 128 - rc
                    print(f"[{PROG}] worker {i} exited with status {rc}; stopping the others", file=sys.stderr,
                          flush=True)
                    for j in pending:
                        procs[j].send_signal(signal.SIGTERM)
            time.sleep(0.2)
    except KeyboardInterrupt:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        status = 130
    return status


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
    try:
        backend = NativeBackend(args)
        backend.setup()
    except cli.UsageError as e:
        cli.fail(PROG, str(e))
    return cli.run_training(PROG, backend, job, args, T0)


if __name__ == "__main__":
    sys.exit(main())
