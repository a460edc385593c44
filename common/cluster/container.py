"""Running the ranks inside a site's container image, and where launchers may write in one.

No TensorFlow here: the launchers build their command lines from this module before anything starts.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

HOROVODRUN_CACHE = ".horovod"  # horovodrun's cache of its start-up checks: ~/.horovod (horovod/runner/launch.py)


def writable_dir(path: str | os.PathLike[str]) -> bool:
    """Whether a file can be created in ``path``, or ``path`` can be created (its nearest existing parent is
    writable): an image's home is often read-only, and a bound home may be another user's."""
    p = Path(path)
    while not p.exists():
        if p.parent == p:
            return False
        p = p.parent
    if not p.is_dir():
        return False
    try:  # by trying: os.access says yes to root on a read-only mount's directory, or on /proc
        fd, name = tempfile.mkstemp(prefix=".twinbench-w", dir=p)
    except OSError:
        return False
    os.close(fd)
    os.unlink(name)
    return True


def horovodrun_cache_flags(home: str | None = None) -> list[str]:
    """``--disable-cache`` when horovodrun could not write its cache (``$HOME/.horovod``, fixed at its import from
    ``$HOME``): it would stop with ``OSError: Read-only file system``. The cache only spares the ssh and network
    checks of a later launch within 60 minutes, never part of a measured run."""
    home = home if home is not None else os.path.expanduser("~")
    return [] if writable_dir(Path(home) / HOROVODRUN_CACHE) else ["--disable-cache"]
