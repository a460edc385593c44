"""A test aid from outside twinbench: the host sleeps after every step (execution) is handed over, between two steps
and inside the timed window, in both modes: host work the step clock must count, which the custom loop's fetch
time must not contain and Keras fit's "input + between steps" must. twinbench has no such code: ``patch`` wraps
``StepHooks.step_ended`` (the end-of-step hook both loops call) of the process it runs in (``sitecustomize.py``)."""

from __future__ import annotations

import time
from typing import Any

ENV = "TWINBENCH_TEST_PAUSE_BETWEEN_STEPS"  # seconds; unset or 0: no pause


def patch(hooks_class: Any, seconds: float) -> None:
    """Make every ``hooks_class`` (``common.training.hostsync.StepHooks``) sleep ``seconds`` at the end of each step."""
    step_ended = hooks_class.step_ended

    def pausing_step_ended(self: Any, dispatched: int) -> bool:
        time.sleep(seconds)  # before the sync this step may trigger: in the window that sync's mark closes
        return step_ended(self, dispatched)

    hooks_class.step_ended = pausing_step_ended
