"""Overhead benchmark: twinbench's throughput against minimal hand-written loops fed two ways (custom loops).

``python -m bench.overhead [--preset smoke,real] [--workers 1,2] [--repeats 3] [--steps N --warmup W]
[--mode ctl|fit] [--backends native,horovod] [--plain plain-const,plain-tfdata] [--frozen DIR [--worktree]]
[--set key=value ...]``: for each preset job, each worker count and
each backend, runs twinbench (``--set mode=ctl``, its custom loop; ``--mode fit``: Keras ``fit``) and
bench/plain_loops.py twice, on the same model, optimizer, batch and steps: ``plain-const`` (one batch made once and
reused, as Horovod's synthetic benchmark feeds its model: no input cost at all) and ``plain-tfdata`` (the worker's
own tf.data iterator passed straight to the step: twinbench's input path without twinbench). Neither plain loop
uses tf.distribute's distributed input: a floor must not share the costs of what it measures. The three
runs of a repeat go in a rotating order (each repeat another one goes first), so drifts of the machine hit all
sides alike. One line per run, then per (preset, workers, backend) the median ratio twinbench / plain-const and
twinbench / plain-tfdata with their min-max over the repeats (the harness' tax is 1 - ratio; target ratio >= 0.98,
and, for the real preset against plain-tfdata, >= 0.95: within 5% of a plain loop on a real CNN), then the
difference of the two backends' taxes (target: within 1 point). It prints figures and never asserts.

Presets: ``smoke`` (the smoke MLP, a 1-3 ms step: the worst case for any fixed per-step cost) and ``real``
(MobileNetV2 on 64x64 images, 32 per replica: a step doing real work). One worker is one process (no launcher);
two are ``--nproc``/horovodrun for twinbench, TF_CONFIG workers/horovodrun --gloo for the plain loops.
``--frozen DIR`` first extracts ``git archive HEAD`` into DIR (``--worktree``: copies the working tree's tracked and
untracked, not ignored, files instead) and runs everything from there, so edits to the checkout during a long
benchmark cannot change what is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from common.cluster.localcluster import start_tf_config_workers
from common.cluster.placement import CPU_BIND
from common.core import registry

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
HVDRUN = str(Path(PY).parent / "horovodrun")
TARGET_RATIO = 0.98  # a harness tax of at most 2%
TARGET_REAL_TFDATA = 0.95  # twinbench within 5% of the plain tf.data loop on a real CNN (docs/findings.md)
TARGET_TAX_DIFF = 0.01  # the two backends' taxes within 1 point of each other
RUN_TIMEOUT = 1800  # seconds for one run: a hang stops the benchmark instead of eating the machine
SIDES = ("twinbench", "plain-const", "plain-tfdata")
PLAIN_FEEDS = {"plain-const": "const", "plain-tfdata": "tfdata"}  # side -> bench.plain_loops --feed


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


@dataclass(frozen=True)
class Setup:
    """What every run of one preset shares."""

    root: Path  # where every run starts (cwd and PYTHONPATH): this checkout or its frozen copy
    steps: int
    warm: int
    sets: tuple[str, ...]
    cpu_bind: str = "none"
    mode: str = "ctl"  # twinbench's loop: ctl (custom loop) or fit; the plain loops are always custom loops


def bench_env(root: Path = REPO) -> dict[str, str]:
    """The environment of every benchmark run: tf_keras, quiet TF, the code measured, Open MPI as root, no
    TF_CONFIG."""
    env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(root),
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.pop("TF_CONFIG", None)
    return env


def _job_args(sets: Sequence[str]) -> list[str]:
    return ["--job", "jobs/smoke.toml", *(x for s in sets for x in ("--set", s))]


def _run(cmd: list[str], s: Setup) -> str:
    """Run ``cmd`` from the measured code; its stdout, or an error carrying the tail of its output."""
    proc = subprocess.run(cmd, cwd=s.root, env=bench_env(s.root), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return proc.stdout


def twinbench(kind: str, n: int, s: Setup) -> float:
    """Images/s of twinbench's ``kind`` backend with ``n`` local workers (its own launcher; one: a plain process)."""
    with tempfile.TemporaryDirectory() as out:
        args = [*_job_args(s.sets), "--set", f"mode={s.mode}", "--set", f"steps={s.steps}",
                "--set", f"timing_warmup_steps={s.warm}", "--results", out, "--quiet", "--cpu-bind", s.cpu_bind]
        _run(registry.load(kind).local_command(n, args, python=PY), s)
        files = [f for f in Path(out).glob("*.json") if not f.name.startswith(".")]
        if len(files) != 1:
            raise RuntimeError(f"twinbench {kind} x{n}: expected one results JSON, found {files}")
        return float(json.loads(files[0].read_text())["images_per_sec"])


def plain(kind: str, n: int, feed: str, s: Setup) -> float:
    """Images/s of bench.plain_loops (``--feed feed``) with ``n`` workers, timed by its slowest rank."""
    args = ["-m", "bench.plain_loops", kind, str(s.steps), str(s.warm), "--feed", feed, *_job_args(s.sets),
            "--cpu-bind", s.cpu_bind]
    if n == 1:  # one process: no TF_CONFIG (a one-worker MWMS), no horovodrun (hvd.init() alone: a world of one)
        lines = _run([PY, *args], s).splitlines()
    elif kind == "horovod":
        out = _run([HVDRUN, "-np", str(n), "-H", f"localhost:{n}", "--gloo", PY, *args], s)
        lines = [ln.split(">:", 1)[-1] for ln in out.splitlines()]
    else:
        procs = start_tf_config_workers(n, [PY, *args], bench_env(s.root), cwd=s.root, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, text=True)
        lines = [ln for p in procs for ln in p.communicate(timeout=RUN_TIMEOUT)[0].splitlines()]
        if any(p.returncode for p in procs):
            raise RuntimeError(f"plain {kind} x{n} --feed {feed}: exit codes {[p.returncode for p in procs]}")
    recs = [json.loads(ln) for ln in lines if '"wall"' in ln]
    if len(recs) != n:
        raise RuntimeError(f"plain {kind} x{n} --feed {feed}: {len(recs)} result lines, expected {n}")
    return recs[0]["global_batch"] * recs[0]["timed_steps"] / max(r["wall"] for r in recs)


def run_side(side: str, kind: str, n: int, s: Setup) -> float:
    return twinbench(kind, n, s) if side == "twinbench" else plain(kind, n, PLAIN_FEEDS[side], s)


def rotation(items: Sequence[str], i: int) -> list[str]:
    """The order of repeat ``i``: ``items`` rotated left by ``i``, so each goes first in turn."""
    k = i % len(items)
    return [*items[k:], *items[:k]]


def ratios(got: dict[str, float]) -> dict[str, float]:
    """twinbench / each plain side measured, from one repeat's images/s per side."""
    return {side: got["twinbench"] / got[side] for side in PLAIN_FEEDS if side in got}


def summary(repeats: list[dict[str, float]]) -> dict[str, tuple[float, float, float]]:
    """Per plain side, (median, min, max) over the repeats of the ratio twinbench / that side."""
    per = [ratios(got) for got in repeats]
    return {side: (statistics.median(r[side] for r in per), min(r[side] for r in per), max(r[side] for r in per))
            for side in per[0]}


def targets(preset: str, side: str) -> str:
    out = f"target ratio >= {TARGET_RATIO}"
    if preset == "real" and side == "plain-tfdata":
        out += f"; real CNN: >= {TARGET_REAL_TFDATA}"
    return out


Figures = dict[tuple[int, str], list[dict[str, float]]]  # (workers, backend) -> per repeat, images/s per side


def measure(name: str, s: Setup, workers: Sequence[int], repeats: int, kinds: Sequence[str] = (),
            sides: Sequence[str] = SIDES) -> Figures:
    """Every repeat: for each worker count and backend (``kinds``, default all), the sides in that repeat's rotated
    order."""
    kinds = list(kinds) or registry.names()
    figures: Figures = {(n, kind): [] for n in workers for kind in kinds}
    for i in range(repeats):
        for n in workers:
            for kind in kinds:
                got: dict[str, float] = {}
                for side in rotation(sides, i):
                    got[side] = run_side(side, kind, n, s)
                    print(f"{name} {n}w {kind} repeat {i + 1}/{repeats}: {side:<12} {got[side]:9.1f} img/s",
                          flush=True)
                r = ratios(got)
                print(f"{name} {n}w {kind} repeat {i + 1}/{repeats}: ratios "
                      + ", ".join(f"twinbench/{side} {v:.3f}" for side, v in r.items()), flush=True)
                figures[(n, kind)].append(got)
    return figures


def summarize(name: str, figures: Figures) -> None:
    kinds = list(dict.fromkeys(kind for _, kind in figures))
    for n in sorted({n for n, _ in figures}):
        med: dict[str, dict[str, float]] = {}
        for kind in kinds:
            reps = figures[(n, kind)]
            ips = ", ".join(f"{side} {statistics.median(g[side] for g in reps):.1f}" for side in reps[0])
            print(f"{name} {n}w {kind}: median img/s {ips}", flush=True)
            med[kind] = {}
            for side, (m, lo, hi) in summary(reps).items():
                med[kind][side] = m
                print(f"{name} {n}w {kind}: median ratio twinbench/{side} = {m:.3f} ({lo:.3f}-{hi:.3f}) over "
                      f"{len(reps)} repeats, tax {100 * (1 - m):+.1f}% ({targets(name, side)})", flush=True)
        a, b = registry.PAIRS[0]  # the headline pair of the report
        if a not in med or b not in med:
            continue
        for side in med[a]:
            diff = (1 - med[b][side]) - (1 - med[a][side])
            print(f"{name} {n}w vs {side}: tax difference {b} - {a} = {100 * diff:+.1f} points (target within "
                  f"{100 * TARGET_TAX_DIFF:.0f})", flush=True)


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True).stdout


def freeze(dest: Path, worktree: bool) -> str:
    """Copy the code measured into ``dest`` (empty or new): ``git archive HEAD``, or with ``worktree`` the working
    tree's tracked and untracked, not ignored, files. Returns what is measured (the commit, and changes)."""
    if dest.exists() and any(dest.iterdir()):
        raise ValueError(f"--frozen {dest}: not empty")
    dest.mkdir(parents=True, exist_ok=True)
    commit = _git("rev-parse", "HEAD").strip()
    if not worktree:
        archive = subprocess.Popen(["git", "-C", str(REPO), "archive", "HEAD"], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=True)
        if archive.stdout:
            archive.stdout.close()
        if archive.wait() != 0:
            raise RuntimeError("git archive HEAD failed")
        return commit
    for rel in _git("ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0"):
        src = REPO / rel
        if rel and os.path.lexists(src):  # a tracked file deleted in the working tree is not copied
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel, follow_symlinks=False)
    changed = len(_git("status", "--porcelain").splitlines())
    return f"{commit} + working tree ({changed} changed or untracked paths)"


def parse_workers(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of worker counts: {text!r}") from None
    if not out or min(out) < 1 or len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(f"worker counts must be distinct and >= 1: {text!r}")
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="smoke,real", help=f"comma-separated, of {', '.join(PRESETS)} (default both)")
    p.add_argument("--workers", type=parse_workers, default=[1, 2], help="comma-separated worker counts (default 1,2)")
    p.add_argument("--repeats", type=int, default=3, help="rotations of the three sides per backend (default 3)")
    p.add_argument("--steps", type=int, default=0, help="training steps per run (default: the preset's)")
    p.add_argument("--warmup", type=int, default=-1, help="untimed first steps, >= 1 (default: the preset's)")
    p.add_argument("--set", action="append", default=[], dest="sets", help="extra job override key=value")
    p.add_argument("--cpu-bind", choices=CPU_BIND, default="none",
                   help="--cpu-bind for every side (default none, twinbench's default)")
    p.add_argument("--mode", choices=("ctl", "fit"), default="ctl",
                   help="twinbench's loop: ctl, its custom loop (default), or fit; the plain loops stay custom loops")
    p.add_argument("--backends", default=",".join(registry.names()), help="comma-separated (default all)")
    p.add_argument("--plain", default=",".join(PLAIN_FEEDS),
                   help=f"the plain sides measured beside twinbench, comma-separated (default {','.join(PLAIN_FEEDS)})")
    p.add_argument("--frozen", type=Path, metavar="DIR",
                   help="first copy the code (git archive HEAD) into DIR, empty or new, and run everything from it")
    p.add_argument("--worktree", action="store_true", help="with --frozen: copy the working tree instead of HEAD")
    return p


def main() -> int:
    a = parser().parse_args()
    names = [n for n in a.preset.split(",") if n]
    unknown = [n for n in names if n not in PRESETS]
    kinds = [k for k in a.backends.split(",") if k]
    plains = [p for p in a.plain.split(",") if p]
    if unknown or a.repeats < 1 or (a.worktree and not a.frozen) or not kinds or not plains \
            or not set(kinds) <= set(registry.names()) or not set(plains) <= set(PLAIN_FEEDS):
        print(f"bench.overhead: unknown preset {unknown}, --repeats < 1, --worktree without --frozen, or --backends "
              f"/ --plain not among {registry.names()} / {list(PLAIN_FEEDS)}", file=sys.stderr)
        return 2
    root = a.frozen.resolve() if a.frozen else REPO
    setups = {name: Setup(root, a.steps or PRESETS[name].steps, PRESETS[name].warmup if a.warmup < 0 else a.warmup,
                          (*PRESETS[name].sets, *a.sets), a.cpu_bind, a.mode) for name in names}
    for name, s in setups.items():
        if not 1 <= s.warm < s.steps:
            print(f"bench.overhead: {name}: need 1 <= warmup < steps, got {s.warm} and {s.steps}", file=sys.stderr)
            return 2
    if a.frozen:
        try:
            what = freeze(root, a.worktree)
        except ValueError as e:
            print(f"bench.overhead: {e}", file=sys.stderr)
            return 2
    else:
        dirty = " + uncommitted changes" if _git("status", "--porcelain", "--untracked-files=no").strip() else ""
        what = f"{_git('rev-parse', 'HEAD').strip()}{dirty} (live checkout)"
    print(f"measuring {what}, from {root}", flush=True)
    loop = "custom loop" if a.mode == "ctl" else "Keras fit (the plain loops stay custom loops)"
    for name, s in setups.items():
        job = " ".join(["jobs/smoke.toml", *s.sets])
        print(f"{name}: {job}, {s.steps} steps ({s.warm} untimed), twinbench mode={a.mode}: {loop}, "
              f"workers {','.join(map(str, a.workers))}, --cpu-bind {a.cpu_bind}", flush=True)
        summarize(name, measure(name, s, a.workers, a.repeats, kinds, ("twinbench", *plains)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
