"""What the test suite's started processes cost, by test file and by test: how many Python processes, how many of
them imported TensorFlow, their CPU and wall seconds. The suite's time on 2 cores is mostly these processes' CPU.

Each process the tests start writes one line at exit when ``TWINBENCH_TEST_PROC_LOG`` names a directory
(tests/aids/sitecustomize.py); a process killed by a signal writes none. Then read them here:

    mkdir /tmp/proclog && TWINBENCH_TEST_PROC_LOG=/tmp/proclog make test DURATIONS=0
    python -m bench.suite_processes /tmp/proclog --top 30
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any


def load(directory: Path) -> list[dict[str, Any]]:
    """Every process line in ``directory`` (one JSON file per process)."""
    out = []
    for p in directory.glob("*.json"):
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    return out


def test_of(line: dict[str, Any]) -> str:
    """``tests/test_x.py::name`` without pytest's phase suffix (" (call)"), or "-" outside any test."""
    if line["test"].startswith("(pytest"):
        return line["test"]  # a pytest process's own CPU (tests/conftest.py), the in-process tests'
    return line["test"].rsplit(" (", 1)[0] if line["test"] else "-"


def table(lines: list[dict[str, Any]], key: Any, top: int) -> str:
    agg: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0.0, 0.0])
    for line in lines:
        a = agg[key(line)]
        a[0] += 1
        a[1] += bool(line["tf"])
        a[2] += line["cpu"]
        a[3] += line["wall"]
    rows = sorted(agg.items(), key=lambda kv: -kv[1][2])[:top]
    width = max([len(k) for k, _ in rows] + [4])
    head = f"{'what':<{width}}  procs  tf_procs   cpu_s   wall_s"
    body = [f"{k:<{width}}  {a[0]:5d}  {a[1]:8d}  {a[2]:6.0f}  {a[3]:7.0f}" for k, a in rows]
    return "\n".join([head, *body])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.suite_processes", description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path, help="the TWINBENCH_TEST_PROC_LOG directory of a suite run")
    parser.add_argument("--top", type=int, default=25, help="rows per table (default: %(default)s)")
    args = parser.parse_args(argv)
    lines = load(args.directory)
    tf = [ln for ln in lines if ln["tf"]]
    print(f"{len(lines)} processes, {len(tf)} imported TensorFlow; CPU {sum(ln['cpu'] for ln in lines):.0f} s "
          f"({sum(ln['cpu'] for ln in tf):.0f} s in the TensorFlow ones)\n")
    print(table(lines, lambda ln: test_of(ln).split("::")[0], args.top))
    print()
    print(table(lines, test_of, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
