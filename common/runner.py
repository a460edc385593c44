"""How a set-up backend's run ends: exit 0 when done, 75 after a preemption checkpoint, 3 naming a lost peer, 1 naming
the exception of a rank that failed (its traceback first, then one line with its rank).

The entry points (``backends/*.py``) parse, prepare and set up; this module runs the job (or the microbenchmark, or
the ``--diagnose breakdown`` run) and turns its outcome into the exit statuses docs/reliability.md documents.
"""

from __future__ import annotations

import sys
import traceback
from typing import TYPE_CHECKING, NoReturn

from common.core.contract import Backend
from common.core.errors import (
    EXIT_PEER_LOST,
    EXIT_PREEMPTED,
    PeerLost,
    Preempted,
    UsageError,
    exit_now,
    fail,
    one_line,
)
from common.training.runconfig import RunOptions
from common.workload.job import Job

if TYPE_CHECKING:
    from common.workload.data import DataFacts

EXIT_FAILED = 1  # what an uncaught exception gives a Python process: launchers and sbatch scripts read it as failed


def run_to_exit(prog: str, backend: Backend, job: Job, opts: RunOptions, facts: DataFacts | None = None) -> NoReturn:
    """Train (or benchmark, or diagnose) on a set-up backend, then end the process with 0, 2, 3 or 75. ``facts``: the
    training data's, as ``common.cli`` worked them out (None: the plan works them out)."""
    from common.training.train import train

    if opts.bench is not None:
        from common.diagnostics.allreduce import run_allreduce

        run_allreduce(backend, opts.bench, opts.results_dir, list(opts.command),
                      verbose=opts.verbose and backend.is_chief, iface=opts.iface)
        backend.exit_barrier()
        backend.shutdown()
        exit_now(0)
    try:
        if opts.diagnose == "breakdown":
            from common.diagnostics.breakdown import run_breakdown

            run_breakdown(job, backend, opts, facts)  # a diagnostic run: its own record, never a benchmark's
        else:
            train(job, backend, opts, facts)
    except UsageError as e:
        fail(prog, str(e))
    except Preempted as e:
        if backend.is_chief:
            print(f"[twinbench] preempted: {e}", file=sys.stderr, flush=True)
        backend.exit_barrier()  # exit_now is instant: without the barrier a peer still in the last collective fails
        exit_now(EXIT_PREEMPTED)  # skip TF/Horovod teardown: the checkpoint is safe, exit promptly
    except PeerLost as e:
        print(f"[twinbench] error: lost {e.who}: it no longer answers; rank {backend.rank} stops ({e.detail})",
              file=sys.stderr, flush=True)
        exit_now(EXIT_PEER_LOST)
    except Exception as e:  # noqa: BLE001 - any other failure is this rank's own: said as such, never as a lost peer
        traceback.print_exc()
        print(f"[twinbench] error: rank {backend.rank} failed: {one_line(e)}", file=sys.stderr, flush=True)
        exit_now(EXIT_FAILED)  # no teardown: TF/Horovod threads may wait in a collective the peers left
    backend.exit_barrier()
    backend.shutdown()
    exit_now(0)

