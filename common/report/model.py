"""The report's diagnostics sections, after the jobs: the allreduce microbenchmark tables, the scaling model
(predictions, set apart; arithmetic in common.diagnostics.scaling) and the ``--diagnose breakdown`` step-time
breakdown (common.diagnostics.breakdown writes the records)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.core import registry
from common.core.results import BREAKDOWN_PHASES, AllreduceRecord, BreakdownRecord
from common.diagnostics import scaling
from common.report.base import NA, fmt_num
from common.report.document import Block, Box, Bullets, Heading, Images, Para, table
from common.report.load import LoadedRun
from common.report.machines import distinct
from common.report.stats import MIN_CI_RUNS, difference_interval, median, num
from common.report.summary import JobSummary, order_backends


def allreduce_part(benches: Sequence[AllreduceRecord], image: str | None = None) -> list[Block]:
    """One table per backend x world size: time, algbw and busbw per message size (and the bus bandwidth plot)."""
    out: list[Block] = [
        Heading("Allreduce microbenchmark", 2),
        Para("SUM of float32 tensors; time = median over iterations of the slowest rank; algbw = bytes / time; "
             "busbw = algbw x 2(n-1)/n (nccl-tests' definitions).")]
    for b in benches:
        body = [[f"{int(r['bytes']):,}", fmt_num(num(r.get("time_median")), ".1f", 1e6),
                 fmt_num(num(r.get("time_p95")), ".1f", 1e6), fmt_num(num(r.get("algbw_GBps")), ".3f"),
                 fmt_num(num(r.get("busbw_GBps")), ".3f")] for r in b.rows]
        out += [Heading(f"{b.backend}, {b.world_size} ranks ({b.collective_used or NA}; hosts "
                        f"{distinct(str(h) for h in b.hosts or [])})", 3),
                table(("bytes", "time p50 (us)", "time p95 (us)", "algbw (GB/s)", "busbw (GB/s)"), body)]
    return out + ([Images(((Path(image).stem, image),))] if image else [])


MAX_EXTRAPOLATION = 4  # the model's table goes at most this factor beyond the largest measured size by default
ABOVE_BOUND = 1.05  # a measured step this far above the no-overlap prediction is flagged (5%: beyond a median's noise)


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
        return [Para(f"- {backend}: {m_in}")]
    tc, grad, fit, comp = m_in.t_compute, m_in.grad_bytes, m_in.fit, m_in.compression
    blocks: list[Block] = [Heading(f"Model: {backend}", 3), Para(
        f"Compute time per step {tc * 1e3:.2f} ms (1-replica median step), gradient bytes S = "
             f"{int(grad):,}{' (fp16 compression: half of float32)' if comp == 'fp16' else ''}; fitted from "
             f"the {m_in.bench_world_size}-rank allreduce benchmark: latency {fit.alpha * 1e6:.1f} us "
             f"({fit.alpha_hop * 1e6:.2f} us per ring hop), bus bandwidth {fit.bus_bandwidth / 1e9:.3f} GB/s. "
             "Step(N) = compute + 2(N-1) x hop latency + 2(N-1)/N x S / B, no overlap (an upper bound).")]
    measured = {r.identity.world_size: r for r in summary.rows if r.identity.label == backend}
    body, above = [], []
    for n in sorted(measured):
        p = scaling.predict(tc, grad, fit, n)
        m = measured[n]
        body.append([str(n), fmt_num(m.steps.p50, ".2f", 1e3), fmt_num(p["step_time"], ".2f", 1e3),
                     fmt_num(m.scaling.efficiency, ".1f", 100, "%"), fmt_num(p["efficiency"], ".1f", 100, "%")])
        if n > 1 and m.steps.p50 is not None and m.steps.p50 > ABOVE_BOUND * p["step_time"]:
            above.append(f"{n} replicas: {m.steps.p50 * 1e3:.2f} ms measured vs {p['step_time'] * 1e3:.2f} ms")
    blocks.append(table(("replicas", "measured step p50 (ms)", "predicted step (ms)", "measured efficiency",
                         "predicted efficiency"), body))
    if above:
        blocks.append(Para(f"**Measured above the model's upper bound** ({'; '.join(above)}): the step costs more "
                           "than computing and then all-reducing without any overlap, so the model misses a cost of "
                           "these runs that neither the 1-replica step nor the allreduce benchmark shows: ranks "
                           "contending for the cores or memory bandwidth, input the step waits for, a link slower "
                           "under training traffic than in the benchmark, or synchronisation. Its predictions here, "
                           "and the extrapolation, are optimistic."))
    sizes = extrapolation_sizes(max(measured), extrapolate_to)
    if not sizes:
        return blocks
    body = [[str(n), fmt_num(p["step_time"], ".2f", 1e3), fmt_num(p["comm_time"], ".2f", 1e3),
             fmt_num(p["efficiency"], ".1f", 100, "%")] for n in sizes for p in [scaling.predict(tc, grad, fit, n)]]
    how_far = f"up to {extrapolate_to} replicas (--extrapolate-to)" if extrapolate_to is not None else \
        f"at most {MAX_EXTRAPOLATION}x the largest measured size; --extrapolate-to N for more"
    return blocks + [Para(f"Extrapolation (MODEL, not measured; assumes the benchmarked links at every size; "
                          f"{how_far}):"),
                     table(("replicas", "predicted step (ms)", "of which allreduce (ms)", "predicted efficiency"),
                           body)]


def format_model(summary: JobSummary, benches: Sequence[AllreduceRecord],
                 extrapolate_to: int | None = None) -> Box | None:
    """Predicted vs measured step time and efficiency per backend, and the extrapolation: a section of its own,
    labelled a model (never in the measured tables and plots); None when no backend can be modelled."""
    # Asynchronous rows (their own labels, no backend of a run) exchange no allreduce: no model for them.
    real = {r.backend for r in summary.records}
    blocks = [b for backend in summary.backends if backend in real
              for b in _backend_model(summary, backend, benches, extrapolate_to)]
    if not blocks:
        return None
    intro = Para("Model, not measured: an alpha-beta model fitted to the allreduce microbenchmark; its numbers are "
                  "predictions, kept out of the measured tables and plots above.")
    return Box("model", (Heading(f"Scaling model (Model, not measured) — {summary.name} (`{summary.job_hash}`)", 2),
                         intro, *blocks))


# -- the --diagnose breakdown section (common.diagnostics.breakdown writes the records) -----------------------
PHASE_WORDS = {"input": "input", "compute": "compute (forward + backward)", "comm": "gradient communication",
               "apply": "the optimizer update", "rest": "the rest (between steps)"}
BREAKDOWN_METHOD = (
    "DIAGNOSTIC runs (`--diagnose breakdown`), not benchmark figures: the custom loop's step, with its phases "
    "serialized inside one tf.function and a device timestamp at each boundary, so the bars show where the time "
    "goes WITHOUT overlap (Horovod normally overlaps the all-reduce with the backward pass). input = next batch; "
    "compute = forward + backward (local gradients); comm = SUM all-reduce of the gradients, including waiting for "
    "the slowest rank (of which waiting: comm minus the least comm of any rank at that step); apply = optimizer "
    "update; rest = between the end of one step's device work and the start of the next (dispatch, host loop, "
    "syncs). Means over the timed steps and over ranks; the parts sum to the device step time, checked against "
    "the host's wall clock (sum / host) and compared with the normal benchmark run of the same job, backend and "
    "world size (diagnostic / benchmark: the cost of the phase barriers and of losing overlap)"
)


@dataclass(frozen=True)
class BreakdownCell:
    """The breakdowns of one backend x world size (newest last), with what they are cross-checked against."""

    rec: BreakdownRecord  # the newest: the table's row and the plot's bar
    bench_step: float | None  # median over repeats of the normal runs' step_time mean (same job, backend, size)
    bench_repeats: int
    allreduce: float | None  # the allreduce microbenchmark's median time at the record's gradient bytes
    runs: tuple[BreakdownRecord, ...] = ()  # every breakdown of the cell, oldest first (the comparison's repeats)

    @property
    def repeats(self) -> tuple[BreakdownRecord, ...]:
        return self.runs or (self.rec,)


def allreduce_time_at(rows: Sequence[Mapping[str, Any]], nbytes: float) -> float | None:
    """The microbenchmark's median time at ``nbytes``: log-log interpolation between the measured sizes around it,
    or None outside them (no extrapolation)."""
    pts = sorted((float(r["bytes"]), t) for r in rows if (t := num(r.get("time_median"))) and num(r.get("bytes")))
    for (b0, t0), (b1, t1) in zip(pts, pts[1:]):
        if b0 <= nbytes <= b1 and b0 > 0 and t0 > 0 and t1 > 0:
            f = 0.0 if b1 == b0 else (math.log(nbytes) - math.log(b0)) / (math.log(b1) - math.log(b0))
            return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
    return next((t for b, t in pts if b == nbytes), None)


def breakdown_cells(records: Sequence[BreakdownRecord], runs: Sequence[LoadedRun],
                    benches: Sequence[AllreduceRecord]) -> dict[str, list[BreakdownCell]]:
    """Job hash -> the breakdowns per backend x world size (world size, then registry order), newest shown."""
    every: dict[tuple[str, str, int], list[BreakdownRecord]] = {}
    for r in records:  # oldest first: the newest is last
        every.setdefault((r.job_hash, r.backend, r.world_size), []).append(r)
    out: dict[str, list[BreakdownCell]] = {}
    for (h, backend, n), recs in every.items():
        rec = recs[-1]
        steps = [num(r.step_time.get("mean")) for r in (x.record for x in runs)
                 if r.job_hash == h and r.backend == backend and r.world_size == n and r.asynchronous is not True]
        bench = next((b for b in reversed(benches) if b.backend == backend and b.world_size == n), None)
        at = allreduce_time_at(bench.rows, rec.gradient_bytes) if bench and rec.gradient_bytes else None
        out.setdefault(h, []).append(BreakdownCell(rec, median(steps), len(steps), at, tuple(recs)))
    for cells in out.values():
        order = order_backends(c.rec.backend for c in cells)
        cells.sort(key=lambda c: (c.rec.world_size, order.index(c.rec.backend)))
    return out


def _runs_words(a: int, b: int, a_name: str, b_name: str) -> str:
    """"one run", "3 runs each", "one run of horovod, 6 of native"."""
    if a == b:
        return "one run" if a == 1 else f"{a} runs each"
    return f"{'one run' if a == 1 else f'{a} runs'} of {a_name}, {b} of {b_name}"


def difference_sentence(a_runs: Sequence[BreakdownRecord], b_runs: Sequence[BreakdownRecord]) -> str:
    """What the breakdowns of two backends at one world size say about their phases, in one sentence. A difference
    is stated only when measured: with ``MIN_CI_RUNS`` runs a side, a phase whose bootstrap 95% interval of the
    difference of medians (``stats.difference_interval``) excludes zero; a single run of a side compares nothing
    (run-to-run spread on a shared machine is tens of ms: one pair of runs cannot tell it from a backend's cost)."""
    a, b = a_runs[-1], b_runs[-1]
    where = f"at {a.world_size} replica{'s' if a.world_size != 1 else ''}"
    runs = _runs_words(len(a_runs), len(b_runs), a.backend, b.backend)
    if len(a_runs) < MIN_CI_RUNS or len(b_runs) < MIN_CI_RUNS:
        return (f"{where} {a.backend} vs {b.backend}: {runs}: no comparison (a phase difference is stated with "
                f"{MIN_CI_RUNS} breakdown runs per backend and a 95% interval that excludes zero; the table shows "
                "the newest run).")
    med = {p: (median(r.phases[p] for r in a_runs) or 0.0, median(r.phases[p] for r in b_runs) or 0.0)
           for p in BREAKDOWN_PHASES}
    ci = {p: difference_interval([r.phases[p] for r in a_runs], [r.phases[p] for r in b_runs])
          for p in BREAKDOWN_PHASES}
    found = sorted((p for p in BREAKDOWN_PHASES if (c := ci[p]) and (c[0] > 0 or c[1] < 0)),
                   key=lambda p: -abs(med[p][0] - med[p][1]))
    same = [PHASE_WORDS[p].split(" (")[0] for p in BREAKDOWN_PHASES if p not in found]
    tail = f"; no significant difference in {', '.join(same)}" if same and found else ""
    if not found:
        return (f"{where} no phase differs significantly between {a.backend} and {b.backend} ({runs}; every phase's "
                "95% interval of the difference of medians contains zero).")
    parts = []
    for i, p in enumerate(found):
        d, (lo, hi) = med[p][0] - med[p][1], ci[p] or (0.0, 0.0)  # found: every one has its interval
        parts.append(f"{abs(d) * 1e3:.2f} ms {'less' if d < 0 else 'more'}"
                     f"{f' per step than {b.backend}' if i == 0 else ''} in {PHASE_WORDS[p]} ({med[p][0] * 1e3:.2f} "
                     f"vs {med[p][1] * 1e3:.2f} ms, difference [{lo * 1e3:+.2f}, {hi * 1e3:+.2f}] ms)")
    return (f"{where} {a.backend} spends {'; '.join(parts)}{tail} ({runs}: medians, bootstrap 95% intervals of the "
            "difference).")


def breakdown_part(cells: Sequence[BreakdownCell], image: str | None = None,
                   pairs: Sequence[registry.Pair] = registry.PAIRS) -> list[Block]:
    """One job's breakdowns: method, table, one sentence per compared pair and world size, the plot."""
    rec0 = cells[0].rec
    f = fmt_num
    body = []
    for c in cells:
        r, ph = c.rec, c.rec.phases
        body.append([r.backend, str(r.world_size), *(f(ph[p], ".3f", 1e3) for p in ("input", "compute", "comm")),
                     f(r.wait, ".3f", 1e3), f(ph["apply"], ".3f", 1e3), f(ph["rest"], ".3f", 1e3),
                     f(r.step_time, ".3f", 1e3), f(r.host_step_time, ".3f", 1e3),
                     f(r.step_time / r.host_step_time, ".1f", 100, "%"),
                     f(c.bench_step, ".3f", 1e3) + (f" (n={c.bench_repeats})" if c.bench_repeats else ""),
                     f(r.step_time / c.bench_step if c.bench_step else None, ".2f"),
                     f(ph["comm"] / c.allreduce if c.allreduce else None, ".2f")])
    out: list[Block] = [
        Heading(f"Step-time breakdown — {rec0.job.get('name', '?')} (`{rec0.job_hash}`), DIAGNOSTIC", 2),
        Para(BREAKDOWN_METHOD + "."),
        table(("backend", "replicas", "input (ms)", "compute (ms)", "comm (ms)", "of which waiting (ms)", "apply (ms)",
               "rest (ms)", "sum (ms)", "host clock (ms)", "sum / host", "benchmark step (ms)",
               "diagnostic / benchmark", "comm / allreduce bench"), body),
        Para("comm / allreduce bench: comm against the allreduce microbenchmark's median time for one tensor of the "
             "gradient bytes (log-log interpolated between its sizes; n/a outside them or without a benchmark at "
             "that world size); a step's gradients are several tensors, the benchmark's one.")]
    by_n: dict[int, dict[str, tuple[BreakdownRecord, ...]]] = {}
    for c in cells:
        by_n.setdefault(c.rec.world_size, {})[c.rec.backend] = c.repeats
    sentences = [difference_sentence(v[num_b], v[den_b]) for num_b, den_b in pairs for _, v in sorted(by_n.items())
                 if num_b in v and den_b in v]
    if sentences:
        out.append(Bullets(tuple(f"{s[0].upper()}{s[1:]}" for s in sentences)))
    return out + ([Images((("breakdown", image),))] if image else [])
