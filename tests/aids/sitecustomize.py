"""Imported at start-up by every Python process the tests start (tests/aids is on their PYTHONPATH, tests/conftest.py
``base_env``). With ``TWINBENCH_TEST_SIGNAL_AT_STEP`` set it installs ``signal_aid.patch`` on
``common.training.loops.StepHooks`` as that module is imported; otherwise it does nothing."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from typing import Any

_STEP = int(os.environ.get("TWINBENCH_TEST_SIGNAL_AT_STEP") or 0)
_TARGET = "common.training.loops"


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)  # find the real module with the other finders
        spec = importlib.util.find_spec(name)
        exec_module = spec.loader.exec_module

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            import signal_aid

            signal_aid.patch(module.StepHooks, _STEP)

        spec.loader.exec_module = exec_and_patch
        return spec


if _STEP > 0:
    sys.meta_path.insert(0, _PatchOnImport())
