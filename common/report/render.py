"""The report's blocks (common.report.document) written three ways: report.md (Markdown), report.html (one
self-contained page: plots embedded as PNG data URIs, styles inline, every text escaped with html.escape) and
report.csv (the scaling table's rows, ``document.COLUMNS``' csv names); and its PNG plots (throughput, efficiency,
allreduce bus bandwidth, breakdown), drawn with matplotlib's Agg canvas (no pyplot, so no global backend is changed;
matplotlib is imported only when a plot is drawn)."""

from __future__ import annotations

import base64
import csv
import html
import io
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from common.core import registry
from common.core.results import AllreduceRecord
from common.report import document as doc
from common.report.base import NA, md_escape, md_unescape
from common.report.machines import subtitle
from common.report.stats import num
from common.report.summary import JobSummary, Row


# -- Markdown ----------------------------------------------------------------------------------------------------
def md_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """A Markdown table (cells escaped)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def _md_block(b: doc.Block) -> str:
    if isinstance(b, doc.Heading):
        return f"{'#' * b.level} {b.text}"
    if isinstance(b, doc.Para):
        return b.text
    if isinstance(b, doc.Bullets):
        return "\n".join(f"- {i}" for i in b.items)
    if isinstance(b, doc.Table):
        return md_table(b.header, b.body)
    if isinstance(b, doc.Images):
        return "\n".join(f"![{alt}]({name})" for alt, name in b.files)
    if isinstance(b, doc.Code):
        return f"```{b.lang}\n{b.text}\n```"
    inner = markdown_body(b.blocks)
    return f"<details><summary>{b.summary}</summary>\n\n{inner}\n\n</details>" if b.kind == "details" else inner


def markdown_body(blocks: Sequence[doc.Block]) -> str:
    return "\n\n".join(_md_block(b) for b in blocks)


def markdown(blocks: Sequence[doc.Block]) -> str:
    """report.md: the blocks, a blank line between them."""
    return markdown_body(blocks) + "\n"


# -- HTML --------------------------------------------------------------------------------------------------------
STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em auto; max-width: 1400px;
       padding: 0 1em; color: #1a1a1a; line-height: 1.4; }
h1 { font-size: 1.6em; } h2 { font-size: 1.3em; border-bottom: 1px solid #ccc; margin-top: 2em; }
h3 { font-size: 1.1em; margin-top: 1.4em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.6em 0; display: block; overflow-x: auto; }
th, td { border: 1px solid #bbb; padding: 0.25em 0.4em; text-align: right; vertical-align: top; }
th { background: #eef2f7; } td:first-child, th:first-child, td.prose { text-align: left; }
tr:nth-child(even) td { background: #fafafa; }
.plots img { max-width: 100%; width: 620px; margin: 0.3em; border: 1px solid #ddd; }
.model { background: #fff8e6; border-left: 4px solid #e0a800; padding: 0.2em 1em; }
code { background: #f3f3f3; padding: 0 0.2em; } .muted { color: #555; font-size: 0.9em; }
.verdict { background: #eef6ee; border-left: 4px solid #2e7d32; padding: 0.2em 1em; }
.verdict li { margin: 0.3em 0; }
pre { background: #f3f3f3; padding: 0.5em; overflow-x: auto; }
"""
_INLINE = re.compile(r"`([^`]*)`|\*\*(.+?)\*\*")  # a code span or bold text
# Figures align right so their digits line up; a cell of several words (an answer, a cause) reads from the left.
_PROSE = re.compile(r"[A-Za-z]{3,}[^|]* [A-Za-z]{3,}[^|]* [A-Za-z]{3,}")


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def inline(text: str) -> str:
    """The blocks' inline Markdown as HTML: code spans, bold, the rest escaped."""
    out, at = [], 0
    for m in _INLINE.finditer(text):
        out.append(esc(md_unescape(text[at:m.start()])))
        code, bold = m.group(1), m.group(2)
        out.append(f"<code>{esc(md_unescape(code))}</code>" if code is not None else f"<strong>{inline(bold)}</strong>")
        at = m.end()
    return "".join(out) + esc(md_unescape(text[at:]))


def html_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """An HTML table, every cell escaped."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    rows = "".join("<tr>" + "".join(f"<td{_td_class(c)}>{esc(c)}</td>" for c in row) + "</tr>" for row in body)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def _td_class(cell: object) -> str:
    """' class="prose"' for a cell of three words or more (left-aligned), '' for a figure."""
    return ' class="prose"' if _PROSE.search(str(cell)) else ""


def data_uri(png: Path) -> str:
    """The PNG as a data: URI (the page needs no file beside it)."""
    return "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode("ascii")


def _html_block(b: doc.Block, images: Path | None) -> str:
    if isinstance(b, doc.Heading):
        return f"<h{b.level}>{inline(b.text)}</h{b.level}>"
    if isinstance(b, doc.Para):
        return f"<p class='muted'>{inline(b.text)}</p>" if b.note else f"<p>{inline(b.text)}</p>"
    if isinstance(b, doc.Bullets):
        return "<ul>" + "".join(f"<li>{inline(i)}</li>" for i in b.items) + "</ul>"
    if isinstance(b, doc.Table):
        return html_table(b.header, b.body)
    if isinstance(b, doc.Images):
        imgs = [f'<img src="{data_uri(images / name)}" alt="{esc(alt)}">' for alt, name in b.files
                if images is not None and (images / name).is_file()]
        return "<div class='plots'>" + "".join(imgs) + "</div>"
    if isinstance(b, doc.Code):
        return f"<pre><code>{esc(b.text)}</code></pre>"
    inner = "\n".join(_html_block(x, images) for x in b.blocks)
    if b.kind == "details":
        return f"<details><summary>{inline(b.summary)}</summary>\n{inner}\n</details>"
    return f"<div class='{esc(b.kind)}'>\n{inner}\n</div>"


def page(blocks: Sequence[doc.Block], images: Path | None = None) -> str:
    """report.html: the blocks as one page; ``images``: the directory holding the PNGs the blocks name."""
    parts = ["<!DOCTYPE html>", "<html lang='en'><head><meta charset='utf-8'>",
             "<meta name='viewport' content='width=device-width, initial-scale=1'>",
             "<title>twinbench scaling report</title>", f"<style>{STYLE}</style></head><body>"]
    return "\n".join([*parts, *(_html_block(b, images) for b in blocks), "</body></html>", ""])


# -- CSV ---------------------------------------------------------------------------------------------------------
def _csv_cell(x: Any) -> str:
    return "" if x is None else x if isinstance(x, str) else repr(x)


def format_csv(summaries: Sequence[JobSummary], columns: Sequence[doc.Column] | None = None) -> str:
    """report.csv: one row per job x scaling-table row; an empty cell means n/a."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(doc.csv_header(columns, summaries[0].pairs[0]) if summaries else doc.csv_header(columns))
    for s in summaries:
        for r in s.rows:
            w.writerow([_csv_cell(x) for x in doc.csv_values(s, r, columns)])
    return buf.getvalue()


def _tables(blocks: Sequence[doc.Block]) -> list[doc.Table]:
    """Every table among the blocks, boxes opened, in order."""
    out: list[doc.Table] = []
    for b in blocks:
        out += [b] if isinstance(b, doc.Table) else _tables(b.blocks) if isinstance(b, doc.Box) else []
    return out


def tables_csv(blocks: Sequence[doc.Block], name: str) -> str:
    """The CSV file ``name``: the rows of every table written to it (``Table.csv``), each after its ``key`` (the
    job's hash and name), under the first such table's header; "" when no table is."""
    tables = [t for t in _tables(blocks) if t.csv == name]
    if not tables:
        return ""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([*doc.JOB_CSV, *tables[0].header])
    for t in tables:
        w.writerows([*t.key, *row] for row in t.body)
    return buf.getvalue()


# -- one job's tables as Markdown (the command line prints them) -------------------------------------------------
def format_table(summary: JobSummary) -> str:
    """The job's scaling table in Markdown."""
    return _md_block(doc.with_unit(doc.scaling_table(summary), summary.unit))


def format_ratio_table(summary: JobSummary) -> str:
    """Each compared pair's median throughput ratio per world size in Markdown, one table a pair."""
    return "\n\n".join(_md_block(doc.with_unit(doc.ratio_table(summary, pair), summary.unit))
                       for pair in summary.pairs)


def format_section(summary: JobSummary, results_dir: Path | None = None) -> str:
    """One job's whole section in Markdown."""
    return markdown([doc.with_unit(b, summary.unit) for b in doc.job_section(summary, results_dir=results_dir)])


# -- the plots -----------------------------------------------------------------------------------------------------
def backend_color(name: str, index: int) -> str:
    """The registry's colour of a backend; a backend the registry does not know takes matplotlib's colour cycle
    (``index``: its position among the backends drawn, offset past the cycle colours of the registry's)."""
    if name in registry.names():
        return registry.entry(name).color
    return f"C{index + len(registry.names())}"


Style = tuple[str, str, str]  # colour, line style, marker of one row label's line
SERIES_STYLES = (("-", "o"), ("-.", "s"), (":", "^"), ("-", "D"))  # a backend's machines (row labels), in turn


def line_styles(s: JobSummary) -> dict[str, Style]:
    """Each row label's line: its backend's colour, and for a backend whose rows name several machines a line
    style and marker per machine (dashes stay for the ideal lines)."""
    plains = list(dict.fromkeys(r.identity.plain for r in s.rows))
    drawn: dict[str, int] = {}  # backend label -> its row labels styled so far
    out: dict[str, Style] = {}
    for b in s.backends:
        plain = next(r.identity.plain for r in s.rows if r.identity.label == b)
        line, marker = SERIES_STYLES[drawn.get(plain, 0) % len(SERIES_STYLES)]
        drawn[plain] = drawn.get(plain, 0) + 1
        out[b] = (backend_color(plain, plains.index(plain)), line, marker)
    return out


def primary_rows(rows: Sequence[Row]) -> list[Row]:
    """The rows a backend's line joins: per world size the one on the fewest nodes (the others, other layouts at
    that size, are drawn as separate hollow points labelled with their layout)."""
    best: dict[int, Row] = {}
    for r in rows:
        n, ws = r.layout_counts[0], r.identity.world_size
        if ws not in best or (n is not None and (best[ws].layout_counts[0] or 1 << 30) > n):
            best[ws] = r
    return [best[w] for w in sorted(best)]


def _new_figure() -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.4), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _png_bytes(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _setup_x(ax: Any, sizes: Sequence[int]) -> None:
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    if sizes and max(sizes) / min(sizes) >= 8:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(sorted(sizes))
    ax.set_xlabel("replicas (world size)")
    ax.grid(True, alpha=0.3)


def _throughput(s: JobSummary, styles: Mapping[str, Style], sizes: Sequence[int], title: str) -> bytes:
    fig = _new_figure()
    ax = fig.add_subplot()
    for b in s.backends:
        rows = [r for r in s.rows if r.identity.label == b]
        xs = [r.identity.world_size for r in rows]
        color, line, marker = styles[b]
        main = primary_rows(rows)
        ax.plot([r.identity.world_size for r in main], [r.throughput.median for r in main], marker=marker,
                linestyle=line, color=color, label=f"{b} (median)")
        for r in rows:
            ws, ips, iv = r.identity.world_size, r.throughput.median, r.throughput.interval
            if r not in main:  # another layout at a size already drawn: a point of its own, hollow
                ax.plot([ws], [ips], marker=marker, linestyle="none", color=color, markerfacecolor="white")
            if sum(x == ws for x in xs) > 1:  # several layouts at this size: name each
                ax.annotate(r.identity.layout, (ws, ips), textcoords="offset points", xytext=(5, -10), fontsize=7,
                            color=color)
            if iv is not None:
                ax.vlines(ws, iv.low, iv.high, color=color, alpha=0.6, linewidth=3)
        base = next((r for r in rows if r.identity.world_size == 1), None)
        if base is not None:
            xi = sorted({1, *xs})
            ax.plot(xi, [base.throughput.median * x for x in xi], "--", color=color, alpha=0.7,
                    label=f"{b} ideal (linear from 1 replica)")
    _setup_x(ax, sizes)
    ax.set_ylim(bottom=0)
    ax.set_ylabel(f"{s.unit} (bars: 95% CI of median, or min-max)")
    ax.set_title(f"throughput — {title}", fontsize=9)
    ax.legend(fontsize=8)
    return _png_bytes(fig)


def _eff(r: Row) -> float:
    """The efficiency of a row that has one."""
    assert r.scaling.efficiency is not None
    return r.scaling.efficiency


def _efficiency(s: JobSummary, styles: Mapping[str, Style], sizes: Sequence[int], title: str) -> bytes:
    fig = _new_figure()
    ax = fig.add_subplot()
    drawn = False
    for b in s.backends:
        rows = [r for r in s.rows if r.identity.label == b and r.scaling.efficiency is not None]
        main = primary_rows(rows)
        if rows:
            color, line, marker = styles[b]
            ax.plot([r.identity.world_size for r in main], [100 * _eff(r) for r in main], marker=marker,
                    linestyle=line, color=color, label=b)
            for r in rows:
                if r not in main:
                    ax.plot([r.identity.world_size], [100 * _eff(r)], marker=marker, linestyle="none", color=color,
                            markerfacecolor="white")
                    ax.annotate(r.identity.layout, (r.identity.world_size, 100 * _eff(r)),
                                textcoords="offset points", xytext=(5, -10), fontsize=7, color=color)
            drawn = True
    ax.axhline(100, linestyle="--", color="gray", label="ideal (100%)")
    if not drawn:
        ax.set_xlim(min(sizes) / 1.5, max(sizes) * 1.5)
        ax.text(0.5, 0.5, f"no 1-replica baseline: efficiency {NA}", transform=ax.transAxes, ha="center")
    _setup_x(ax, sizes)
    ax.set_ylim(0, max([110.0] + [100 * _eff(r) * 1.05 for r in s.rows if r.scaling.efficiency is not None]))
    ax.set_ylabel("scaling efficiency (%)")
    ax.set_title(f"efficiency — {title}", fontsize=9)
    ax.legend(fontsize=8)
    return _png_bytes(fig)


def plot_job(summary: JobSummary) -> dict[str, bytes]:
    """PNG bytes of the throughput and efficiency plots, keyed by file name (named with the job hash)."""
    s = summary
    sizes = sorted({r.identity.world_size for r in s.rows})
    styles = line_styles(s)
    machine = subtitle(s.records)  # the GPU (or CPU) model and the nodes, under the job's name
    title = f"{s.name} ({s.job_hash})" + (f"\n{machine}" if machine else "")
    return {f"throughput_{s.job_hash}.png": _throughput(s, styles, sizes, title),
            f"efficiency_{s.job_hash}.png": _efficiency(s, styles, sizes, title)}


def plot_allreduce(benches: Sequence[AllreduceRecord]) -> dict[str, bytes]:
    """PNG bytes of the allreduce bus bandwidth per message size, one line per benchmark."""
    fig = _new_figure()
    ax = fig.add_subplot()
    for i, b in enumerate(benches):
        rows = [r for r in b.rows if num(r.get("busbw_GBps")) is not None]
        ax.plot([r["bytes"] for r in rows], [r["busbw_GBps"] for r in rows], "o-",
                color=backend_color(b.backend, i), label=f"{b.backend}, {b.world_size} ranks")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title("allreduce bus bandwidth (float32 sum)", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return {"allreduce_busbw.png": _png_bytes(fig)}


PHASE_COLORS = {"input": "tab:green", "compute": "tab:blue", "comm": "tab:red", "apply": "tab:purple",
                "rest": "tab:gray"}  # one colour per phase, whatever the backend


def plot_breakdown(title: str, bars: Sequence[tuple[str, Mapping[str, float], float | None]]) -> bytes:
    """PNG bytes of a stacked bar per (label, phases in seconds, benchmark step in seconds or None): the phases
    in step order, bottom to top, in ms; the normal benchmark's mean step as a dashed tick where one exists."""
    from common.core.results import BREAKDOWN_PHASES

    fig = _new_figure()
    ax = fig.add_subplot()
    xs = list(range(len(bars)))
    bottoms = [0.0] * len(bars)
    for p in BREAKDOWN_PHASES:
        heights = [1e3 * phases[p] for _, phases, _ in bars]
        ax.bar(xs, heights, bottom=bottoms, width=0.6, color=PHASE_COLORS.get(p, "black"), label=p)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ticked = False
    for x, (_, _, bench) in zip(xs, bars):
        if bench is not None:
            ax.hlines(1e3 * bench, x - 0.38, x + 0.38, colors="black", linestyles="--",
                      label=None if ticked else "benchmark step (normal run, mean)")
            ticked = True
    ax.set_xticks(xs)
    ax.set_xticklabels([label for label, _, _ in bars], fontsize=8)
    top = max(bottoms + [1e3 * b for _, _, b in bars if b is not None] + [1e-3])
    ax.set_ylim(0, top * 1.35)  # head room for the legend above the bars
    ax.set_ylabel("ms per step (mean over timed steps and ranks)")
    ax.set_title(f"step breakdown, DIAGNOSTIC (phases serialized) — {title}", fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, ncol=3, loc="upper center")
    return _png_bytes(fig)
