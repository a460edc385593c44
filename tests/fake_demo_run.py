"""A stand-in for one benchmark run of scripts/demo.sh (tests/test_demo_until.py): no TensorFlow, it writes a copy
of a template results JSON for its backend and world size, with a throughput that is tight around 100 images/s, or
alternately 80 and 120 for the cell named by $FAKE_DEMO_SPREAD ("native 2"), and appends its cell to order.txt.
$FAKE_DEMO_REFUSE (a line) makes every diagnostic run refuse with it (exit 2), as a backend refuses a job it cannot
split; $FAKE_DEMO_FAIL ("native 2") makes that cell's runs fail (exit 1) after printing a traceback-like line.

    python tests/fake_demo_run.py BACKEND N [the backend's flags ... --results DIR ...]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    backend, n, flags = argv[0], int(argv[1]), argv[2:]
    if "--diagnose" in flags and os.environ.get("FAKE_DEMO_REFUSE"):
        print(f"[twinbench] error: {os.environ['FAKE_DEMO_REFUSE']}", file=sys.stderr)
        return 2
    if "--bench" in flags or "--diagnose" in flags:  # the demo's microbenchmark and diagnostic runs: nothing
        return 0
    if os.environ.get("FAKE_DEMO_FAIL") == f"{backend} {n}":
        print("RuntimeError: a rank died", file=sys.stderr)
        return 1
    out = Path(flags[flags.index("--results") + 1])
    with (out / "order.txt").open("a") as f:
        f.write(f"{backend} {n}\n")
    k = sum(1 for line in (out / "order.txt").read_text().splitlines() if line == f"{backend} {n}")
    spread = os.environ.get("FAKE_DEMO_SPREAD") == f"{backend} {n}"
    rec = json.loads(Path(os.environ["FAKE_DEMO_TEMPLATE"]).read_text())
    rec.update(backend=backend, backend_info={"strategy": backend}, world_size=n, num_workers=n,
               global_batch_size=rec["job"]["per_replica_batch_size"] * n, hosts=[f"node{i}" for i in range(n)],
               devices=["cpu"] * n, run_id=f"{backend}-{n}-{k}",
               images_per_sec=(80.0 if k % 2 else 120.0) if spread else 100.0 + (k % 3) * 0.5)
    path = out / f"{backend}-{n}-{k}.json"
    path.write_text(json.dumps(rec))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
