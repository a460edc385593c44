"""Horovod backend: one process per device, allreduce. Always run as a module (``-m``), never by path:
``horovodrun -np 2 -H localhost:2 --gloo python -m backends.horovod --job jobs/smoke.toml``
(also under ``mpirun`` or ``srun --mpi=pmix``; which one twinbench's own launches use: backends/horovod_launch.py).
"""

from __future__ import annotations

import time

T0 = time.time()  # process start, for time-to-first-step (TF import counts: users pay it too)

import argparse  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from backends import entrypoint  # noqa: E402
from backends import horovod_knobs as knobs_mod  # noqa: E402
from backends import horovod_launch as launch  # noqa: E402
from common import cli  # noqa: E402
from common.cluster import container  # noqa: E402
from common.cluster.placement import configure_threads, pin_one_gpu  # noqa: E402
from common.core.contract import (  # noqa: E402
    Backend,
    BaseOptions,
    Capabilities,
    Collective,
    Diagnosis,
    Launch,
    RankInfo,
    StackCheck,
    Warmup,
)
from common.core.errors import UsageError  # noqa: E402
from common.training import keras3  # noqa: E402

PROG = "backends.horovod"


@dataclass(frozen=True)
class Options(BaseOptions):
    fp16_allreduce: bool = False  # compress gradients to float16 (off: it changes the math, parity needs it off)
    timeline: bool = False  # --profile-steps: Horovod's timeline can be started at run time (HOROVOD_TIMELINE)
    knobs: knobs_mod.KnobFlags = knobs_mod.KnobFlags()  # none given: Horovod's defaults or the launcher's values

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Options:
        return cls(threads=args.threads, cpu_bind=args.cpu_bind, fp16_allreduce=args.fp16_allreduce,
                   timeline=getattr(args, "profile_steps", None) is not None,
                   knobs=knobs_mod.KnobFlags.from_args(args))


class Parser(cli.OneLineParser):
    """Refuses flags that are wrong only together (``--autotune-log`` without ``--autotune``) while parsing, so that
    whoever parses a Horovod command line (this entry point, the sweep's --variant check) refuses it alike."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        ns, rest = super().parse_known_args(args, namespace)
        problem = knobs_mod.check(ns)
        if problem:
            self.error(problem)
        return ns, rest


def parser() -> argparse.ArgumentParser:
    p = cli.base_parser(PROG, "Run a twinbench job with Horovod (launch under horovodrun, mpirun or srun).", Parser)
    p.add_argument("--fp16-allreduce", action="store_true",
                   help="compress gradients to float16 for the allreduce (default off: exact parity with native)")
    knobs_mod.add_arguments(p)
    return cli.with_defaults(p, Options)


def local_command(n: int, args: list[str], python: str = sys.executable) -> list[str]:
    """The command that runs ``n`` ranks of this backend on this host, by the controller the build has or
    TWINBENCH_HOROVOD_CONTROLLER names (backends/horovod_launch.py); one rank: no launcher."""
    if n == 1:
        return [python, "-m", PROG, *args]  # hvd.init() with no launcher is a world of one
    return launch_command(f"localhost:{n}", n, args, python)


def launch_command(hosts: str, n: int, args: list[str], python: str = sys.executable,
                   controller: str | None = None) -> list[str]:
    """``n`` ranks on ``hosts`` (``localhost:2``, ``node1:2,node2:2``) under ``controller`` (``gloo``:
    ``horovodrun --gloo``, ``mpi``: ``mpirun``; None: TWINBENCH_HOROVOD_CONTROLLER, else what the build has)."""
    box = container.parse()
    wrap = (lambda cmd: container.wrap(cmd, box)) if box else None
    chosen = controller or launch.controller(python, wrap)
    if chosen == "gloo":
        return horovodrun_command(hosts, n, args, python)
    return launch.mpirun_command(hosts, n, [python, "-m", PROG, *args], iface=_iface(args),
                                 mpirun=launch.which_mpirun(python))


def _iface(args: list[str]) -> str | None:
    """The data interface of a launch: ``--iface`` in the ranks' ``args``, else TWINBENCH_IFACE."""
    iface = next((a.split("=", 1)[1] for a in args if a.startswith("--iface=")), None)
    if "--iface" in args[:-1]:
        iface = args[args.index("--iface") + 1]
    return iface or os.environ.get("TWINBENCH_IFACE")


def horovodrun_command(hosts: str, n: int, args: list[str], python: str = sys.executable) -> list[str]:
    """``horovodrun --gloo`` running ``n`` ranks on ``hosts`` (``node1:2,node2:2``), told the data interface
    (``--iface`` in ``args``, else TWINBENCH_IFACE) by ``--network-interface`` when a host is remote."""
    iface = _iface(args)
    remote = not launch.is_local(hosts)
    # horovodrun with only local hosts accepts loopback interfaces alone; the ranks' --iface then sets Gloo's
    nic = ["--network-interface", iface] if iface and remote else []
    return [str(Path(python).parent / "horovodrun"), "-np", str(n), "-H", hosts, "--gloo", *nic,
            *container.horovodrun_cache_flags(), python, "-m", PROG, *args]


def launch_env(python: str = sys.executable) -> tuple[dict[str, str], str]:
    """For a command about to start many runs: the variables to hand them (the controller, resolved and checked
    against the build once) and the line that says it; LaunchError (exit 2) when no launch can run."""
    box = container.parse()
    return launch.resolve_env(python, (lambda cmd: container.wrap(cmd, box)) if box else None)


def doctor(tf_version: str | None) -> Diagnosis:
    """Horovod must be built against this TensorFlow with a controller (Gloo or MPI); which patch it carries."""
    from common.core import buildinfo

    if tf_version is None:
        return Diagnosis(False, "cannot run: TensorFlow is not importable", {}, [])
    try:
        import horovod
        import horovod.tensorflow as hvd
    except Exception as e:  # noqa: BLE001 - report any import failure
        return Diagnosis(False, f"cannot run: {e}", {"horovod": None},
                         [f"horovod=={buildinfo.HOROVOD_VERSION} built with TensorFlow {tf_version} (make setup)"])
    built = {"gloo": bool(hvd.gloo_built()), "mpi": bool(hvd.mpi_built())}
    details: dict[str, Any] = {
        "horovod": horovod.__version__,
        "horovod_controllers": built,
        "horovod_ops": {"nccl": bool(hvd.nccl_built()), **built},
        "horovod_patch": buildinfo.horovod_patch_description(),
    }
    try:
        chosen = launch.resolve(launch.requested(), built)
    except launch.LaunchError as e:
        return Diagnosis(False, f"cannot run: {e}", details, [])
    details["horovod_launch"] = f"{launch.LAUNCHER[chosen]} ({launch.TITLE[chosen]} controller) for 2+ local ranks"
    return Diagnosis(True, "ok", details, [])


LAUNCH = Launch(launch.LAUNCHERS, slurm_variable="HVD_LAUNCH", env=launch_env)


# -- the stack doctor (python -m common.doctor --stack) ----------------------------------------------------------
def stack_facts() -> dict[str, Any]:
    """What this Python's Horovod and MPI are, read the way the runs read them (an import, Horovod's own build
    queries, ``mpirun --version``); called after the doctor imported TensorFlow."""
    facts: dict[str, Any] = {}
    try:
        import horovod
        import horovod.tensorflow as hvd

        facts["horovod"] = horovod.__version__
        # horovod.common.basics: mpi_built/gloo_built True or False, nccl_built NCCL's version code (0: none)
        facts["horovod_built"] = {"mpi": bool(hvd.mpi_built()), "gloo": bool(hvd.gloo_built()),
                                  "nccl": int(hvd.nccl_built()), "cuda": bool(hvd.cuda_built()),
                                  "rocm": bool(hvd.rocm_built())}
        from common.core import buildinfo

        facts["horovod_build"] = "twinbench's build" if buildinfo.read_marker() else "found in the stack"
        facts["horovod_controller_asked"] = os.environ.get(launch.ENV)
    except Exception as e:  # noqa: BLE001 - any import failure is the fact
        facts["horovod_error"] = f"{type(e).__name__}: {e}".splitlines()[0]
    mpirun = shutil.which("mpirun")
    if mpirun:
        try:
            v = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=20).stdout
            facts["mpi"] = (v.strip().splitlines() or ["?"])[0]
        except (OSError, subprocess.TimeoutExpired):
            facts["mpi"] = "?"
    return facts


def judge_stack(f: dict[str, Any], shared_ok: bool) -> StackCheck:
    """One line per fact of ``stack_facts``; Horovod can run when the shared stack can and a launch can start its
    ranks (backends/horovod_launch.py)."""
    built, lines = f.get("horovod_built"), []
    if built is None:
        lines.append(f"horovod: cannot run: horovod.tensorflow does not import ({f.get('horovod_error', '?')})")
    else:
        lines.append(f"horovod: {f['horovod']} with TensorFlow support, {f.get('horovod_build', '?')}: ok")
        ctl = [n for n in ("mpi", "gloo") if built[n]]
        lines.append("horovod controllers: " + (", ".join(c.upper() if c == "mpi" else c.title() for c in ctl)
                                                if ctl else "none: cannot run (built without MPI and Gloo)"))
        gpu = "NCCL" if built["nccl"] else ("MPI" if built["cuda"] or built["rocm"] else "none (a CPU build)")
        lines.append(f"horovod GPU operations: {gpu}")
    lines.append(f"mpi: {f['mpi']}" if f.get("mpi") else
                 "mpi: no mpirun on PATH (Horovod runs under horovodrun --gloo or srun --mpi=pmix)")
    launch_ok = False
    if built is not None:
        launch_lines, launch_ok = launch.stack_lines(built, f.get("horovod_controller_asked"), f.get("mpi"))
        lines += launch_lines
    return StackCheck(shared_ok and launch_ok, tuple(lines))


def stack(shared_ok: bool) -> StackCheck:
    """Horovod on this stack as it is: it imports with TensorFlow support, and a launch can start its ranks."""
    return judge_stack(stack_facts(), shared_ok)


class HorovodBackend(Backend):
    name = "horovod"

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.visible_gpus: str | None = None
        self.gpu = False  # this rank kept a GPU (pin_one_gpu)
        self.knob_env: dict[str, str] = {}  # the knobs' variables as hvd.init read them

    def _connect(self) -> RankInfo:
        try:
            import horovod.tensorflow as htf  # tensors: allreduce, broadcast, allgather
            import horovod.tensorflow.keras as hvd  # Keras: callbacks
        except ImportError as e:
            raise UsageError(
                f"Horovod is not importable ({e}); run `make setup` (or see README) to build it") from None
        import tensorflow as tf

        self.hvd, self.htf, self.tf = hvd, htf, tf
        if self.opts.timeline:
            # start_timeline() refuses to run unless HOROVOD_TIMELINE is set at init on every rank; DYNAMIC records
            # nothing until started (a user's own HOROVOD_TIMELINE=file is kept: that file is then switched)
            os.environ.setdefault("HOROVOD_TIMELINE", "DYNAMIC")
        knobs_mod.apply(self.opts.knobs, os.environ, PROG)  # Horovod reads them once, in hvd.init
        self.knob_env = knobs_mod.snapshot(os.environ)
        hvd.init()
        threads, cpus, bound = configure_threads(hvd.local_size(), self.opts.threads, hvd.local_rank(),
                                                 self.opts.cpu_bind)
        pin = pin_one_gpu(hvd.local_rank(), PROG)
        self.visible_gpus = pin.visible
        self.gpu = pin.device != "cpu"
        self._warn_hierarchical()
        self.compression = hvd.Compression.fp16 if self.opts.fp16_allreduce else hvd.Compression.none
        return RankInfo(rank=hvd.rank(), num_workers=hvd.size(), local_rank=hvd.local_rank(),
                        local_size=hvd.local_size(), replicas_per_worker=1, device=pin.label(), threads=threads,
                        cpus=tuple(cpus), cpu_bind=bound)

    def _controller(self) -> str:
        return "gloo" if self.hvd.gloo_enabled() else ("mpi" if self.hvd.mpi_enabled() else "?")

    def capabilities(self) -> Capabilities:
        return Capabilities(
            collective=self._collective(), controller=self._controller(), knobs=tuple(knobs_mod.knobs(self.knob_env)),
            compression="fp16" if self.opts.fp16_allreduce else "none",  # Horovod compresses before the allreduce
            every_rank_writes_checkpoint=False)  # rank 0 writes; the others get its state by broadcast on restore

    def describe(self) -> dict[str, Any]:
        hvd = self.hvd
        return {
            "controller": self._controller(),
            # TWINBENCH_HOROVOD_CONTROLLER as the ranks saw it (backends/horovod_launch.py; auto: unset)
            "controller_asked": os.environ.get(launch.ENV, "").strip().lower() or "auto",
            "local_size": hvd.local_size(),  # Horovod's own view of the placement (the record's topology agrees)
            "cross_size": hvd.cross_size(),
            "built": {"gloo": hvd.gloo_built(), "mpi": bool(hvd.mpi_built()), "nccl": bool(hvd.nccl_built())},
            "compression": "fp16" if self.opts.fp16_allreduce else "none",
            "threads_per_process": self.info.threads,
            "device": self.info.device,
            "cuda_visible_devices": self.visible_gpus,
            "hierarchical_allreduce_applies": self._hierarchical_applies(),
        }

    def _collective(self) -> Collective:
        """What carried the gradients: Horovod builds its op lists in this order and runs the first enabled one
        (operations.cc CreateOperationManager, 0.28.1): NCCL for GPU tensors when built with it, then Gloo's CPU ops
        when its Gloo context is on (controller gloo or HOROVOD_CPU_OPERATIONS=gloo: horovodrun --gloo sets both),
        then oneCCL's, then MPI's (the CPU operations' default under an MPI controller, docs/install.rst)."""
        hvd = self.hvd
        if self.gpu and hvd.nccl_built():
            return Collective("auto", "nccl", "GPU tensors, Horovod built with NCCL: its NCCL allreduce")
        where = ("this rank's GPU tensors go through host memory (Horovod built without NCCL); "
                 if self.gpu else "CPU tensors; ")
        cpu_ops = os.environ.get("HOROVOD_CPU_OPERATIONS", "").lower()
        if hvd.gloo_enabled():
            return Collective("auto", "gloo", where + "Horovod's Gloo context is on, whose ops come first")
        if cpu_ops == "ccl" and hvd.ccl_built():
            return Collective("auto", "ccl", where + "HOROVOD_CPU_OPERATIONS=ccl")
        if hvd.mpi_enabled():
            return Collective("auto", "mpi", where + "MPI controller, MPI CPU operations")
        return Collective("auto", "?", where + "neither Gloo nor MPI is enabled")

    def _hierarchical_applies(self) -> bool | None:
        """Whether Horovod honours HOROVOD_HIERARCHICAL_ALLREDUCE here (None: not asked): only across nodes and with
        NCCL GPU allreduce (operations.cc:569-577); elsewhere it is silently off."""
        if not knobs_mod.hierarchical_asked(self.knob_env):
            return None
        hvd = self.hvd
        return bool(hvd.size() != hvd.local_size() and self.gpu and hvd.nccl_built())

    def _warn_hierarchical(self) -> None:
        if self._hierarchical_applies() is False and self.hvd.rank() == 0:
            print(f"[{PROG}] warning: hierarchical allreduce asked for, but Horovod applies it only across nodes "
                  "with NCCL GPU allreduce: it is off in this run (the record still says it was asked for)",
                  file=sys.stderr, flush=True)

    def make_dataset(self, dataset_fn: Callable[[int, int, int], Any]) -> Any:
        return dataset_fn(self.rank, self.num_workers, 1)

    def fit_callbacks(self, warmup: Warmup | None) -> tuple[list[Any], bool]:
        hvd = self.hvd
        cbs = [hvd.callbacks.MetricAverageCallback()]
        if warmup is not None:
            # Horovod's own rule, in Horovod fit (twinbench re-implements it for native and the custom loop)
            cbs.append(hvd.callbacks.LearningRateWarmupCallback(
                initial_lr=warmup.learning_rate, warmup_epochs=warmup.epochs, momentum_correction=False,
                steps_per_epoch=warmup.steps_per_epoch, verbose=0))
        return self._keras_callbacks(cbs), warmup is not None

    def _keras_callbacks(self, cbs: list[Any]) -> list[Any]:
        for cb in cbs:
            # Horovod binds `keras.backend`, which is Keras 3 here; our models are tf_keras.
            cb.backend = self.tf.keras.backend
            # None of them reads a batch's logs: without this Keras would convert them, waiting for every step.
            cb._supports_tf_logs = True
        return cbs

    def run_step(self, step_fn: Callable[..., Any], batch: Any) -> Any:
        return [step_fn(*batch)]

    def reduce_gradients(self, grads: list[Any]) -> list[Any]:
        # What DistributedGradientTape(op=Sum) does: one allreduce per gradient (Horovod fuses them), SUM (each
        # replica's loss is already divided by the global batch), the run's compression, and nothing in a world of
        # one (its tf.cond on size() > 1). Not through Horovod's Keras module: it does not take Keras 3 variables
        # (Horovod issue 4290), and the tensors are all it needs.
        if self.num_workers == 1:
            return list(grads)
        htf = self.htf
        return [htf.allreduce(g, op=htf.Sum, compression=self.compression) for g in grads]

    def before_training(self, model: Any, optimizer: Any) -> None:
        # Same seed gives the same weights on every rank, but the chief's are the reference: make sure. The optimizer
        # state too (slots and iteration counter: common.training.train.build created them before step 1, and a
        # restore loaded them), so every rank's first step starts from rank 0's. Not Horovod's
        # BroadcastGlobalVariablesCallback in fit: after step 1 it would also copy rank 0's BatchNorm moving
        # statistics over the others', which MWMS never does.
        self.htf.broadcast_variables(keras3.tf_variables(model.variables), root_rank=0)
        self.htf.broadcast_variables(keras3.optimizer_variables(optimizer), root_rank=0)

    def sync_model_state(self, model: Any) -> None:
        # Each rank updated its BatchNorm moving statistics from its own batches (as every MWMS replica does).
        # MWMS stores them ON_READ with MEAN aggregation, so what it saves and evaluates is the mean over replicas;
        # the update is linear (m <- m*momentum + (1-momentum)*batch_stat), so averaging the per-rank values once
        # here gives exactly that, and a run resumed from averaged values ends on the same mean (to rounding).
        state = [v for v in keras3.tf_variables(model.non_trainable_variables) if v.dtype.is_floating]
        if self.num_workers == 1 or not state:
            return
        averaged = self.htf.grouped_allreduce([v.value() for v in state], op=self.htf.Average)
        for v, a in zip(state, averaged):
            v.assign(a)

    def restore(self, ckpt: Any, path: str, model: Any, optimizer: Any) -> None:
        if self.rank == 0:
            ckpt.read(path).assert_existing_objects_matched()
        # Everyone else takes rank 0's weights and optimizer state (slots exist: common.training.train created them).
        self.htf.broadcast_variables(keras3.tf_variables(model.variables), root_rank=0)
        self.htf.broadcast_variables(keras3.optimizer_variables(optimizer), root_rank=0)

    def start_timeline(self, path: str) -> bool:
        """Horovod's timeline from now into ``path``; only rank 0 (the coordinator) writes it: its negotiation
        rows show when each rank was ready for each allreduce."""
        self.htf.start_timeline(path, mark_cycles=False)
        return self.is_chief

    def stop_timeline(self) -> None:
        self.htf.stop_timeline()  # rank 0 flushes and closes the file before this returns

    def allsum(self, values: list[float]) -> list[float]:
        if self.num_workers == 1:
            return list(values)
        total = self.htf.allreduce(self.tf.constant(values, dtype=self.tf.float64), op=self.htf.Sum,
                                   name="twinbench_allsum")
        return [float(v) for v in total.numpy()]

    def allreduce_fn(self) -> Any:
        htf = self.htf
        # in a tf.function as in training (DistributedGradientTape); Horovod's fusion/cycle settings apply
        return self.tf.function(lambda v: htf.allreduce(v, op=htf.Sum, compression=self.compression),
                                reduce_retracing=True)

    def allgather(self, obj: Any) -> list[Any]:
        return list(self.htf.allgather_object(obj))

    def shutdown(self) -> None:
        self.hvd.shutdown()


def make_backend(args: argparse.Namespace, argv: list[str], job: Any) -> HorovodBackend:
    return HorovodBackend(Options.from_args(args))


def main(argv: list[str] | None = None) -> int:
    return entrypoint.run_main(PROG, T0, parser, make_backend, argv)


if __name__ == "__main__":
    sys.exit(main())
