"""Rendering summaries as text: the Markdown tables and report.md sections, and report.csv."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from common.report.base import NA, NO_INTERVAL, fmt_value
from common.report.best import best_ratios, best_rows
from common.report.environment import (
    binding_mix,
    environment_section,
    machine_section,
    md_escape,
    run_files,
    shorten_paths,
)
from common.report.evaluation import TTT_METHOD, validation_names
from common.report.resources import ENERGY_SCOPE, memory_text
from common.report.rows import (
    RATIO_DEN,
    RATIO_NUM,
    JobSummary,
    RatioRow,
    Row,
    input_text,
)
from common.report.stats import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, MIN_CI_RUNS, NEEDS_RUNS
from common.report.verdict import VERDICT_NOTE, job_verdicts

METHOD = (
    "centre = the median images/s over a row's repeats (Hoefler & Belli, SC15: medians and nonparametric "
    "intervals, not means);",
    f"interval, with at least {MIN_CI_RUNS} repeats = the 95% confidence interval of the median from order "
    "statistics [x(j), x(k)] of the sorted repeats, j = max{m+1 : F(m) <= 0.025} with F the Binomial(n, 1/2) cdf "
    "(scipy.stats.binom), k = n+1-j (coverage 1-2F(j-1) >= 95%; n = 6 gives min-max at 96.9%);",
    f"with 2-{MIN_CI_RUNS - 1} repeats the range min-max, labelled \"min-max (n=...)\" (not a confidence "
    f"interval); a single repeat has none (\"{NO_INTERVAL}\");",
    f"{RATIO_NUM}/{RATIO_DEN} = ratio of the medians, with a bootstrap 95% percentile interval when both cells have "
    f"at least {MIN_CI_RUNS} repeats ({BOOTSTRAP_RESAMPLES:,} independent resamples of each cell, numpy "
    f"Generator seed {BOOTSTRAP_SEED}, reproducible), else \"{NEEDS_RUNS}\";",
    "speedup and efficiency are against the same backend's absolute 1-replica (1-GPU or 1-process) median, "
    "stated under each scaling table; rows are kept apart by layout (nodes x ranks per node, from each run's "
    "hosts): 1x8 and 2x4 are different rows and points;",
    "the scaling model's numbers are predictions, in a section of their own, never in the measured tables or plots.",
)
INTERVAL_METHOD = " ".join(METHOD)  # one paragraph (report.md); report.html lists METHOD's lines
DEFINITIONS = (
    "speedup = median images/s at N replicas / median images/s at 1 replica of the same backend; "
    f"efficiency = throughput(N) / (N × throughput(1)); {RATIO_NUM}/{RATIO_DEN} = ratio of the two backends' median "
    "images/s at the same world size; images/s = global batch x timed steps / the slowest rank's wall clock from "
    "the end of the warm-up to its last step; step times (p50, p95 over each run's timed steps, step end to step "
    "end, or per sync window: see Notes) and time to first step are medians over repeats; final loss = median "
    "over repeats of the last step's loss"
)
KEY_JOB_FIELDS = ("model", "dataset", "per_replica_batch_size", "steps", "epochs", "optimizer", "learning_rate",
                  "lr_scaling", "mode", "mixed_precision", "xla", "seed")  # shown in each job's header
TABLE_HEADER = ("backend", "replicas", "layout", "workers", "repeats", "img/s median", "interval",
                "speedup", "efficiency", "step p50 (ms)", "step p95 (ms)", "first step (s)", "final loss",
                "input wait", "collective")  # then "time to target (s)" when the job sets a target
CSV_COLUMNS = (
    "job_hash", "job_name", "backend", "world_size", "layout", "nodes", "ranks_per_node", "num_workers", "repeats",
    "global_batch_size", "images_per_sec_median", "interval_kind", "interval_low", "interval_high",
    "images_per_sec_min", "images_per_sec_max", "speedup", "efficiency", f"{RATIO_NUM}_{RATIO_DEN}_ratio",
    "ratio_ci95_low", "ratio_ci95_high", "step_time_p50_s", "step_time_p95_s", "step_time_mean_s",
    "time_to_first_step_s", "timed_wall_time_s", "final_loss", "input_method", "input_wait_fraction",
    "input_verdict", "collective", "variant", "time_to_target_s", "target_reached_repeats", "final_validation",
)


def fmt_num(x: float | None, fmt: str, scale: float = 1.0, suffix: str = "") -> str:
    """``x * scale`` formatted, plus ``suffix``; n/a for None."""
    if x is None:
        return NA
    if math.isnan(x):
        return "nan"
    return f"{x * scale:{fmt}}{suffix}"


def interval_text(row: Row) -> str:
    """The row's interval cell: "[lo, hi] 95% CI", "[lo, hi] min-max (n=3)" or NO_INTERVAL."""
    iv = row.throughput.interval
    return iv.text() if iv is not None else NO_INTERVAL


def ratio_text(ratio: float | None, ci: tuple[float, float] | None) -> str:
    """The ratio and its bootstrap interval, e.g. "1.050 [1.010, 1.090]", "1.050 (needs 6 runs per cell)"."""
    if ratio is None:
        return NA
    return f"{ratio:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f"{ratio:.3f} ({NEEDS_RUNS})"


def has_target(summary: JobSummary) -> bool:
    """The job sets a target (the time-to-target column is shown beside throughput)."""
    return any(r.validation.targeted for r in summary.rows)


def scaling_table(summary: JobSummary) -> tuple[tuple[str, ...], list[list[str]]]:
    """The job's scaling table (one row per backend x world size x layout) as header and text cells."""
    f = fmt_num
    body = [[*_cell_cells(r), interval_text(r), f(r.scaling.speedup, ".2f", suffix="x"),
             f(r.scaling.efficiency, ".1f", 100, "%"), f(r.steps.p50, ".2f", 1e3), f(r.steps.p95, ".2f", 1e3),
             f(r.steps.first_step, ".2f"), f(r.facts.final_loss, ".4f"), input_text(r), r.facts.collective or NA]
            for r in summary.rows]
    if has_target(summary):
        return (*TABLE_HEADER, "time to target (s)"), [[*b, f(r.validation.ttt, ".2f")]
                                                      for b, r in zip(body, summary.rows)]
    return TABLE_HEADER, body


def _cell_cells(r: Row) -> list[str]:
    """The first cells of a row in every per-row table: label, replicas, layout, workers, repeats, img/s median."""
    i = r.identity
    return [i.label, str(i.world_size), i.layout, str(i.num_workers), str(r.throughput.repeats),
            fmt_num(r.throughput.median, ".1f")]


def baselines(summary: JobSummary) -> list[str]:
    """One line per series: the absolute 1-replica throughput its speedup and efficiency are against."""
    out = []
    for series in dict.fromkeys(r.identity.series for r in summary.rows):
        base = next((r for r in summary.rows if r.identity.series == series and r.identity.world_size == 1), None)
        if base is not None:
            out.append(f"{series}: 1 replica ({base.identity.layout}), {base.throughput.median:.1f} img/s median of "
                       f"{base.throughput.repeats} repeat(s), {interval_text(base)}")
    return out


def md_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """A Markdown table (cells escaped)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def format_table(summary: JobSummary) -> str:
    """The job's scaling table (one row per backend x world size x layout) in Markdown."""
    return md_table(*scaling_table(summary))


def format_ratio_table(summary: JobSummary) -> str:
    """registry.RATIO median throughput (numerator / denominator) per world size in Markdown."""
    return md_table(*ratio_table(summary))


def ratio_table(summary: JobSummary) -> tuple[tuple[str, ...], list[list[str]]]:
    """registry.RATIO per world size (and layout) as header and text cells."""
    header = ("replicas", "layout", f"{RATIO_DEN} img/s", f"{RATIO_NUM} img/s",
              f"{RATIO_NUM}/{RATIO_DEN} [bootstrap 95% CI]", f"workers ({RATIO_DEN} / {RATIO_NUM})",
              f"collective ({RATIO_DEN} / {RATIO_NUM})", "like for like")
    body = [[str(q.world_size), q.layout or NA, fmt_num(q.den_ips, ".1f"), fmt_num(q.num_ips, ".1f"),
             ratio_text(q.ratio, q.ratio_ci),
             f"{q.den_workers if q.den_workers is not None else NA} / "
             f"{q.num_workers if q.num_workers is not None else NA}",
             f"{q.den_collective or NA} / {q.num_collective or NA}", _like_for_like(q)] for q in summary.ratios]
    if any(q.machine for q in summary.ratios):  # a job run on several machines: each pair's own
        header += ("machine",)
        body = [[*b, q.machine or NA] for b, q in zip(body, summary.ratios)]
    return header, body


def _like_for_like(q: RatioRow) -> str:
    if q.caveat:
        return f"no: {q.caveat}"
    return "yes" if q.ratio is not None and q.den_collective and q.num_collective else NA


def validation_table(summary: JobSummary) -> tuple[list[str], list[list[str]], str] | None:
    """Time to target beside throughput, and the final validation numbers, per row, as (header, body, the note on
    its method); None when no run of the job evaluated (rows of runs without evaluation show n/a)."""
    names = validation_names(summary.records)
    targeted = has_target(summary)
    if not names and not targeted:
        return None
    f = fmt_num
    header = ["backend", "replicas", "layout", "workers", "repeats", "img/s median"]
    if targeted:
        header += ["time to target (s)", "reached"]
    header += [f"final val {n}" for n in names]
    body = []
    for r in summary.rows:
        v = r.validation
        cells = _cell_cells(r)
        if targeted:
            cells += [f(v.ttt, ".2f"), f"{v.reached}/{v.targeted}" if v.targeted else NA]
        cells += [f(v.final.get(n), ".4f") for n in names]
        body.append(cells)
    job = summary.job
    target = (f"target: {job.get('target_metric')} {'<=' if job.get('target_metric') == 'loss' else '>='} "
              f"{job.get('target_value')}. " if targeted else "")
    return header, body, f"{target}{TTT_METHOD[0].upper()}{TTT_METHOD[1:]}."


def format_validation_table(summary: JobSummary) -> str | None:
    """``validation_table`` as Markdown (table, then its note)."""
    got = validation_table(summary)
    return None if got is None else md_table(got[0], got[1]) + f"\n\n{got[2]}"


def resources_table(summary: JobSummary) -> tuple[list[str], list[list[str]], str] | None:
    """Peak memory per rank and, for rows on GPUs, GPU energy and GPU-hours, as (header, body, note); None when no
    run recorded any."""
    rows = summary.rows
    gpu = any(r.machine.gpu for r in rows)
    if not any(r.resources.memory_kind for r in rows) and not gpu:
        return None
    f = fmt_num
    header = ["backend", "replicas", "layout", "workers", "repeats", "img/s median", "peak memory per rank"]
    if gpu:
        header += ["GPU energy (J)", "energy per image (mJ)", "GPU-hours per epoch", "GPU-hours to target"]
    body = []
    for r in rows:
        res = r.resources
        cells = [*_cell_cells(r), memory_text(res) or NA]
        if gpu:
            cells += [f(res.energy_j, ".1f"), f(res.energy_per_image_j, ".3g", 1e3), f(res.gpu_hours_per_epoch, ".3g"),
                      f(res.gpu_hours_to_target, ".3g")]
        body.append(cells)
    note = ("Peak memory per rank: the largest rank's, median over repeats; GPU = TensorFlow's allocator peak on the "
            "rank's GPU, host RSS = the process's peak resident set (getrusage, at least Linux's VmHWM).")
    if gpu:
        note += (f" Energy: {ENERGY_SCOPE}; n/a where not measured. GPU-hours per epoch = GPUs x mean step time x "
                 "steps per epoch; to target = GPUs x time to target.")
    return header, body, note


def format_best_table(summary: JobSummary) -> str | None:
    """Best vs best (common.report.best) in Markdown: per backend and size the default and the fastest variant,
    then the backend ratio of the fastest beside that of the defaults; None when the job has no variants."""
    tables = best_tables(summary)
    if not tables:
        return None
    lines = [x for header, body in tables for x in (md_table(header, body), "")]
    return "\n".join([*lines, BEST_NOTE])


BEST_NOTE = ("Fastest = the highest median img/s among a backend's variants at that size (its default strategy "
             "only); the maximum of several noisy medians favours a lucky variant, so check its interval in the "
             "scaling table before trusting a small gap.")


def best_tables(summary: JobSummary) -> list[tuple[tuple[str, ...], list[list[str]]]]:
    """The best vs best tables (header, cells): per backend and size, then the ratios; [] without variants."""
    cells = best_rows(summary)
    if not cells:
        return []
    f = fmt_num
    body = [[c.backend, str(c.world_size), f(c.default.throughput.median if c.default else None, ".1f"),
             c.best_name, f(c.best.throughput.median, ".1f"),
             f(c.best.throughput.median / c.default.throughput.median if c.default else None, ".3f")] for c in cells]
    out = [(("backend", "replicas", "default img/s", "fastest variant", "fastest img/s", "fastest / default"),
            body)]
    ratios = [[str(q.world_size), f(q.default_ratio, ".3f"), f(q.best_ratio, ".3f"), q.den_best, q.num_best]
              for q in best_ratios(cells)]
    if ratios:
        out.append((("replicas", f"{RATIO_NUM}/{RATIO_DEN} defaults", f"{RATIO_NUM}/{RATIO_DEN} fastest",
                     f"fastest {RATIO_DEN}", f"fastest {RATIO_NUM}"), ratios))
    return out


def _head(s: JobSummary, h: str) -> list[str]:
    """Title, key job fields, the version-mix line if any, and the two tables."""
    lines = [f"{h} Job `{md_escape(s.name)}` — hash `{s.job_hash}`", ""]
    key = [f"{k} = {fmt_value(s.job[k])}" for k in KEY_JOB_FIELDS if k in s.job]
    if s.job.get("model") == "mlp" and "mlp_hidden" in s.job:
        key.insert(1, f"mlp_hidden = {fmt_value(s.job['mlp_hidden'])}")
    lines += [f"Key job fields: {', '.join(key)}.", "",
              f"{len(s.runs)} runs; backends: {', '.join(s.backends)}.", ""]
    if s.version_mix:
        lines += [f"**Mixed software versions** (compared anyway, --allow-mixed-versions): "
                  f"{md_escape('; '.join(s.version_mix))}.", ""]
    mix = binding_mix(s.records)
    if mix:
        lines += [f"**Mixed CPU binding**: {md_escape(mix)}. Binding alone moved a backend's throughput by 8-43% "
                  "on the CPU machine of docs/multinode.md, \"CPU binding\": compare runs bound alike.", ""]
    base = baselines(s)
    lines += [f"{h}# Scaling", "", format_table(s), "",
              *(["Speedup and efficiency base (absolute): " + "; ".join(md_escape(b) for b in base) + ".", ""]
                if base else []),
              f"{h}# {RATIO_NUM} / {RATIO_DEN} throughput", "", format_ratio_table(s), ""]
    validation = format_validation_table(s)
    if validation:
        lines += [f"{h}# Time to target and validation", "", validation, ""]
    resources = resources_table(s)
    if resources:
        lines += [f"{h}# Memory and energy", "", md_table(resources[0], resources[1]), "", resources[2], ""]
    best = format_best_table(s)
    return lines + ([f"{h}# Best vs best", "", best, ""] if best else [])


def format_section(summary: JobSummary, *, level: int = 2, out_dir: Path | None = None,
                   results_dir: Path | None = None, images: Sequence[Path] = ()) -> str:
    """The full Markdown section for one job: header, key fields, tables, notes, plots and environment."""
    s, h = summary, "#" * level
    lines = _head(s, h)
    if s.notes:
        lines += [f"{h}# Notes", ""] + [f"- {md_escape(n)}" for n in s.notes] + [""]
    if images:
        lines += [f"{h}# Plots", ""]
        lines += [f"![{p.stem}]({p.name})" for p in images] + [""]
    lines += machine_section(s, h)
    lines += environment_section(s, h, results_dir)
    lines += ["<details><summary>Full job definition</summary>", "", "```json",
              json.dumps(s.job, indent=1, sort_keys=True), "```", "", "</details>", ""]
    return "\n".join(lines + run_files(s, results_dir))


def results_line(summaries: Sequence[JobSummary], sources: Sequence[Path]) -> str:
    """What was read: the directories (one set) and how many runs of how many jobs."""
    n_runs = sum(len(s.runs) for s in summaries)
    where = ", ".join(f"`{shorten_paths(str(d))}`" for d in sources)
    return (f"Results: {where}{' (read as one set)' if len(sources) > 1 else ''} — {n_runs} runs of {len(summaries)} "
            "job(s). Runs of different jobs (different job hash) are never compared with each other.")


def format_markdown(summaries: Sequence[JobSummary], *, results_dir: Path | None = None,
                    images: Mapping[str, Sequence[Path]] | None = None, sources: Sequence[Path] = (),
                    after_verdict: Sequence[str] = ()) -> str:
    """The whole report.md: the verdict (then ``after_verdict``: the baseline's section), method, definitions, then
    one section per job."""
    lines = ["# twinbench scaling report", ""]
    sources = list(sources) or ([results_dir] if results_dir is not None else [])
    if sources:
        lines += [results_line(summaries, sources), ""]
    lines += [*verdict_section(summaries), *after_verdict]
    lines += ["## Method", "", *(f"- {m}" for m in METHOD), "", f"Definitions: {DEFINITIONS}.", ""]
    for s in summaries:
        lines.append(format_section(s, results_dir=results_dir, images=(images or {}).get(s.job_hash, ())))
    return "\n".join(lines).rstrip("\n") + "\n"


def verdict_section(summaries: Sequence[JobSummary]) -> list[str]:
    """The report's first section: per job, one verdict line per layout (common.report.verdict)."""
    lines = ["## Verdict", ""]
    for s in summaries:
        vs = job_verdicts(s)
        lines += [f"`{md_escape(s.name)}` (`{s.job_hash}`), {RATIO_NUM} vs {RATIO_DEN}:", ""]
        lines += [f"- {md_escape(v.text)}" for v in vs] or ["- no runs of both backends to compare"]
        lines.append("")
    return lines + [VERDICT_NOTE, ""]


def format_csv(summaries: Sequence[JobSummary]) -> str:
    """report.csv: one row per job x backend x world size; an empty cell means n/a."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)

    def c(x: float | int | None) -> str:
        return "" if x is None else repr(x)

    for s in summaries:
        for r in s.rows:
            i, t, sc, st, v = r.identity, r.throughput, r.scaling, r.steps, r.validation
            iv = t.interval
            rlo, rhi = sc.ratio_ci if sc.ratio_ci else (None, None)
            nodes, per = r.layout_counts
            w.writerow([s.job_hash, s.name, i.label, i.world_size, i.layout, c(nodes), c(per), i.num_workers,
                        t.repeats, c(r.facts.global_batch_size), c(t.median), iv.kind if iv else "",
                        c(iv.low if iv else None), c(iv.high if iv else None), c(min(t.ips)), c(max(t.ips)),
                        c(sc.speedup), c(sc.efficiency), c(sc.ratio), c(rlo), c(rhi),
                        c(st.p50), c(st.p95), c(st.mean), c(st.first_step), c(st.timed_wall),
                        c(r.facts.final_loss), r.input.method or "", c(r.input.fraction), r.input.verdict or "",
                        r.facts.collective or "", i.variant or "", c(v.ttt),
                        f"{v.reached}/{v.targeted}" if v.targeted else "",
                        ";".join(f"{k}={x!r}" for k, x in v.final.items() if x is not None)])
    return buf.getvalue()
