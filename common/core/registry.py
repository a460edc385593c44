"""The registry: the only list of backends in the project, and the one place ``common/`` reaches ``backends/``.

It is lazy: importing it imports no backend module, no TensorFlow and no Horovod, so the report, the sweep and the
doctor can iterate it cheaply and a native run never imports Horovod. Each entry names its module as a string;
``load`` imports it with ``importlib`` when asked. That call is the only way ``common/`` reaches ``backends/``
(scripts/check_structure.py fails on any static import of ``backends`` from ``common/``): the backends sit on top of
the shared code they implement the contract of (``common.core.contract``), and shared code that must start a
backend (the doctor, the check, the sweep's argument check) names it here, by string, at run time.

Each backend module is a ``common.core.contract.BackendSpec`` (``PROG``, ``T0``, a frozen ``Options`` dataclass
whose defaults are the flags', ``parser()``, ``make_backend()``, ``local_command(n, args)``: how to start ``n`` ranks
on this host, ``doctor()``, and ``main()``, a call of ``backends.entrypoint.run_main``) with one ``Backend``
subclass. Run them as modules (``python -m backends.native``), never by path: ``backends/horovod.py`` would shadow
the real ``horovod`` package.

Adding a backend: a module ``backends/NAME.py`` and one entry below (see docs/architecture.md).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import cast

from common.core.contract import BackendSpec


@dataclass(frozen=True)
class BackendEntry:
    """What code that never imports a backend (report, sweep, doctor) knows of it."""

    name: str  # the results' "backend" field, the entry point's module suffix and the sbatch script's stem
    module: str  # importable module: python -m <module>
    summary: str  # one line for help texts and the doctor
    color: str  # plot colour in the report
    slurm_script: str  # sbatch script under jobs/slurm/
    # How srun starts its ranks (one-allocation steps, the ReFrame check): here, not on its srun ``Launcher``, as
    # the ReFrame check reads them in ReFrame's process, which imports this module (the standard library only) but
    # no backend module (they import the project's packages, numpy first, which a centre's ReFrame need not have).
    srun_mpi: bool = False  # srun starts its ranks with --mpi=<plugin> (they wire up through PMI, not own ports)
    port_base: bool = False  # takes --port-base: its ranks listen on ports of their own, one block per Slurm job


REGISTRY: dict[str, BackendEntry] = {
    e.name: e
    for e in (
        BackendEntry("native", "backends.native", "tf.distribute MultiWorkerMirroredStrategy (Mirrored, OneDevice)",
                     "tab:blue", "jobs/slurm/native.sbatch", srun_mpi=False, port_base=True),
        BackendEntry("horovod", "backends.horovod", "Horovod allreduce, one process per device",
                     "tab:orange", "jobs/slurm/horovod.sbatch", srun_mpi=True, port_base=False),
    )
}
Pair = tuple[str, str]  # (numerator, denominator): the report's ratio of their images/s at each world size
# The report's comparisons when none is asked for (``python -m common.report DIR --pair NUM,DEN``): Horovod against
# native, the question twinbench exists for. The first pair is the headline (report.csv's ratio column).
PAIRS: tuple[Pair, ...] = (("horovod", "native"),)
# The report's migration question (common.report.migrate), leaving the numerator for the denominator: Horovod for
# native MWMS, fixed whatever pairs are compared, since its rows are those two backends' own (Horovod constructs not
# carried over, the horovod and horovod_patch versions, common.check's native vs Horovod answers).
MIGRATION: Pair = ("horovod", "native")


def names() -> tuple[str, ...]:
    """Every backend, in the report's table order."""
    return tuple(REGISTRY)


def entry(name: str) -> BackendEntry:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}: use one of {', '.join(REGISTRY)}") from None


def parse_pair(text: str) -> Pair:
    """``"toy,native"`` -> ("toy", "native"): two different registered backends, numerator first; ValueError
    naming the backends otherwise."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"a pair is NUM,DEN (two backends, e.g. {','.join(PAIRS[0])}), got {text!r}")
    for name in parts:
        entry(name)
    if parts[0] == parts[1]:
        raise ValueError(f"a pair compares two different backends, got {text!r}")
    return parts[0], parts[1]


def load(name: str) -> ModuleType:
    """Import a backend module by name only when it is asked for."""
    return importlib.import_module(entry(name).module)


def spec(name: str) -> BackendSpec:
    """The backend module as its typed contract: what the doctor, the launches and the sweep read of it (its
    ``LAUNCH`` and ``stack`` among them), imported when asked."""
    return cast(BackendSpec, load(name))
