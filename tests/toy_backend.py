"""A third backend, written as a newcomer adding one would: this module plus one registry line (which
tests/test_registry.py adds for the test). One process, no communication: every collective of the contract is the
identity. ``python -m tests.toy_backend --job jobs/smoke.toml --results DIR``.
"""

from __future__ import annotations

import time

T0 = time.time()  # process start, for time-to-first-step

import sys  # noqa: E402
from typing import Any  # noqa: E402

from backends import entrypoint
from common import cli  # noqa: E402
from common.cluster import placement  # noqa: E402
from common.core import contract as base  # noqa: E402

PROG = "tests.toy_backend"
Options = base.BaseOptions  # no flags of its own


def parser() -> Any:
    return cli.base_parser(PROG, "Run a twinbench job on the toy backend.")


def make_backend(args: Any, argv: list[str], job: Any) -> base.Backend:
    return ToyBackend()  # no options, no launcher


def local_command(n: int, args: list[str], python: str = sys.executable) -> list[str]:
    if n != 1:
        raise ValueError("the toy backend runs one process (it has no launcher)")
    return [python, "-m", PROG, *args]


def doctor(tf_version: str | None) -> base.Diagnosis:
    ok = tf_version is not None
    return base.Diagnosis(ok, "ok" if ok else "cannot run: TensorFlow is not importable", {}, [])


# One process started as it is: nothing to resolve before (Launch's default env), no Slurm launcher of its own.
LAUNCH = base.Launch((base.Launcher("python", ("local",), "python -m tests.toy_backend: one process"),))


def stack(shared_ok: bool) -> base.StackCheck:
    return base.StackCheck(shared_ok, ("toy: nothing beyond TensorFlow",))


class ToyBackend(base.Backend):
    name = "toy"

    def _connect(self) -> base.RankInfo:
        threads, cpus, bound = placement.configure_threads(1, 0)
        return base.RankInfo(rank=0, num_workers=1, local_rank=0, local_size=1, replicas_per_worker=1,
                             device="cpu", threads=threads, cpus=tuple(cpus), cpu_bind=bound)

    def capabilities(self) -> base.Capabilities:
        return base.Capabilities(base.Collective("auto", "none", "one process: nothing to reduce"))

    def make_dataset(self, dataset_fn: Any) -> Any:
        return dataset_fn(0, 1, 1)

    def run_step(self, step_fn: Any, batch: Any) -> Any:
        return [step_fn(*batch)]

    def reduce_gradients(self, grads: list[Any]) -> list[Any]:
        return list(grads)  # the only replica: its gradients are the sum

    def allsum(self, values: list[float]) -> list[float]:
        return list(values)

    def allreduce_fn(self) -> Any:
        return lambda v: v

    def allgather(self, obj: Any) -> list[Any]:
        return [obj]


def main(argv: list[str] | None = None) -> int:
    return entrypoint.run_main(PROG, T0, parser, make_backend, argv)


if __name__ == "__main__":
    sys.exit(main())
