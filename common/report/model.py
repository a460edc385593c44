"""The report's allreduce microbenchmark tables and its scaling-model section (arithmetic in
common.diagnostics.scaling)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from common.diagnostics import scaling
from common.report.base import NA
from common.report.load import capabilities, collective_used
from common.report.render import distinct, fmt_num, md_table
from common.report.stats import median, num
from common.report.summary import JobSummary


def format_allreduce(benches: Sequence[Mapping[str, Any]]) -> str:
    """One Markdown table per backend x world size: time, algbw and busbw per message size."""
    lines = ["## Allreduce microbenchmark", "",
             "SUM of float32 tensors; time = median over iterations of the slowest rank; algbw = bytes / time; "
             "busbw = algbw x 2(n-1)/n (nccl-tests' definitions).", ""]
    for b in benches:
        comm = collective_used(b) or NA
        lines += [f"### {b['backend']}, {b['world_size']} ranks ({comm}; hosts "
                  f"{distinct(str(h) for h in b.get('hosts', []))})", ""]
        body = [[f"{int(r['bytes']):,}", fmt_num(num(r.get("time_median")), ".1f", 1e6),
                 fmt_num(num(r.get("time_p95")), ".1f", 1e6), fmt_num(num(r.get("algbw_GBps")), ".3f"),
                 fmt_num(num(r.get("busbw_GBps")), ".3f")] for r in b["rows"]]
        lines += [md_table(("bytes", "time p50 (us)", "time p95 (us)", "algbw (GB/s)", "busbw (GB/s)"), body), ""]
    return "\n".join(lines)


@dataclass(frozen=True)
class ModelInputs:
    """What the scaling model of one backend is computed from (the report's and the planner's)."""

    backend: str
    t_compute: float  # s, the 1-replica median step
    grad_bytes: float
    fit: scaling.LinkFit
    bench_world_size: int
    compression: str | None


def model_inputs(summary: JobSummary, backend: str, benches: Sequence[Mapping[str, Any]]) -> ModelInputs | str:
    """The model's inputs for ``backend`` from the measurements, or the sentence saying why there are none."""
    base = next((r for r in summary.rows if r.backend == backend and r.world_size == 1), None)
    bench = next((b for b in reversed(benches) if b["backend"] == backend and b["world_size"] >= 2), None)
    grad = median(num(r.get("gradient_bytes")) for r in summary.runs
                  if r["backend"] == backend and r["world_size"] == 1)
    if base is None or bench is None or grad is None or base.step_p50 is None:
        missing = [w for w, ok in (("a 1-replica run", base is not None and grad is not None),
                                   ("an allreduce benchmark at >= 2 ranks", bench is not None)) if not ok]
        return f"no model ({' and '.join(missing)} missing)"
    fit = scaling.fit_alpha_beta(bench["rows"], bench["world_size"])
    if fit is None:
        return "no model (the allreduce times do not fit alpha + beta x bytes)"
    comp = next((capabilities(r).get("compression") for r in summary.runs if r["backend"] == backend), None)
    return ModelInputs(backend, base.step_p50, grad, fit, bench["world_size"], comp)


def _backend_model(summary: JobSummary, backend: str, benches: Sequence[Mapping[str, Any]]) -> list[str]:
    """One backend's model: fitted link, predicted vs measured table and extrapolation; or why there is none."""
    m_in = model_inputs(summary, backend, benches)
    if isinstance(m_in, str):
        return [f"- {backend}: {m_in}"]
    tc, grad, fit, comp = m_in.t_compute, m_in.grad_bytes, m_in.fit, m_in.compression
    lines = [f"### Model: {backend}", "",
             f"Compute time per step {tc * 1e3:.2f} ms (1-replica median step), gradient bytes S = "
             f"{int(grad):,}{' (fp16 compression: half of float32)' if comp == 'fp16' else ''}; fitted from "
             f"the {m_in.bench_world_size}-rank allreduce benchmark: latency {fit.alpha * 1e6:.1f} us "
             f"({fit.alpha_hop * 1e6:.2f} us per ring hop), bus bandwidth {fit.bus_bandwidth / 1e9:.3f} GB/s. "
             "Step(N) = compute + 2(N-1) x hop latency + 2(N-1)/N x S / B, no overlap (an upper bound).", ""]
    measured = {r.world_size: r for r in summary.rows if r.backend == backend}
    body = []
    for n in sorted(measured):
        p = scaling.predict(tc, grad, fit, n)
        m = measured[n]
        body.append([str(n), fmt_num(m.step_p50, ".2f", 1e3), fmt_num(p["step_time"], ".2f", 1e3),
                     fmt_num(m.efficiency, ".1f", 100, "%"), fmt_num(p["efficiency"], ".1f", 100, "%")])
    lines += [md_table(("replicas", "measured step p50 (ms)", "predicted step (ms)", "measured efficiency",
                        "predicted efficiency"), body), ""]
    body = [[str(n), fmt_num(p["step_time"], ".2f", 1e3), fmt_num(p["comm_time"], ".2f", 1e3),
             fmt_num(p["efficiency"], ".1f", 100, "%")]
            for n in scaling.EXTRAPOLATE for p in [scaling.predict(tc, grad, fit, n)]]
    return lines + ["Extrapolation (MODEL, not measured; assumes the benchmarked links at every size):", "",
                    md_table(("replicas", "predicted step (ms)", "of which allreduce (ms)", "predicted efficiency"),
                             body), ""]


def format_model(summary: JobSummary, benches: Sequence[Mapping[str, Any]]) -> str:
    """Predicted vs measured step time and efficiency per backend, and the extrapolation (a model, labelled)."""
    # Asynchronous rows (their own labels, no backend of a run) exchange no allreduce: no model for them.
    real = {r["backend"] for r in summary.runs}
    lines = [line for backend in summary.backends if backend in real
             for line in _backend_model(summary, backend, benches)]
    if not lines:
        return ""
    return "\n".join([f"## Scaling model — {summary.name} (`{summary.job_hash}`)", "", *lines])
