"""Imported at start-up by every Python process the tests start (tests/aids is on their PYTHONPATH, tests/conftest.py
``base_env``). Each test aid asked for by its environment variable is installed on the twinbench module it patches
as that module is imported; with none set it does nothing:
- ``TWINBENCH_TEST_SIGNAL_AT_STEP``: ``signal_aid.patch`` on ``common.training.hostsync.StepHooks``;
- ``TWINBENCH_TEST_PAUSE_BETWEEN_STEPS``: ``pause_aid.patch`` on ``common.training.hostsync.StepHooks``;
- ``TWINBENCH_TEST_SLOW_INPUT``: ``slow_input_aid.patch`` on ``common.training.train``;
- ``TWINBENCH_TEST_PROC_LOG``: ``proclog.install``, the process's line at exit (bench/suite_processes.py)."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

_STEP = int(os.environ.get("TWINBENCH_TEST_SIGNAL_AT_STEP") or 0)
_PAUSE = float(os.environ.get("TWINBENCH_TEST_PAUSE_BETWEEN_STEPS") or 0)
_SLOW = float(os.environ.get("TWINBENCH_TEST_SLOW_INPUT") or 0)


def _aid(name: str) -> Any:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    return importlib.import_module(name)


def _patch_hooks(module: Any) -> None:
    if _STEP > 0:
        _aid("signal_aid").patch(module.StepHooks, _STEP)
    if _PAUSE > 0:
        _aid("pause_aid").patch(module.StepHooks, _PAUSE)


def _patch_train(module: Any) -> None:
    _aid("slow_input_aid").patch(module, _SLOW)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def __init__(self, patches: dict[str, Callable[[Any], None]]) -> None:
        self.patches = patches

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        patch = self.patches.pop(name, None)
        if patch is None:
            return None
        if not self.patches:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)  # the real module, from the other finders (``name`` is no longer ours)
        exec_module = spec.loader.exec_module

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


_PATCHES: dict[str, Callable[[Any], None]] = {}
if _STEP > 0 or _PAUSE > 0:
    _PATCHES["common.training.hostsync"] = _patch_hooks
if _SLOW > 0:
    _PATCHES["common.training.train"] = _patch_train
if _PATCHES:
    sys.meta_path.insert(0, _PatchOnImport(_PATCHES))

if os.environ.get("TWINBENCH_TEST_PROC_LOG"):
    _aid("proclog").install(os.environ["TWINBENCH_TEST_PROC_LOG"])
