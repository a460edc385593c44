"""Many refusal cases in one started process: each case runs an entry point's ``__main__`` (``runpy``, as ``python -m``
does) with its own arguments and environment, its stdout and stderr captured, and records its exit status and
whether TensorFlow was imported by then. One process for a catalogue of bad inputs instead of one each (a process
start-up is about a second on 2 cores); what a case proves is unchanged: the status, the one line, nothing written,
and TensorFlow never imported (each case is checked in a process that has not imported it).

``batch(cases)`` from a test; ``python tests/aids/refusals.py IN OUT`` is the process it starts."""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 120  # s for the whole batch: every case stops at its input check, a few ms each


def batch(cases: list[dict[str, Any]], env: dict[str, str]) -> list[dict[str, Any]]:
    """Run ``cases`` (each ``{"module", "argv"}`` and optionally ``"env"``, the full environment of that run, else
    ``env``) in one process started with ``env``; per case ``{"rc", "stdout", "stderr", "tensorflow"}``, in order."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.json", Path(tmp) / "out.json"
        src.write_text(json.dumps(cases))
        proc = subprocess.run([sys.executable, __file__, str(src), str(dst)], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=TIMEOUT)
        if proc.returncode != 0 or not dst.exists():
            raise AssertionError(f"the refusal batch exited {proc.returncode}\n{proc.stderr[-4000:]}")
        return json.loads(dst.read_text())


def _one(case: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    os.environ.clear()
    os.environ.update(case.get("env") or env)
    saved_path = list(sys.path)
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
    return {"rc": rc or 0, "stdout": out.getvalue(), "stderr": err.getvalue(),
            "tensorflow": "tensorflow" in sys.modules}


def main() -> None:
    cases = json.loads(Path(sys.argv[1]).read_text())
    dst = Path(sys.argv[2])
    env = dict(os.environ)  # a case without an environment of its own runs in the batch's
    dst.write_text(json.dumps([_one(c, env) for c in cases]))


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
