"""What the report says, once: its sections as blocks (headings, paragraphs, bullet lists, tables, images, code,
boxes), which common.report.render writes as report.md, report.html and (the scaling table) report.csv.

The scaling table's columns are ``COLUMNS``: each column is one ``Column`` (its header in the tables, its name(s)
in report.csv, its value, its format, its definition), so a column added there reaches all three files. Text in the
blocks is inline Markdown (`code`, **bold**, table-cell escapes: base.md_escape); the HTML renderer reads it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from common.core import registry
from common.report.base import IMAGES, NA, NO_INTERVAL, SAMPLES, fmt_num, fmt_value, in_unit, md_escape
from common.report.load import versions_by_key
from common.report.machines import binding_mix, distinct, format_machines, short_command, shorten_paths
from common.report.stats import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, MIN_CI_RUNS, MIN_PAIRED_ROUNDS, NEEDS_RUNS, num
from common.report.summary import (
    ENERGY_SCOPE,
    TTT_METHOD,
    JobSummary,
    Row,
    from_runs,
    input_text,
    memory_text,
    order_backends,
    row_label,
    validation_names,
)
from common.report.verdict import VERDICT_NOTE, best_ratios, best_rows, like_for_like, verdict_texts, verdict_title


# -- the blocks --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Heading:
    text: str
    level: int  # 1 the report's title, 2 a section, 3 a part of one


@dataclass(frozen=True)
class Para:
    text: str
    note: bool = False  # a note on method (report.html sets it in smaller type)


@dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    body: tuple[tuple[str, ...], ...]  # plain text cells (each renderer escapes its own way)
    csv: str = ""  # a CSV file beside report.md that holds this table's rows too (render.tables_csv); "": none
    key: tuple[str, ...] = ()  # the CSV's first cells in each of its rows (the job's hash and name: JOB_CSV)


@dataclass(frozen=True)
class Images:
    files: tuple[tuple[str, str], ...]  # (alt text, PNG file name beside report.md)


@dataclass(frozen=True)
class Code:
    text: str
    lang: str = ""  # the fenced block's language ("": none)


@dataclass(frozen=True)
class Box:
    """Blocks kept together: "verdict", "model" (predictions, set apart) or "details" (collapsed, ``summary``)."""

    kind: str
    blocks: tuple[Block, ...]
    summary: str = ""  # the collapsed box's title


Block = Heading | Para | Bullets | Table | Images | Code | Box


def table(header: Sequence[str], body: Sequence[Sequence[str]]) -> Table:
    return Table(tuple(header), tuple(tuple(row) for row in body))


# -- the scaling table's columns ---------------------------------------------------------------------------------
def number(spec: str, scale: float = 1.0, suffix: str = "") -> Callable[[Any], str]:
    """A table format: ``value * scale`` by ``spec``, plus ``suffix``; n/a for None."""
    return lambda x: fmt_num(x, spec, scale, suffix)


def text(x: Any) -> str:
    return NA if x is None else str(x)


def always(_: JobSummary) -> bool:
    return True


def has_target(summary: JobSummary) -> bool:
    """The job sets a target (the time-to-target column is shown beside throughput)."""
    return any(r.validation.targeted for r in summary.rows)


@dataclass(frozen=True)
class Column:
    """One column of the scaling table: in the Markdown and HTML tables (``header``), in report.csv (``csv``), or
    both."""

    header: str | None  # the tables' header; None: in report.csv only
    csv: str | tuple[str, ...] | None  # report.csv's name (several: ``value`` gives a tuple); None: tables only
    value: Callable[[Row], Any]  # what the row holds (report.csv writes it: "" for None, numbers by repr)
    fmt: Callable[[Any], str] = text  # the tables' text of the value
    definition: str | None = None  # its sentence in the report's Definitions
    shown: Callable[[JobSummary], bool] = always  # in the tables of this job only when true

    @property
    def csv_names(self) -> tuple[str, ...]:
        return () if self.csv is None else (self.csv,) if isinstance(self.csv, str) else self.csv


def _interval(r: Row) -> tuple[Any, ...]:
    iv = r.throughput.interval
    return (iv.kind, iv.low, iv.high) if iv else (None, None, None)


def interval_text(row: Row) -> str:
    """The row's interval cell: "[lo, hi] 95% CI", "[lo, hi] min-max (n=3)" or NO_INTERVAL."""
    iv = row.throughput.interval
    return iv.text() if iv is not None else NO_INTERVAL


def _reached(r: Row) -> str | None:
    return f"{r.validation.reached}/{r.validation.targeted}" if r.validation.targeted else None


def _finals(r: Row) -> str:
    return ";".join(f"{k}={x!r}" for k, x in r.validation.final.items() if x is not None)


C = Column
RATIO_CSV = "{num}_{den}_ratio"  # report.csv's ratio column, named by the headline pair: horovod_native_ratio
TTT = C("time to target (s)", "time_to_target_s", lambda r: r.validation.ttt, number(".2f"), shown=has_target)
COLUMNS: tuple[Column, ...] = (  # the scaling table, in order; report.csv starts with job_hash, job_name
    C("backend", "backend", lambda r: r.identity.label),
    C("replicas", "world_size", lambda r: r.identity.world_size),
    C("layout", "layout", lambda r: r.identity.layout),
    C(None, ("nodes", "ranks_per_node"), lambda r: r.layout_counts),
    C("workers", "num_workers", lambda r: r.identity.num_workers),
    C("repeats", "repeats", lambda r: r.throughput.repeats),
    C(None, "global_batch_size", lambda r: r.facts.global_batch_size),
    C("images/s median", "images_per_sec_median", lambda r: r.throughput.median, number(".1f"),
      "images/s = global batch x timed steps / the slowest rank's wall clock from the end of the warm-up to its "
      "last step"),
    C("interval", None, lambda r: r, interval_text),
    C(None, ("interval_kind", "interval_low", "interval_high"), _interval),
    C(None, ("images_per_sec_min", "images_per_sec_max"), lambda r: (min(r.throughput.ips), max(r.throughput.ips))),
    C("speedup", "speedup", lambda r: r.scaling.speedup, number(".2f", suffix="x"),
      "speedup = median images/s at N replicas / median images/s at 1 replica of the same backend"),
    C("efficiency", "efficiency", lambda r: r.scaling.efficiency, number(".1f", 100, "%"),
      "efficiency = throughput(N) / (N × throughput(1))"),
    C(None, RATIO_CSV, lambda r: r.scaling.ratio, number(".3f"),
      "NUM/DEN = ratio of a compared pair's median images/s at the same world size (report.csv: the first pair's)"),
    C(None, ("ratio_ci95_low", "ratio_ci95_high"), lambda r: r.scaling.ratio_ci or (None, None)),
    C("step p50 (ms)", "step_time_p50_s", lambda r: r.steps.p50, number(".2f", 1e3),
      "step times (p50, p95 over each run's timed steps, step end to step end, or per sync window: see Notes) and "
      "time to first step are medians over repeats"),
    C("step p95 (ms)", "step_time_p95_s", lambda r: r.steps.p95, number(".2f", 1e3)),
    C(None, "step_time_mean_s", from_runs(lambda run: num(run.step_time.get("mean")))),
    C("first step (s)", "time_to_first_step_s", from_runs(lambda run: num(run.time_to_first_step)), number(".2f")),
    C(None, "timed_wall_time_s", from_runs(lambda run: num(run.timed_wall_time))),
    C("final loss", "final_loss", lambda r: r.facts.final_loss, number(".4f"),
      "final loss = median over repeats of the last step's loss"),
    C("input wait", None, lambda r: r, input_text),
    C(None, ("input_method", "input_wait_fraction", "input_verdict"),
      lambda r: (r.input.method, r.input.fraction, r.input.verdict)),
    C("collective", "collective", lambda r: r.facts.collective or None),
    C(None, "variant", lambda r: r.identity.variant),
    TTT,
    C(None, "target_reached_repeats", _reached),
    C(None, "final_validation", _finals),
)
JOB_CSV = ("job_hash", "job_name")  # report.csv's first columns: the row's job


def scaling_table(summary: JobSummary, columns: Sequence[Column] | None = None) -> Table:
    """The job's scaling table (one row per backend x world size x layout)."""
    cols = [c for c in (COLUMNS if columns is None else columns) if c.header is not None and c.shown(summary)]
    return table([str(c.header) for c in cols], [[c.fmt(c.value(r)) for c in cols] for r in summary.rows])


def csv_header(columns: Sequence[Column] | None = None, pair: registry.Pair = registry.PAIRS[0]) -> list[str]:
    """report.csv's header; ``pair``: the headline pair, which names the ratio column (``RATIO_CSV``)."""
    names = (n for c in (COLUMNS if columns is None else columns) for n in c.csv_names)
    return [*JOB_CSV, *(n.format(num=pair[0], den=pair[1]) if n == RATIO_CSV else n for n in names)]


def csv_values(summary: JobSummary, row: Row, columns: Sequence[Column] | None = None) -> list[Any]:
    """One row of report.csv as values (report.csv writes None as an empty cell)."""
    out: list[Any] = [summary.job_hash, summary.name]
    for c in COLUMNS if columns is None else columns:
        if c.csv_names:
            v = c.value(row)
            out += list(v) if len(c.csv_names) > 1 else [v]
    return out


def definitions() -> str:
    return "; ".join(c.definition for c in COLUMNS if c.definition)


# -- the other tables of a job -----------------------------------------------------------------------------------
# The first cells of a row in every per-row table: label, replicas, layout, workers, repeats, images/s median.
CELLS = tuple(c for c in COLUMNS if c.header in ("backend", "replicas", "layout", "workers", "repeats",
                                                 "images/s median"))
CELL_HEADER = tuple(str(c.header) for c in CELLS)


def cells(r: Row, columns: Sequence[Column] = CELLS) -> list[str]:
    """The row's table text of ``columns`` (by default its first cells in every per-row table)."""
    return [c.fmt(c.value(r)) for c in columns]


def ratio_text(ratio: float | None, ci: tuple[float, float] | None) -> str:
    """The ratio and its bootstrap interval, e.g. "1.050 [1.010, 1.090]", "1.050 (needs 6 runs per cell)"."""
    if ratio is None:
        return NA
    return f"{ratio:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f"{ratio:.3f} ({NEEDS_RUNS})"


def ratio_table(summary: JobSummary, pair: registry.Pair | None = None) -> Table:
    """A compared pair's ratio per world size (and layout); ``pair`` None: the headline (the summary's first)."""
    top, bottom = pair = pair or summary.pairs[0]
    ratios = summary.ratios_of(pair)
    header: tuple[str, ...] = (
        "replicas", "layout", f"{bottom} images/s", f"{top} images/s",
        f"{top}/{bottom} [95% CI]", f"workers ({bottom} / {top})",
        f"collective ({bottom} / {top})", "like for like")
    body = [[str(q.world_size), q.layout or NA, fmt_num(q.den_ips, ".1f"), fmt_num(q.num_ips, ".1f"),
             ratio_text(q.ratio, q.ratio_ci),
             f"{q.den_workers if q.den_workers is not None else NA} / "
             f"{q.num_workers if q.num_workers is not None else NA}",
             f"{q.den_collective or NA} / {q.num_collective or NA}", like_for_like(summary, q)] for q in ratios]
    if any(q.same_nodes for q in ratios):  # runs that recorded their nodes: did a round's pair share them
        header += ("same nodes",)
        body = [[*b, f"{q.same_nodes or NA}{' (paired)' if q.paired else ''}"] for b, q in zip(body, ratios)]
    if any(q.machine for q in ratios):  # a job run on several machines: each pair's own
        header += ("machine",)
        body = [[*b, q.machine or NA] for b, q in zip(body, ratios)]
    return table(header, body)


def validation_part(summary: JobSummary) -> list[Block]:
    """Time to target beside throughput, and the final validation numbers, per row, with the note on its method;
    nothing when no run of the job evaluated (rows of runs without evaluation show n/a)."""
    names = validation_names(summary.records)
    targeted = has_target(summary)
    if not names and not targeted:
        return []
    header = [*CELL_HEADER, *((str(TTT.header), "reached") if targeted else ()),
              *(f"final val {n}" for n in names)]
    body = []
    for r in summary.rows:
        first = [*cells(r, (*CELLS, TTT)), _reached(r) or NA] if targeted else cells(r)
        body.append(first + [fmt_num(r.validation.final.get(n), ".4f") for n in names])
    job = summary.job
    target = (f"target: {job.get('target_metric')} {'<=' if job.get('target_metric') == 'loss' else '>='} "
              f"{job.get('target_value')}. " if targeted else "")
    return [Heading("Time to target and validation", 3), table(header, body),
            Para(f"{target}{TTT_METHOD[0].upper()}{TTT_METHOD[1:]}.", note=True)]


def resources_part(summary: JobSummary) -> list[Block]:
    """Peak memory per rank and, for rows on GPUs, GPU energy and GPU-hours, with their note; nothing when no run
    recorded any."""
    rows = summary.rows
    gpu = any(r.machine.gpu for r in rows)
    if not any(r.resources.memory_kind for r in rows) and not gpu:
        return []
    f = fmt_num
    header = [*CELL_HEADER, "peak memory per rank"]
    if gpu:
        header += ["GPU energy (J)", "energy per image (mJ)", "GPU-hours per epoch", "GPU-hours to target"]
    body = []
    for r in rows:
        res = r.resources
        row = [*cells(r), memory_text(res) or NA]
        if gpu:
            row += [f(res.energy_j, ".1f"), f(res.energy_per_image_j, ".3g", 1e3), f(res.gpu_hours_per_epoch, ".3g"),
                      f(res.gpu_hours_to_target, ".3g")]
        body.append(row)
    note = ("Peak memory per rank: the largest rank's, median over repeats; GPU = TensorFlow's allocator peak on the "
            "rank's GPU, host RSS = the process's peak resident set (getrusage, at least Linux's VmHWM).")
    if gpu:
        note += (f" Energy: {ENERGY_SCOPE}; n/a where not measured. GPU-hours per epoch = GPUs x mean step time x "
                 "steps per epoch; to target = GPUs x time to target.")
    return [Heading("Memory and energy", 3), table(header, body), Para(note)]


BEST_NOTE = ("Fastest = the highest median images/s among a backend's variants at that size and layout (its default "
             "strategy only; layouts are never compared with each other); the maximum of several noisy medians "
             "favours a lucky variant, so check its interval in the scaling table before trusting a small gap.")


def best_part(summary: JobSummary) -> list[Block]:
    """Best vs best (common.report.verdict): per backend and size the default and the fastest variant, then the
    backend ratio of the fastest beside that of the defaults; nothing when the job has no variants."""
    cells = best_rows(summary)
    if not cells:
        return []
    f = fmt_num
    body = [[c.backend, str(c.world_size), c.layout, f(c.default.throughput.median if c.default else None, ".1f"),
             c.best_name, f(c.best.throughput.median, ".1f"),
             f(c.best.throughput.median / c.default.throughput.median if c.default else None, ".3f")] for c in cells]
    out: list[Block] = [Heading("Best vs best", 3), table(
        ("backend", "replicas", "layout", "default images/s", "fastest variant", "fastest images/s",
         "fastest / default"), body)]
    for top, bottom in summary.pairs:
        ratios = [[str(q.world_size), q.layout, f(q.default_ratio, ".3f"), f(q.best_ratio, ".3f"), q.den_best,
                   q.num_best] for q in best_ratios(cells, (top, bottom))]
        if ratios:
            out.append(table(("replicas", "layout", f"{top}/{bottom} defaults", f"{top}/{bottom} fastest",
                              f"fastest {bottom}", f"fastest {top}"), ratios))
    return [*out, Para(BEST_NOTE)]


def baselines(summary: JobSummary) -> list[str]:
    """One line per series: the absolute 1-replica throughput its speedup and efficiency are against."""
    out = []
    for series in dict.fromkeys(r.identity.series for r in summary.rows):
        base = next((r for r in summary.rows if r.identity.series == series and r.identity.world_size == 1), None)
        if base is not None:
            out.append(f"{series}: 1 replica ({base.identity.layout}), {base.throughput.median:.1f} images/s median of "
                       f"{base.throughput.repeats} repeat(s), {interval_text(base)}")
    return out


# -- one job's section -------------------------------------------------------------------------------------------
KEY_JOB_FIELDS = ("model", "dataset", "per_replica_batch_size", "steps", "epochs", "optimizer", "learning_rate",
                  "lr_scaling", "mode", "mixed_precision", "xla", "seed")  # shown in each job's header


RECIPE_FIELDS = ("optimizer", "learning_rate")  # the job's keys a compiled model's recipe replaces in the header


def compiled_recipes(records: Sequence[Any]) -> list[str]:
    """What trained the runs whose model function compiled its own optimizer (``RunRecord.recipe``, source
    "compiled"), one text per distinct recipe, e.g. "the compiled model's SGD (base learning rate 0.001; loss
    sparse_categorical_crossentropy; metrics accuracy)"; [] when the job's keys trained. The base rate, not each
    run's: under lr_scaling = "linear" a run's rate is the base times its replicas."""
    out = []
    for r in records:
        rec = r.recipe if isinstance(r.recipe, Mapping) else {}
        if rec.get("source") != "compiled":
            continue
        parts = [f"base learning rate {fmt_value(rec.get('base_learning_rate'))}"]
        if rec.get("loss"):
            parts.append(f"loss {rec['loss']}")
        if rec.get("metrics"):
            parts.append(f"metrics {', '.join(map(str, rec['metrics']))}")
        name = str(rec.get("optimizer") or "?").rsplit(".", 1)[-1]
        out.append(f"the compiled model's {name} ({'; '.join(parts)})")
    return list(dict.fromkeys(out))


def _key_fields(s: JobSummary) -> list[str]:
    """The job's key fields; a compiled model's recipe in place of the job's optimizer and learning rate, which
    did not train it (the job file's keys stay the job's identity, ``job`` in the records)."""
    compiled = compiled_recipes(s.records)
    shown = [k for k in KEY_JOB_FIELDS if k in s.job or (compiled and k == RECIPE_FIELDS[0])]
    key = [f"{k} = {fmt_value(s.job[k])}" for k in shown if not (compiled and k in RECIPE_FIELDS)]
    if compiled:  # where the optimizer would stand
        key.insert(shown.index(RECIPE_FIELDS[0]), "trained by " + " / ".join(compiled))
    if s.job.get("model") == "mlp" and "mlp_hidden" in s.job:
        key.insert(1, f"mlp_hidden = {fmt_value(s.job['mlp_hidden'])}")
    return key


def _head(s: JobSummary) -> list[Block]:
    """Title, key job fields, the version and binding mixes if any, and the job's tables."""
    key = _key_fields(s)
    out: list[Block] = [Heading(f"Job `{md_escape(s.name)}` — hash `{s.job_hash}`", 2),
                        Para(f"Key job fields: {', '.join(key)}."),
                        Para(f"{len(s.runs)} runs; backends: {', '.join(s.backends)}.")]
    if s.version_mix:
        out.append(Para(f"**Mixed software versions** (compared anyway, --allow-mixed-versions): "
                        f"{md_escape('; '.join(s.version_mix))}."))
    mix = binding_mix(s.records)
    if mix:
        out.append(Para(f"**Mixed CPU binding**: {md_escape(mix)}. Binding alone moved a backend's throughput by "
                        "8-43% on the CPU machine of docs/multinode.md, \"CPU binding\": compare runs bound alike."))
    base = baselines(s)
    out += [Heading("Scaling", 3), scaling_table(s),
            *([Para("Speedup and efficiency base (absolute): " + "; ".join(md_escape(b) for b in base) + ".")]
              if base else []),
            *(b for pair in s.pairs for b in (Heading(f"{pair[0]} / {pair[1]} throughput", 3), ratio_table(s, pair)))]
    return out + validation_part(s) + resources_part(s) + best_part(s)


def _environment(s: JobSummary, results_dir: Path | None = None) -> list[Block]:
    """Versions, hosts, devices, backend_info, run period and an example command per backend (paths relative to
    the results directory, no home directory)."""
    runs = s.records
    labels = order_backends({r.identity.plain for r in s.rows})  # row labels without their machine part
    parts = []
    for k, vals in versions_by_key(runs).items():
        if len(vals) == 1:
            parts.append(f"{k} {next(iter(vals))}")
        else:
            parts.append(f"{k} DIFFERS: " + ", ".join(f"{v} ({', '.join(order_backends(bs))})"
                                                      for v, bs in sorted(vals.items())))
    items = [f"versions: {'; '.join(parts) or NA}", f"hosts: {distinct(_rank_strings(r.hosts for r in runs))}",
             f"devices: {distinct(_rank_strings(r.devices for r in runs))}"]
    for b in labels:
        infos = [shorten_paths(json.dumps(r.backend_info, sort_keys=True), results_dir) for r in runs
                 if row_label(r) == b and isinstance(r.backend_info, dict)]
        shown = [i if len(i) <= 300 else i[:297] + "..." for i in dict.fromkeys(infos)]
        items.append(f"backend_info ({b}): {distinct(shown, limit=4)}")
    starts = sorted(str(r.started_at) for r in runs if r.started_at)
    ends = sorted(str(r.finished_at) for r in runs if r.finished_at)
    if starts or ends:
        items.append(f"runs from {starts[0] if starts else '?'} to {ends[-1] if ends else '?'}")
    for b in labels:
        cmd = next((r.command for r in runs if row_label(r) == b and isinstance(r.command, list)), None)
        if cmd:
            items.append(f"example command ({b}): `{md_escape(short_command(cmd, results_dir))}`")
    return [Heading("Environment", 3), Bullets(tuple(items))]


def _rank_strings(per_run: Any) -> list[str]:
    """The per-rank strings (hosts, devices) of every run, in order."""
    return [str(x) for v in per_run if isinstance(v, list) for x in v]


def _machine(s: JobSummary) -> list[Block]:
    """One line per distinct machine set the job's runs ran on (common.report.machines)."""
    several = any(r.machine.label for r in s.rows)
    why = (" Runs on different machines never share a row: when the job ran on several CPU or GPU models every row "
           "names its own (and each has its own 1-replica baseline), and a backend whose runs of one size ran on "
           "different node counts names the node count in its rows (the baseline stays its 1-replica run)."
           if several else "")
    order = order_backends({row_label(r) for r in s.records})
    runs = sorted(s.records, key=lambda r: (order.index(row_label(r)), r.world_size))  # lines list them so
    return [Heading("Machine", 3),
            Para(f"CPU model x logical cores; GPU (memory, compute capability, driver) or no GPU; nodes; CUDA and "
                 "cuDNN TensorFlow was built with, MPI, the NCCL Horovod was built with; Slurm job.step "
                 f"(partition).{why}"),
            Bullets(tuple(md_escape(line.removeprefix("- ")) for line in format_machines(runs, row_label)))]


def _run_files(s: JobSummary, results_dir: Path | None) -> Box:
    """The collapsed list of run files, relative to the results directory."""
    files = []
    for run in sorted(s.runs, key=lambda r: (r.record.backend, r.record.world_size, str(r.path))):
        r, p = run.record, Path(run.path or "?")
        if results_dir is not None:
            try:
                p = p.relative_to(results_dir)
            except ValueError:
                pass
        reps = f"{r.world_size} replica{'' if r.world_size == 1 else 's'}"
        files.append(f"`{p}`: {row_label(r)}, {reps}, {float(r.images_per_sec):.1f} images/s")
    return Box("details", (Bullets(tuple(files)),), "Run files")


def job_section(s: JobSummary, *, results_dir: Path | None = None, images: Sequence[Path] = ()) -> list[Block]:
    """The full section for one job: header, key fields, tables, notes, plots, machine and environment."""
    out = _head(s)
    if s.notes:
        out += [Heading("Notes", 3), Bullets(tuple(md_escape(n) for n in s.notes))]
    if images:
        out += [Heading("Plots", 3), Images(tuple((p.stem, p.name) for p in images))]
    out += _machine(s) + _environment(s, results_dir)
    out.append(Box("details", (Code(json.dumps(s.job, indent=1, sort_keys=True), "json"),), "Full job definition"))
    return [*out, _run_files(s, results_dir)]


# -- the whole report --------------------------------------------------------------------------------------------
METHOD = (
    "centre = the median images/s over a row's repeats (Hoefler & Belli, SC15: medians and nonparametric "
    "intervals, not means);",
    f"interval, with at least {MIN_CI_RUNS} repeats = the 95% confidence interval of the median from order "
    "statistics [x(j), x(k)] of the sorted repeats, j = max{m+1 : F(m) <= 0.025} with F the Binomial(n, 1/2) cdf "
    "(scipy.stats.binom), k = n+1-j (coverage 1-2F(j-1) >= 95%; n = 6 gives min-max at 96.9%);",
    f"with 2-{MIN_CI_RUNS - 1} repeats the range min-max, labelled \"min-max (n=...)\" (not a confidence "
    f"interval); a single repeat has none (\"{NO_INTERVAL}\");",
    f"a pair's ratio (numerator/denominator, {'/'.join(registry.PAIRS[0])} unless others are asked for: --pair) = "
    "ratio of the medians, with a bootstrap 95% percentile interval when both cells have "
    f"at least {MIN_CI_RUNS} repeats ({BOOTSTRAP_RESAMPLES:,} independent resamples of each cell, numpy "
    f"Generator seed {BOOTSTRAP_SEED}, reproducible), else \"{NEEDS_RUNS}\"; when both backends ran every round on "
    "the same nodes (a sweep's rounds: the records' Slurm nodelist and run directory; the demo's: its hosts and the "
    "file name's -r<k>), the interval is paired instead: the Student t 95% interval of the mean of the per-round "
    f"log ratios, exponentiated, from {MIN_PAIRED_ROUNDS} rounds, so a round's nodes and hour, which hit both alike, "
    "cancel in the ratio rather than widen its interval (the ratio shown is then the geometric mean of the round "
    "ratios, the interval's centre, and the verdict says \"paired\");",
    "speedup and efficiency are against the same backend's absolute 1-replica (1-GPU or 1-process) median, "
    "stated under each scaling table; rows are kept apart by layout (nodes x ranks per node, from each run's "
    "hosts): 1x8 and 2x4 are different rows and points;",
    "the scaling model's numbers are predictions, in a section of their own, never in the measured tables or plots.",
)


def verdict_section(summaries: Sequence[JobSummary]) -> Box:
    """The report's first section: per job, one verdict line per layout (common.report.verdict)."""
    blocks: list[Block] = [Heading("Verdict", 2)]
    for s in summaries:
        lines = [md_escape(t) for t in verdict_texts(s)] or ["no runs of both backends to compare"]
        blocks += [Para(verdict_title(s)), Bullets(tuple(lines))]
    return Box("verdict", (*blocks, Para(VERDICT_NOTE, note=True)))


def results_line(summaries: Sequence[JobSummary], sources: Sequence[Path]) -> str:
    """What was read: the directories (one set) and how many runs of how many jobs."""
    n_runs = sum(len(s.runs) for s in summaries)
    where = ", ".join(f"`{shorten_paths(str(d))}`" for d in sources)
    return (f"Results: {where}{' (read as one set)' if len(sources) > 1 else ''} — {n_runs} runs of {len(summaries)} "
            "job(s). Runs of different jobs (different job hash) are never compared with each other.")


def report(summaries: Sequence[JobSummary], *, results_dir: Path | None = None,
           images: Mapping[str, Sequence[Path]] | None = None, sources: Sequence[Path] = (),
           after_verdict: Sequence[Block] = (), after_jobs: Sequence[Block] = ()) -> list[Block]:
    """The whole report: the verdict (then ``after_verdict``: the baseline's section), method, definitions, one
    section per job, then ``after_jobs`` (the allreduce benchmark, the scaling model, the breakdown)."""
    out: list[Block] = [Heading("twinbench scaling report", 1)]
    sources = list(sources) or ([results_dir] if results_dir is not None else [])
    if sources:
        out.append(Para(results_line(summaries, sources)))
    out += [verdict_section(summaries), *after_verdict, Heading("Method", 2), Bullets(METHOD),
            Para(f"Definitions: {definitions()}.", note=True)]
    for s in summaries:
        out += job_section(s, results_dir=results_dir, images=(images or {}).get(s.job_hash, ()))
    unit = IMAGES if all(s.unit == IMAGES for s in summaries) else SAMPLES  # images are samples too
    return [with_unit(b, unit) for b in [*out, *after_jobs]]


def with_unit(block: Block, unit: str) -> Block:
    """The block's text in ``unit`` (base.in_unit)."""
    if unit == IMAGES:
        return block
    if isinstance(block, Heading | Para):
        return replace(block, text=in_unit(block.text, unit))
    if isinstance(block, Bullets):
        return Bullets(tuple(in_unit(i, unit) for i in block.items))
    if isinstance(block, Table):
        return replace(block, header=tuple(in_unit(h, unit) for h in block.header),
                       body=tuple(tuple(in_unit(c, unit) for c in row) for row in block.body))
    if isinstance(block, Box):
        return Box(block.kind, tuple(with_unit(b, unit) for b in block.blocks), block.summary)
    return block
