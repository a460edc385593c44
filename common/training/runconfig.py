"""The runtime options of one run (not part of the job's identity): typed and frozen, made once by ``common.cli``."""

from __future__ import annotations

from dataclasses import dataclass

from common.training.reliability import PEER_TIMEOUT, STALL_TIMEOUT

# Preemption agreements (one small collective each, at a host sync): about once a second by default (a signal is
# acted on within a second or so, at a cost of one collective per second), every 10 steps until the step is timed.
PREEMPT_CHECK_SECONDS = 1.0
PREEMPT_CHECK_STEPS = 10
# The chief's progress line: often enough to see a long run move, rare enough not to flood a batch log.
PROGRESS_SECONDS = 30.0


@dataclass(frozen=True)
class BenchOptions:
    """``--bench allreduce``: message sizes in bytes, timed and untimed iterations per size."""

    sizes: tuple[int, ...]
    iters: int = 20
    warmup_iters: int = 5


@dataclass(frozen=True)
class RunOptions:
    t_process_start: float  # time.time() at process start (time to first step includes TF import)
    command: tuple[str, ...]  # the exact command line, for the record
    results_dir: str | None = None  # where the chief writes the results JSON (None: nowhere)
    verbose: bool = True  # progress on the chief
    peer_timeout: float = PEER_TIMEOUT  # see common.training.reliability
    stall_timeout: float = STALL_TIMEOUT  # see common.training.reliability
    preempt_check_steps: int = 0  # agree on a pending SIGTERM/SIGUSR1 every N steps (0: about once a second)
    resume_from: str | None = None  # explicit checkpoint dir (default: this run's own in the results dir)
    bench: BenchOptions | None = None  # run a microbenchmark instead of the job
    profile_steps: tuple[int, int] | None = None  # --profile-steps A:B (global, 1-based, inclusive); None = no trace
    progress_seconds: float = PROGRESS_SECONDS  # seconds between the chief's progress lines (0 = none)
    # "breakdown": a diagnostic run of the job's step split into phases (common.diagnostics.breakdown)
    diagnose: str | None = None
    iface: str | None = None  # --iface: the data network interface every launcher was pointed at (None: theirs)
    # --lr-replicas N: scale (and warm up) the recipe's learning rate as if N replicas trained (None: the run's own);
    # a 1-worker run with N x the batch then takes N workers' steps (common.check). Not part of the job's identity.
    lr_replicas: int | None = None
