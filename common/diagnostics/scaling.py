"""A first-order scaling model (no TensorFlow): compute time from a 1-worker run, communication from the
allreduce microbenchmark, ring allreduce bound for the gradient bytes.

- Fit ``time = alpha + beta * bytes`` to the microbenchmark measured at ``n_fit`` ranks (least squares on the
  medians). With a ring, ``beta = 2(n-1)/n / B`` where ``B`` is the bus (per-link) bandwidth, and the latency
  term is ``2(n-1)`` hops, so ``alpha_hop = alpha / (2(n_fit-1))``.
- Predicted step time at N workers: ``t_compute + 2(N-1) * alpha_hop + 2(N-1)/N * S / B`` with ``S`` the
  gradient bytes allreduced per step. No overlap of communication with the backward pass is assumed, so this is
  an upper bound on step time (a lower bound on efficiency) for one-GPU-per-worker data parallelism.
- Efficiency(N) = t_compute / step(N) (throughput(N) / (N x throughput(1)) with the 1-worker run's step time).
- Horovod's fp16 compression halves S (the results JSON's ``gradient_bytes`` already reflects it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

EXTRAPOLATE = (8, 16, 32, 64, 128, 256, 512)  # world sizes of the extrapolated table (clearly labelled a model)


@dataclass(frozen=True)
class LinkFit:
    n_fit: int  # ranks the microbenchmark ran on
    alpha: float  # s, fitted latency at n_fit ranks
    beta: float  # s per byte at n_fit ranks
    bus_bandwidth: float  # bytes/s per link, B

    @property
    def alpha_hop(self) -> float:
        return self.alpha / (2 * (self.n_fit - 1))


def fit_alpha_beta(rows: list[dict[str, Any]], n_fit: int) -> LinkFit | None:
    """Least-squares fit of time_median = alpha + beta * bytes; None when it cannot be fitted (< 2 sizes, 1 rank,
    or a non-positive slope)."""
    pts = [(float(r["bytes"]), float(r["time_median"])) for r in rows if r.get("time_median")]
    if n_fit < 2 or len({b for b, _ in pts}) < 2:
        return None
    n = len(pts)
    mx = sum(b for b, _ in pts) / n
    my = sum(t for _, t in pts) / n
    sxx = sum((b - mx) ** 2 for b, _ in pts)
    beta = sum((b - mx) * (t - my) for b, t in pts) / sxx
    alpha = max(my - beta * mx, 0.0)
    if beta <= 0:
        return None
    return LinkFit(n_fit=n_fit, alpha=alpha, beta=beta, bus_bandwidth=2 * (n_fit - 1) / n_fit / beta)


def comm_time(fit: LinkFit, grad_bytes: float, n: int) -> float:
    """Ring allreduce time of ``grad_bytes`` over ``n`` workers (0 for one worker)."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * fit.alpha_hop + 2 * (n - 1) / n * grad_bytes / fit.bus_bandwidth


def predict(t_compute: float, grad_bytes: float, fit: LinkFit, n: int) -> dict[str, float]:
    step = t_compute + comm_time(fit, grad_bytes, n)
    return {"world_size": n, "step_time": step, "efficiency": t_compute / step, "comm_time": step - t_compute}
