"""What a command that starts many runs resolves once for all their launch lines: each backend's ``LAUNCH.env``
(``common.core.contract.Launch``; Horovod: the controller its build has or TWINBENCH_HOROVOD_CONTROLLER names,
backends/horovod_launch.py; by default nothing), checked before any run (UsageError: one line, exit 2), then exported
while the runs start. No TensorFlow here."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping

from common.core import registry


def resolve(backends: Iterable[str], python: str) -> tuple[dict[str, str], list[str]]:
    """The variables every launch line of ``backends`` (ranks run by ``python``) should see, and one line per
    backend saying its choice; backends whose launch has no choice add nothing."""
    env: dict[str, str] = {}
    said = []
    for name in backends:
        resolved = registry.spec(name).LAUNCH.env(python)
        if resolved is not None:
            more, line = resolved
            env.update(more)
            said.append(line)
    return env, said


@contextlib.contextmanager
def exported(env: Mapping[str, str]) -> Iterator[None]:
    """``env`` in this process's environment while its runs start (their launch lines and the runs read it), the
    earlier values after: a caller in the same process (a test) sees no change."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
