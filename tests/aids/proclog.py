"""One line per process for ``TWINBENCH_TEST_PROC_LOG=DIR``: what started it, which test, its wall and CPU seconds and
whether it imported TensorFlow, in DIR/<pid>.json (read by bench/suite_processes.py). Written at exit by every process
the tests start (tests/aids/sitecustomize.py) and by the pytest processes themselves (tests/conftest.py)."""

from __future__ import annotations

import json
import os
import resource
import sys
import time

ENV = "TWINBENCH_TEST_PROC_LOG"
STARTED = time.time()  # this module is imported at start-up (sitecustomize): the process's start, near enough


def write(directory: str, test: str | None = None) -> None:
    """This process's line; ``test`` defaults to the test that started it (pytest's PYTEST_CURRENT_TEST)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    line = {"pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv[:8], "t0": STARTED,
            "wall": time.time() - STARTED, "cpu": ru.ru_utime + ru.ru_stime, "rss_mb": ru.ru_maxrss / 1024,
            "tf": "tensorflow" in sys.modules,
            "test": os.environ.get("PYTEST_CURRENT_TEST", "") if test is None else test}
    try:
        with open(os.path.join(directory, f"{os.getpid()}.json"), "w") as f:
            f.write(json.dumps(line) + "\n")
    except OSError:
        pass  # a measurement aid: a directory gone or full never fails the process being measured


def install(directory: str) -> None:
    """Write the line at exit, also when the process ends by ``os._exit`` (common.core.errors.exit_now skips the
    atexit hooks)."""
    import atexit

    atexit.register(write, directory)
    os_exit = os._exit

    def exit_logged(code: int) -> None:
        write(directory)
        os_exit(code)

    os._exit = exit_logged
