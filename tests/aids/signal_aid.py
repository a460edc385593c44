"""A test aid from outside twinbench: the chief sends itself SIGTERM in the host sync whose block contains global
step ``step``, as a scheduler's signal arrives mid-run, but at a step the test chooses, so a resumed run's losses can
be compared with an uninterrupted run's exactly. A sync is forced at that step (once the signal is pending, the next
preemption agreement stops every rank). twinbench has no such code: ``patch`` wraps ``StepHooks`` of the process it
runs in (``sitecustomize.py`` here, for the processes the tests start; tests/test_clock.py, directly)."""

from __future__ import annotations

import os
import signal
from typing import Any

ENV = "TWINBENCH_TEST_SIGNAL_AT_STEP"  # the global step (1-based count of steps done); unset or 0: no signal


def patch(hooks_class: Any, step: int) -> None:
    """Make every ``hooks_class`` (``common.training.hostsync.StepHooks``) signal the chief after global step
    ``step``."""
    sync_due, sync = hooks_class.sync_due, hooks_class.sync

    def signalling_sync_due(self: Any) -> bool:
        at = step - self.start_step  # the step within this run (<= 0: a resumed run starts past it)
        return sync_due(self) or (at > 0 and self.synced < at <= self.dispatched)

    def signalling_sync(self: Any, losses: list[float]) -> bool:
        # once, in the run whose block contains that step: a resumed run (same command) starts past it
        if self.start_step + self.synced < step <= self.global_step and self.ctx.backend.is_chief:
            os.kill(os.getpid(), signal.SIGTERM)  # handled before this sync's agreement reads the flag
        return sync(self, losses)

    hooks_class.sync_due, hooks_class.sync = signalling_sync_due, signalling_sync
