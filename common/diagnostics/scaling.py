"""A first-order scaling model (no TensorFlow): compute time from a 1-worker run, communication from the
allreduce microbenchmark, ring allreduce bound for the gradient bytes.

- Fit ``time = alpha + beta * bytes`` to the microbenchmark measured at ``n_fit`` ranks: a Theil-Sen line through
  the per-size medians (scipy.stats.theilslopes: the median of the pairwise slopes, the intercept the median of
  ``time - beta * bytes``), so one disturbed size (a 64 KiB message slower than a 1 MiB one) moves it little where
  least squares would carry it; with two sizes it is the line through both. ``fit_quality`` says how well the
  line fits the measured points. With a ring, ``beta = 2(n-1)/n / B`` where ``B`` is the bus (per-link)
  bandwidth, and the latency term is ``2(n-1)`` hops, so ``alpha_hop = alpha / (2(n_fit-1))``.
- Predicted step time at N workers: ``t_compute + 2(N-1) * alpha_hop + 2(N-1)/N * S / B`` with ``S`` the
  gradient bytes allreduced per step. No overlap of communication with the backward pass is assumed, so this is
  an upper bound on step time (a lower bound on efficiency) for one-GPU-per-worker data parallelism.
- Efficiency(N) = t_compute / step(N) (throughput(N) / (N x throughput(1)) with the 1-worker run's step time).
- Horovod's fp16 compression halves S (the results JSON's ``gradient_bytes`` already reflects it).
- The planner (``python -m common.planner``) uses the same :func:`predict` with two more parameters: an overlap
  fraction (step = compute + comm - overlap x min(compute, comm)) and GPUs per node (a hierarchical allreduce:
  reduce-scatter and allgather inside a node over an intra-node link, ring across nodes over the inter-node link).
  Their defaults (0, 1) are the report's model.
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


def _points(rows: list[dict[str, Any]]) -> list[tuple[float, float]]:
    return [(float(r["bytes"]), float(r["time_median"])) for r in rows if r.get("time_median")]


def fit_alpha_beta(rows: list[dict[str, Any]], n_fit: int) -> LinkFit | None:
    """Theil-Sen fit of time_median = alpha + beta * bytes (robust to a disturbed size); None when it cannot be
    fitted (< 2 sizes, 1 rank, or a non-positive slope)."""
    from scipy.stats import theilslopes

    pts = _points(rows)
    if n_fit < 2 or len({b for b, _ in pts}) < 2:
        return None
    xs, ys = [b for b, _ in pts], [t for _, t in pts]
    beta, intercept, _, _ = theilslopes(ys, xs, method="joint")
    beta = float(beta)
    if not beta > 0:
        return None
    alpha = max(float(intercept), 0.0)
    return LinkFit(n_fit=n_fit, alpha=alpha, beta=beta, bus_bandwidth=2 * (n_fit - 1) / n_fit / beta)


def fit_quality(fit: LinkFit, rows: list[dict[str, Any]]) -> str:
    """How well ``fit`` fits the benchmark's measured sizes: the median relative error and the worst point."""
    errs = sorted(((t - (fit.alpha + fit.beta * b)) / t, b, t) for b, t in _points(rows) if t > 0)
    if not errs:
        return "no measured point to compare the fit with"
    worst = max(errs, key=lambda e: abs(e[0]))
    med = sorted(abs(e[0]) for e in errs)[len(errs) // 2]
    size = f"{worst[1] / 1024:g} KiB" if worst[1] < 1 << 20 else f"{worst[1] / (1 << 20):g} MiB"
    return (f"the line fits the {len(errs)} measured sizes within {100 * med:.1f}% (median); worst {size}: "
            f"{worst[2] * 1e3:.2f} ms measured, {(fit.alpha + fit.beta * worst[1]) * 1e3:.2f} ms on the line "
            f"({100 * abs(worst[0]):.0f}% of the measured {'below' if worst[0] > 0 else 'above'} it)")


def comm_time(fit: LinkFit, grad_bytes: float, n: int) -> float:
    """Ring allreduce time of ``grad_bytes`` over ``n`` workers (0 for one worker)."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * fit.alpha_hop + 2 * (n - 1) / n * grad_bytes / fit.bus_bandwidth


def stated_link(hop_latency: float, bandwidth: float) -> LinkFit:
    """A link given by its per-hop latency (s) and bandwidth (bytes/s) instead of a fit: the LinkFit a 2-rank
    benchmark of that link would give."""
    if not (hop_latency >= 0 and bandwidth > 0):
        raise ValueError(f"a link needs latency >= 0 and bandwidth > 0 (got {hop_latency}, {bandwidth})")
    return LinkFit(n_fit=2, alpha=2 * hop_latency, beta=1 / bandwidth, bus_bandwidth=bandwidth)


def node_layout(n: int, gpus_per_node: int) -> tuple[int, int]:
    """(nodes, GPUs per node) of ``n`` workers, nodes filled first; ValueError when ``n`` does not fill whole
    nodes."""
    if gpus_per_node < 1:
        raise ValueError(f"GPUs per node must be >= 1, got {gpus_per_node}")
    if n <= gpus_per_node:
        return 1, n
    if n % gpus_per_node:
        raise ValueError(f"{n} GPUs do not fill whole nodes of {gpus_per_node}")
    return n // gpus_per_node, gpus_per_node


def hier_comm_time(inter: LinkFit, intra: LinkFit | None, grad_bytes: float, n: int, gpus_per_node: int) -> float:
    """Hierarchical allreduce of ``grad_bytes`` over ``n`` workers, ``gpus_per_node`` per node: reduce-scatter
    inside each node over the intra link, ring allreduce across the nodes over the inter link (the node's shards
    share its link: S crosses it as in a ring of nodes), allgather inside the node. One node: a ring over the intra
    link; one GPU per node: :func:`comm_time` over the inter link. ``intra`` None: the inter link inside too."""
    nodes, g = node_layout(n, gpus_per_node)
    intra = intra or inter
    if nodes == 1:
        return comm_time(intra, grad_bytes, g)
    inside = 0.0
    if g > 1:  # reduce-scatter + allgather: (g-1) hops and (g-1)/g x S each
        inside = 2 * (g - 1) * intra.alpha_hop + 2 * (g - 1) / g * grad_bytes / intra.bus_bandwidth
    return inside + comm_time(inter, grad_bytes, nodes)


def overlapped(t_compute: float, comm: float, overlap: float) -> float:
    """Step time with a fraction ``overlap`` (0 none .. 1 full) of communication hidden behind the backward pass:
    ``compute + comm - overlap x min(compute, comm)`` (overlap 1: ``max(compute, comm)``)."""
    if not 0.0 <= overlap <= 1.0:
        raise ValueError(f"overlap must be between 0 and 1, got {overlap}")
    return t_compute + comm - overlap * min(t_compute, comm)


def overlap_from_breakdown(phases: dict[str, float], measured_step: float) -> float | None:
    """The overlap a training run achieved: the breakdown's serialized step (no overlap) minus the run's measured
    step, as a fraction of min(compute, comm), clamped to [0, 1]; None when compute or comm is 0."""
    hideable = min(phases.get("compute", 0.0), phases.get("comm", 0.0))
    if hideable <= 0:
        return None
    return min(max((sum(phases.values()) - measured_step) / hideable, 0.0), 1.0)


def predict(t_compute: float, grad_bytes: float, fit: LinkFit, n: int, *, overlap: float = 0.0,
            gpus_per_node: int = 1, intra: LinkFit | None = None) -> dict[str, float]:
    """Predicted step (s), allreduce time and efficiency at ``n`` workers. Defaults (no overlap, one GPU per node):
    the flat ring the report's model uses."""
    comm = hier_comm_time(fit, intra, grad_bytes, n, gpus_per_node)
    step = overlapped(t_compute, comm, overlap)
    nodes, _ = node_layout(n, gpus_per_node)
    return {"world_size": n, "nodes": nodes, "step_time": step, "efficiency": t_compute / step, "comm_time": comm,
            "exposed_comm": step - t_compute}
