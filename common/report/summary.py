"""Summarizing runs: one JobSummary per job hash, with its rows (backend x world size), ratios and notes."""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from common.core import registry
from common.report.base import NA, NO_INTERVAL
from common.report.evaluation import row_fields as evaluation_fields
from common.report.load import capabilities, layout_of, upgrade_run
from common.report.machines import MachineKey, machine_keys, nodes_text
from common.report.stats import MIN_CI_RUNS, Interval, median, median_interval, num, ratio_interval
from common.report.versions import version_mix, versions_by_key

RATIO_NUM, RATIO_DEN = registry.RATIO  # numerator and denominator of the throughput ratio


@dataclass
class Row:
    """One backend x world size (x worker count) cell of a job's scaling table; None means n/a."""

    backend: str
    world_size: int  # replicas
    num_workers: int  # processes
    repeats: int
    ips: list[float]  # images/s of every repeat
    ips_median: float
    ips_interval: Interval | None  # 95% CI of the median (>= 6 repeats), else min-max; None for n = 1
    global_batch_size: int | None
    step_p50: float | None  # seconds
    step_p95: float | None  # seconds
    step_mean: float | None  # seconds
    time_to_first_step: float | None  # seconds
    timed_wall_time: float | None  # seconds
    final_loss: float | None
    speedup: float | None = None
    efficiency: float | None = None
    ratio: float | None = None  # registry.RATIO at this world size, on both backends' rows
    files: list[str] = field(default_factory=list)
    input_method: str | None = None  # RunRecord.input.method of the repeats ("fetch", "gap"); None: not measured
    input_fraction: float | None = None  # median over repeats of the input wait's share of the timed wall time
    input_verdict: str | None = None  # "kept up", "moderately input-bound", "highly input-bound" or None (undecided)
    plain: str = ""  # the row label without its machine part (row_label); "" until set: the backend column
    series: str = ""  # the rows sharing a speedup baseline: plain label + hardware, no node count ("": plain)
    machine: str = ""  # the machine part of the label ("" when the job ran on one machine: MachineKey)
    hardware: str = ""  # the hardware part of it ("" when the job's runs share one hardware)
    nodes: int | None = None  # the node count of the row's runs (None: not recorded)
    layout: str = "?"  # nodes x ranks per node, from the runs' hosts (load.layout_of), e.g. "2x4"
    ratio_ci: tuple[float, float] | None = None  # bootstrap 95% interval of ``ratio`` (stats.ratio_interval)

    def __post_init__(self) -> None:
        self.plain = self.plain or self.backend
        self.series = self.series or self.plain

    @property
    def layout_counts(self) -> tuple[int | None, int | None]:
        """(nodes, ranks per node) of ``layout`` ("2x4" -> (2, 4); None where not known or uneven)."""
        m = re.fullmatch(r"(\d+)x(\d+)?.*", self.layout)
        return (int(m.group(1)), int(m.group(2)) if m.group(2) else None) if m else (None, None)

    @property
    def pair_key(self) -> tuple[str, int, int, str]:
        """What a ratio pairs on when a world size has several rows: hardware, nodes, workers."""
        return self.hardware, -1 if self.nodes is None else self.nodes, self.num_workers, self.layout
    base: str = ""  # the runs' backend (``backend`` is the row label)
    variant: str | None = None  # the runs' tuning variant (``RunRecord.tuning.variant``); None: default knobs
    comparable: bool = True  # the backend's default way of training (strategy, synchronous): in best vs best
    collective: str | None = None  # ``RunRecord.collective.used`` of the repeats ("a, b" if they differ); None: unknown
    gpu: bool = False  # a repeat ran on GPUs (its devices name one)
    ttt: float | None = None  # time to target (s): median over the repeats that reached it (report.evaluation)
    ttt_reached: int = 0  # repeats that reached the job's target
    targeted: int = 0  # repeats whose job set a target
    final_validation: dict[str, float | None] = field(default_factory=dict)  # last evaluation, median over repeats


@dataclass
class RatioRow:
    """registry.RATIO (numerator / denominator median throughput) at one world size."""

    world_size: int
    den_workers: int | None  # denominator's worker count (None: no denominator run here)
    num_workers: int | None  # numerator's worker count
    den_ips: float | None
    num_ips: float | None
    ratio: float | None
    machine: str = ""  # the pair's hardware and nodes when the job ran on several machines ("": one machine)
    ratio_ci: tuple[float, float] | None = None  # bootstrap 95% interval (None: a cell has < 6 repeats)
    layout: str = ""  # the pair's layouts, e.g. "1x2" or "1x2 / 2x1" when they differ
    den_collective: str | None = None  # the rows' used collectives
    num_collective: str | None = None
    caveat: str | None = None  # why the ratio is not like for like (collectives_caveat), None when it is


@dataclass
class JobSummary:
    """Everything the report shows about one job (one job_hash); runs of other jobs never enter it."""

    job_hash: str
    name: str
    job: dict[str, Any]
    rows: list[Row]
    ratios: list[RatioRow]
    notes: list[str]
    runs: list[dict[str, Any]]
    version_mix: list[str] = field(default_factory=list)  # versions.version_mix(runs): empty when consistent

    @property
    def backends(self) -> list[str]:
        """The row labels in table order (registry order of the backends, then their machines)."""
        return list(dict.fromkeys(r.backend for r in self.rows))


def order_backends(names: Iterable[str]) -> list[str]:
    """The registry's backends in its order, then any other backend found in results, sorted."""
    names = set(names)
    known = registry.names()
    return [b for b in known if b in names] + sorted(names - set(known))


def _final_loss(run: Mapping[str, Any]) -> float | None:
    losses = run.get("step_losses")
    if isinstance(losses, list) and losses:
        return num(losses[-1])
    return None


def _make_row(backend: str, ws: int, nw: int, runs: list[dict[str, Any]]) -> Row:
    ips = [float(r["images_per_sec"]) for r in runs]
    used = sorted({c for r in runs if (c := run_collective(r))})
    gbs = Counter(r.get("global_batch_size") for r in runs if isinstance(r.get("global_batch_size"), int))
    return Row(
        backend=backend,
        world_size=ws,
        num_workers=nw,
        repeats=len(runs),
        ips=ips,
        ips_median=statistics.median(ips),
        ips_interval=median_interval(ips),
        global_batch_size=gbs.most_common(1)[0][0] if gbs else None,
        step_p50=median(num(r["step_time"].get("median")) for r in runs),
        step_p95=median(num(r["step_time"].get("p95")) for r in runs),
        step_mean=median(num(r["step_time"].get("mean")) for r in runs),
        time_to_first_step=median(num(r["time_to_first_step"]) for r in runs),
        timed_wall_time=median(num(r.get("timed_wall_time")) for r in runs),
        final_loss=median(_final_loss(r) for r in runs),
        layout=str(runs[0].get("_layout") or layout_of(runs[0])[2]),
        files=[r.get("_path", "?") for r in runs],
        **_input_fields(runs),
        base=str(runs[0]["backend"]),
        variant=run_variant(runs[0]),  # one label, one variant
        comparable=run_strategy(runs[0]) is None and runs[0].get("asynchronous") is not True,
        collective=", ".join(used) if used else None,
        gpu=any(gpu_run(r) for r in runs),
        **evaluation_fields(runs),
    )


def _input_fields(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The row's input wait (``RunRecord.input``): method, median share over repeats, and the verdict all repeats
    support (the worst one: a row is "kept up" only if every repeat kept up)."""
    measured = [i for r in runs if isinstance(i := r.get("input"), Mapping) and i.get("method")]
    if not measured:
        return {}
    methods = {str(i["method"]) for i in measured}
    kept = [i.get("kept_up") for i in measured]
    verdict = None
    if all(k is True for k in kept) and len(measured) == len(runs):
        verdict = "kept up"
    elif False in kept:
        verdict = "highly input-bound" if any(i.get("input_bound") == "highly" for i in measured) \
            else "moderately input-bound"
    return {"input_method": methods.pop() if len(methods) == 1 else "mixed",
            "input_fraction": median(num(i.get("wait_fraction")) for i in measured), "input_verdict": verdict}


def input_text(row: Row) -> str:
    """The row's input-wait cell, e.g. "0.4% kept up", "23% highly input-bound", "48% input + between steps"."""
    if row.input_method is None or row.input_fraction is None:
        return NA
    share = f"{100 * row.input_fraction:.1f}%"
    if row.input_method == "fetch":
        return f"{share} {row.input_verdict}" if row.input_verdict else share
    what = f"{share} input + between steps" if row.input_method == "gap" else f"{share} ({row.input_method})"
    return f"{what}: kept up" if row.input_verdict == "kept up" else what


def run_strategy(run: Mapping[str, Any]) -> str | None:
    """The run's non-default way of training (``capabilities.variant``, e.g. native's --strategy mirrored), None
    for its backend's default."""
    variant = capabilities(run).get("variant")
    return variant if isinstance(variant, str) and variant else None


def run_variant(run: Mapping[str, Any]) -> str | None:
    """The run's tuning variant (``RunRecord.tuning.variant``, e.g. "fusion 32 MiB"), None at the default knobs;
    files from before the record had ``tuning`` count as default."""
    tuning = run.get("tuning")
    variant = tuning.get("variant") if isinstance(tuning, Mapping) else None
    return variant if isinstance(variant, str) and variant else None


def run_collective(run: Mapping[str, Any]) -> str | None:
    """The collective that carried the run's gradients (``RunRecord.collective.used``), None when not recorded."""
    c = run.get("collective")
    used = c.get("used") if isinstance(c, Mapping) else None
    return used if isinstance(used, str) and used else None


_GPU = re.compile(r"gpu:", re.IGNORECASE)  # TensorFlow's device names: "/physical_device:GPU:0", "/gpu:0"


def gpu_run(run: Mapping[str, Any]) -> bool:
    """A rank of the run computed on a GPU (its ``devices`` name one; "cpu (CUDA_VISIBLE_DEVICES=0)" does not)."""
    devices = run.get("devices")
    return isinstance(devices, list) and any(_GPU.search(str(d)) for d in devices)


def collectives_caveat(den: Row, num: Row) -> str | None:
    """Why a ratio of these rows does not compare like for like, or None: on GPUs, NCCL on one side only (e.g.
    native ring, whose gRPC collectives go through host memory, against Horovod's NCCL)."""
    if not (den.gpu or num.gpu) or den.collective is None or num.collective is None:
        return None
    if (den.collective == "nccl") == (num.collective == "nccl"):
        return None
    return f"{RATIO_DEN} {den.collective} vs {RATIO_NUM} {num.collective} on GPUs"


def row_label(run: Mapping[str, Any]) -> str:
    """The backend column of a run's row: its backend, or with a strategy other than the default e.g. "native
    (mirrored)", with tuning knobs not at their defaults e.g. "horovod (fusion 32 MiB)", and for an asynchronous
    run (``RunRecord.asynchronous``: parameter-server training) "native (parameter_server, asynchronous)": rows of
    their own, never merged with the default's, outside the backend ratio (which compares the backends' default
    ways of training; variants meet in the report's best vs best table)."""
    parts = [s for s in (run_strategy(run), run_variant(run)) if s]
    if run.get("asynchronous") is True:
        parts = [*(parts or ["?"]), "asynchronous"]
    return f"{run['backend']} ({', '.join(parts)})" if parts else str(run["backend"])


def _rows(runs: list[dict[str, Any]]) -> list[Row]:
    """One row per backend (row label) x machine (common.report.machines) x world size x worker count, in table
    order: runs on different CPU or GPU models, or on different node counts, never share a row."""
    cells: dict[tuple[str, str, int, bool, int, str, int], list[dict[str, Any]]] = {}
    for r, m in zip(runs, machine_keys(runs, row_label)):
        nodes = -1 if m.nodes is None else m.nodes
        layout = str(r.get("_layout") or layout_of(r)[2])
        cells.setdefault((row_label(r), m.hardware, nodes, m.show_nodes, r["world_size"], layout, r["num_workers"]),
                         []).append(r)
    order = {b: i for i, b in enumerate(order_backends(k[0] for k in cells))}
    rows = []
    for (label, hw, nodes, show, ws, _, nw), rs in sorted(cells.items(), key=lambda kv: (order[kv[0][0]], kv[0][1:])):
        key = MachineKey(hw, None if nodes < 0 else nodes, show)
        row = _make_row(f"{label} [{key.suffix()}]" if key.suffix() else label, ws, nw, rs)
        row.plain, row.machine, row.hardware, row.nodes = label, key.suffix(), hw, key.nodes
        row.series = f"{label} [{hw}]" if hw else label
        rows.append(row)
    return rows


def _speedups(rows: list[Row], notes: list[str]) -> None:
    """Speedup and efficiency against the 1-replica median of the same series (backend label and hardware; a note
    where there is none)."""
    for b in dict.fromkeys(r.series for r in rows):
        base = next((r for r in rows if r.series == b and r.world_size == 1), None)
        if base is None:
            sizes = ", ".join(str(r.world_size) for r in rows if r.series == b)
            notes.append(f"{b}: no 1-replica run (only world size {sizes}), so its speedup and efficiency are "
                         f"{NA}; run {b} at world size 1 to get the baseline")
            continue
        for r in rows:
            if r.series == b:
                r.speedup = r.ips_median / base.ips_median
                r.efficiency = r.ips_median / (r.world_size * base.ips_median)


def _pairs(rows: list[Row], ws: int) -> list[tuple[Row | None, Row | None]]:
    """(denominator row, numerator row) at one world size, never across hardware; several rows (worker counts,
    node counts) pair equal ones only."""
    den = [r for r in rows if r.plain == RATIO_DEN and r.world_size == ws]
    nom = [r for r in rows if r.plain == RATIO_NUM and r.world_size == ws]
    if len(den) <= 1 and len(nom) <= 1 and (not den or not nom or den[0].hardware == nom[0].hardware):
        return [(den[0] if den else None, nom[0] if nom else None)]
    return [(next((r for r in den if r.pair_key == k), None), next((r for r in nom if r.pair_key == k), None))
            for k in sorted({r.pair_key for r in den + nom})]


def _pair_machine(d: Row | None, n: Row | None, several: bool) -> str:
    """The ratio row's machine text when the job ran on several machines ("" otherwise)."""
    r = d or n
    if not several or r is None:
        return ""
    return ", ".join(p for p in (r.hardware, nodes_text(r.nodes) if r.nodes is not None else "") if p)


def _ratios(rows: list[Row], notes: list[str]) -> list[RatioRow]:
    """The registry.RATIO throughput ratio per world size, set on both rows too; notes on what is missing."""
    names = order_backends(r.plain for r in rows)
    several = any(r.machine for r in rows)
    ratios: list[RatioRow] = []
    missing = [b for b in (RATIO_DEN, RATIO_NUM) if b not in names]
    if missing:
        present = ", ".join(names) or "none"
        notes.append(f"no {' or '.join(missing)} runs for this job (backends present: {present}), so the "
                     f"{RATIO_NUM}/{RATIO_DEN} ratio is {NA}")
    lone_sizes: dict[str, list[int]] = {}  # backend -> world sizes only it ran (ratio n/a there)
    for ws in sorted({r.world_size for r in rows}):
        for d, n in _pairs(rows, ws):
            if d is None and n is None:  # only other backends ran at this world size
                continue
            ratio = n.ips_median / d.ips_median if d and n else None
            caveat = collectives_caveat(d, n) if d and n else None
            ci = ratio_interval(n.ips, d.ips) if d and n else None
            layouts = " / ".join(dict.fromkeys(r.layout for r in (d, n) if r is not None))
            ratios.append(RatioRow(ws, d.num_workers if d else None, n.num_workers if n else None,
                                   d.ips_median if d else None, n.ips_median if n else None, ratio,
                                   machine=_pair_machine(d, n, several), ratio_ci=ci, layout=layouts,
                                   den_collective=d.collective if d else None,
                                   num_collective=n.collective if n else None, caveat=caveat))
            if caveat:
                notes.append(f"at world size {ws} the {RATIO_NUM}/{RATIO_DEN} ratio is not like for like ({caveat}): "
                             "it compares the collectives as much as the backends")
            for r in (d, n):
                if r is not None:
                    r.ratio, r.ratio_ci = ratio, ci
            lone = d if n is None else n if d is None else None
            if not missing and lone is not None:
                lone_sizes.setdefault(lone.backend, []).append(ws)
            elif d and n and d.num_workers != n.num_workers:
                notes.append(f"at world size {ws} the backends ran different topologies ({RATIO_DEN}: "
                             f"{d.num_workers} worker(s), {RATIO_NUM}: {n.num_workers} worker(s)); the ratio "
                             "compares them as they ran")
            elif d and n and d.nodes != n.nodes and None not in (d.nodes, n.nodes):
                notes.append(f"at world size {ws} the backends ran on different node counts ({RATIO_DEN}: "
                             f"{d.nodes}, {RATIO_NUM}: {n.nodes}); the ratio compares them as they ran")
            elif d and n and d.layout != n.layout:
                notes.append(f"at world size {ws} the backends ran different layouts (nodes x ranks per node; "
                             f"{RATIO_DEN}: {d.layout}, {RATIO_NUM}: {n.layout}); the ratio compares them as they ran")
    for b, sizes in lone_sizes.items():
        listed = ", ".join(str(x) for x in dict.fromkeys(sizes))
        notes.append(f"{RATIO_NUM}/{RATIO_DEN} ratio is {NA} at world size {listed}: only {b} ran there")
    return ratios


def _run_notes(job: Mapping[str, Any], runs: list[dict[str, Any]], rows: list[Row], notes: list[str]) -> None:
    """Notes on single repeats, inconsistent batch sizes or weights, and differing software versions."""
    if any(r.repeats == 1 for r in rows):
        notes.append(f"rows with a single repeat show \"{NO_INTERVAL}\"; repeat those runs to get an interval")
    if any(1 < r.repeats < MIN_CI_RUNS for r in rows):
        notes.append(f"rows with 2-{MIN_CI_RUNS - 1} repeats show their range (min-max), not a confidence interval: "
                     f"a 95% interval of the median needs at least {MIN_CI_RUNS} repeats")
    per_replica = num(job.get("per_replica_batch_size"))
    for r in runs:
        gb = r.get("global_batch_size")
        if per_replica and isinstance(gb, int) and gb != per_replica * r["world_size"]:
            where = r.get("_path", r.get("run_id", "?"))
            notes.append(f"{where}: global_batch_size {gb} is not per_replica_batch_size "
                         f"{int(per_replica)} x world_size {r['world_size']}")
    bad_weights = [r for r in runs if r.get("weights_consistent") is False]
    if bad_weights:
        notes.append(f"{len(bad_weights)} run(s) ended with different weights on different ranks "
                     "(weights_consistent = false): their replicas did not train in lockstep")
    differing = [k for k, vals in versions_by_key(runs).items() if len(vals) > 1]
    if differing:
        notes.append(f"software versions differ across runs ({', '.join(differing)}): see Environment")
    for label in dict.fromkeys(row_label(r) for r in runs if r.get("asynchronous") is True):
        notes.append(f"{label}: asynchronous training (workers update the parameter servers without waiting for "
                     "each other), so its per-step losses are not those of the synchronous runs: it is in no parity "
                     f"claim and not in the {RATIO_NUM}/{RATIO_DEN} ratio; compare its throughput and final loss "
                     "only (its speedup is against its own 1-worker run)")
    for label in dict.fromkeys(row_label(r) for r in runs if r.get("asynchronous") is not True and run_strategy(r)):
        notes.append(f"{label}: rows of their own (a variant of the backend that changes the math or the schedule, "
                     f"e.g. another tf.distribute strategy); not in the {RATIO_NUM}/{RATIO_DEN} ratio, speedup "
                     "against its own 1-replica run")
    for label in dict.fromkeys(row_label(r) for r in runs if r.get("asynchronous") is not True
                               and not run_strategy(r) and run_variant(r)):
        notes.append(f"{label}: rows of their own (tuning knobs not at their defaults, see each run's tuning); "
                     f"not in the {RATIO_NUM}/{RATIO_DEN} ratio of the defaults (see Best vs best), speedup against "
                     "its own 1-replica run")
    for r in rows:
        if r.collective and "," in r.collective:
            notes.append(f"{r.backend} at {r.world_size} replicas: its repeats used different collectives "
                         f"({r.collective}); pin one (native --comm) to compare like with like")
    _input_notes(runs, notes)


def _input_notes(runs: list[dict[str, Any]], notes: list[str]) -> None:
    """What the input-wait column measures (once), and why some rows have none."""
    inputs = [i for r in runs if isinstance(i := r.get("input"), Mapping)]
    methods = {i.get("method") for i in inputs} - {None}
    if methods:
        threshold = next((num(i.get("threshold")) for i in inputs if num(i.get("threshold")) is not None), None)
        line = f"below {100 * threshold:g}% kept up; " if threshold is not None else ""
        notes.append("input wait: the share of its timed wall time the slowest rank spent waiting for the next "
                     "batch, median over repeats, timed on the device during the run; " + line + "from 20% highly "
                     "input-bound (TensorFlow Profiler's lines)"
                     + ("; custom-loop rows time the fetch itself" if "fetch" in methods else "")
                     + ("; fit rows show \"input + between steps\": Keras fetches the batch out of reach, so theirs "
                        "is the time from the end of one step to the next batch being available, Keras' host work "
                        "between steps included (an upper bound of the input wait, so never called input-bound)"
                        if "gap" in methods else ""))
    for reason, labels in _not_measured(runs).items():
        notes.append(f"{', '.join(labels)}: input wait not measured ({reason})")
    _input_path_note(runs, notes)


def _input_path_note(runs: list[dict[str, Any]], notes: list[str]) -> None:
    """One line when the backends were fed through different input paths (RunRecord.input.path)."""
    paths: dict[str, set[str]] = {}
    for r in runs:
        i = r.get("input")
        if isinstance(i, Mapping) and isinstance(i.get("path"), str):
            paths.setdefault(row_label(r), set()).add(i["path"])
    if len(set().union(*paths.values()) if paths else set()) > 1:
        fed = "; ".join(f"{label}: {', '.join(sorted(p))}" for label, p in paths.items())
        notes.append(f"the backends were fed differently ({fed}): \"per-worker\" = each process's own tf.data "
                     "iterator into the step, \"distributed\" = tf.distribute's distributed input (a "
                     "MultiDeviceIterator), which cost native about half its CPU throughput on a real CNN "
                     "(docs/findings.md)")


def _not_measured(runs: list[dict[str, Any]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r in runs:
        i = r.get("input")
        if isinstance(i, Mapping) and not i.get("method") and i.get("reason"):
            labels = out.setdefault(str(i["reason"]), [])
            if row_label(r) not in labels:
                labels.append(row_label(r))
    return out


def _summarize_job(job_hash: str, runs: list[dict[str, Any]]) -> JobSummary:
    names = Counter(str(r["job"].get("name", "unnamed")) for r in runs)
    name = names.most_common(1)[0][0]
    job = dict(next(r["job"] for r in runs if str(r["job"].get("name", "unnamed")) == name))
    notes: list[str] = []
    if len(names) > 1:
        notes.append(f"runs of this job carry different names ({', '.join(sorted(names))}); the name is a label "
                     "only, the job hash is identical")
    rows = _rows(runs)
    _speedups(rows, notes)
    ratios = _ratios(rows, notes)
    _run_notes(job, runs, rows, notes)
    windows = sorted({int(w) for r in runs if isinstance(w := r["step_time"].get("window_steps"), int) and w > 1})
    if windows:
        notes.append(f"step p50 / p95 are per-window: the host read the device every {' or '.join(map(str, windows))}"
                     " steps (job key sync_every_steps), so each value is the mean step time of such a window; "
                     "sync_every_steps = 1 gives per-step times at the price of a host sync per step")
    return JobSummary(job_hash, name, job, rows, ratios, notes, runs, version_mix(runs))


def summarize(runs: Sequence[Mapping[str, Any]]) -> list[JobSummary]:
    """One JobSummary per job_hash (sorted by job name, then hash); runs of different jobs are never mixed."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        run = dict(r)
        upgrade_run(run)  # an older file's way of saying what newer fields say (load_runs did it for files)
        groups.setdefault(r["job_hash"], []).append(run)
    out = [_summarize_job(h, rs) for h, rs in groups.items()]
    return sorted(out, key=lambda s: (s.name, s.job_hash))
