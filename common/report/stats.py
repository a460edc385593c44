"""Statistics of the report: Student-t quantiles, the 95% interval of the mean, medians of optional numbers."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

# Two-sided 95% Student-t quantiles t(0.975, df) for df = 1..30 (scipy.stats.t.ppf(0.975, df)).
_T975 = (
    12.706204736174694, 4.302652729749462, 3.1824463052837078, 2.7764451051977934, 2.5705818356363146,
    2.4469118511449786, 2.364624251592784, 2.306004135204166, 2.262157162798205, 2.228138851986274,
    2.200985160091639, 2.1788128296672284, 2.1603686564627913, 2.144786687917804, 2.131449545559776,
    2.1199052992212546, 2.1098155778333156, 2.1009220402410382, 2.0930240544083087, 2.085963447265864,
    2.0796138447276795, 2.0738730679040254, 2.0686576104190486, 2.0638985616280245, 2.0595385527532972,
    2.0555294386428735, 2.0518305164802846, 2.0484071417952454, 2.045229642132703, 2.0422724563012378,
)
_Z975 = 1.959963984540054  # standard normal 0.975 quantile


def t_quantile_975(df: int) -> float:
    """t(0.975, df): tabulated for df <= 30, Cornish-Fisher expansion beyond (error < 3e-8)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


def mean_ci95(values: Sequence[float]) -> tuple[float, float] | None:
    """Student-t 95% confidence interval of the mean; None for fewer than two values."""
    n = len(values)
    if n < 2:
        return None
    m = statistics.fmean(values)
    half = t_quantile_975(n - 1) * statistics.stdev(values) / math.sqrt(n)
    return m - half, m + half


def median(values: Iterable[float | None]) -> float | None:
    """Median of the values that are not None; None when there are none."""
    vals = [float(v) for v in values if v is not None]
    return statistics.median(vals) if vals else None


def num(value: Any) -> float | None:
    """A JSON number as float, else None (bools are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
