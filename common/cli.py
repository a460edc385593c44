"""Command-line handling shared by both entry points. No TensorFlow import: bad input exits 2 before TF starts."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from common.job import Job, JobError, load_job

REPO = Path(__file__).resolve().parent.parent
DEFAULT_JOB = REPO / "jobs" / "smoke.toml"
EXIT_USAGE = 2  # bad input: config, flags or environment
PROXY_VARS = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")


class UsageError(Exception):
    """Bad input; its message is the one line the user sees."""


def fail(prog: str, message: str) -> NoReturn:
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
    sys.exit(EXIT_USAGE)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is a single line on stderr (and exit 2), not a usage dump."""

    def error(self, message: str) -> NoReturn:
        fail(self.prog, f"{message} (see --help)")


def base_parser(prog: str, description: str) -> OneLineParser:
    p = OneLineParser(prog=prog, description=description)
    p.add_argument("--job", default=str(DEFAULT_JOB), help="job TOML file (default: jobs/smoke.toml)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a job key (repeatable); type-checked, unknown keys are an error")
    p.add_argument("--results", default="results", help="directory for the run's results JSON (default: results)")
    p.add_argument("--threads", type=int, default=0,
                   help="intra-op threads per process (default 0 = cores / processes on this host)")
    p.add_argument("--quiet", action="store_true", help="no progress output (results are still written)")
    return p


def prepare(prog: str, args: argparse.Namespace) -> Job:
    """Everything that can be checked before TensorFlow starts: job, data files, results dir."""
    from common import data as data_mod
    from common import results as res

    try:
        job = load_job(args.job, args.sets)
        n, _, _ = data_mod.dataset_info(job)
        job.resolve_steps(n, 1)  # cheapest check that the data fills at least one batch
        if args.results:
            res.check_results_dir(args.results)
    except (JobError, data_mod.DataError, OSError) as e:
        fail(prog, str(e))
    if args.threads < 0:
        fail(prog, f"--threads must be >= 0, got {args.threads}")
    return job


def unset_proxies() -> None:
    """gRPC (MWMS) and Gloo rendezvous would otherwise try to reach peers through a site HTTP proxy."""
    for v in PROXY_VARS:
        os.environ.pop(v, None)


def legacy_keras() -> None:
    """Both backends use tf_keras: Keras 3 breaks MWMS fit and silently disables Horovod's averaging."""
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # hide TF's INFO banner; warnings and errors stay


def command_line() -> list[str]:
    """The exact command line: the launcher's under --nproc (it passes it down), else this process's."""
    import json

    launched = os.environ.get("TWINBENCH_LAUNCH_COMMAND")
    return json.loads(launched) if launched else list(sys.orig_argv)


def env_int(*names: str, default: int) -> int:
    """First of ``names`` set in the environment, as an int; a malformed value is a usage error."""
    for n in names:
        v = os.environ.get(n)
        if v not in (None, ""):
            try:
                return int(v.split("(")[0].split(",")[0])
            except ValueError:
                raise UsageError(f"environment variable {n}={v!r} is not an integer") from None
    return default


def run_training(prog: str, backend: Any, job: Job, args: argparse.Namespace, t0: float) -> int:
    from common.train import train

    train(job, backend, t_process_start=t0, command=command_line(), results_dir=args.results,
          verbose=not args.quiet)
    backend.shutdown()
    return 0
