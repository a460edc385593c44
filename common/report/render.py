"""The report's blocks (common.report.document) written three ways: report.md (Markdown), report.html (one
self-contained page: plots embedded as PNG data URIs, styles inline, every text escaped with html.escape) and
report.csv (the scaling table's rows, ``document.COLUMNS``' csv names)."""

from __future__ import annotations

import base64
import csv
import html
import io
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common.report import document as doc
from common.report.base import md_escape, md_unescape
from common.report.rows import JobSummary


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
th { background: #eef2f7; } td:first-child, th:first-child { text-align: left; }
tr:nth-child(even) td { background: #fafafa; }
.plots img { max-width: 100%; width: 620px; margin: 0.3em; border: 1px solid #ddd; }
.model { background: #fff8e6; border-left: 4px solid #e0a800; padding: 0.2em 1em; }
code { background: #f3f3f3; padding: 0 0.2em; } .muted { color: #555; font-size: 0.9em; }
.verdict { background: #eef6ee; border-left: 4px solid #2e7d32; padding: 0.2em 1em; }
.verdict li { margin: 0.3em 0; }
pre { background: #f3f3f3; padding: 0.5em; overflow-x: auto; }
"""
_INLINE = re.compile(r"`([^`]*)`|\*\*(.+?)\*\*")  # a code span or bold text


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
    rows = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in body)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


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
    w.writerow(doc.csv_header(columns))
    for s in summaries:
        for r in s.rows:
            w.writerow([_csv_cell(x) for x in doc.csv_values(s, r, columns)])
    return buf.getvalue()


# -- one job's tables as Markdown (the command line prints them) -------------------------------------------------
def format_table(summary: JobSummary) -> str:
    """The job's scaling table in Markdown."""
    return _md_block(doc.with_unit(doc.scaling_table(summary), summary.unit))


def format_ratio_table(summary: JobSummary) -> str:
    """registry.RATIO median throughput per world size in Markdown."""
    return _md_block(doc.with_unit(doc.ratio_table(summary), summary.unit))


def format_section(summary: JobSummary, results_dir: Path | None = None) -> str:
    """One job's whole section in Markdown."""
    return markdown([doc.with_unit(b, summary.unit) for b in doc.job_section(summary, results_dir=results_dir)])
