"""A third backend, written as a newcomer adding one would: this module plus one registry line (which
tests/test_registry.py adds for the test). One process, no communication: every collective of the contract is the
identity. ``python -m tests.toy_backend --job jobs/smoke.toml --results DIR``.
"""

from __future__ import annotations

import time

T0 = time.time()  # process start, for time-to-first-step

import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

from backends.base import Backend, Collective, Diagnosis, RankInfo, configure_threads  # noqa: E402
from common import cli, runner  # noqa: E402

PROG = "tests.toy_backend"


def local_command(n: int, args: list[str], python: str = sys.executable) -> list[str]:
    """The command that runs this backend on this host: one process (the toy has no launcher)."""
    if n != 1:
        raise ValueError("the toy backend runs one process")
    return [python, "-m", PROG, *args]


def doctor(tf_version: str | None) -> Diagnosis:
    ok = tf_version is not None
    return Diagnosis(ok, "ok" if ok else "cannot run: TensorFlow is not importable", {}, [])


class ToyBackend(Backend):
    name = "toy"

    def _connect(self) -> RankInfo:
        threads, cpus, bound = configure_threads(1, 0)
        return RankInfo(rank=0, num_workers=1, local_rank=0, local_size=1, replicas_per_worker=1, device="cpu",
                        threads=threads, cpus=tuple(cpus), cpu_bind=bound)

    def describe(self) -> dict[str, Any]:
        return {"device": self.info.device, "threads_per_process": self.info.threads}

    def collective(self) -> Collective:
        return Collective("auto", "none", "one process: nothing to reduce")

    def make_dataset(self, dataset_fn: Callable[[int, int, int], Any]) -> Any:
        return dataset_fn(0, 1, 1)

    def run(self, step_fn: Callable[..., Any], batch: Any) -> Any:
        return [step_fn(*batch)]

    def allsum(self, values: list[float]) -> list[float]:
        return list(values)

    def allreduce_fn(self) -> Any:
        return lambda v: v

    def allgather(self, obj: Any) -> list[Any]:
        return [obj]


def main(argv: list[str] | None = None) -> int:
    args = cli.base_parser(PROG, "Run a twinbench job on the toy backend.").parse_args(argv)
    cli.legacy_keras()
    job, run_opts = cli.prepare(PROG, args, T0)
    backend = ToyBackend()
    backend.setup()
    return runner.run(PROG, backend, job, run_opts)


if __name__ == "__main__":
    sys.exit(main())
