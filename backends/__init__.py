"""Backends: how a job is distributed. ``REGISTRY`` is the only list of backends in the project.

It is lazy (importing this package imports no backend module, no TensorFlow and no Horovod), so the report, the
sweep and the doctor can iterate it cheaply and a native run never imports Horovod. Each backend module is a
``backends.base.BackendSpec`` (``PROG``, ``T0``, a frozen ``Options`` dataclass whose defaults are the flags',
``parser()``, ``make_backend()``, ``local_command(n, args)``: how to start ``n`` ranks on this host, ``doctor()``,
and ``main()``, a call of ``backends.entrypoint.run_main``) with one ``Backend`` subclass (the contract in
``backends.base``). Run them as modules (``python -m backends.native``), never by path: ``backends/horovod.py``
would shadow the real ``horovod`` package.

Adding a backend: a module ``backends/NAME.py`` and one entry below (see docs/architecture.md).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class BackendEntry:
    """What code that never imports a backend (report, sweep, doctor) knows of it."""

    name: str  # the results' "backend" field, the entry point's module suffix and the sbatch script's stem
    module: str  # importable module: python -m <module>
    summary: str  # one line for help texts and the doctor
    color: str  # plot colour in the report
    slurm_script: str  # sbatch script under jobs/slurm/


REGISTRY: dict[str, BackendEntry] = {
    e.name: e
    for e in (
        BackendEntry("native", "backends.native", "tf.distribute MultiWorkerMirroredStrategy (Mirrored, OneDevice)",
                     "tab:blue", "jobs/slurm/native.sbatch"),
        BackendEntry("horovod", "backends.horovod", "Horovod allreduce, one process per device",
                     "tab:orange", "jobs/slurm/horovod.sbatch"),
    )
}
# The report's headline ratio: numerator / denominator of images/s at each world size (the first two backends).
RATIO = ("horovod", "native")


def names() -> tuple[str, ...]:
    """Every backend, in the report's table order."""
    return tuple(REGISTRY)


def entry(name: str) -> BackendEntry:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}: use one of {', '.join(REGISTRY)}") from None


def load(name: str) -> ModuleType:
    """Import a backend module by name only when it is asked for."""
    return importlib.import_module(entry(name).module)
