"""What-if planner: the report's scaling MODEL (common.diagnostics.scaling) at the sizes you ask for.

    python -m common.planner --from DIR [--backend B] [--job-hash H] [overrides] [--sizes 8,16,64]
    python -m common.planner --step-ms 120 --grad-bytes 102e6 --link-gbits 100 [--latency-us 5]
                             [--gpus-per-node 4 --intra-gbits 600 [--intra-latency-us 2]]
                             [--overlap 0.5] [--batch 64] [--sizes 8,16,64]

``--from DIR`` reads a results directory as the report does: compute per step = the 1-replica runs' median step,
gradient bytes = their ``gradient_bytes``, latency and bandwidth fitted (common.report.model.model_inputs, the
report's code) from the newest allreduce benchmark at >= 2 ranks; overlap from a ``--diagnose breakdown`` record
and the training run of the same size (the breakdown serializes the phases, the run may overlap them), else 0.
Any stated parameter overrides the measured one. Without ``--from``, ``--step-ms``, ``--grad-bytes`` and
``--link-gbits`` are required.

How far to trust it: the link fit is robust to a disturbed message size (Theil-Sen, common.diagnostics.scaling) and
each table says how well it fits the measured sizes. When a measured input comes from runs without a GPU, or the
benchmark's ranks shared one host (a loopback link), the FIRST line says so: such inputs predict nothing about
GPUs; state the links. With a stated link, each backend keeps what it measured of itself: its overlap, and the share
of the measured wire (the benchmark's point-to-point probe, ``link``) its collective reached, applied to the stated
link (without a probe, the stated link as is, said).

Prints, per backend, predicted step time, allreduce time, throughput (images/s with a per-GPU batch: ``--batch``,
or the job's) and efficiency = compute / step, all labelled MODEL: a ring allreduce, hierarchical when
``--gpus-per-node`` > 1 (reduce-scatter and allgather inside a node over the intra-node link, ring across nodes
over the inter-node link), step = compute + comm - overlap x min(compute, comm). Latencies are per ring hop.
Bad parameters: one line on stderr, exit 2. No TensorFlow here.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import NoReturn

from common import cli
from common.core.errors import fail as _fail
from common.core.results import AllreduceRecord
from common.core.text import text_table
from common.diagnostics import scaling
from common.report.base import ReportError
from common.report.load import load_allreduce, load_breakdowns, load_runs
from common.report.model import model_inputs
from common.report.summary import JobSummary, summarize

PROG = "common.planner"
DEFAULT_SIZES = "8,16,32,64"


class PlanError(Exception):
    """Bad parameters; the message is the one line the user sees."""


@dataclass
class Plan:
    """One table's inputs, each with where it came from."""

    label: str
    t_compute: float
    grad_bytes: float
    inter: scaling.LinkFit
    intra: scaling.LinkFit | None
    gpus_per_node: int
    overlap: float
    batch: int | None
    sources: list[str]
    caveats: tuple[str, ...] = ()  # measured inputs that say nothing about GPUs ("CPU-only runs", "a loopback link")


def fail(message: str) -> NoReturn:
    _fail(PROG, message)


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise PlanError(f"--sizes: {text!r} is not a list of integers (e.g. 8,16,64)") from None
    if not sizes or any(n < 1 for n in sizes):
        raise PlanError(f"--sizes: {text!r}: give world sizes >= 1, e.g. 8,16,64")
    return sizes


def _check(a: argparse.Namespace) -> None:
    for name in ("step_ms", "grad_bytes", "link_gbits", "intra_gbits"):
        v = getattr(a, name)
        if v is not None and not v > 0:
            raise PlanError(f"--{name.replace('_', '-')} must be > 0, got {v}")
    for name in ("latency_us", "intra_latency_us"):
        v = getattr(a, name)
        if v is not None and not v >= 0:
            raise PlanError(f"--{name.replace('_', '-')} must be >= 0, got {v}")
    if a.overlap is not None and not 0 <= a.overlap <= 1:
        raise PlanError(f"--overlap must be between 0 (none) and 1 (full), got {a.overlap}")
    if a.gpus_per_node < 1:
        raise PlanError(f"--gpus-per-node must be >= 1, got {a.gpus_per_node}")
    if a.batch is not None and a.batch < 1:
        raise PlanError(f"--batch must be >= 1, got {a.batch}")
    if a.from_dir is None:
        missing = [f"--{n.replace('_', '-')}" for n in ("step_ms", "grad_bytes", "link_gbits") if getattr(a, n) is None]
        if missing:
            raise PlanError(f"without --from DIR, give {', '.join(missing)} (see --help)")


def _links(a: argparse.Namespace, fit: scaling.LinkFit | None, src: list[str],
           share: float | None = None) -> tuple[scaling.LinkFit, scaling.LinkFit | None]:
    """The inter-node link (stated parameters over the fit) and the intra-node one (None: the inter link);
    ``share``: the fraction of the measured wire the backend's collective reached, kept on a stated link."""
    if fit is None or a.link_gbits is not None or a.latency_us is not None:
        bw = a.link_gbits * 1e9 / 8 if a.link_gbits is not None else fit.bus_bandwidth
        if a.link_gbits is not None and share is not None:
            bw *= share
            src.append(f"stated link x {share:.2f}: the share of the measured wire this backend's allreduce reached")
        elif a.link_gbits is not None and fit is not None:
            src.append("stated link as is: no measured wire (point-to-point probe) to say what share of it this "
                       "backend's allreduce reaches")
        lat = a.latency_us * 1e-6 if a.latency_us is not None else (fit.alpha_hop if fit else 0.0)
        if a.latency_us is None and fit is None:
            src.append("inter-node hop latency 0 assumed (no --latency-us)")
        fit = scaling.stated_link(lat, bw)
    intra = None
    if a.intra_gbits is not None:
        lat = a.intra_latency_us * 1e-6 if a.intra_latency_us is not None else fit.alpha_hop
        intra = scaling.stated_link(lat, a.intra_gbits * 1e9 / 8)
    elif a.gpus_per_node > 1:
        src.append("no --intra-gbits: the inter-node link is assumed inside a node too")
    return fit, intra


def _stated(a: argparse.Namespace) -> Plan:
    src: list[str] = []
    inter, intra = _links(a, None, src)
    overlap = a.overlap if a.overlap is not None else 0.0
    return Plan("stated parameters", a.step_ms / 1e3, a.grad_bytes, inter, intra, a.gpus_per_node, overlap,
                a.batch, src)


def _measured_overlap(d: str, s: JobSummary, backend: str) -> tuple[float, str]:
    """The overlap a training run of ``backend`` achieved, from a breakdown record of the same job and size."""
    steps = {r.identity.world_size: r.steps.p50 for r in s.rows if r.identity.label == backend and r.steps.p50}
    for rec in reversed(load_breakdowns(d, warn=lambda m: None)):
        if rec.backend == backend and rec.job_hash == s.job_hash and rec.world_size >= 2 and rec.world_size in steps:
            ov = scaling.overlap_from_breakdown(rec.phases, steps[rec.world_size])
            if ov is not None:
                return ov, (f"overlap {ov:.2f} estimated from the {rec.world_size}-replica breakdown (serialized "
                            f"{rec.step_time * 1e3:.2f} ms) vs the training runs' median step "
                            f"{steps[rec.world_size] * 1e3:.2f} ms")
    return 0.0, "overlap 0 assumed: no breakdown record (--diagnose breakdown) with a training run of its size"


def _caveats(a: argparse.Namespace, s: JobSummary, backend: str, bench: AllreduceRecord) -> tuple[str, ...]:
    """Which measured inputs (those not stated) came from where a GPU cluster's figures cannot: runs without a GPU
    (every device of the 1-replica runs a CPU) or a benchmark whose ranks shared one host (loopback)."""
    out = []
    devices = [str(d) for r in s.records if r.backend == backend and r.world_size == 1 for d in (r.devices or [])]
    if a.step_ms is None and devices and not any("GPU" in d.upper() for d in devices):
        out.append("CPU-only runs")
    if a.link_gbits is None and bench.hosts and len(set(bench.hosts)) == 1:
        out.append(f"a loopback link (the benchmark's {bench.world_size} ranks on one host)")
    return tuple(out)


def warning(plans: list[Plan]) -> str | None:
    """The planner's first line when measured inputs came from CPU-only runs or a loopback link."""
    found = list(dict.fromkeys(c for p in plans for c in p.caveats))
    if not found:
        return None
    return (f"WARNING: measured on {' and over '.join(found)}: this predicts nothing about GPUs; state the links "
            "(--link-gbits, --latency-us, --gpus-per-node with --intra-gbits) and the compute (--step-ms) of the "
            "machine you plan for")


def _from_dir(a: argparse.Namespace) -> list[Plan]:
    try:
        summaries = summarize(load_runs(a.from_dir, warn=lambda m: None))
    except ReportError as e:
        raise PlanError(str(e)) from None
    if a.job_hash:
        summaries = [s for s in summaries if s.job_hash.startswith(a.job_hash)]
    if len(summaries) != 1:
        hashes = ", ".join(s.job_hash for s in summaries) or "none"
        raise PlanError(f"--from {a.from_dir}: {len(summaries)} jobs match (job hashes: {hashes}); "
                        + ("choose one with --job-hash" if summaries else "no training runs there"))
    s = summaries[0]
    benches = load_allreduce(a.from_dir, warn=lambda m: None)
    plans, why = [], []
    for backend in [a.backend] if a.backend else s.backends:
        m = model_inputs(s, backend, benches)
        if isinstance(m, str):
            why.append(f"{backend}: {m}")
            continue
        bench = next(b for b in reversed(benches) if b.backend == backend and b.world_size >= 2)  # model_inputs'
        src = [f"compute {m.t_compute * 1e3:.2f} ms (1-replica median step), gradient bytes {int(m.grad_bytes):,}, "
               f"link fitted from the {m.bench_world_size}-rank allreduce benchmark (bus bandwidth "
               f"{m.fit.bus_bandwidth / 1e9:.3f} GB/s, {m.fit.alpha_hop * 1e6:.2f} us per hop): "
               f"{scaling.fit_quality(m.fit, bench.rows)}"]
        wire = (bench.link or {}).get("bytes_per_s")
        share = min(m.fit.bus_bandwidth / wire, 1.0) if wire else None
        inter, intra = _links(a, m.fit, src, share)
        caveats = _caveats(a, s, backend, bench)
        if a.overlap is not None:
            overlap = a.overlap
        else:
            overlap, said = _measured_overlap(a.from_dir, s, backend)
            src.append(said)
        tc = a.step_ms / 1e3 if a.step_ms is not None else m.t_compute
        grad = a.grad_bytes if a.grad_bytes is not None else m.grad_bytes
        batch = a.batch or s.job.get("per_replica_batch_size")
        plans.append(Plan(f"{backend} ({s.name}, {s.job_hash})", tc, grad, inter, intra, a.gpus_per_node, overlap,
                          batch, src, caveats))
    if not plans:
        raise PlanError(f"--from {a.from_dir}: " + "; ".join(why or [f"no backend {a.backend!r}"]))
    return plans


def table(p: Plan, sizes: list[int]) -> list[str]:
    """The MODEL table of one plan; ValueError when a size does not fill whole nodes."""
    intra = p.intra or p.inter
    lines = [f"MODEL (predicted, not measured): {p.label}",
             f"  ring allreduce{', hierarchical' if p.gpus_per_node > 1 else ''}; {p.gpus_per_node} GPU(s) per node;"
             f" inter-node {p.inter.bus_bandwidth * 8 / 1e9:.1f} Gbit/s, {p.inter.alpha_hop * 1e6:.2f} us per hop"
             + (f"; intra-node {intra.bus_bandwidth * 8 / 1e9:.1f} Gbit/s, {intra.alpha_hop * 1e6:.2f} us per hop"
                if p.gpus_per_node > 1 else ""),
             f"  compute {p.t_compute * 1e3:.2f} ms per step, gradient bytes {int(p.grad_bytes):,}, overlap "
             f"{p.overlap:.2f}: step = compute + comm - overlap x min(compute, comm)",
             *(f"  ({s})" for s in p.sources)]
    head = ("GPUs", "nodes", "step (ms)", "allreduce (ms)", "images/s", "efficiency")
    rows = []
    for n in sizes:
        r = scaling.predict(p.t_compute, p.grad_bytes, p.inter, n, overlap=p.overlap, gpus_per_node=p.gpus_per_node,
                            intra=p.intra)
        ips = f"{n * p.batch / r['step_time']:.1f}" if p.batch else "-"
        rows.append((str(n), str(r["nodes"]), f"{r['step_time'] * 1e3:.2f}", f"{r['comm_time'] * 1e3:.2f}", ips,
                     f"{r['efficiency'] * 100:.1f}%"))
    lines += text_table([head, *rows], right=True, indent="  ")
    if not p.batch:
        lines.append("  (images/s: give --batch, the per-GPU batch)")
    return lines


def parser() -> argparse.ArgumentParser:
    p = cli.OneLineParser(prog=PROG, description="What-if scaling planner: a MODEL of ring-allreduce data parallelism.")
    p.add_argument("--from", dest="from_dir", metavar="DIR", help="a results directory (runs, allreduce benchmark)")
    p.add_argument("--backend", help="with --from: only this backend (row label)")
    p.add_argument("--job-hash", help="with --from: the job (prefix of its hash) when DIR holds several")
    p.add_argument("--step-ms", type=float, help="compute time per step at 1 GPU (ms)")
    p.add_argument("--grad-bytes", type=float, help="gradient bytes allreduced per step")
    p.add_argument("--link-gbits", type=float, help="inter-node link bandwidth (Gbit/s)")
    p.add_argument("--latency-us", type=float, help="inter-node latency per ring hop (us; default 0 when stated)")
    p.add_argument("--gpus-per-node", type=int, default=1, help="GPUs per node (default 1: a flat ring, the report's)")
    p.add_argument("--intra-gbits", type=float, help="intra-node link bandwidth (Gbit/s; default the inter link)")
    p.add_argument("--intra-latency-us", type=float, help="intra-node latency per hop (us; default the inter one)")
    p.add_argument("--overlap", type=float, help="0 (none) .. 1 (full) of comm hidden by compute (default measured/0)")
    p.add_argument("--batch", type=int, help="per-GPU batch, for images/s (default: the job's with --from)")
    p.add_argument("--sizes", default=DEFAULT_SIZES, help=f"world sizes (GPUs), default {DEFAULT_SIZES}")
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        _check(a)
        sizes = parse_sizes(a.sizes)
        plans = _from_dir(a) if a.from_dir else [_stated(a)]
        first = warning(plans)
        out: list[str] = [first] if first else []
        for p in plans:
            out += [*table(p, sizes), ""]
    except (PlanError, ValueError) as e:
        fail(str(e))
    print("\n".join(out).rstrip())
    print("All figures above are a MODEL (predictions), not measurements.", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
