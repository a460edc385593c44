"""common.report.document: the report described once and rendered three ways (report.md, report.html, report.csv).

Fast (no TensorFlow): results JSONs written by hand, as in tests/test_report.py.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from common.core.results import BreakdownRecord
from common.report import document
from common.report.build import ReportOptions, build_report
from common.report.document import Column, number
from common.report.load import load_runs, recompute_job_hash
from common.report.summary import JobSummary, from_runs, summarize
from common.workload.job import Job
from tests.test_report import make_run, put
from tests.test_report_model import GRAD, bench


class Tables(HTMLParser):
    """The header cells of every table of a page, table by table."""

    def __init__(self) -> None:
        super().__init__()
        self.headers: list[list[str]] = []
        self._th = False

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "table":
            self.headers.append([])
        self._th = tag == "th"

    def handle_endtag(self, tag: str) -> None:
        self._th = self._th and tag != "th"

    def handle_data(self, data: str) -> None:
        if self._th:
            self.headers[-1].append(data)


def html_headers(page: str) -> list[list[str]]:
    p = Tables()
    p.feed(page)
    return p.headers


def md_headers(md: str) -> list[list[str]]:
    """The header row of every Markdown table (the line above each |---| rule)."""
    lines = md.splitlines()
    return [[c.strip() for c in lines[i - 1].strip("|").split(" | ")] for i, ln in enumerate(lines)
            if re.fullmatch(r"\|(---\|)+", ln)]


def test_a_column_defined_once_reaches_md_html_and_csv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Adding a figure of the records to the scaling table is one Column in document.COLUMNS, reading each run and
    combining the repeats (``from_runs``: the median by default): the tables and report.csv carry it."""
    d = tmp_path / "r"
    for b, ips in (("native", 100.0), ("horovod", 120.0)):
        for i, ttfs in enumerate((2.0, 2.5, 4.0)):
            put(d, make_run(b, 1, ips + i, ttfs=ttfs))
    extra = Column("startup share", "startup_share", from_runs(lambda run: run.time_to_first_step / 10),
                   number(".1f", 100, "%"), "startup share = time to first step / 10 s")
    monkeypatch.setattr(document, "COLUMNS", (*document.COLUMNS, extra))
    build_report(d, tmp_path / "o", ReportOptions(plots=False))
    md = (tmp_path / "o" / "report.md").read_text()
    scaling_md = next(h for h in md_headers(md) if h[0] == "backend" and "interval" in h)
    assert scaling_md[-1] == "startup share" and "| 25.0% |" in md
    assert "startup share = time to first step / 10 s" in md  # its definition
    page = (tmp_path / "o" / "report.html").read_text()
    assert next(h for h in html_headers(page) if "interval" in h)[-1] == "startup share"
    assert "<td>25.0%</td>" in page
    rows = list(csv.DictReader((tmp_path / "o" / "report.csv").open()))
    assert [float(r["startup_share"]) for r in rows] == [0.25, 0.25]  # the median of 0.2, 0.25, 0.4


def _breakdown(backend: str, n: int, job: dict) -> dict:
    phases = {"input": 0.2e-3, "compute": 1.0e-3, "comm": 1e-3 * (2 if backend == "native" else 1), "apply": 0.1e-3,
              "rest": 0.5e-3}
    return BreakdownRecord(
        backend=backend, world_size=n, num_workers=n, job_hash=recompute_job_hash(job), job=job, steps=100,
        timed_steps=90, warmup_steps=10, phases=phases, wait=0.1e-3, step_time=sum(phases.values()),
        host_step_time=sum(phases.values()) * 1.01, gradient_bytes=8192, run_id=f"bd-{backend}{n}",
        finished_at="2026-01-01T00:00:00").to_dict()


def test_report_html_holds_every_table_report_md_holds(tmp_path: Path) -> None:
    """Scaling, ratio, validation, baseline, allreduce, model and breakdown tables: the same in both files, in the
    same order; the verdict's title line is one line in both."""
    d, old = tmp_path / "new", tmp_path / "old"
    evals = [{"step": 12, "loss": 0.4, "accuracy": 0.9}]
    for b in ("native", "horovod"):
        for n in (1, 2):
            run = make_run(b, n, 100.0 * n, step=(0.010 * n, 0.012 * n), gradient_bytes=GRAD, evaluations=evals)
            put(d, run)
            put(old, {**run, "run_id": run["run_id"] + "-old"})
        put(d, bench(b), name=f"allreduce-{b}.json")
        put(d, _breakdown(b, 2, run["job"]), name=f"breakdown-{b}.json")
    rep = build_report(d, tmp_path / "o", ReportOptions(plots=False, baseline=(old,)))
    md = (tmp_path / "o" / "report.md").read_text()
    page = (tmp_path / "o" / "report.html").read_text()
    tables = md_headers(md)
    assert len(tables) == sum(isinstance(b, document.Table) for b in _flat(rep.blocks))
    firsts = {h[0] for h in tables}
    assert {"backend", "replicas", "job", "bytes"} <= firsts  # scaling/breakdown, ratio/model, baseline, allreduce
    assert any("final val accuracy" in h for h in tables) and any("comm (ms)" in h for h in tables)
    assert html_headers(page) == tables
    title = f"`small` (`{rep.summaries[0].job_hash}`), horovod vs native:"
    assert title in md and "<p><code>small</code> (<code>" in page


def _flat(blocks: list) -> list:
    out = []
    for b in blocks:
        out += _flat(list(b.blocks)) if isinstance(b, document.Box) else [b]
    return out


# -- report.html at a laptop's width ------------------------------------------------------------------------------
WIDTH = 1280  # a laptop window, in CSS pixels
PROBE = """<script>
window.addEventListener('load', () => {
  const out = [...document.querySelectorAll('table')].map(t => [...t.querySelectorAll('th')].map(
    th => [th.textContent, Math.round(th.getBoundingClientRect().right)]));
  const pre = document.createElement('pre'); pre.id = 'probe';
  pre.textContent = JSON.stringify({width: window.innerWidth, tables: out}); document.body.appendChild(pre);
});
</script></body>"""


def wide_results(d: Path) -> None:
    """The widest cells a scaling table gets: long labels, min-max intervals, input-bound rows, a target."""
    wait = {"method": "fetch", "wait_fraction": 0.047, "kept_up": False, "input_bound": "moderately", "threshold": 0.02}
    j = Job(name="a text classifier with a long name", per_replica_batch_size=16, steps=12, target_metric="loss",
            target_value=0.5)
    evals = [{"step": 12, "loss": 0.4, "accuracy": 0.9}]
    for b, tuning in (("native", None), ("horovod", {"variant": "fusion 32 MiB, cycle 10 ms"})):
        for n in (1, 2, 4):
            for i in range(3):
                put(d, make_run(b, n, 12345.6 * n + i, job=j, run_id=f"{b}{n}-{i}", input=wait, evaluations=evals,
                                time_to_target_s=123.4, collective={"requested": "auto", "used": "ring, nccl"},
                                **({"tuning": tuning} if tuning else {})))


def test_the_scaling_table_fits_a_1280_px_window(tmp_path: Path) -> None:
    """Every column of the scaling table is visible in headless Chromium at 1280 px: no header cell ends right of
    the window."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (scripts/setup.sh installs it with TWINBENCH_WITH_SLURM=1)")
        pytest.skip("chromium is not installed")
    wide_results(tmp_path / "r")
    build_report(tmp_path / "r", tmp_path / "o", ReportOptions(plots=False))
    page = (tmp_path / "o" / "report.html").read_text()
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", PROBE))
    flags = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}",
             f"--window-size={WIDTH},900", "--virtual-time-budget=2000"]
    dom = subprocess.run([*flags, "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom.stdout, re.S)
    assert dom.returncode == 0 and found, dom.stderr[-2000:]
    got = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert got["width"] == WIDTH
    scaling = next(t for t in got["tables"] if any(h == "interval" for h, _ in t))
    assert [h for h, _ in scaling] == list(document.scaling_table(_summary(tmp_path / "r")).header)  # all columns
    assert all(right <= WIDTH for _, right in scaling), scaling


def _summary(d: Path) -> JobSummary:
    return summarize(load_runs(d))[0]


def test_throughput_is_named_for_what_a_step_consumes(tmp_path: Path) -> None:
    """images/s for twinbench's (image) datasets, samples/s for the user's own: one unit, the same words in report.md
    and report.html, never "img/s"."""
    for dataset, unit in (("synthetic", "images/s"), ("textpkg.data:tokens", "samples/s")):
        d = tmp_path / dataset
        for b in ("native", "horovod"):
            run = make_run(b, 1, 100.0)
            run["job"]["dataset"] = dataset
            put(d, run)
        rep = build_report(d, tmp_path / f"o-{dataset}", ReportOptions(plots=False), warn=lambda m: None)
        assert rep.summaries[0].unit == unit
        md = (tmp_path / f"o-{dataset}" / "report.md").read_text()
        page = (tmp_path / f"o-{dataset}" / "report.html").read_text()
        other = ({"images/s", "samples/s"} - {unit}).pop()
        assert f"| {unit} median |" in md and f"<th>{unit} median</th>" in page
        for text in (md, page):
            assert other not in text and "img/s" not in text and "Img/s" not in text


def test_per_row_tables_share_the_scaling_tables_cells() -> None:
    """Issue 47.4: the first six cells of the validation and memory tables, and the time to target, are the scaling
    table's own columns (one definition, one format), not cells built again beside them."""
    from dataclasses import replace as copy

    from common.cluster import machine

    job = copy(Job(name="small", per_replica_batch_size=16, steps=12), target_metric="loss", target_value=0.6)
    block = machine.combine([{"host": "n0", "cpu": {"model": "C"}, "gpu": dict(machine.NO_GPU),
                              "memory": {"peak_rss_bytes": 2**29, "peak_gpu_bytes": None}}])
    runs = [make_run(b, ws, 100.0 * ws + i, job=job, time_to_target_s=10.0 + i, machine=block, run_id=f"{b}{ws}{i}",
                     evaluations=[{"step": 12, "loss": 0.5}]) for b in ("native", "horovod") for ws in (1, 2)
            for i in range(3)]
    (s,) = summarize(runs)
    scaling = document.scaling_table(s)
    col = {h: [row[i] for row in scaling.body] for i, h in enumerate(scaling.header)}
    assert all(c in document.COLUMNS for c in (*document.CELLS, document.TTT))
    for part in (document.validation_part(s), document.resources_part(s)):
        t = next(b for b in part if isinstance(b, document.Table))
        assert t.header[:6] == document.CELL_HEADER
        for i, h in enumerate(t.header[:7]):
            if h in col:
                assert [row[i] for row in t.body] == col[h], h
    assert col["time to target (s)"] == ["11.00"] * 4


def test_html_cells_of_words_read_from_the_left_and_figures_align_right() -> None:
    from common.report.render import html_table

    row = ["same math", "yes: 2 pairs agree to 1e-05, bit for bit", "6949.6 [6480.4, 7363.9] min-max (n=4)"]
    page = html_table(["question", "answer", "images/s"], [row])
    assert '<td class="prose">yes: 2 pairs agree to 1e-05, bit for bit</td>' in page
    assert "<td>6949.6 [6480.4, 7363.9] min-max (n=4)</td>" in page
