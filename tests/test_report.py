"""common.report: numbers checked against hand-computed values, job separation, bad files, plots, no TensorFlow.

Fast (no TensorFlow): every fixture is a results JSON written by hand into tmp_path.
"""

from __future__ import annotations

import csv
import json
import statistics
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common.core.results import RunRecord  # noqa: E402
from common.report.build import ReportOptions, build_report  # noqa: E402
from common.report.cli import main  # noqa: E402
from common.report.document import COLUMNS, always  # noqa: E402
from common.report.load import load_runs  # noqa: E402
from common.report.render import format_table  # noqa: E402
from common.report.stats import median, median_interval  # noqa: E402
from common.report.summary import summarize  # noqa: E402
from common.workload.job import Job  # noqa: E402

TABLE_HEADER = [c.header for c in COLUMNS if c.header and c.shown is always]  # the columns every job shows
JOB_A = Job(name="small", per_replica_batch_size=16, steps=12)  # the job most tests use
JOB_B = Job(name="bigger", per_replica_batch_size=32, steps=20)  # differs from A in two hashed fields


def make_run(backend: str, ws: int, ips: float, *, job: Job = JOB_A, step: tuple[float, float] = (0.01, 0.02),
             ttfs: float = 3.0, loss: float = 0.5, run_id: str | None = None, **extra: Any) -> dict[str, Any]:
    """A results JSON of schema 2 (the report upgrades it): without ``capabilities``, which schema 3 always writes,
    so what ``backend_info`` says (strategy, asynchronous, compression) is what the record says."""
    rid = run_id or f"{backend}-{ws}-{ips}"
    rec: dict[str, Any] = {
        "schema": 2, "kind": "train", "backend": backend, "backend_info": {"strategy": backend},
        "world_size": ws, "num_workers": ws, "mode": job.mode, "job_hash": job.job_hash, "job": job.to_dict(),
        "global_batch_size": job.per_replica_batch_size * ws, "learning_rate": job.learning_rate,
        "steps": job.steps, "steps_per_epoch": 4, "step_losses": [2.3, 1.0, loss], "images_per_sec": ips,
        "step_time": {"median": step[0], "p95": step[1], "mean": step[0], "timed_steps": 10, "warmup_steps": 2,
                      "window_steps": 1, "windows": 10},
        "per_rank_timed_wall": [1.0] * ws, "time_to_first_step": ttfs,
        "timed_wall_time": 1.0, "versions": {"python": "3.11.9", "tensorflow": "2.18.1"},
        "hosts": [f"node{i}" for i in range(ws)], "devices": ["cpu"] * ws, "command": ["python", "-m", backend],
        "started_at": "2025-01-01T00:00:00+00:00", "finished_at": "2025-01-01T00:01:00+00:00", "run_id": rid,
        "weights_digest": "abc", "weights_consistent": True,
    }
    rec.update(extra)
    return rec


def record(backend: str, ws: int, ips: float, **kw: Any) -> RunRecord:
    """make_run's record as the report reads it."""
    return RunRecord.from_dict(make_run(backend, ws, ips, **kw))


def put(directory: Path, rec: dict[str, Any], name: str | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / (name or f"{rec['run_id']}.json")
    path.write_text(json.dumps(rec))
    return path


# native:  1 replica 100/110/120 (3 repeats), 2 replicas 200/190, 4 replicas 360 (one repeat)
# horovod: 1 replica 105, 2 replicas 204/206/208, 4 replicas 400/380
NATIVE = {1: [100.0, 110.0, 120.0], 2: [200.0, 190.0], 4: [360.0]}
HOROVOD = {1: [105.0], 2: [204.0, 206.0, 208.0], 4: [400.0, 380.0]}
NATIVE_1_STEPS = [(0.010, 0.020), (0.012, 0.030), (0.011, 0.025)]  # (p50, p95) of the three 1-replica repeats


@pytest.fixture
def results(tmp_path: Path) -> Path:
    d = tmp_path / "results"
    for ws, values in NATIVE.items():
        for i, ips in enumerate(values):
            step = NATIVE_1_STEPS[i] if ws == 1 else (0.02, 0.03)
            put(d, make_run("native", ws, ips, step=step, ttfs=[4.0, 2.0, 3.0][i]))
    for ws, values in HOROVOD.items():
        for ips in values:
            put(d / "horovod", make_run("horovod", ws, ips))  # one level of nesting is read
    return d


def csv_rows(path: Path) -> dict[tuple[str, str, int], dict[str, str]]:
    with path.open() as f:
        return {(r["job_hash"], r["backend"], int(r["world_size"])): r for r in csv.DictReader(f)}


def md_row(md: str, backend: str, ws: int) -> list[str]:
    for line in md.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == len(TABLE_HEADER) and cells[0] == backend and cells[1] == str(ws):
            return cells
    raise AssertionError(f"no table row for {backend} x {ws}")


def col(cells: list[str], name: str) -> str:
    return cells[TABLE_HEADER.index(name)]


# --------------------------------------------------------------------------------------------------------
def test_numbers_match_hand_computation(results: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    paths = build_report(results, out).paths
    assert {p.name for p in paths} >= {"report.md", "report.csv"}
    rows = csv_rows(out / "report.csv")
    h = JOB_A.job_hash
    n1, n2, n4 = rows[(h, "native", 1)], rows[(h, "native", 2)], rows[(h, "native", 4)]
    h1, h2, h4 = rows[(h, "horovod", 1)], rows[(h, "horovod", 2)], rows[(h, "horovod", 4)]

    # medians and repeats
    assert [n1["repeats"], n2["repeats"], n4["repeats"], h2["repeats"]] == ["3", "2", "1", "3"]
    assert float(n1["images_per_sec_median"]) == 110.0
    assert float(n2["images_per_sec_median"]) == 195.0  # (190 + 200) / 2
    assert float(h4["images_per_sec_median"]) == 390.0  # (380 + 400) / 2

    # fewer than 6 repeats: the range min-max (no confidence interval of the median exists below 6)
    assert "images_per_sec_mean" not in n1 and "images_per_sec_stdev" not in n1
    assert (n1["interval_kind"], float(n1["interval_low"]), float(n1["interval_high"])) == ("min-max", 100.0, 120.0)
    assert (h2["interval_kind"], float(h2["interval_low"]), float(h2["interval_high"])) == ("min-max", 204.0, 208.0)
    assert n4["interval_kind"] == n4["interval_low"] == n4["interval_high"] == ""  # n = 1
    assert n2["layout"] == "2x1" and (n2["nodes"], n2["ranks_per_node"]) == ("2", "1")  # hosts node0, node1

    # speedup and efficiency against the same backend's 1-replica median
    assert float(n1["speedup"]) == pytest.approx(1.0) and float(n1["efficiency"]) == pytest.approx(1.0)
    assert float(n2["speedup"]) == pytest.approx(195 / 110)  # 1.7727
    assert float(n2["efficiency"]) == pytest.approx(195 / (2 * 110))  # 0.8864
    assert float(n4["efficiency"]) == pytest.approx(360 / (4 * 110))  # 0.8182
    assert float(h2["speedup"]) == pytest.approx(206 / 105)  # 1.9619
    assert float(h4["efficiency"]) == pytest.approx(390 / (4 * 105))  # 0.9286

    # horovod / native ratio of medians, on both backends' rows
    assert float(h1["horovod_native_ratio"]) == pytest.approx(105 / 110)
    assert float(n2["horovod_native_ratio"]) == pytest.approx(206 / 195)
    assert float(h4["horovod_native_ratio"]) == pytest.approx(390 / 360)

    # step times and time to first step: medians over repeats
    assert float(n1["step_time_p50_s"]) == pytest.approx(0.011)
    assert float(n1["step_time_p95_s"]) == pytest.approx(0.025)
    assert float(n1["time_to_first_step_s"]) == pytest.approx(3.0)

    # the same numbers, rounded, in the Markdown table
    md = (out / "report.md").read_text()
    c = md_row(md, "native", 1)
    assert col(c, "images/s median") == "110.0"
    assert col(c, "interval") == "[100.0, 120.0] min-max (n=3)" and col(c, "layout") == "1x1"
    assert col(c, "step p50 (ms)") == "11.00" and col(c, "step p95 (ms)") == "25.00"
    assert col(c, "first step (s)") == "3.00"
    c = md_row(md, "native", 2)
    assert col(c, "speedup") == "1.77x" and col(c, "efficiency") == "88.6%"
    c = md_row(md, "native", 4)
    assert col(c, "interval") == "n=1, no interval" and col(c, "efficiency") == "81.8%"
    c = md_row(md, "horovod", 4)
    assert col(c, "speedup") == "3.71x" and col(c, "efficiency") == "92.9%"
    assert "| 2 | 2x1 | 195.0 | 206.0 | 1.056 (needs 6 runs per cell) |" in md  # ratio table: 206 / 195
    assert "native: 1 replica (1x1), 110.0 images/s median of 3 repeat(s)" in md  # the absolute speedup base
    assert "## Method" in md and "Binomial(n, 1/2)" in md and "mean" not in col(c, "interval")
    assert "Student-t" not in md and JOB_A.job_hash in md and "small" in md  # method, hash and name stated
    assert "tensorflow 2.18.1" in md and "`node0`" in md  # versions and hosts


def test_small_samples_get_min_max_or_nothing() -> None:
    assert median_interval([5.0]) is None
    iv = median_interval([3.0, 1.0, 2.0])
    assert (iv.low, iv.high, iv.kind, iv.text()) == (1.0, 3.0, "min-max", "[1.0, 3.0] min-max (n=3)")
    assert median_interval([1.0, 2.0, 3.0, 4.0, 5.0]).kind == "min-max"  # 5 < 6 repeats


def test_api_summarize_and_format(results: Path) -> None:
    runs = load_runs(results)
    assert len(runs) == 12 and all(r.path and Path(r.path).is_file() for r in runs)
    (s,) = summarize(runs)
    assert s.job_hash == JOB_A.job_hash and s.name == "small" and s.backends == ["native", "horovod"]
    table = format_table(s)
    assert table.splitlines()[0].startswith("| backend | replicas |")
    assert len(table.splitlines()) == 2 + 6  # header, rule, 2 backends x 3 world sizes


def test_cli_prints_table_and_paths(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(results)]) == 0
    out = capsys.readouterr().out
    assert "| native | 2 | 2x1 | 2 | 2 | 195.0 |" in out
    for name in ("report.md", "report.csv", f"throughput_{JOB_A.job_hash}.png", f"efficiency_{JOB_A.job_hash}.png"):
        assert f"wrote {results / 'report' / name}" in out  # default --out is RESULTS_DIR/report
        assert (results / "report" / name).is_file()
    assert not [p for p in (results / "report").iterdir() if p.name.startswith(".")]  # no temp files left


def test_pngs_are_valid(results: Path, tmp_path: Path) -> None:
    paths = build_report(results, tmp_path / "out").paths
    pngs = [p for p in paths if p.suffix == ".png"]
    assert sorted(p.name for p in pngs) == sorted([f"throughput_{JOB_A.job_hash}.png",
                                                   f"efficiency_{JOB_A.job_hash}.png"])
    for p in pngs:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
        width, height = struct.unpack(">II", data[16:24])
        assert width > 100 and height > 100 and p.stat().st_size > 1000


def test_no_plots(results: Path, tmp_path: Path) -> None:
    paths = build_report(results, tmp_path / "out", ReportOptions(plots=False)).paths
    assert sorted(p.name for p in paths) == ["migration.csv", "report.csv", "report.html", "report.md"]


# --------------------------------------------------------------------------------------------------------
def two_jobs(tmp_path: Path) -> Path:
    d = tmp_path / "mixed"
    for ws, ips in ((1, 100.0), (2, 180.0)):
        put(d, make_run("native", ws, ips, job=JOB_A))
        put(d, make_run("horovod", ws, ips + 5, job=JOB_A))
        put(d, make_run("native", ws, ips * 3, job=JOB_B))
    return d


def test_several_jobs_get_separate_sections(tmp_path: Path) -> None:
    d = two_jobs(tmp_path)
    out = tmp_path / "out"
    build_report(d, out)
    rows = csv_rows(out / "report.csv")
    assert set(rows) == {(JOB_A.job_hash, b, ws) for b in ("native", "horovod") for ws in (1, 2)} | {
        (JOB_B.job_hash, "native", ws) for ws in (1, 2)}
    # each job's speedup uses only its own baseline: 180 / 100 for A, 540 / 300 for B
    assert float(rows[(JOB_A.job_hash, "native", 2)]["speedup"]) == pytest.approx(1.8)
    assert float(rows[(JOB_B.job_hash, "native", 2)]["images_per_sec_median"]) == 540.0
    assert all(r["repeats"] == "1" for r in rows.values())
    md = (out / "report.md").read_text()
    assert f"hash `{JOB_A.job_hash}`" in md and f"hash `{JOB_B.job_hash}`" in md
    assert (out / f"throughput_{JOB_B.job_hash}.png").is_file()


def test_comparing_different_jobs_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = two_jobs(tmp_path)
    assert main([str(d), "--compare", JOB_A.job_hash, JOB_B.job_hash[:8]]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "runs belong to different jobs" in err
    assert "per_replica_batch_size: 16 vs 32" in err and "steps: 12 vs 20" in err
    assert "--job-hash" in err
    assert not (d / "report").exists()  # nothing written


def test_job_hash_selects_one_job_and_unknown_hash_is_refused(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    d = two_jobs(tmp_path)
    assert main([str(d), "--job-hash", JOB_B.job_hash[:6], "--out", str(tmp_path / "o")]) == 0
    rows = csv_rows(tmp_path / "o" / "report.csv")
    assert {k[0] for k in rows} == {JOB_B.job_hash}
    capsys.readouterr()
    assert main([str(d), "--job-hash", "0123456789abcdef"]) == 2
    err = capsys.readouterr().err
    assert "no runs with job hash" in err and JOB_A.job_hash in err and len(err.strip().splitlines()) == 1


def test_job_file_not_in_results_names_differing_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = two_jobs(tmp_path)
    toml = tmp_path / "other.toml"
    toml.write_text("per_replica_batch_size = 16\nsteps = 12\nlearning_rate = 0.5\n")  # JOB_A but another LR
    assert main([str(d), "--job", str(toml)]) == 2
    err = capsys.readouterr().err
    assert "runs belong to different jobs" in err and "learning_rate: 0.5 vs 0.01" in err
    assert JOB_A.job_hash in err  # the closest job is named
    assert main([str(d), "--job", str(toml), "--set", "learning_rate=0.01", "--no-plots",
                        "--out", str(tmp_path / "o")]) == 0


def test_summarize_never_mixes_jobs() -> None:
    runs = [make_run("native", 1, 100.0, job=JOB_A), make_run("native", 1, 999.0, job=JOB_B)]
    summaries = summarize(runs)
    assert len(summaries) == 2
    assert all(len(s.rows) == 1 and s.rows[0].throughput.repeats == 1 for s in summaries)


# --------------------------------------------------------------------------------------------------------
def test_incomplete_and_corrupt_files_are_ignored(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    huge = make_run("native", 1, 1e6, run_id="should-not-count")
    put(results, huge, ".hidden-in-progress.json")  # hidden: a writer's temp file
    put(results, huge, "run.json.tmp")  # .tmp: incomplete
    put(results, huge, "x.tmp")
    put(results / ".staging", huge, "run.json")  # inside a hidden subdirectory
    (results / "truncated.json").write_text(json.dumps(huge)[:80])
    (results / "list.json").write_text("[1, 2, 3]")
    missing = dict(huge)
    del missing["images_per_sec"]
    put(results, missing, "missing-field.json")
    put(results, make_run("native", 1, float("nan"), run_id="nan-run"), "nan.json")
    put(results, make_run("native", 1, 110.0), "zz-copy.json")  # a copy: same run_id as a real run
    capsys.readouterr()

    runs = load_runs(results)
    err = capsys.readouterr().err
    assert len(runs) == 12  # only the fixture's 12 complete runs
    for name in ("truncated.json", "list.json", "missing-field.json", "nan.json", "zz-copy.json"):
        line = [ln for ln in err.splitlines() if name in ln]
        assert len(line) == 1, name  # one warning line per bad file, naming it
    assert "images_per_sec" in next(ln for ln in err.splitlines() if "missing-field.json" in ln)
    assert "hidden" not in err and ".tmp" not in err and "staging" not in err  # skipped silently
    (s,) = summarize(runs)
    base = next(r for r in s.rows if r.identity.label == "native" and r.identity.world_size == 1)
    assert base.throughput.ips == [100.0, 110.0, 120.0]


def test_missing_baseline_and_missing_backend_show_na(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "r"
    put(d, make_run("horovod", 2, 200.0))
    put(d, make_run("horovod", 4, 360.0))
    assert main([str(d), "--out", str(tmp_path / "o")]) == 0
    md = (tmp_path / "o" / "report.md").read_text()
    c = md_row(md, "horovod", 4)
    assert col(c, "speedup") == "n/a" and col(c, "efficiency") == "n/a" and col(c, "images/s median") == "360.0"
    assert "horovod: no 1-replica run" in md  # plain note
    assert "no native runs for this job" in md and "| 4 | 4x1 | n/a | 360.0 | n/a |" in md
    rows = csv_rows(tmp_path / "o" / "report.csv")
    r = rows[(JOB_A.job_hash, "horovod", 4)]
    assert r["speedup"] == "" and r["efficiency"] == "" and r["horovod_native_ratio"] == ""
    for p in (tmp_path / "o").glob("*.png"):  # plots still drawn (efficiency plot says n/a)
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_partial_world_size_coverage(tmp_path: Path) -> None:
    d = tmp_path / "r"
    for b in ("native", "horovod"):
        put(d, make_run(b, 1, 100.0))
    put(d, make_run("native", 2, 150.0))
    (s,) = summarize(load_runs(d))
    q = {x.world_size: x for x in s.ratios}
    assert q[1].ratio == pytest.approx(1.0) and q[2].ratio is None
    assert any("only native ran there" in n for n in s.notes)


def test_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == 2
    assert "no results" in capsys.readouterr().err
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "a.json").write_text("{")
    assert main([str(tmp_path / "junk")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert "a.json" in err[0] and "no results" in err[-1] and "1 results JSON" in err[-1]
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path), "--set", "steps=3"])  # --set without --job
    assert e.value.code == 2


def test_cli_subprocess_does_not_import_tensorflow(results: Path, tmp_path: Path) -> None:
    code = (
        "import json, sys\n"
        "from common.report.cli import main\n"
        f"rc = main([{str(results)!r}, '--out', {str(tmp_path / 'o')!r}, '--quiet'])\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras', 'tf_keras', 'horovod'))\n"
        "print(json.dumps({'rc': rc, 'bad': bad}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"rc": 0, "bad": []}

    proc = subprocess.run([sys.executable, "-m", "common.report", str(results / "missing")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1

    # the real entry point end to end (module run as __main__), writing every file
    out = tmp_path / "cli-out"
    proc = subprocess.run([sys.executable, "-m", "common.report", str(results), "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "| native | 1 | 1x1 | 1 | 3 | 110.0 |" in proc.stdout and f"wrote {out / 'report.md'}" in proc.stdout
    assert (out / f"throughput_{JOB_A.job_hash}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_median_helper_matches_statistics() -> None:
    vals = [3.0, 1.0, 2.0, 10.0]
    assert median(vals) == statistics.median(vals) == 2.5
