"""Exit statuses and the exceptions that carry them: the bottom module, importing nothing of the project.

Everything that decides how a process ends (bad input, a lost peer, a preemption) is named here once, so the entry
points, the runner, the training loop and the launchers agree without importing one another.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any, NoReturn

EXIT_USAGE = 2  # bad input (config, flags, environment): one line on stderr, before TensorFlow where possible
EXIT_PEER_LOST = 3  # a peer died or the job stalled: the run is lost, start it again
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: a checkpoint was written, launch the same command again to resume


class UsageError(Exception):
    """Bad input; its message is the one line the user sees (exit ``EXIT_USAGE``)."""


class Preempted(Exception):
    """The run stopped on a signal after writing a checkpoint; relaunching the same command resumes it."""


class PeerLost(Exception):
    """A collective failed because a peer rank no longer answers; ``peers`` names them (rank, host, pid)."""

    def __init__(self, peers: list[dict[str, Any]], cause: BaseException) -> None:
        self.peers = peers
        self.who = ", ".join(f"rank {p['rank']} (host {p['host']}, pid {p['pid']})" for p in peers)
        first = (str(cause).strip().splitlines() or [type(cause).__name__])[0][:200]
        self.detail = f"{type(cause).__name__}: {first}"  # the failed collective's own first line
        super().__init__(f"lost {self.who}: it no longer answers ({self.detail})")


def one_line(e: BaseException, *, with_type: bool = True, limit: int = 300) -> str:
    """The informative first line of an exception for a one-line error: Keras' "Exception encountered" / "Call
    arguments" lines and TF's graph-node dump left out, prefixed by the exception's type unless ``with_type`` is
    False, at most ``limit`` characters."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    useful = [ln for ln in lines if not ln.startswith(("Exception encountered", "Call arguments received", "•"))]
    line = (useful or lines or [""])[0]
    line = re.sub(r" for '\{\{node .*?\}\}.*?' with", " with", line)  # "for '{{node x}} = MaxPool[...]' with"
    if with_type:
        line = f"{type(e).__name__}: {line}" if line else type(e).__name__
    line = line or type(e).__name__
    return line if len(line) <= limit else line[:limit - 3] + "..."


def fail(prog: str, message: str) -> NoReturn:
    """The one way bad input ends a process: ``PROG: error: MESSAGE`` on stderr, status 2."""
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
    sys.exit(EXIT_USAGE)


AUTOGRAPH_PREFIX = "__autograph_generated_file"  # tensorflow/python/autograph/pyct/loader.py, load_source


def exit_now(code: int) -> NoReturn:
    """End the process at once, without the interpreter's teardown (TensorFlow's destructors and thread pools cost
    about a second per process, and may block on a dead collective), once the caller has written its work and
    passed its last collective. What the skipped atexit hooks would have cleaned is cleaned here: TensorFlow's
    autograph writes every function it converts to a temporary file named ``__autograph_generated_file*.py`` and
    imports it as a module of that name, deleting the file only in an atexit hook (autograph/pyct/loader.py); left
    alone, every process would leave several of them in $TMPDIR (5 for the smoke job)."""
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None) if name.startswith(AUTOGRAPH_PREFIX) else None
        if path and os.path.basename(path).startswith(AUTOGRAPH_PREFIX):
            try:
                os.remove(path)
            except OSError:
                pass  # already gone (another cleaner of $TMPDIR): nothing to do
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
