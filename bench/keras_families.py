"""Keras 3 against tf_keras on the same model: twinbench's custom loop, each backend, interleaved repeats.

``python -m bench.keras_families [--preset real] [--workers 1,2] [--repeats 3] [--steps N --warmup W]
[--set key=value ...]``: for each worker count and backend, runs the preset job (bench/overhead.py's presets) in
twinbench's custom loop twice per repeat, as tf_keras (``keras = 2``) and as Keras 3 (``--set keras=3``), in an
order that alternates between repeats so drifts of the machine hit both alike. One line per run, then per (workers,
backend) the median images/s of each family and the median ratio Keras 3 / tf_keras with its min-max over the
repeats. The two are different jobs (``keras`` is hashed at 3): this answers "what does moving my model to Keras 3
cost", not a parity question. It prints figures and never asserts.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from bench.overhead import PRESETS, REPO, Setup, parse_workers, rotation, twinbench
from common.core import registry

FAMILIES = {"tf_keras": (), "keras3": ("keras=3",)}  # name -> job overrides on the preset


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="real", choices=sorted(PRESETS), help="the job (default real: MobileNetV2)")
    p.add_argument("--workers", type=parse_workers, default=[1, 2], help="comma-separated worker counts (default 1,2)")
    p.add_argument("--repeats", type=int, default=3, help="pairs of runs per backend and worker count (default 3)")
    p.add_argument("--steps", type=int, default=0, help="training steps per run (default: the preset's)")
    p.add_argument("--warmup", type=int, default=-1, help="untimed first steps, >= 1 (default: the preset's)")
    p.add_argument("--set", action="append", default=[], dest="sets", help="extra job override key=value")
    return p


def main() -> int:
    a = parser().parse_args()
    preset = PRESETS[a.preset]
    steps, warm = a.steps or preset.steps, preset.warmup if a.warmup < 0 else a.warmup
    if a.repeats < 1 or not 1 <= warm < steps:
        print("bench.keras_families: need --repeats >= 1 and 1 <= warmup < steps", file=sys.stderr)
        return 2
    setups = {fam: Setup(REPO, steps, warm, (*preset.sets, *a.sets, *extra)) for fam, extra in FAMILIES.items()}
    print(f"{a.preset}: jobs/smoke.toml {' '.join((*preset.sets, *a.sets))}, {steps} steps ({warm} untimed), "
          f"custom loop, tf_keras vs keras=3, workers {','.join(map(str, a.workers))}", flush=True)
    got: dict[tuple[int, str], list[dict[str, float]]] = {(n, k): [] for n in a.workers for k in registry.names()}
    for i in range(a.repeats):
        for n in a.workers:
            for kind in registry.names():
                ips = {}
                for fam in rotation(list(FAMILIES), i):
                    ips[fam] = twinbench(kind, n, setups[fam])
                    print(f"{n}w {kind} repeat {i + 1}/{a.repeats}: {fam:<8} {ips[fam]:8.1f} img/s", flush=True)
                got[(n, kind)].append(ips)
    for (n, kind), reps in got.items():
        med = {fam: statistics.median(r[fam] for r in reps) for fam in FAMILIES}
        ratios = [r["keras3"] / r["tf_keras"] for r in reps]
        print(f"{n}w {kind}: median img/s tf_keras {med['tf_keras']:.1f}, keras3 {med['keras3']:.1f}; "
              f"keras3/tf_keras {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) over "
              f"{len(reps)} repeats", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
