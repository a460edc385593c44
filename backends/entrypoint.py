"""The one ``main`` of every backend entry point: each ``backends/NAME.py`` says ``run_main(this module, argv)``.

In order: parse (bad flags: one line, exit 2), check the job and the run options (``common.cli.prepare``, still
before TensorFlow starts), let the module make its backend (or run a launcher instead), set it up, and run the job
(``common.runner``: exit 0, 3 or 75).
"""

from __future__ import annotations

import sys

from backends.base import BackendSpec
from common import cli, runner
from common.errors import UsageError, fail


def run_main(spec: BackendSpec, argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = spec.parser().parse_args(argv)
    cli.legacy_keras()
    cli.unset_proxies()
    job, run_opts = cli.prepare(spec.PROG, args, spec.T0)
    try:
        backend = spec.make_backend(args, argv, job)
        if isinstance(backend, int):  # a launcher ran the ranks (or this task served them) and is done
            return backend
        backend.setup()
    except UsageError as e:
        fail(spec.PROG, str(e))
    return runner.run(spec.PROG, backend, job, run_opts)
