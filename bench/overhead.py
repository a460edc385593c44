"""Overhead benchmark: twinbench's throughput against minimal hand-written loops (custom loop, 2 workers).

``python -m bench.overhead [--preset smoke,real] [--repeats 3] [--steps N --warmup W] [--set key=value ...]``: for
each preset job and each backend, interleaves twinbench runs (``--set mode=ctl``) with bench/plain_loops.py runs of
the same model, optimizer, batch and steps, and prints the median throughput ratio twinbench / plain (the harness'
tax is 1 - ratio; target: ratio >= 0.98), then the difference of the two backends' taxes (target: within 1 point).
A benchmark that prints figures, not a test. Presets: ``smoke`` (the smoke MLP, a 1-3 ms step: the worst case for
any fixed per-step cost) and ``real`` (MobileNetV2 on 64x64 images, 32 per replica: a step doing real work).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import backends
from backends.base import CPU_BIND
from common.localcluster import start_tf_config_workers

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
HVDRUN = str(Path(PY).parent / "horovodrun")
TARGET_RATIO = 0.98  # a harness tax of at most 2%
TARGET_TAX_DIFF = 0.01  # the two backends' taxes within 1 point of each other


@dataclass(frozen=True)
class Preset:
    sets: tuple[str, ...]  # job overrides on jobs/smoke.toml
    steps: int  # enough timed steps for a few seconds of training
    warmup: int  # untimed first steps (tracing, autotune)


REAL_WORK = ("model=MobileNetV2", "image_shape=[64,64,3]", "per_replica_batch_size=32")  # ~100 ms steps here
PRESETS = {
    "smoke": Preset((), 1500, 50),
    "real": Preset(REAL_WORK, 60, 10),
}


def bench_env() -> dict[str, str]:
    """The environment of every benchmark run: tf_keras, quiet TF, this checkout, Open MPI as root, no TF_CONFIG."""
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(REPO),
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.pop("TF_CONFIG", None)
    return env


def _job_args(sets: list[str]) -> list[str]:
    return ["--job", "jobs/smoke.toml", *(x for s in sets for x in ("--set", s))]


def twinbench(kind: str, steps: int, warm: int, sets: list[str], cpu_bind: str = "none") -> float:
    with tempfile.TemporaryDirectory() as out:
        args = [*_job_args(sets), "--set", "mode=ctl", "--set", f"steps={steps}",
                "--set", f"timing_warmup_steps={warm}", "--results", out, "--quiet", "--cpu-bind", cpu_bind]
        cmd = backends.load(kind).local_command(2, args, python=PY)
        subprocess.run(cmd, cwd=REPO, env=bench_env(), check=True, capture_output=True)
        rec = json.loads(next(Path(out).glob("*.json")).read_text())
        return rec["images_per_sec"]


def plain(kind: str, steps: int, warm: int, sets: list[str], cpu_bind: str = "none") -> float:
    args = ["-m", "bench.plain_loops", kind, str(steps), str(warm), *_job_args(sets), "--cpu-bind", cpu_bind]
    if kind == "horovod":
        proc = subprocess.run([HVDRUN, "-np", "2", "-H", "localhost:2", "--gloo", PY, *args], cwd=REPO, env=bench_env(),
                              check=True, capture_output=True, text=True)
        lines = [ln.split(">:", 1)[-1] for ln in proc.stdout.splitlines() if '"wall"' in ln]
    else:
        procs = start_tf_config_workers(2, [PY, *args], bench_env(), cwd=REPO, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, text=True)
        lines = [ln for p in procs for ln in p.communicate()[0].splitlines() if '"wall"' in ln]
    recs = [json.loads(ln) for ln in lines]
    wall = max(r["wall"] for r in recs)
    return recs[0]["global_batch"] * recs[0]["timed_steps"] / wall


def measure(name: str, sets: list[str], steps: int, warm: int, repeats: int,
            cpu_bind: str = "none") -> dict[str, list[float]]:
    """Ratios twinbench / plain per backend, every repeat interleaved across backends and sides."""
    ratios: dict[str, list[float]] = {kind: [] for kind in backends.names()}
    for i in range(repeats):
        for kind in backends.names():
            # alternate which side goes first: drifts of the machine hit both sides alike
            order = (twinbench, plain) if i % 2 == 0 else (plain, twinbench)
            got = {f.__name__: f(kind, steps, warm, sets, cpu_bind) for f in order}
            ratios[kind].append(got["twinbench"] / got["plain"])
            print(f"{name} {kind} repeat {i + 1}: twinbench {got['twinbench']:9.1f} img/s, plain "
                  f"{got['plain']:9.1f} img/s, ratio {ratios[kind][-1]:.3f}", flush=True)
    return ratios


def summarize(name: str, ratios: dict[str, list[float]]) -> None:
    med = {kind: statistics.median(r) for kind, r in ratios.items()}
    for kind, r in ratios.items():
        print(f"{name} {kind}: median ratio twinbench/plain = {med[kind]:.3f} ({min(r):.3f}-{max(r):.3f}) over "
              f"{len(r)} repeats, tax {100 * (1 - med[kind]):+.1f}% (target ratio >= {TARGET_RATIO})", flush=True)
    a, b = backends.RATIO
    diff = (1 - med[b]) - (1 - med[a])
    print(f"{name}: tax difference {b} - {a} = {100 * diff:+.1f} points (target within "
          f"{100 * TARGET_TAX_DIFF:.0f})", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="smoke,real", help=f"comma-separated, of {', '.join(PRESETS)} (default both)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved pairs per backend and preset (default 3)")
    p.add_argument("--steps", type=int, default=0, help="training steps per run (default: the preset's)")
    p.add_argument("--warmup", type=int, default=-1, help="untimed first steps (default: the preset's)")
    p.add_argument("--set", action="append", default=[], dest="sets", help="extra job override key=value")
    p.add_argument("--cpu-bind", choices=CPU_BIND, default="none",
                   help="--cpu-bind for both sides (default none, twinbench's default)")
    a = p.parse_args()
    names = [n for n in a.preset.split(",") if n]
    unknown = [n for n in names if n not in PRESETS]
    if unknown or a.repeats < 1:
        print(f"bench.overhead: unknown preset {unknown} or --repeats < 1", file=sys.stderr)
        return 2
    for name in names:
        pre = PRESETS[name]
        steps, warm = a.steps or pre.steps, pre.warmup if a.warmup < 0 else a.warmup
        sets = [*pre.sets, *a.sets]
        print(f"{name}: jobs/smoke.toml {' '.join(sets)}, {steps} steps ({warm} untimed), custom loop, 2 workers, "
              f"--cpu-bind {a.cpu_bind}", flush=True)
        summarize(name, measure(name, sets, steps, warm, a.repeats, a.cpu_bind))
    return 0


if __name__ == "__main__":
    sys.exit(main())
