"""Overhead benchmark: twinbench's throughput against minimal hand-written loops (custom loop, 2 workers).

``python -m bench.overhead [--repeats 5] [--steps 300] [--job FILE] [--set key=value ...]``: interleaves twinbench
runs (``--set mode=ctl``) with bench/plain_loops.py runs of the same model, optimizer, batch and steps, for each
backend, and prints the median throughput ratio twinbench / plain (target >= 0.98). A benchmark that prints figures,
not a test. The default job (smoke: a 2 ms MLP step) is the worst case for fixed per-step costs; for example
``--set model=small_cnn --set per_replica_batch_size=64`` measures a step that does real work.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import backends
from common.localcluster import start_tf_config_workers

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
HVDRUN = str(Path(PY).parent / "horovodrun")


def _env() -> dict[str, str]:
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO),
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.pop("TF_CONFIG", None)
    return env


def _job_args(job: str, sets: list[str]) -> list[str]:
    return ["--job", job, *(x for s in sets for x in ("--set", s))]


def twinbench(kind: str, steps: int, warm: int, job: str, sets: list[str]) -> float:
    with tempfile.TemporaryDirectory() as out:
        args = [*_job_args(job, sets), "--set", "mode=ctl", "--set", f"steps={steps}",
                "--set", f"timing_warmup_steps={warm}", "--results", out, "--quiet"]
        cmd = backends.load(kind).local_command(2, args, python=PY)
        subprocess.run(cmd, cwd=REPO, env=_env(), check=True, capture_output=True)
        rec = json.loads(next(Path(out).glob("*.json")).read_text())
        return rec["images_per_sec"]


def plain(kind: str, steps: int, warm: int, job: str, sets: list[str]) -> float:
    args = ["-m", "bench.plain_loops", kind, str(steps), str(warm), *_job_args(job, sets)]
    if kind == "horovod":
        proc = subprocess.run([HVDRUN, "-np", "2", "-H", "localhost:2", "--gloo", PY, *args], cwd=REPO, env=_env(),
                              check=True, capture_output=True, text=True)
        lines = [ln.split(">:", 1)[-1] for ln in proc.stdout.splitlines() if '"wall"' in ln]
    else:
        procs = start_tf_config_workers(2, [PY, *args], _env(), cwd=REPO, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, text=True)
        lines = [ln for p in procs for ln in p.communicate()[0].splitlines() if '"wall"' in ln]
    recs = [json.loads(ln) for ln in lines]
    wall = max(r["wall"] for r in recs)
    return recs[0]["global_batch"] * recs[0]["timed_steps"] / wall


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeats", type=int, default=5, help="interleaved pairs per backend (default 5)")
    p.add_argument("--steps", type=int, default=300, help="training steps per run (default 300)")
    p.add_argument("--warmup", type=int, default=20, help="untimed first steps (default 20)")
    p.add_argument("--job", default="jobs/smoke.toml", help="job file (default jobs/smoke.toml)")
    p.add_argument("--set", action="append", default=[], dest="sets", help="job override key=value (repeatable)")
    a = p.parse_args()
    print(f"job {a.job} {' '.join(a.sets)}, {a.steps} steps ({a.warmup} untimed), custom loop, 2 workers", flush=True)
    for kind in backends.names():
        ratios = []
        for i in range(a.repeats):
            # interleaved, alternating which goes first: drifts of the machine hit both sides alike
            first, second = (twinbench, plain) if i % 2 == 0 else (plain, twinbench)
            r1 = first(kind, a.steps, a.warmup, a.job, a.sets)
            r2 = second(kind, a.steps, a.warmup, a.job, a.sets)
            tb, pl = (r1, r2) if first is twinbench else (r2, r1)
            ratios.append(tb / pl)
            print(f"{kind} repeat {i + 1}: twinbench {tb:9.1f} img/s, plain {pl:9.1f} img/s, ratio {tb / pl:.3f}",
                  flush=True)
        print(f"{kind}: median ratio twinbench/plain = {statistics.median(ratios):.3f} over {a.repeats} repeats "
              f"(target >= 0.98)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
