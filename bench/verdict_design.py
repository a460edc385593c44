"""Which design of the demo's repeats gives a 95% verdict soonest? A simulation fitted to a real demo's runs.

``python -m bench.verdict_design DEMO_DIR [--log DEMO_LOG] [--sims 2000] [--seed 1]``: DEMO_DIR is a demo's results
(``OUT=DIR bash scripts/demo.sh`` with today's fixed rounds, e.g. 6), DEMO_LOG its printed output (each run's
``name ok (N s)`` line: the wall time of a run, start-up included); without it the wall times are the records'
``started_at`` to ``finished_at``.

**The fit** (log images/s; a cell = backend x world size; round k = a cell's k-th run in start order, as the
demo's rounds run every cell once): cell level mu_c (mean over rounds), round effect d_k (the mean over cells of
a round's deviations: the machine's drift, shared by the round's runs), and each cell's own per-run noise sigma_c
(the residual). The noise is fitted at several step counts S from the same runs: each run's sync marks
(``per_rank_sync_marks``, a mark every 25 steps) give the images/s the run would have reported had it stopped at
step S (the slowest rank's time from the end of the warm-up to step S): so "fewer steps" is measured, not assumed.
A run's wall time at S steps is its cell's fixed cost (start-up, warm-up, writing) plus S x its step time.

**The simulation** draws ``--sims`` demos of up to 6 rounds in the demo's order (forward, then reversed): per run
log images/s = mu_c + the machine's drift at that run + noise. The drift is a round effect (normal, sd the fitted
one) plus a random walk over the runs inside and across rounds (per-run step sd half the round effect's: drift
between the two backends of a round, which pairing cannot cancel); the noise is normal with the fitted sd, and,
in a second pass, Student t with 3 degrees of freedom scaled to the same sd (the outliers a shared machine gives).
The truth at each size is exp(mu_horovod - mu_native). Each design's interval is computed on the same draws:

- ``today``: 6 rounds, the bootstrap 95% interval of the ratio of medians, each cell resampled on its own
  (``stats.ratio_interval``'s method; 2,000 resamples here for speed, 10,000 in the report);
- ``paired-t R``: R rounds, the paired interval: the 95% t interval of the mean of the per-round log ratios
  (``stats.paired_t_interval``; exact for normal noise, whatever the drift between rounds);
- ``seq a..b``: paired rounds with looks after rounds a, a+1, ..., b: stop at the first look where every size's
  interval excludes 1, each look's interval at 1 - 0.05 / (number of looks) (Bonferroni: the chance that the
  interval reported, at whichever look the demo stops, misses the truth is at most the sum over looks, 5%).

Printed per design and step count: mean rounds, the demo's wall time for its benchmark runs (from the fitted
costs), per size the coverage of the truth (the share of simulated demos whose reported interval holds it, with
its binomial 95% margin) and the share that decides (an interval excluding 1, the truth's side), and the share
agreeing with today's verdict on the same draws. A benchmark: it judges nothing and exits 0 (2 on bad input).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
from scipy import stats as sst

from common.report.load import load_runs
from common.report.stats import paired_t_interval, welch_ratio_interval

CELLS = (("native", 1), ("horovod", 1), ("native", 2), ("horovod", 2))  # the demo's order in a forward round
SIZES = (1, 2)
ALPHA = 0.05
RESAMPLES = 2000  # the simulation's bootstrap resamples per interval (the report's 10,000 would take minutes)
STEP_COUNTS = (50, 100, 200)  # steps per run tried (the demo's 10 untimed warm-up steps included)
WARM = 10  # the demo's untimed warm-up steps
MAX_ROUNDS = 6


@dataclass
class Fit:
    """What the simulation draws from: per step count, each cell's level and noise; the round effect; the costs."""

    rounds: int
    mu: dict[int, np.ndarray]  # step count -> log images/s per cell (CELLS order)
    sigma: dict[int, np.ndarray]  # step count -> per-run noise sd of log images/s per cell (what a pair does not share)
    drift: dict[int, float]  # world size -> sd of what both backends' runs of a round at that size share (log)
    fixed_s: np.ndarray  # per cell: a run's wall time besides its steps (start-up, warm-up compile, writing)
    step_s: np.ndarray  # per cell: seconds per step


def _pair(size: int) -> tuple[int, int]:
    return CELLS.index(("horovod", size)), CELLS.index(("native", size))


def ips_at(rec: object, steps: int) -> float | None:
    """The images/s the run would have reported had it stopped at ``steps``: global batch x timed steps over the
    slowest rank's time from its warm-up mark to its mark at ``steps`` (None without those marks)."""
    marks = getattr(rec, "per_rank_sync_marks", None)
    gbs = getattr(rec, "global_batch_size", None)
    if not marks or not gbs:
        return None
    spans = []
    for rank in marks:
        at = {int(s): float(t) for s, t in rank}
        if WARM not in at or steps not in at:
            return None
        spans.append(at[steps] - at[WARM])
    return gbs * (steps - WARM) / max(spans)


def _wall_times(log: Path | None, runs: Sequence[object]) -> dict[tuple[str, int], list[float]]:
    out: dict[tuple[str, int], list[float]] = {}
    if log is not None:
        for m in re.finditer(r"^(\w+)-(\d+)-r\d+\s+ok \((\d+) s\)", log.read_text(), re.M):
            out.setdefault((m.group(1), int(m.group(2))), []).append(float(m.group(3)))
        return out
    for r in runs:
        a, b = getattr(r, "started_at", None), getattr(r, "finished_at", None)
        if a and b:
            dt = (datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds()
            out.setdefault((r.backend, r.world_size), []).append(dt)  # type: ignore[attr-defined]
    return out


def fit(directory: Path, log: Path | None) -> Fit:
    """The model's parameters from a demo's results (and its printed output for the wall times)."""
    recs = [x.record for x in load_runs(directory, warn=lambda m: None)]
    by = {c: sorted((r for r in recs if (r.backend, r.world_size) == c), key=lambda r: r.started_at or "")
          for c in CELLS}
    rounds = min(len(v) for v in by.values())
    if rounds < 3:
        raise SystemExit(f"verdict_design: {directory} holds {rounds} run(s) of a cell; the fit needs 3 rounds")
    mu, sigma, drift = {}, {}, {}
    for s in sorted(STEP_COUNTS, reverse=True):
        y = np.log([[ips_at(by[c][k], s) or np.nan for c in CELLS] for k in range(rounds)])  # rounds x cells
        if np.isnan(y).any():
            continue
        mu[s], sd = y.mean(axis=0), np.zeros(len(CELLS))
        for size in SIZES:  # the pair's shared part: the covariance of its two cells over the rounds
            h, n = _pair(size)
            shared = max(float(np.cov(y[:, h], y[:, n])[0, 1]), 0.0)
            drift.setdefault(size, shared ** 0.5)  # at the most steps; fewer steps share the same machine
            for c in (h, n):
                sd[c] = max(float(np.var(y[:, c], ddof=1)) - drift[size] ** 2, 1e-6) ** 0.5
        sigma[s] = sd
    if max(STEP_COUNTS) not in mu:
        raise SystemExit(f"verdict_design: the runs in {directory} lack sync marks at steps {WARM} and 200")
    walls = _wall_times(log, [r for v in by.values() for r in v])
    step_s = np.array([statistics.median(r.timed_wall_time / (r.steps - WARM) for r in by[c]) for c in CELLS])
    wall = np.array([statistics.median(walls.get(c) or [np.nan]) for c in CELLS])
    return Fit(rounds, mu, sigma, drift, wall - max(STEP_COUNTS) * step_s, step_s)


def draw(f: Fit, steps: int, sims: int, rng: np.random.Generator, heavy: bool) -> np.ndarray:
    """Simulated demos: sims x MAX_ROUNDS x cells of log images/s, the runs in the demo's order."""
    order = [list(range(len(CELLS))) if k % 2 == 0 else list(range(len(CELLS)))[::-1] for k in range(MAX_ROUNDS)]
    n_runs = MAX_ROUNDS * len(CELLS)
    step = max(f.drift.values()) / 2  # beyond the fit: a drift from run to run that a pair does not share
    walk = np.cumsum(rng.normal(0, step, (sims, n_runs)), axis=1)
    shared = {size: rng.normal(0, f.drift[size], (sims, MAX_ROUNDS)) for size in SIZES}
    if heavy:
        noise = rng.standard_t(3, (sims, MAX_ROUNDS, len(CELLS))) / np.sqrt(3.0)  # t(3) has variance 3
    else:
        noise = rng.normal(0, 1, (sims, MAX_ROUNDS, len(CELLS)))
    y = np.empty((sims, MAX_ROUNDS, len(CELLS)))
    for k in range(MAX_ROUNDS):
        for pos, c in enumerate(order[k]):
            y[:, k, c] = (f.mu[steps][c] + shared[CELLS[c][1]][:, k] + walk[:, k * len(CELLS) + pos]
                          + f.sigma[steps][c] * noise[:, k, c])
    return y


def unpaired_boot(y: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """Today's interval per simulated demo (sims x 2), 6 rounds: each cell resampled on its own."""
    h, n = _pair(size)
    a, b = np.exp(y[:, :, h]), np.exp(y[:, :, n])
    r = y.shape[1]
    ia, ib = rng.integers(0, r, (RESAMPLES, r)), rng.integers(0, r, (RESAMPLES, r))
    ratios = np.median(a[:, ia], axis=2) / np.median(b[:, ib], axis=2)
    return np.percentile(ratios, [2.5, 97.5], axis=1).T


def paired_t(y: np.ndarray, size: int, rounds: int, alpha: float) -> np.ndarray:
    """The paired t interval of the horovod/native ratio from the first ``rounds`` rounds (sims x 2); the same
    arithmetic as the report's ``stats.paired_t_interval`` (checked on one demo in ``main``), vectorized."""
    h, n = _pair(size)
    d = y[:, :rounds, h] - y[:, :rounds, n]
    half = sst.t.ppf(1 - alpha / 2, rounds - 1) * d.std(axis=1, ddof=1) / np.sqrt(rounds)
    m = d.mean(axis=1)
    return np.exp(np.stack([m - half, m + half], axis=1))


def welch_t(y: np.ndarray, size: int, rounds: int, alpha: float) -> np.ndarray:
    """Welch's t interval of the difference of mean log images/s (the ratio of geometric means), the two cells'
    runs taken as independent samples (``stats.welch_ratio_interval``), vectorized."""
    h, n = _pair(size)
    a, b = y[:, :rounds, h], y[:, :rounds, n]
    va, vb = a.var(axis=1, ddof=1) / rounds, b.var(axis=1, ddof=1) / rounds
    df = (va + vb) ** 2 / (va ** 2 / (rounds - 1) + vb ** 2 / (rounds - 1))
    half = sst.t.ppf(1 - alpha / 2, df) * np.sqrt(va + vb)
    m = a.mean(axis=1) - b.mean(axis=1)
    return np.exp(np.stack([m - half, m + half], axis=1))


Interval = Callable[[np.ndarray, int, int, float], np.ndarray]  # (demos, size, rounds, alpha) -> sims x 2
Design = Callable[[np.ndarray], dict[int, tuple[np.ndarray, np.ndarray]]]  # demos -> size -> (rounds run, intervals)


def sequential(y: np.ndarray, interval: Interval, looks: Sequence[int], alphas: Sequence[float]
               ) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Each size on its own: after each look's round, stop that size's runs when its interval at that look's
    alpha excludes 1; at the last look report whatever it is. Bonferroni: the alphas sum to at most ALPHA."""
    out = {}
    for s in SIZES:
        stop = np.full(y.shape[0], looks[-1])
        ivs = interval(y, s, looks[-1], alphas[-1])
        done = np.zeros(y.shape[0], dtype=bool)
        for r, a in zip(looks[:-1], alphas[:-1]):
            iv = interval(y, s, r, a)
            now = ~done & ((iv[:, 0] > 1) | (iv[:, 1] < 1))
            stop[now], ivs[now] = r, iv[now]
            done |= now
        out[s] = (stop, ivs)
    return out


def verdicts(iv: np.ndarray) -> np.ndarray:
    """+1 horovod faster, -1 native faster, 0 no significant difference."""
    return np.where(iv[:, 0] > 1, 1, np.where(iv[:, 1] < 1, -1, 0))


@dataclass
class Row:
    design: str
    steps: int
    rounds: dict[int, float]
    wall_s: float
    cover: dict[int, float]
    decide: dict[int, float]
    agree: dict[int, float]


def evaluate(f: Fit, steps: int, y: np.ndarray, today: dict[int, np.ndarray], designs: dict[str, Design]
             ) -> list[Row]:
    """Each design on the same simulated demos: rounds, the benchmark runs' wall time, coverage, decisions."""
    truth = {s: float(np.exp(f.mu[steps][_pair(s)[0]] - f.mu[steps][_pair(s)[1]])) for s in SIZES}
    cost = f.fixed_s + steps * f.step_s
    rows = []
    for name, design in designs.items():
        got = design(y)
        wall = sum(float(got[s][0].mean()) * float(cost[list(_pair(s))].sum()) for s in SIZES)
        rows.append(Row(
            name, steps, {s: float(got[s][0].mean()) for s in SIZES}, wall,
            {s: float(np.mean((got[s][1][:, 0] <= truth[s]) & (truth[s] <= got[s][1][:, 1]))) for s in SIZES},
            {s: float(np.mean(verdicts(got[s][1]) == np.sign(np.log(truth[s])))) for s in SIZES},
            {s: float(np.mean(verdicts(got[s][1]) == verdicts(today[s]))) for s in SIZES}))
    return rows


SPLITS = {  # looks (rounds) -> alpha at each look, summing to ALPHA (Bonferroni)
    (3, 4, 5, 6): (0.0125, 0.0125, 0.0125, 0.0125),
    (3, 6): (0.01, 0.04),
    (4, 6): (0.01, 0.04),
    (3, 4): (0.01, 0.04),
}


def designs_for(steps: int, rng: np.random.Generator) -> dict[str, Design]:
    def fixed(interval: Interval, r: int) -> Design:
        return lambda y: {s: (np.full(y.shape[0], r), interval(y, s, r, ALPHA)) for s in SIZES}

    def seq(interval: Interval, looks: tuple[int, ...]) -> Design:
        return lambda y: sequential(y, interval, looks, SPLITS[looks])

    out: dict[str, Design] = {}
    if steps == max(STEP_COUNTS):
        out["today: 6 rounds, unpaired bootstrap"] = lambda y: {s: (np.full(y.shape[0], 6), unpaired_boot(y, s, rng))
                                                               for s in SIZES}
    for name, iv in (("paired t", paired_t), ("welch t", welch_t)):
        out.update({f"{name}, {r} rounds": fixed(iv, r) for r in (3, 4, 6)})
        out.update({f"{name}, looks {','.join(map(str, k))} alpha {'/'.join(f'{a:g}' for a in a_)}": seq(iv, k)
                    for k, a_ in SPLITS.items()})
    return out


def print_fit(f: Fit) -> None:
    shared = ", ".join(f"{s} replica(s) {100 * d:.1f}%" for s, d in f.drift.items())
    print(f"fit: {f.rounds} rounds; what a round's pair shares (drift), sd (log): {shared}; per-run noise sd:")
    for s in sorted(f.sigma):
        cells = ", ".join(f"{b} {n}: {np.exp(f.mu[s][i]):.0f} img/s +-{100 * f.sigma[s][i]:.1f}%"
                          for i, (b, n) in enumerate(CELLS))
        print(f"  {s} steps: {cells}")
    print("  wall per run (s): " + ", ".join(f"{b} {n}: {f.fixed_s[i]:.1f} + {s} x {1e3 * f.step_s[i]:.1f} ms"
                                            for i, (b, n) in enumerate(CELLS) for s in [max(STEP_COUNTS)]))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.verdict_design", description=__doc__.split("\n")[0])
    ap.add_argument("demo_dir", type=Path)
    ap.add_argument("--log", type=Path, help="the demo's printed output (each run's wall time)")
    ap.add_argument("--sims", type=int, default=2000, help="simulated demos per design (default 2000)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    if not a.demo_dir.is_dir() or (a.log is not None and not a.log.is_file()) or a.sims < 100:
        print("verdict_design: DEMO_DIR must be a directory, --log a file, --sims at least 100", file=sys.stderr)
        return 2
    f = fit(a.demo_dir, a.log)
    print_fit(f)
    rng = np.random.default_rng(a.seed)
    one = draw(f, max(STEP_COUNTS), 1, rng, False)
    h, n = _pair(2)
    assert np.allclose(paired_t(one, 2, 4, ALPHA)[0], paired_t_interval(np.exp(one[0, :4, h]), np.exp(one[0, :4, n])))
    assert np.allclose(welch_t(one, 2, 4, ALPHA)[0], welch_ratio_interval(np.exp(one[0, :4, h]), np.exp(one[0, :4, n])))
    for heavy in (False, True):
        print(f"\nnoise {'Student t(3), same sd' if heavy else 'normal'}; {a.sims} simulated demos; coverage margin "
              f"+-{100 * 1.96 * (0.95 * 0.05 / a.sims) ** 0.5:.1f} points at 95%; rounds per size; cover = share of "
              "intervals holding the truth, decide = share excluding 1 on the truth's side, agree = same verdict as "
              "today's design on the same demo")
        y200 = draw(f, max(STEP_COUNTS), a.sims, rng, heavy)
        today = {s: unpaired_boot(y200, s, rng) for s in SIZES}
        print(f"{'design':46} {'steps':>5} {'rounds':>9} {'bench s':>7}"
              + "".join(f" | {s} repl.: cover decide agree" for s in SIZES))
        for steps in sorted(f.mu, reverse=True):
            y = y200 if steps == max(STEP_COUNTS) else draw(f, steps, a.sims, rng, heavy)
            for r in evaluate(f, steps, y, today, designs_for(steps, rng)):
                rounds = "/".join(f"{r.rounds[s]:.1f}" for s in SIZES)
                print(f"{r.design:46} {r.steps:5d} {rounds:>9} {r.wall_s:7.0f}" + "".join(
                    f" | {100 * r.cover[s]:12.1f}% {100 * r.decide[s]:5.1f}% {100 * r.agree[s]:4.1f}%" for s in SIZES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
