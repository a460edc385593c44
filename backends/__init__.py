"""Backends: how a job is distributed. A lazy name -> module registry, so a native run never imports Horovod.

Each backend module defines ``make_backend(args) -> Backend`` and a ``main()`` entry point
(``python -m backends.native`` / ``python -m backends.horovod``; never run them by path: the file
``backends/horovod.py`` would shadow the real ``horovod`` package).
"""

from __future__ import annotations

import importlib
from types import ModuleType

REGISTRY = {
    "native": "backends.native",  # tf.distribute (MultiWorkerMirrored / Mirrored / OneDevice)
    "horovod": "backends.horovod",  # Horovod allreduce, one process per device
}


def load(name: str) -> ModuleType:
    """Import a backend module by name only when it is asked for."""
    try:
        return importlib.import_module(REGISTRY[name])
    except KeyError:
        raise ValueError(f"unknown backend {name!r}: use one of {', '.join(REGISTRY)}") from None
