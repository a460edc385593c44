"""The one ``main`` of every backend entry point: each ``backends/NAME.py``'s ``main`` is a call of ``run_main``.

In order: parse (bad flags: one line, exit 2), check the job and the run options (``common.cli.prepare``, still
before TensorFlow starts), let the module make its backend (or run a launcher instead), set it up, and run the job
(``common.runner``: exit 0, 3 or 75).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from common import cli, runner
from common.core import tfquiet
from common.core.contract import Backend
from common.core.errors import UsageError, fail


def run_main(prog: str, t0: float, parser: Callable[[], argparse.ArgumentParser],
             make_backend: Callable[[argparse.Namespace, list[str], Any], Backend | int],
             argv: list[str] | None = None) -> int:
    """``main`` of a backend module, from its ``BackendSpec`` members (passed one by one: a module run by
    ``runpy`` is not ``sys.modules[__name__]``)."""
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    cli.legacy_keras()
    cli.unset_proxies()
    job, run_opts, facts = cli.prepare(prog, args, t0)
    try:
        backend = make_backend(args, argv, job)
        if isinstance(backend, int):  # a launcher ran the ranks (or this task served them) and is done
            return backend
        tfquiet.import_tensorflow()  # this process is a rank: TensorFlow, without a GPU probe's lines on a CPU
        backend.setup()
    except UsageError as e:
        fail(prog, str(e))
    # A user dataset function runs here, after set-up: one returning a tf.data.Dataset starts TensorFlow's runtime,
    # whose threads the backend has sized by now (and its batch-size parameter needs the world size).
    if run_opts.bench is None:
        facts = cli.load_user_data(prog, job, backend.num_replicas, backend.is_chief and run_opts.verbose) or facts
    return runner.run_to_exit(prog, backend, job, run_opts, facts)
