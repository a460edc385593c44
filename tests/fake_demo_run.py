"""A stand-in for one benchmark run of scripts/demo.sh (tests/test_demo_until.py): no TensorFlow, it writes a copy
of a template results JSON for its backend and world size, with a throughput that is tight around 100 images/s, or
alternately 80 and 120 for the cell named by $FAKE_DEMO_SPREAD ("native 2"), and appends its cell to order.txt.
$FAKE_DEMO_REFUSE (a line) makes every diagnostic run refuse with it (exit 2), as a backend refuses a job it cannot
split; $FAKE_DEMO_FAIL ("native 2") makes that cell's runs fail (exit 1) after printing a traceback-like line.

It also stands in for the demo's parity check (``python tests/fake_demo_run.py check [common.check's flags]``): it
writes ``--results DIR/check.json`` for the template's job (its hash: the job the benchmark runs ran) with the answers
$FAKE_DEMO_CHECK names ("agree", the default: exit 0; "scales": the backends agree, 1 worker x 2b vs 2 workers x b
differs, exit 6) and its last lines as common.check prints them, or with "fail" a run's failure (exit 1, no
check.json).

    python tests/fake_demo_run.py BACKEND N [the backend's flags ... --results DIR ...]
    python tests/fake_demo_run.py check [--job FILE --set K=V ... --steps N --modes M --results DIR]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def fake_check(flags: list[str]) -> int:
    from common.report import migrate
    from common.report.migrate import NO, NOT_COMPARED, YES, Answer

    out = Path(flags[flags.index("--results") + 1])
    rec = json.loads(Path(os.environ["FAKE_DEMO_TEMPLATE"]).read_text())
    kind = os.environ.get("FAKE_DEMO_CHECK", "agree")
    print("[check] run 1/4: native ctl 1 worker ... 1.0 s")
    if kind == "fail":
        print("common.check: horovod ctl 2 workers failed (exit 1): cmd\nRuntimeError: a rank died", file=sys.stderr)
        return 1
    answers = {migrate.SAME_MATH: Answer(YES, "2 pairs agree to 1e-05, bit for bit (native = horovod in ctl at 1 and "
                                              "2 workers)"),
               migrate.SCALES: Answer(YES, "2 pairs agree to 1e-05 (native, horovod in ctl)"),
               migrate.MODES: Answer(NOT_COMPARED, "one mode checked (ctl: --modes)")}
    status, line = 0, "all 4 pairs agree to 1e-05"
    if kind == "scales":
        answers[migrate.SCALES] = Answer(NO, "native ctl: 1 worker x 2b vs 2 workers x b: loss differs, step 1: 2.5 vs "
                                             "2.6", ("per-replica random draws: Dropout",), True)
        status, line = 6, "SCALES INEXACTLY (exit 6): the backends agree (same math), but native ctl: ..."
    out.mkdir(parents=True, exist_ok=True)
    summary = migrate.check_summary(rec["job"], rec["job_hash"], status, line, 1e-5, "2026-12-06T00:00:00+00:00",
                                    answers)
    (out / migrate.CHECK_FILE).write_text(json.dumps(summary))
    print("\n".join(f"[check] {migrate.QUESTIONS[q]}: {a.words()}" for q, a in answers.items()))
    print(line, file=sys.stderr if status else sys.stdout)
    return status


def main(argv: list[str]) -> int:
    if argv[0] == "check":
        return fake_check(argv[1:])
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
