"""Outside-clock check: is the throughput twinbench reports what a stopwatch outside the process sees?

``python -m bench.clock [--preset smoke,real] [--repeats 2] [--workers 1,2]``: for each backend and world size, runs
the same job at two step counts S1 < S2 (interleaved, repeated) and timestamps, from this process, two lines the
chief prints: ``first step done`` (after step 1) and the results headline (after the last step and the gathering).
The difference between the two step counts cancels start-up, the first step and the gathering: for each S2 run,
``global batch x (S2 - S1) / (dt(S2 run) - median dt(S1 runs))`` is the outside throughput of that run's steady
state, compared with the images/s that same run reported (pairing each run with itself cancels the run-to-run
drift of the machine, which comparing medians of different runs does not). Prints the median of those ratios and
their range; target within 1%. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.overhead import REAL_WORK, bench_env
from common.core import registry

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
TARGET = 0.01  # reported within 1% of the outside clock
START_LINE = "first step done"
END_LINE = " images/s over "


@dataclass(frozen=True)
class Preset:
    sets: tuple[str, ...]  # job overrides on jobs/smoke.toml
    # S1 < S2: S2 - S1 steps make a few seconds of training; S1 small against S2 - S1, since the S1 runs' own drift
    # enters the outside figure with weight S1 / (S2 - S1)
    steps: tuple[int, int]


PRESETS = {
    "smoke": Preset((), (20, 2020)),  # 1-3 ms steps; S1 runs' drift weighs 1%
    "real": Preset(REAL_WORK, (4, 64)),  # ~100 ms steps; 7%
}


def timed_run(kind: str, workers: int, steps: int, sets: tuple[str, ...], mode: str) -> tuple[float, float, int]:
    """(seconds between the two lines as seen from outside, reported images/s, global batch)."""
    with tempfile.TemporaryDirectory() as out:
        args = ["--job", "jobs/smoke.toml", *(x for s in sets for x in ("--set", s)), "--set", f"mode={mode}",
                "--set", f"steps={steps}", "--results", out]
        cmd = registry.load(kind).local_command(workers, args, python=PY)
        proc = subprocess.Popen(cmd, cwd=REPO, env=bench_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True, bufsize=1)
        seen: dict[str, float] = {}
        assert proc.stdout is not None
        for line in proc.stdout:
            for needle in (START_LINE, END_LINE):
                if needle in line and needle not in seen:
                    seen[needle] = time.monotonic()
        if proc.wait() != 0 or len(seen) != 2:
            raise RuntimeError(f"{' '.join(cmd)}: exit {proc.returncode}, lines seen {sorted(seen)}")
        rec = json.loads(next(Path(out).glob("*.json")).read_text())
        return seen[END_LINE] - seen[START_LINE], rec["images_per_sec"], rec["global_batch_size"]


def paired_ratios(gb: int, s1: int, s2: int, s1_dts: list[float], s2_runs: list[tuple[float, float]]) -> list[float]:
    """Per S2 run (reported images/s, outside seconds between the two lines): reported / outside throughput, the
    outside one being ``gb x (S2 - S1) / (dt - median of the S1 runs' dt)`` (start-up, first step, the S1 steps and
    the gathering cancel)."""
    fixed = statistics.median(s1_dts)
    return [ips * (dt - fixed) / (gb * (s2 - s1)) for ips, dt in s2_runs]


def check(kind: str, workers: int, pre: Preset, repeats: int, mode: str) -> float:
    s1, s2 = pre.steps
    dts: dict[int, list[float]] = {s1: [], s2: []}
    reported, gb = [], 0
    for i in range(repeats):
        for steps in ((s1, s2) if i % 2 == 0 else (s2, s1)):  # interleaved, alternating order
            dt, ips, gb = timed_run(kind, workers, steps, pre.sets, mode)
            dts[steps].append(dt)
            if steps == s2:
                reported.append(ips)
    ratios = paired_ratios(gb, s1, s2, dts[s1], list(zip(reported, dts[s2])))
    ratio = statistics.median(ratios)
    print(f"  {kind} x{workers}: reported {statistics.median(reported):9.1f} img/s (S2 runs {min(reported):.0f}-"
          f"{max(reported):.0f}), reported/outside per S2 run {ratio:.3f} median ({min(ratios):.3f}-"
          f"{max(ratios):.3f}, {len(ratios)} runs)", flush=True)
    return ratio


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="smoke,real", help=f"comma-separated, of {', '.join(PRESETS)} (default both)")
    p.add_argument("--repeats", type=int, default=2, help="runs per step count (default 2)")
    p.add_argument("--workers", default="1,2", help="world sizes (default 1,2)")
    p.add_argument("--mode", default="ctl", choices=("fit", "ctl"), help="training loop (default ctl)")
    a = p.parse_args()
    worst = 0.0
    for name in a.preset.split(","):
        pre = PRESETS[name]
        print(f"{name}: jobs/smoke.toml {' '.join(pre.sets)}, {a.mode}, steps {pre.steps[0]} and {pre.steps[1]}",
              flush=True)
        for workers in (int(w) for w in a.workers.split(",")):
            for kind in registry.names():
                worst = max(worst, abs(check(kind, workers, pre, a.repeats, a.mode) - 1))
    print(f"largest |reported/outside - 1| = {100 * worst:.1f}% (target {100 * TARGET:.0f}%)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
