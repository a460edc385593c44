"""Many refusal cases in one started process: each case runs an entry point's ``__main__`` (``runpy``, as ``python -m``
does) with its own arguments and environment, its stdout and stderr captured, and records its exit status and
whether TensorFlow was imported by then. One process for a catalogue of bad inputs instead of one each (a process
start-up is about a second on 2 cores, one that imports TensorFlow about 3 CPU-seconds); what a case proves is
unchanged: the status, the one line, nothing written, and (for a refusal before TensorFlow, checked in a process
that has not imported it yet) TensorFlow never imported.

Cases that fail after TensorFlow is imported share the process too: each case sees its own user package, because the
modules a case imported from outside the repository and the interpreter's own directories (the user's packages,
which share names such as ``ifpkg`` across temporary directories) are dropped from ``sys.modules`` after it. Such a
refusal must end by ``SystemExit`` (``common.core.errors.fail``); a case that ends the process itself
(``os._exit``, as ``common.core.errors.exit_now`` does after a run) stops the batch, and ``batch`` names that case.
What TensorFlow keeps per process (its context, thread pools, its configuration) is shared by the cases: a case whose
refusal depends on a fresh process (TensorFlow started by the user's module before twinbench configured it) needs a
process of its own, and would leave the process unconfigurable for the cases after it.

``batch(cases)`` or ``refuse_jobs(jobs)`` from a test; ``python tests/aids/refusals.py IN OUT`` is the process it
starts."""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import subprocess
import sys
import sysconfig
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 300  # s for the whole batch: a case stops at its input check, after TensorFlow at most a few seconds each


def batch(cases: list[dict[str, Any]], env: dict[str, str]) -> list[dict[str, Any]]:
    """Run ``cases`` (each ``{"module", "argv"}`` and optionally ``"env"``, the full environment of that run, else
    ``env``) in one process started with ``env``; per case ``{"rc", "stdout", "stderr", "tensorflow"}``, in order."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.json", Path(tmp) / "out.json"
        src.write_text(json.dumps(cases))
        proc = subprocess.run([sys.executable, __file__, str(src), str(dst)], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=TIMEOUT)
        done = json.loads(dst.read_text()) if dst.exists() else []
        if proc.returncode != 0 or len(done) != len(cases):
            which = (f"; case {len(done)} ({cases[len(done)]['module']} {' '.join(cases[len(done)]['argv'])}) ended "
                     "the process itself (os._exit?): it cannot share a process") if len(done) < len(cases) else ""
            raise AssertionError(f"the refusal batch exited {proc.returncode}{which}\n{proc.stderr[-4000:]}")
        return done


def refuse_jobs(jobs: dict[str, Path], env: dict[str, str]) -> dict[str, tuple[dict[str, Any], Path]]:
    """``backends.native --job JOB --results <JOB's directory>/results --quiet`` for each named job, all in one batch:
    per name, its case's outcome (as ``batch``'s) and that results directory, which a refusal leaves absent or empty.
    Each job should sit in a directory of its own (its user package beside it)."""
    cases = [{"module": "backends.native", "argv": ["--job", str(job), "--results", str(job.parent / "results"),
                                                    "--quiet"]} for job in jobs.values()]
    return {name: (got, job.parent / "results") for (name, job), got in zip(jobs.items(), batch(cases, env),
                                                                                 strict=True)}


def _ours(path: str | None, keep: tuple[str, ...]) -> bool:
    """Whether a module file (or package directory) lies under the repository or the interpreter's directories."""
    return path is None or os.path.realpath(path).startswith(keep)


def _drop_user_modules(before: set[str], keep: tuple[str, ...]) -> None:
    """Forget the modules a case imported from elsewhere (the user's packages), so the next case imports its own."""
    for name in [n for n in sys.modules if n not in before]:
        module = sys.modules[name]
        paths = [getattr(module, "__file__", None), *list(getattr(module, "__path__", None) or [])]
        if not all(_ours(p, keep) for p in paths):
            del sys.modules[name]


def _one(case: dict[str, Any], env: dict[str, str], keep: tuple[str, ...]) -> dict[str, Any]:
    os.environ.clear()
    os.environ.update(case.get("env") or env)
    saved_path = list(sys.path)
    before = set(sys.modules)
    sys.argv = [case["module"], *case["argv"]]
    out, err = io.StringIO(), io.StringIO()
    rc: Any = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_module(case["module"], run_name="__main__", alter_sys=True)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) or e.code is None else 1
        if not isinstance(e.code, int) and e.code is not None:
            err.write(f"{e.code}\n")  # what the interpreter prints for sys.exit("text")
    except Exception:  # an uncaught error: what the interpreter would print, status 1
        err.write(traceback.format_exc())
        rc = 1
    finally:
        sys.path[:] = saved_path
        _drop_user_modules(before, keep)
    return {"rc": rc or 0, "stdout": out.getvalue(), "stderr": err.getvalue(),
            "tensorflow": "tensorflow" in sys.modules}


def main() -> None:
    cases = json.loads(Path(sys.argv[1]).read_text())
    dst = Path(sys.argv[2])
    env = dict(os.environ)  # a case without an environment of its own runs in the batch's
    # what stays imported between cases: the repository, the interpreter's library and its environment's packages
    keep = tuple({os.path.realpath(p) + os.sep for p in (str(REPO), sys.prefix, sys.base_prefix, sys.exec_prefix,
                                                         *sysconfig.get_paths().values())})
    done: list[dict[str, Any]] = []
    for case in cases:
        done.append(_one(case, env, keep))
        dst.write_text(json.dumps(done))  # after each case: a case that ends the process is named by ``batch``
    dst.write_text(json.dumps(done))


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
