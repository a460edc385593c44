"""Statistics of the report (Hoefler & Belli, SC15: medians and nonparametric intervals), with scipy and numpy.

- A row's centre is the median images/s over its repeats.
- With at least ``MIN_CI_RUNS`` repeats, its 95% interval is the distribution-free confidence interval of the
  median from order statistics: with x(1) <= ... <= x(n) the sorted repeats and F the cdf of Binomial(n, 1/2),
  j = max{m + 1 : F(m) <= 0.025} and k = n + 1 - j; [x(j), x(k)] covers the population median with probability
  1 - 2 F(j - 1) >= 0.95 (n = 6: j = 1, k = 6, coverage 96.9%). Below 6 repeats no j exists (F(0) = 2^-n > 0.025),
  so the report shows the range min-max, labelled as such.
- The ratio of two backends' medians gets a bootstrap 95% percentile interval when both cells have at least
  ``MIN_CI_RUNS`` repeats: the two samples are independent, each is resampled with replacement on its own
  (``BOOTSTRAP_RESAMPLES`` times, numpy Generator seeded ``BOOTSTRAP_SEED``, so the report is reproducible), and
  the interval is the 2.5% and 97.5% percentiles of median(numerator*) / median(denominator*).
- When both backends ran in rounds on the same nodes (``paired_t_interval``), the ratio's interval is paired: the
  Student t 95% interval of the mean of the per-round log ratios, exponentiated (the geometric mean of the round
  ratios), from ``MIN_PAIRED_ROUNDS`` (3) rounds. What a round's machine state did to both runs of its pair cancels.
  On the demo's real spread 4 paired rounds decide at least as often as 6 unpaired runs a cell, at 95% coverage
  (bench/verdict_design.py; docs/measurement.md).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

MIN_CI_RUNS = 6  # repeats needed for a 95% confidence interval of a median (and for the ratio's bootstrap)
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 20151115  # SC15: any fixed seed; fixed so that the same results give the same report
NEEDS_RUNS = f"needs {MIN_CI_RUNS} runs per cell"  # the ratio's interval when a cell has fewer repeats


@dataclass(frozen=True)
class Interval:
    """An interval around a median and what it is: "95% CI" (order statistics) or "min-max" (fewer repeats)."""

    low: float
    high: float
    kind: str  # "95% CI" or "min-max"
    n: int
    coverage: float | None = None  # the exact coverage of a "95% CI" (>= 0.95); None for min-max

    def text(self, fmt: str = ".1f") -> str:
        """e.g. "[85.0, 120.0] 95% CI" or "[100.0, 120.0] min-max (n=3)"."""
        what = self.kind if self.kind != "min-max" else f"min-max (n={self.n})"
        return f"[{self.low:{fmt}}, {self.high:{fmt}}] {what}"


def median_ranks(n: int) -> tuple[int, int] | None:
    """The 1-based ranks (j, k) of the 95% order-statistic interval of the median of n values, None for n < 6."""
    if n < MIN_CI_RUNS:
        return None
    from scipy.stats import binom

    cdf = binom.cdf(range(n + 1), n, 0.5)
    j = max(m + 1 for m in range(n + 1) if cdf[m] <= 0.025)
    return j, n + 1 - j


def median_interval(values: Sequence[float]) -> Interval | None:
    """The 95% CI of the median (>= 6 values), else min-max (2-5 values); None for a single value."""
    xs = sorted(float(v) for v in values)
    n = len(xs)
    if n < 2:
        return None
    ranks = median_ranks(n)
    if ranks is None:
        return Interval(xs[0], xs[-1], "min-max", n)
    from scipy.stats import binom

    j, k = ranks
    return Interval(xs[j - 1], xs[k - 1], "95% CI", n, float(1 - 2 * binom.cdf(j - 1, n, 0.5)))


def ratio_interval(num: Sequence[float], den: Sequence[float]) -> tuple[float, float] | None:
    """Bootstrap 95% percentile interval of median(num) / median(den) (independent samples), None unless both
    have at least 6 values."""
    if len(num) < MIN_CI_RUNS or len(den) < MIN_CI_RUNS:
        return None
    import numpy as np

    rng = np.random.default_rng(BOOTSTRAP_SEED)
    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    ma = np.median(a[rng.integers(0, len(a), (BOOTSTRAP_RESAMPLES, len(a)))], axis=1)
    mb = np.median(b[rng.integers(0, len(b), (BOOTSTRAP_RESAMPLES, len(b)))], axis=1)
    lo, hi = np.percentile(ma / mb, [2.5, 97.5])
    return float(lo), float(hi)


def difference_interval(num: Sequence[float], den: Sequence[float]) -> tuple[float, float] | None:
    """Bootstrap 95% percentile interval of median(num) - median(den) (independent samples, resampled as
    ``ratio_interval``'s), None unless both have at least 6 values: a breakdown phase's difference between backends."""
    if len(num) < MIN_CI_RUNS or len(den) < MIN_CI_RUNS:
        return None
    import numpy as np

    rng = np.random.default_rng(BOOTSTRAP_SEED)
    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    ma = np.median(a[rng.integers(0, len(a), (BOOTSTRAP_RESAMPLES, len(a)))], axis=1)
    mb = np.median(b[rng.integers(0, len(b), (BOOTSTRAP_RESAMPLES, len(b)))], axis=1)
    lo, hi = np.percentile(ma - mb, [2.5, 97.5])
    return float(lo), float(hi)


MIN_PAIRED_ROUNDS = 3  # rounds a paired t interval needs: 2 give one degree of freedom (t = 12.7), no verdict


def paired_t_interval(num: Sequence[float], den: Sequence[float], alpha: float = 0.05) -> tuple[float, float] | None:
    """The 1 - ``alpha`` interval of the ratio num/den from rounds where ``num[i]`` and ``den[i]`` ran back to back
    (the demo's rounds): the Student t interval of the mean of the per-round log ratios, exponentiated, i.e. of
    their geometric mean. Whatever the machine did to a round (load, thermal drift) hits both runs of its pair and
    cancels in the ratio; the t interval is exact for normal log ratios, with any number of rounds from
    ``MIN_PAIRED_ROUNDS`` (bench/verdict_design.py measures its coverage on a real demo's spread). None under 3."""
    if len(num) != len(den) or len(num) < MIN_PAIRED_ROUNDS:
        return None
    import numpy as np
    from scipy.stats import t

    d = np.log(np.asarray(num, dtype=float)) - np.log(np.asarray(den, dtype=float))
    half = float(t.ppf(1 - alpha / 2, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d)))
    return float(np.exp(d.mean() - half)), float(np.exp(d.mean() + half))


def welch_ratio_interval(num: Sequence[float], den: Sequence[float], alpha: float = 0.05
                         ) -> tuple[float, float] | None:
    """The 1 - ``alpha`` interval of the ratio of the two cells' geometric means: Welch's t interval of the
    difference of their mean log images/s (``scipy.stats.ttest_ind(..., equal_var=False)``), exponentiated. The
    runs are taken as independent, which a shared machine's drift makes conservative (it moves both cells of a round
    alike). None unless both have at least ``MIN_PAIRED_ROUNDS`` values."""
    if len(num) < MIN_PAIRED_ROUNDS or len(den) < MIN_PAIRED_ROUNDS:
        return None
    import numpy as np
    from scipy.stats import ttest_ind

    ci = ttest_ind(np.log(np.asarray(num, dtype=float)), np.log(np.asarray(den, dtype=float)),
                   equal_var=False).confidence_interval(1 - alpha)
    return float(np.exp(ci.low)), float(np.exp(ci.high))


def median(values: Iterable[float | None]) -> float | None:
    """Median of the values that are not None; None when there are none."""
    vals = [float(v) for v in values if v is not None]
    return statistics.median(vals) if vals else None


def num(value: Any) -> float | None:
    """A JSON number as float, else None (bools are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
