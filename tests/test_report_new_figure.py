"""A new measured figure added to the report the way docs/architecture.md ("Adding a measured figure to the report")
says: the record holds it (a ``RunRecord`` field with a default), one ``Column`` line shows it; the tables of
report.md and report.html and report.csv then carry its median over repeats, row by row.

The figure is the recipe's example, the busiest rank's process CPU time (``cpu_time_s``). Nothing of the product is
edited: the field is a subclass of ``RunRecord`` (``WithCpu``) and the Column is added to ``document.COLUMNS`` by
monkeypatch. Fast: no TensorFlow, no processes; results JSONs written into tmp_path, the report built by
``build_report`` (load, summarise, render md, html and csv).
"""

from __future__ import annotations

import csv
import html
import statistics
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from common.cluster import machine
from common.core import results
from common.core.results import RunRecord, write_record
from common.report import document, load
from common.report.build import ReportOptions, build_report
from common.report.document import Column, number
from common.report.stats import num
from common.report.summary import from_runs
from tests.test_report import make_run, put


@dataclass(frozen=True, kw_only=True)
class WithCpu(RunRecord):
    """RunRecord after the recipe's edit (b): one optional field. Its default is what a file written before the
    field reads as, so no schema step."""

    cpu_time_s: float | None = None  # the busiest rank's process CPU time (user + system, every thread), s


HEADER = "CPU (s)"
DEFINITION = "CPU (s) = the busiest rank's process CPU time (user + system), median over repeats"
# the recipe's edit (c): one Column line
CPU = Column(HEADER, "cpu_time_s", from_runs(lambda run: num(run.cpu_time_s)), number(".2f"), DEFINITION)

# Four repeats per cell: the median (the mean of the middle two) is no single repeat's value, nor the mean, the
# first, the last, the minimum or the maximum, so a wrong combine cannot give it.
CPU_S = {("native", 1): [12.0, 3.0, 40.0, 5.0], ("native", 2): [21.0, 26.0, 60.0, 14.0],
         ("horovod", 1): [11.0, 2.0, 30.0, 6.0], ("horovod", 2): [19.0, 25.0, 70.0, 12.0]}
MEDIAN = {cell: statistics.median(v) for cell, v in CPU_S.items()}  # 8.5, 23.5, 8.5, 22.0
# a machine block with a peak RSS, so that the report has a per-row table (Memory and energy) besides the scaling one
MACHINE = machine.combine([{"host": "n0", "cpu": {"model": "C"}, "gpu": dict(machine.NO_GPU),
                            "memory": {"peak_rss_bytes": 2**29, "peak_gpu_bytes": None}}])


def run(backend: str, ws: int, ips: float, run_id: str) -> dict[str, Any]:
    return make_run(backend, ws, ips, run_id=run_id, machine=MACHINE)


def results_dir(d: Path) -> Path:
    """The runs: every cell's four repeats written by a writer with the field (WithCpu, through the chief's own
    ``write_record``); beside them files of writers before it, which lack the key: a fifth repeat of horovod x 2
    (schema 2, upgraded on reading) and native x 4 (two schema-3 repeats), which holds no value at all."""
    for (backend, ws), values in CPU_S.items():
        for i, cpu in enumerate(values):
            rec = RunRecord.from_dict(run(backend, ws, 100.0 * ws + i, f"{backend}{ws}-{i}"))
            write_record(d, WithCpu(**{**rec.to_dict(), "cpu_time_s": cpu}))
    put(d, run("horovod", 2, 205.0, "horovod2-old"))
    for i in range(2):
        write_record(d, RunRecord.from_dict(run("native", 4, 400.0 + i, f"native4-{i}")))
    return d


@pytest.fixture
def with_field(monkeypatch: pytest.MonkeyPatch) -> None:
    """The report reads records as WithCpu. In the product edit (b) is the field line alone: ``results.FIELDS`` and
    ``_FIELD_NAMES``, which ``RunRecord.from_dict`` keeps a file's keys by, are derived from RunRecord's fields on
    import; a subclass needs its field added to that set by hand."""
    monkeypatch.setattr(results, "_FIELD_NAMES", results._FIELD_NAMES | {"cpu_time_s"})
    monkeypatch.setattr(load, "RunRecord", WithCpu)  # load.read_run: the report's one reading of a results file


class Tables(HTMLParser):
    """Every table of a page as rows of cell texts (header row first)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[Any]) -> None:
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("th", "td"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("th", "td") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def html_tables(page: str) -> list[list[list[str]]]:
    p = Tables()
    p.feed(page)
    return p.tables


def md_tables(md: str) -> list[list[list[str]]]:
    """Every Markdown table as rows of cells (header row first, the |---| rule left out)."""
    out: list[list[list[str]]] = []
    inside = False
    for line in md.splitlines():
        if line.startswith("|---"):
            continue
        if not line.startswith("| "):
            inside = False
            continue
        if not inside:
            out.append([])
            inside = True
        out[-1].append([c.strip() for c in line.strip().strip("|").split(" | ")])
    return out


def scaling(tables: list[list[list[str]]]) -> dict[tuple[str, int], dict[str, str]]:
    """The scaling table's rows as {(backend, replicas): {header: cell}}."""
    (head, *body), = [t for t in tables if t[0][:2] == ["backend", "replicas"] and "interval" in t[0]]
    return {(r[0], int(r[1])): dict(zip(head, r)) for r in body}


def report(d: Path, out: Path) -> tuple[str, str, dict[tuple[str, int], dict[str, str]]]:
    """report.md, report.html and report.csv's rows by (backend, world size) of the results in ``d``."""
    build_report(d, out, ReportOptions(plots=False), warn=lambda m: None)
    with (out / "report.csv").open() as f:
        rows = {(r["backend"], int(r["world_size"])): r for r in csv.DictReader(f)}
    return (out / "report.md").read_text(), (out / "report.html").read_text(), rows


def test_a_record_field_and_one_column_put_the_median_in_md_html_and_csv(
        tmp_path: Path, with_field: None, monkeypatch: pytest.MonkeyPatch) -> None:
    d = results_dir(tmp_path / "r")
    runs = load.load_runs(d)
    assert all(isinstance(r.record, WithCpu) for r in runs)  # the loaded records hold the field ...
    held = sorted(r.record.cpu_time_s for r in runs if r.record.cpu_time_s is not None)
    assert held == sorted(x for v in CPU_S.values() for x in v)  # ... with every repeat's value, older files None

    md, page, csv_rows = report(d, tmp_path / "without")  # the record holds it, no Column shows it
    assert HEADER not in md and HEADER not in page and "cpu_time_s" not in next(iter(csv_rows.values()))

    monkeypatch.setattr(document, "COLUMNS", (*document.COLUMNS, CPU))
    md, page, csv_rows = report(d, tmp_path / "with")
    md_rows, html_rows = scaling(md_tables(md)), scaling(html_tables(page))
    assert list(md_rows) == list(html_rows) == [("native", 1), ("native", 2), ("native", 4), ("horovod", 1),
                                                ("horovod", 2)]
    for cell, m in MEDIAN.items():
        assert md_rows[cell][HEADER] == html_rows[cell][HEADER] == f"{m:.2f}", cell
        assert float(csv_rows[cell]["cpu_time_s"]) == m, cell
    assert html_rows[("horovod", 2)]["repeats"] == "5"  # the older fifth repeat is in the row, not in the median
    assert md_rows[("native", 4)][HEADER] == html_rows[("native", 4)][HEADER] == "n/a"  # older files only
    assert csv_rows[("native", 4)]["cpu_time_s"] == ""
    assert DEFINITION in md and DEFINITION in html.unescape(page)  # in the report's Definitions
    # the per-row tables (here Memory and energy) start with the scaling table's first cells, not its every column
    for tables in (md_tables(md), html_tables(page)):
        (memory,) = [t[0] for t in tables if "peak memory per rank" in t[0]]
        assert memory == [*document.CELL_HEADER, "peak memory per rank"]


def test_a_file_without_the_field_reads_as_its_default_and_an_older_reader_ignores_it(tmp_path: Path) -> None:
    """Why the optional field needs no schema step: a schema-3 file written before the field reads as its default
    (checked with the reader of the field, WithCpu), and a file with the field reads with a reader before it
    (RunRecord) as one without it."""
    old = RunRecord.from_dict(make_run("native", 1, 100.0)).to_dict()
    assert old["schema"] == results.SCHEMA and "cpu_time_s" not in old
    names = results._FIELD_NAMES | {"cpu_time_s"}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(results, "_FIELD_NAMES", names)
        assert WithCpu.from_dict(old).cpu_time_s is None
        assert WithCpu.from_dict({**old, "cpu_time_s": 8.5}).cpu_time_s == 8.5
    new = WithCpu(**{**old, "cpu_time_s": 8.5}).to_dict()
    assert RunRecord.from_dict(new) == RunRecord.from_dict(old)
