"""report.html: one self-contained page (no external requests: plots embedded as PNG data URIs, styles inline),
rendered from the same summaries and tables as report.md (render.scaling_table, ratio_table, best_tables), every
text escaped with html.escape."""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from pathlib import Path

from common.report.baseline import Baseline, baseline_table
from common.report.machines import format_machines, subtitle
from common.report.model import ModelSection
from common.report.render import (
    BEST_NOTE,
    DEFINITIONS,
    KEY_JOB_FIELDS,
    METHOD,
    baselines,
    best_tables,
    ratio_table,
    resources_table,
    results_line,
    scaling_table,
    validation_table,
)
from common.report.rows import RATIO_DEN, RATIO_NUM, JobSummary, row_label
from common.report.verdict import VERDICT_NOTE, job_verdicts
from common.report.versions import versions_by_key

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em auto; max-width: 1400px;
       padding: 0 1em; color: #1a1a1a; line-height: 1.4; }
h1 { font-size: 1.6em; } h2 { font-size: 1.3em; border-bottom: 1px solid #ccc; margin-top: 2em; }
h3 { font-size: 1.1em; margin-top: 1.4em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.6em 0; display: block; overflow-x: auto; }
th, td { border: 1px solid #bbb; padding: 0.25em 0.5em; text-align: right; white-space: nowrap; }
th { background: #eef2f7; } td:first-child, th:first-child { text-align: left; }
tr:nth-child(even) td { background: #fafafa; }
.plots img { max-width: 100%; width: 620px; margin: 0.3em; border: 1px solid #ddd; }
.model { background: #fff8e6; border-left: 4px solid #e0a800; padding: 0.2em 1em; }
code { background: #f3f3f3; padding: 0 0.2em; } .muted { color: #555; font-size: 0.9em; }
.verdict { background: #eef6ee; border-left: 4px solid #2e7d32; padding: 0.2em 1em; }
.verdict li { margin: 0.3em 0; }
"""


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """An HTML table, every cell escaped."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    rows = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in body)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def data_uri(png: Path) -> str:
    """The PNG as a data: URI (the page needs no file beside it)."""
    return "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode("ascii")


def img(png: Path) -> str:
    return f'<img src="{data_uri(png)}" alt="{esc(png.stem)}">'


def _job(s: JobSummary, images: Sequence[Path]) -> list[str]:
    """One job's section: key fields, hardware, tables, baselines, notes, plots, machine."""
    key = ", ".join(f"{k} = {s.job[k]}" for k in KEY_JOB_FIELDS if k in s.job)
    hw = subtitle(s.records)
    out = [f"<h2>Job {esc(s.name)} <code>{esc(s.job_hash)}</code></h2>",
           f"<p>Key job fields: {esc(key)}.</p>",
           f"<p>{len(s.runs)} runs; backends: {esc(', '.join(s.backends))}"
           + (f"; hardware: {esc(hw)}" if hw else "") + ".</p>"]
    if s.version_mix:
        out.append(f"<p><strong>Mixed software versions</strong>: {esc('; '.join(s.version_mix))}.</p>")
    out += ["<h3>Scaling (measured)</h3>", table(*scaling_table(s))]
    base = baselines(s)
    if base:
        out.append("<p>Speedup and efficiency base (absolute): " + esc("; ".join(base)) + ".</p>")
    out += [f"<h3>{esc(RATIO_NUM)} / {esc(RATIO_DEN)} throughput</h3>", table(*ratio_table(s))]
    validation = validation_table(s)
    if validation:
        header, body, note = validation
        out += ["<h3>Time to target and validation</h3>", table(header, body), f"<p class='muted'>{esc(note)}</p>"]
    resources = resources_table(s)
    if resources:
        header, body, note = resources
        out += ["<h3>Memory and energy</h3>", table(header, body), f"<p class='muted'>{esc(note)}</p>"]
    best = best_tables(s)
    if best:
        out += ["<h3>Best vs best</h3>", *(table(h, b) for h, b in best), f"<p class='muted'>{esc(BEST_NOTE)}</p>"]
    if images:
        out += ["<h3>Plots (measured)</h3>", "<div class='plots'>", *(img(p) for p in images), "</div>"]
    if s.notes:
        out += ["<h3>Notes</h3>", "<ul>", *(f"<li>{esc(n)}</li>" for n in s.notes), "</ul>"]
    runs = sorted(s.records, key=lambda r: (row_label(r), r.world_size))
    versions = "; ".join(f"{k} {', '.join(sorted(v))}" for k, v in versions_by_key(s.records).items())
    out += ["<h3>Machine</h3>", "<ul>",
            *(f"<li>{esc(line.removeprefix('- '))}</li>" for line in format_machines(runs, row_label)),
            f"<li>software: {esc(versions or 'n/a')}</li>", "</ul>"]
    return out


def _model(m: ModelSection) -> list[str]:
    out = [f"<div class='model'><h2>{esc(m.title.replace('`', ''))}</h2>"]
    for b in m.blocks:
        if b[0] == "h":
            out.append(f"<h3>{esc(b[1])}</h3>")
        elif b[0] == "p":
            out.append(f"<p>{esc(b[1])}</p>")
        else:
            out.append(table(b[1], b[2]))
    return out + ["</div>"]


def verdict_html(summaries: Sequence[JobSummary]) -> list[str]:
    """The page's first section: per job, one verdict line per layout."""
    out = ["<div class='verdict'><h2>Verdict</h2>"]
    for s in summaries:
        lines = [v.text for v in job_verdicts(s)] or ["no runs of both backends to compare"]
        out += [f"<p>{esc(s.name)} <code>{esc(s.job_hash)}</code>, {esc(RATIO_NUM)} vs {esc(RATIO_DEN)}:</p>",
                "<ul>", *(f"<li>{esc(t)}</li>" for t in lines), "</ul>"]
    return out + [f"<p class='muted'>{esc(VERDICT_NOTE)}</p></div>"]


def baseline_html(b: Baseline, old_sources: Sequence[str]) -> list[str]:
    """The section against the baseline (``--baseline``), after the verdict."""
    *notes, last = b.lines()
    return ["<h2>Against the baseline</h2>",
            f"<p>NEW = this report's results; OLD = {esc(', '.join(old_sources))}.</p>",
            table(*baseline_table(b.changes)), *(f"<p class='muted'>{esc(x)}</p>" for x in notes),
            f"<p><strong>{esc(last)}</strong></p>"]


def format_html(summaries: Sequence[JobSummary], *, sources: Sequence[Path] = (),
                images: Mapping[str, Sequence[Path]] | None = None, models: Sequence[ModelSection] = (),
                other_images: Sequence[Path] = (), baseline: Baseline | None = None,
                baseline_sources: Sequence[str] = ()) -> str:
    """The whole report.html."""
    parts = ["<!DOCTYPE html>", "<html lang='en'><head><meta charset='utf-8'>",
             "<meta name='viewport' content='width=device-width, initial-scale=1'>",
             "<title>twinbench scaling report</title>", f"<style>{STYLE}</style></head><body>",
             "<h1>twinbench scaling report</h1>"]
    if sources:
        parts.append(f"<p>{esc(results_line(summaries, sources).replace('`', ''))}</p>")
    parts += verdict_html(summaries)
    if baseline is not None:
        parts += baseline_html(baseline, baseline_sources)
    parts += ["<h2>Method</h2>", "<ul>", *(f"<li>{esc(m)}</li>" for m in METHOD), "</ul>",
              f"<p class='muted'>Definitions: {esc(DEFINITIONS)}.</p>"]
    for s in summaries:
        parts += _job(s, (images or {}).get(s.job_hash, ()))
    if other_images:
        parts += ["<h2>Allreduce microbenchmark and diagnostics</h2>", "<div class='plots'>",
                  *(img(p) for p in other_images), "</div>"]
    for m in models:
        parts += _model(m)
    return "\n".join([*parts, "</body></html>", ""])
