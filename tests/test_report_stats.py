"""The report's statistics (median, order-statistic 95% interval, min-max, bootstrap ratio), its layouts, several
result directories read as one set, and report.html (self-contained, rendered by headless Chromium).

Fast (no TensorFlow): synthetic records written into tmp_path (tests/test_report.py's make_run).
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from scipy.stats import binom

from common.report.cli import main
from common.report.load import load_runs
from common.report.model import extrapolation_sizes
from common.report.render import format_ratio_table, format_table
from common.report.stats import median, median_interval
from common.report.summary import summarize
from tests.test_report import JOB_A, JOB_B, col, make_run, md_row, put

SEVEN = [100.0, 104.0, 97.0, 110.0, 101.0, 99.0, 103.0]  # native, 1 replica: 7 repeats


def expected_ci(values: list[float]) -> tuple[float, float]:
    """The 95% order-statistic interval of the median computed here from scipy.stats.binom, independently: the
    widest-rank-first search for the largest j with P(B <= j - 1) <= 0.025, B ~ Binomial(n, 1/2)."""
    xs, n = sorted(values), len(values)
    j = 0
    while binom.cdf(j, n, 0.5) <= 0.025:
        j += 1
    assert j >= 1 and 1 - 2 * binom.cdf(j - 1, n, 0.5) >= 0.95
    return xs[j - 1], xs[n - j]


@pytest.mark.parametrize("values", [SEVEN, SEVEN[:6], [float(v) for v in range(50, 80)]])
def test_interval_of_the_median_is_the_binomial_order_statistics(values: list[float]) -> None:
    iv = median_interval(values)
    med = sorted(values)[len(values) // 2] if len(values) % 2 else None
    assert iv.kind == "95% CI" and (iv.low, iv.high) == expected_ci(values)
    assert iv.low <= median(values) <= iv.high and (med is None or iv.low <= med <= iv.high)
    assert iv.coverage >= 0.95
    if len(values) == 30:
        assert (iv.low, iv.high) != (min(values), max(values))  # n = 30: ranks 10 and 21, not the extremes


def test_table_shows_the_ci_with_six_runs_and_min_max_with_three(tmp_path: Path) -> None:
    d = tmp_path / "r"
    for i, ips in enumerate(SEVEN):
        put(d, make_run("native", 1, ips, run_id=f"n1-{i}"))
    for i, ips in enumerate([200.0, 190.0, 195.0]):
        put(d, make_run("native", 2, ips, run_id=f"n2-{i}"))
    assert main([str(d), "--out", str(tmp_path / "o"), "-q", "--no-plots"]) == 0
    md = (tmp_path / "o" / "report.md").read_text()
    lo, hi = expected_ci(SEVEN)
    assert col(md_row(md, "native", 1), "interval") == f"[{lo:.1f}, {hi:.1f}] 95% CI"
    assert col(md_row(md, "native", 1), "images/s median") == "101.0"
    assert col(md_row(md, "native", 2), "interval") == "[190.0, 200.0] min-max (n=3)"
    assert "img/s mean" not in md and "CI of mean" not in md


def test_ratio_gets_a_reproducible_bootstrap_interval_with_six_runs_per_cell(tmp_path: Path) -> None:
    runs = [make_run("native", 2, v, run_id=f"n{i}") for i, v in enumerate(SEVEN)]
    runs += [make_run("horovod", 2, 1.1 * v, run_id=f"h{i}") for i, v in enumerate(SEVEN[:6])]
    [s] = summarize(runs)
    [q] = s.ratios
    assert q.ratio == pytest.approx(1.1 * 100.5 / 101.0)
    assert q.ratio_ci is not None and q.ratio_ci[0] <= q.ratio <= q.ratio_ci[1] and q.ratio_ci[0] < q.ratio_ci[1]
    assert summarize(runs)[0].ratios[0].ratio_ci == q.ratio_ci  # fixed seed: the same interval again
    [s5] = summarize(runs[:7] + runs[7:12])  # horovod with 5 repeats
    assert s5.ratios[0].ratio_ci is None
    assert "(needs 6 runs per cell)" in format_ratio_table(s5)
    assert re.search(r"\| \d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\] \|", format_ratio_table(s))


def test_layouts_at_one_size_are_separate_rows() -> None:
    one_node = ["a", "a"]  # 1 node x 2 ranks
    two_nodes = ["a", "b"]  # 2 nodes x 1 rank
    runs = [make_run("native", 1, 100.0, run_id="n1", hosts=["a"]),
            make_run("native", 2, 190.0, run_id="n2a", hosts=one_node),
            make_run("native", 2, 150.0, run_id="n2b", hosts=two_nodes),
            make_run("native", 2, 152.0, run_id="n2c", hosts=two_nodes)]
    [s] = summarize(runs)
    rows = {(r.identity.world_size, r.identity.layout): r for r in s.rows}
    assert set(rows) == {(1, "1x1"), (2, "1x2"), (2, "2x1")}
    assert rows[(2, "1x2")].throughput.repeats == 1 and rows[(2, "2x1")].throughput.repeats == 2
    assert rows[(2, "2x1")].scaling.speedup == pytest.approx(1.51)  # both against the absolute 1-replica base
    table = format_table(s)
    assert "| native | 2 | 1x2 | 2 | 1 | 190.0 |" in table and "| native | 2 | 2x1 | 2 | 2 | 151.0 |" in table


def test_layout_is_derived_for_old_files_and_uneven_nodes(tmp_path: Path) -> None:
    d = tmp_path / "r"
    rec = make_run("native", 3, 100.0, hosts=["a", "a", "b"])
    rec.pop("machine", None)
    put(d, rec)
    [run] = load_runs(d)
    assert run.layout == (2, None, "2x(2+1)") and run.layout.text == "2x(2+1)"


def test_two_result_dirs_are_one_set_and_mixed_jobs_or_versions_are_refused(tmp_path: Path, capsys) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    put(a, make_run("native", 1, 100.0, run_id="n1"))
    put(b, make_run("native", 2, 190.0, run_id="n2"))
    put(b, make_run("native", 1, 100.0, run_id="n1"), name="copy.json")  # the same run in both: counted once
    out = tmp_path / "o"
    assert main([str(a), str(b), "--out", str(out), "-q", "--no-plots"]) == 0
    with (out / "report.csv").open() as f:
        rows = {(r["backend"], r["world_size"]): r for r in csv.DictReader(f)}
    assert set(rows) == {("native", "1"), ("native", "2")} and rows[("native", "1")]["repeats"] == "1"
    assert float(rows[("native", "2")]["speedup"]) == pytest.approx(1.9)  # base from the other directory
    assert "(read as one set)" in (out / "report.md").read_text()
    assert "same run_id 'n1'" in capsys.readouterr().err
    # another job in a third directory: compared with the first, refused
    c = tmp_path / "c"
    put(c, make_run("native", 1, 300.0, job=JOB_B, run_id="other"))
    assert main([str(a), str(c), "--compare", JOB_A.job_hash, JOB_B.job_hash, "-q"]) == 2
    assert "different jobs" in capsys.readouterr().err.lower()
    # other software versions in another directory: refused without --allow-mixed-versions
    v = tmp_path / "v"
    put(v, make_run("native", 4, 350.0, run_id="n4", versions={"python": "3.11.9", "tensorflow": "2.21.0"}))
    assert main([str(a), str(v), "-q", "--no-plots"]) == 2
    assert "tensorflow" in capsys.readouterr().err


def test_time_to_target_column_only_when_the_job_sets_a_target(tmp_path: Path) -> None:
    [s] = summarize([make_run("native", 1, 100.0)])
    assert "time to target" not in format_table(s)
    runs = [make_run("native", 1, 100.0, run_id="x", time_to_target_s=12.5),
            make_run("native", 1, 110.0, run_id="y", time_to_target_s=13.5)]
    for r in runs:
        r["job"] = {**r["job"], "target_metric": "loss", "target_value": 0.5}
    [s] = summarize(runs)
    assert format_table(s).splitlines()[-1].endswith("| 13.00 |")  # the median of the repeats' times


def test_extrapolation_is_bounded_unless_asked() -> None:
    assert extrapolation_sizes(2) == [8] and extrapolation_sizes(8) == [16, 32]
    assert extrapolation_sizes(8, 512) == [16, 32, 64, 128, 256, 512] and extrapolation_sizes(8, 100)[-1] == 100


# -- report.html ---------------------------------------------------------------------------------------------
def html_results(tmp_path: Path) -> Path:
    d = tmp_path / "r"
    for i, v in enumerate(SEVEN[:6]):
        put(d, make_run("native", 1, v, run_id=f"n1-{i}"))
        put(d, make_run("horovod", 1, v + 2, run_id=f"h1-{i}"))
        put(d, make_run("native", 2, 1.8 * v, run_id=f"n2-{i}", hosts=["a", "a"]))
        put(d, make_run("horovod", 2, 1.9 * v, run_id=f"h2-{i}", hosts=["a", "a"]))
    put(d, make_run("native", 2, 170.0, run_id="n2-2n", hosts=["a", "b"]))
    put(d, make_run("horovod", 1, 99.0, run_id="fusion", tuning={"variant": "fusion <32 MiB>"}))  # escaped
    return d


def test_report_html_is_self_contained(tmp_path: Path) -> None:
    d = html_results(tmp_path)
    assert main([str(d), "--out", str(tmp_path / "o"), "-q"]) == 0
    page = (tmp_path / "o" / "report.html").read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page, re.I)
    assert "@import" not in page and "url(" not in page
    imgs = re.findall(r"<img [^>]*src=\"([^\"]*)\"", page)
    assert len(imgs) == 2 and all(s.startswith("data:image/png;base64,") for s in imgs)
    assert "fusion &lt;32 MiB&gt;" in page and "<32 MiB>" not in page
    assert "<h2>Method</h2>" in page and "Best vs best" in page and "<h3>Machine</h3>" in page
    assert "<td>1x2</td>" in page and "<td>2x1</td>" in page and "95% CI" in page


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_report_html_renders_in_headless_chromium(tmp_path: Path) -> None:
    exe = chromium()
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (scripts/setup.sh installs it with TWINBENCH_WITH_SLURM=1)")
        pytest.skip("chromium is not installed")
    d = html_results(tmp_path)
    assert main([str(d), "--out", str(tmp_path / "o"), "-q"]) == 0
    page = tmp_path / "o" / "report.html"
    flags = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0"]
    shot = tmp_path / "shot.png"
    proc = subprocess.run([*flags, f"--screenshot={shot}", "--window-size=1200,2000", page.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and shot.read_bytes()[:4] == b"\x89PNG", proc.stderr[-2000:]
    assert shot.stat().st_size > 20_000  # a page with tables and plots, not a blank one
    assert "Uncaught" not in proc.stderr and "ERROR:CONSOLE" not in proc.stderr, proc.stderr[-2000:]
    dom = subprocess.run([*flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    srcs = re.findall(r"<img [^>]*src=\"([^\"]*)\"", dom.stdout)
    assert len(srcs) == 2 and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert "twinbench scaling report" in dom.stdout and dom.stdout.count("<table>") >= 4


def test_paired_t_interval_by_hand() -> None:
    import math

    from common.report.stats import paired_t_interval

    num, den = [110.0, 88.0, 121.0], [100.0, 80.0, 110.0]  # every round 10% faster, whatever the round's load
    lo, hi = paired_t_interval(num, den)
    assert lo == pytest.approx(1.1) and hi == pytest.approx(1.1)  # no spread in the ratios: a point
    num = [110.0, 96.0, 121.0, 105.0]  # ratios 1.10, 1.20, 1.10, 1.05 against den = 100, 80, 110, 100
    d = [math.log(a / b) for a, b in zip(num, [100.0, 80.0, 110.0, 100.0])]
    m, sd = sum(d) / 4, (sum((x - sum(d) / 4) ** 2 for x in d) / 3) ** 0.5
    t3 = 3.182446305284263  # Student t 0.975 quantile, 3 degrees of freedom
    lo, hi = paired_t_interval(num, [100.0, 80.0, 110.0, 100.0])
    assert (lo, hi) == pytest.approx((math.exp(m - t3 * sd / 2), math.exp(m + t3 * sd / 2)))
    assert paired_t_interval(num[:2], [100.0, 80.0]) is None  # 2 rounds: one degree of freedom, no interval
    assert paired_t_interval(num, [1.0] * 3) is None  # unequal lengths are not rounds


def test_welch_and_difference_intervals() -> None:
    from common.report.stats import difference_interval, welch_ratio_interval

    lo, hi = welch_ratio_interval([110.0, 112.0, 108.0], [100.0, 101.0, 99.0])
    assert 1.0 < lo < 1.099 < hi < 1.2  # the geometric means' ratio 1.099, inside
    assert welch_ratio_interval([1.0, 2.0], [1.0, 2.0, 3.0]) is None
    # the difference of medians: 6 a side needed; a real 1.0 difference excludes zero, noise alone does not
    a, b = [3.0, 3.1, 2.9, 3.05, 2.95, 3.0], [2.0, 2.1, 1.9, 2.05, 1.95, 2.0]
    lo, hi = difference_interval(a, b)
    assert 0.8 < lo <= 1.0 <= hi < 1.2
    lo, hi = difference_interval(a, [x + 0.02 for x in a[::-1]])
    assert lo < 0 < hi
    assert difference_interval(a[:5], b) is None
