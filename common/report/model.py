"""The report's allreduce microbenchmark tables and its scaling-model section (arithmetic in
common.diagnostics.scaling)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from common.core.records import AllreduceRecord
from common.diagnostics import scaling
from common.report.base import NA
from common.report.environment import distinct
from common.report.render import fmt_num, md_table
from common.report.rows import JobSummary
from common.report.stats import median, num


def format_allreduce(benches: Sequence[AllreduceRecord]) -> str:
    """One Markdown table per backend x world size: time, algbw and busbw per message size."""
    lines = ["## Allreduce microbenchmark", "",
             "SUM of float32 tensors; time = median over iterations of the slowest rank; algbw = bytes / time; "
             "busbw = algbw x 2(n-1)/n (nccl-tests' definitions).", ""]
    for b in benches:
        lines += [f"### {b.backend}, {b.world_size} ranks ({b.collective_used or NA}; hosts "
                  f"{distinct(str(h) for h in b.hosts or [])})", ""]
        body = [[f"{int(r['bytes']):,}", fmt_num(num(r.get("time_median")), ".1f", 1e6),
                 fmt_num(num(r.get("time_p95")), ".1f", 1e6), fmt_num(num(r.get("algbw_GBps")), ".3f"),
                 fmt_num(num(r.get("busbw_GBps")), ".3f")] for r in b.rows]
        lines += [md_table(("bytes", "time p50 (us)", "time p95 (us)", "algbw (GB/s)", "busbw (GB/s)"), body), ""]
    return "\n".join(lines)


Block = tuple[Any, ...]  # ("h", title) | ("p", text) | ("table", header, body): rendered as Markdown or HTML
MAX_EXTRAPOLATION = 4  # the model's table goes at most this factor beyond the largest measured size by default


@dataclass
class ModelSection:
    """One job's scaling model, as blocks both report.md and report.html render."""

    title: str
    blocks: list[Block]

    @property
    def markdown(self) -> str:
        out = [f"## {self.title}", ""]
        for b in self.blocks:
            if b[0] == "h":
                out += [f"### {b[1]}", ""]
            elif b[0] == "p":
                out += [b[1], ""]
            else:
                out += [md_table(b[1], b[2]), ""]
        return "\n".join(out).rstrip("\n")


def extrapolation_sizes(largest: int, extrapolate_to: int | None = None) -> list[int]:
    """The world sizes of the model's extrapolation: scaling.EXTRAPOLATE's beyond the largest measured size, up to
    ``extrapolate_to`` if given, else MAX_EXTRAPOLATION x the largest measured size."""
    limit = extrapolate_to if extrapolate_to is not None else MAX_EXTRAPOLATION * largest
    sizes = [n for n in scaling.EXTRAPOLATE if largest < n <= limit]
    return sizes + ([limit] if limit > largest and limit not in sizes else [])


@dataclass(frozen=True)
class ModelInputs:
    """What the scaling model of one backend is computed from (the report's and the planner's)."""

    backend: str
    t_compute: float  # s, the 1-replica median step
    grad_bytes: float
    fit: scaling.LinkFit
    bench_world_size: int
    compression: str | None


def model_inputs(summary: JobSummary, backend: str, benches: Sequence[AllreduceRecord]) -> ModelInputs | str:
    """The model's inputs for ``backend`` (a row label that is a backend's own: its default way of training) from
    the measurements, or the sentence saying why there are none."""
    base = next((r for r in summary.rows if r.identity.label == backend and r.identity.world_size == 1), None)
    bench = next((b for b in reversed(benches) if b.backend == backend and b.world_size >= 2), None)
    grad = median(num(r.gradient_bytes) for r in summary.records if r.backend == backend and r.world_size == 1)
    if base is None or bench is None or grad is None or base.steps.p50 is None:
        missing = [w for w, ok in (("a 1-replica run", base is not None and grad is not None),
                                   ("an allreduce benchmark at >= 2 ranks", bench is not None)) if not ok]
        return f"no model ({' and '.join(missing)} missing)"
    fit = scaling.fit_alpha_beta(bench.rows, bench.world_size)
    if fit is None:
        return "no model (the allreduce times do not fit alpha + beta x bytes)"
    comp = next((r.compression for r in summary.records if r.backend == backend), None)
    return ModelInputs(backend, base.steps.p50, grad, fit, bench.world_size, comp)


def _backend_model(summary: JobSummary, backend: str, benches: Sequence[AllreduceRecord],
                   extrapolate_to: int | None = None) -> list[Block]:
    """One backend's model: fitted link, predicted vs measured table and extrapolation; or why there is none."""
    m_in = model_inputs(summary, backend, benches)
    if isinstance(m_in, str):
        return [("p", f"- {backend}: {m_in}")]
    tc, grad, fit, comp = m_in.t_compute, m_in.grad_bytes, m_in.fit, m_in.compression
    blocks: list[Block] = [("h", f"Model: {backend}"), (
        "p", f"Compute time per step {tc * 1e3:.2f} ms (1-replica median step), gradient bytes S = "
             f"{int(grad):,}{' (fp16 compression: half of float32)' if comp == 'fp16' else ''}; fitted from "
             f"the {m_in.bench_world_size}-rank allreduce benchmark: latency {fit.alpha * 1e6:.1f} us "
             f"({fit.alpha_hop * 1e6:.2f} us per ring hop), bus bandwidth {fit.bus_bandwidth / 1e9:.3f} GB/s. "
             "Step(N) = compute + 2(N-1) x hop latency + 2(N-1)/N x S / B, no overlap (an upper bound).")]
    measured = {r.identity.world_size: r for r in summary.rows if r.identity.label == backend}
    body = []
    for n in sorted(measured):
        p = scaling.predict(tc, grad, fit, n)
        m = measured[n]
        body.append([str(n), fmt_num(m.steps.p50, ".2f", 1e3), fmt_num(p["step_time"], ".2f", 1e3),
                     fmt_num(m.scaling.efficiency, ".1f", 100, "%"), fmt_num(p["efficiency"], ".1f", 100, "%")])
    blocks.append(("table", ("replicas", "measured step p50 (ms)", "predicted step (ms)", "measured efficiency",
                             "predicted efficiency"), body))
    sizes = extrapolation_sizes(max(measured), extrapolate_to)
    if not sizes:
        return blocks
    body = [[str(n), fmt_num(p["step_time"], ".2f", 1e3), fmt_num(p["comm_time"], ".2f", 1e3),
             fmt_num(p["efficiency"], ".1f", 100, "%")] for n in sizes for p in [scaling.predict(tc, grad, fit, n)]]
    how_far = f"up to {extrapolate_to} replicas (--extrapolate-to)" if extrapolate_to is not None else \
        f"at most {MAX_EXTRAPOLATION}x the largest measured size; --extrapolate-to N for more"
    return blocks + [("p", f"Extrapolation (MODEL, not measured; assumes the benchmarked links at every size; "
                           f"{how_far}):"),
                     ("table", ("replicas", "predicted step (ms)", "of which allreduce (ms)", "predicted efficiency"),
                      body)]


def format_model(summary: JobSummary, benches: Sequence[AllreduceRecord],
                 extrapolate_to: int | None = None) -> ModelSection | None:
    """Predicted vs measured step time and efficiency per backend, and the extrapolation: a section of its own,
    labelled a model (never in the measured tables and plots); None when no backend can be modelled."""
    # Asynchronous rows (their own labels, no backend of a run) exchange no allreduce: no model for them.
    real = {r.backend for r in summary.records}
    blocks = [b for backend in summary.backends if backend in real
              for b in _backend_model(summary, backend, benches, extrapolate_to)]
    if not blocks:
        return None
    intro = ("p", "Model, not measured: an alpha-beta model fitted to the allreduce microbenchmark; its numbers are "
                  "predictions, kept out of the measured tables and plots above.")
    return ModelSection(f"Scaling model (Model, not measured) — {summary.name} (`{summary.job_hash}`)",
                        [intro, *blocks])
