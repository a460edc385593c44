"""Horovod backend: one process per device, allreduce. Always run as a module (``-m``), never by path:
``horovodrun -np 2 -H localhost:2 --gloo python -m backends.horovod --job jobs/smoke.toml``
(also under ``mpirun`` or ``srun --mpi=pmix``).
"""

from __future__ import annotations

import time

T0 = time.time()  # process start, for time-to-first-step (TF import counts: users pay it too)

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

from backends.base import Backend  # noqa: E402
from common import cli  # noqa: E402

PROG = "backends.horovod"


def parser() -> argparse.ArgumentParser:
    p = cli.base_parser(PROG, "Run a twinbench job with Horovod (launch under horovodrun, mpirun or srun).")
    p.add_argument("--fp16-allreduce", action="store_true",
                   help="compress gradients to float16 for the allreduce (default off: exact parity with native)")
    return p


class HorovodBackend(Backend):
    name = "horovod"

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.device = "cpu"

    def setup(self) -> None:
        try:
            import horovod.tensorflow as htf  # tensors: broadcast, allgather, DistributedGradientTape
            import horovod.tensorflow.keras as hvd  # Keras: DistributedOptimizer, callbacks
        except ImportError as e:
            raise cli.UsageError(
                f"Horovod is not importable ({e}); run `make setup` (or see README) to build it") from None
        import tensorflow as tf

        from common.train import configure_threads

        self.hvd, self.htf, self.tf = hvd, htf, tf
        hvd.init()
        self.rank, self.num_workers = hvd.rank(), hvd.size()
        self.local_rank, self.local_size = hvd.local_rank(), hvd.local_size()
        self.threads = configure_threads(self.local_size, self.args.threads)
        gpus = tf.config.list_physical_devices("GPU")
        # The physical GPU ids the launcher gave this process (Slurm sets them per task); recorded with the device,
        # since without a GPU behind them (fake gres, CPU runs) they are the only trace of the binding.
        self.visible_gpus = os.environ.get("CUDA_VISIBLE_DEVICES")
        self.physical_gpu = self.visible_gpus
        if gpus:
            # Pin one GPU per process: the only one if the launcher bound this task to one (srun --gpus-per-task=1),
            # else the local_rank-th of the node's GPUs (horovodrun, mpirun, srun with --gres=gpu:N alone).
            index = 0 if len(gpus) == 1 else self.local_rank % len(gpus)
            mine = gpus[index]
            tf.config.experimental.set_memory_growth(mine, True)
            tf.config.set_visible_devices(mine, "GPU")
            self.device = mine.name
            ids = (self.visible_gpus or "").split(",")
            self.physical_gpu = ids[index] if len(ids) == len(gpus) else str(index)
        self.compression = hvd.Compression.fp16 if self.args.fp16_allreduce else hvd.Compression.none

    def describe(self) -> dict[str, Any]:
        hvd = self.hvd
        device, visible = self.device, getattr(self, "visible_gpus", None)
        if visible is not None:  # "cpu (CUDA_VISIBLE_DEVICES=1)", ".../GPU:2 (CUDA_VISIBLE_DEVICES=0,1,2,3, GPU 2)"
            pick = f", GPU {self.physical_gpu}" if self.physical_gpu != visible else ""
            device = f"{device} (CUDA_VISIBLE_DEVICES={visible}{pick})"
        return {
            "controller": "gloo" if hvd.gloo_enabled() else ("mpi" if hvd.mpi_enabled() else "?"),
            "built": {"gloo": hvd.gloo_built(), "mpi": bool(hvd.mpi_built()), "nccl": bool(hvd.nccl_built())},
            "compression": "fp16" if self.args.fp16_allreduce else "none",
            "threads_per_process": self.threads,
            "fusion_threshold": os.environ.get("HOROVOD_FUSION_THRESHOLD", "default"),
            "cycle_time_ms": os.environ.get("HOROVOD_CYCLE_TIME", "default"),
            "device": device,
            "cuda_visible_devices": visible,
        }

    def make_dataset(self, dataset_fn: Callable[[int, int, int], Any]) -> Any:
        return dataset_fn(self.rank, self.num_workers, 1)

    def wrap_optimizer(self, optimizer: Any, mode: str) -> Any:
        if mode == "fit":
            # Keras' loss is the local mean here (no strategy), so Horovod's default Average is the global mean.
            return self.hvd.DistributedOptimizer(optimizer, compression=self.compression)
        return optimizer

    def fit_callbacks(self, job: Any, steps_per_epoch: int, learning_rate: float, fresh: bool = True) -> list[Any]:
        hvd, tf = self.hvd, self.tf
        backend = self

        class BroadcastOptimizerState(tf.keras.callbacks.Callback):
            """Rank 0's optimizer state after the first step, as ``after_first_step`` does in the custom loop.

            Not Horovod's BroadcastGlobalVariablesCallback: it would also copy rank 0's BatchNorm moving statistics
            over the others' after step 1, which MWMS never does (the model itself was broadcast before step 1).
            """

            done = False

            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                if not self.done:
                    backend.after_first_step(self.model, self.model.optimizer)
                    self.done = True

        cbs = [BroadcastOptimizerState(), hvd.callbacks.MetricAverageCallback()]
        if job.warmup_epochs and fresh:
            warm = hvd.callbacks.LearningRateWarmupCallback(
                initial_lr=learning_rate, warmup_epochs=job.warmup_epochs, momentum_correction=False,
                steps_per_epoch=steps_per_epoch, verbose=0)
            warm.provides_warmup = True
            cbs.append(warm)
        for cb in cbs:
            # Horovod binds `keras.backend`, which is Keras 3 here; our models are tf_keras.
            cb.backend = tf.keras.backend
        return cbs

    def wrap_tape(self, tape: Any) -> Any:
        # op=Sum: the shared loop already divides each replica's loss by the global batch (as MWMS expects).
        return self.htf.DistributedGradientTape(tape, op=self.htf.Sum, compression=self.compression)

    def run(self, step_fn: Callable[..., Any], batch: Any) -> Any:
        return [step_fn(*batch)]

    def before_training(self, model: Any) -> None:
        # Same seed gives the same weights on every rank, but the chief's are the reference: make sure.
        self.htf.broadcast_variables(model.variables, root_rank=0)

    def after_first_step(self, model: Any, optimizer: Any) -> None:
        # Optimizer slots exist only after the first apply_gradients.
        self.htf.broadcast_variables(optimizer.variables(), root_rank=0)

    def sync_model_state(self, model: Any) -> None:
        # Each rank updated its BatchNorm moving statistics from its own batches (as every MWMS replica does).
        # MWMS stores them ON_READ with MEAN aggregation, so what it saves and evaluates is the mean over replicas;
        # the update is linear (m <- m*momentum + (1-momentum)*batch_stat), so averaging the per-rank values once
        # here gives exactly that, and a run resumed from averaged values ends on the same mean (to rounding).
        state = [v for v in model.non_trainable_variables if v.dtype.is_floating]
        if self.num_workers == 1 or not state:
            return
        averaged = self.htf.grouped_allreduce([v.value() for v in state], op=self.htf.Average)
        for v, a in zip(state, averaged):
            v.assign(a)

    @property
    def writes_checkpoint(self) -> bool:
        return self.rank == 0  # rank 0 writes; the others get its state by broadcast on restore

    def restore(self, ckpt: Any, path: str, model: Any, optimizer: Any) -> None:
        if self.rank == 0:
            ckpt.read(path).assert_existing_objects_matched()
        # Everyone else takes rank 0's weights and optimizer state (slots exist: common.train created them).
        self.htf.broadcast_variables(model.variables, root_rank=0)
        self.htf.broadcast_variables(optimizer.variables(), root_rank=0)

    def any_flag(self, flag: bool) -> bool:
        if self.num_workers == 1:
            return flag
        total = self.htf.allreduce(self.tf.constant(1.0 if flag else 0.0), op=self.htf.Sum, name="twinbench_flag")
        return float(total) > 0

    def allreduce_fn(self) -> Any:
        htf = self.htf
        # in a tf.function as in training (DistributedGradientTape); Horovod's fusion/cycle settings apply
        return self.tf.function(lambda v: htf.allreduce(v, op=htf.Sum, compression=self.compression),
                                reduce_retracing=True)

    def allgather(self, obj: Any) -> list[Any]:
        return list(self.htf.allgather_object(obj))

    def shutdown(self) -> None:
        self.hvd.shutdown()


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    cli.legacy_keras()
    cli.unset_proxies()
    job = cli.prepare(PROG, args)
    backend = HorovodBackend(args)
    try:
        backend.setup()
    except cli.UsageError as e:
        cli.fail(PROG, str(e))
    return cli.run_training(PROG, backend, job, args, T0)


if __name__ == "__main__":
    sys.exit(main())
