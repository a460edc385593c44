"""Allreduce microbenchmark on both backends (2 ranks, small sizes) and its bandwidth arithmetic."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from bench import overhead, plain_loops, suite_processes
from common.core import registry
from common.diagnostics.allreduce import bus_factor, parse_sizes
from tests.conftest import BIN, PY, base_env, run

# The regular expressions nccl-tests parsers use on all_reduce_perf's output: a table row (size, count, float sum,
# root -1, out-of-place time, algbw, busbw, #wrong), and CSCS's ReFrame check (cscs-reframe-tests xccl_tests.py).
NCCL_ROW_RE = re.compile(r"^\s+(\d+)\s+(\d+)\s+float\s+sum\s+-1\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)", re.M)
AVG_BUSBW_RE = r"Avg bus bandwidth\s*:\s*(?P<gbs>\S+)"
OUT_OF_BOUNDS_OK_RE = r"Out of bounds values\s*:\s*0\s*OK"
HOROVODRUN_PREFIX = re.compile(r"^\[\d+\]<std(?:out|err)>:", re.M)  # horovodrun --gloo tags each rank's lines


def test_parse_sizes():
    assert parse_sizes("4K,1M,256MiB,8") == [4096, 1024**2, 256 * 1024**2, 8]
    with pytest.raises(ValueError, match="multiple of 4"):
        parse_sizes("6")
    with pytest.raises(ValueError, match="cannot read"):
        parse_sizes("lots")


def test_bus_factor_is_nccl_tests_definition():
    assert bus_factor(2) == 1.0 and bus_factor(8) == pytest.approx(1.75) and bus_factor(1) == 0.0


@pytest.mark.distributed
@pytest.mark.parametrize("kind", ["native", "horovod"])
def test_allreduce_bench_two_ranks(tmp_path, kind):
    body = ["-m", f"backends.{kind}", "--bench", "allreduce", "--sizes", "4K,64K,1M", "--iters", "5",
            "--warmup-iters", "1", "--results", str(tmp_path), "--quiet"]
    if kind == "native":
        proc = run([PY, *body, "--nproc", "2"])
    else:
        proc = run([str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", PY, *body])
    files = list(tmp_path.glob("allreduce-*.json"))
    assert len(files) == 1
    rec = json.loads(files[0].read_text())
    assert rec["kind"] == "allreduce" and rec["backend"] == kind and rec["world_size"] == 2
    assert [r["bytes"] for r in rec["rows"]] == [4096, 65536, 1048576]
    for r in rec["rows"]:
        assert r["time_median"] > 0 and r["time_p95"] >= r["time_median"]
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / r["time_median"] / 1e9)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 2 * (2 - 1) / 2)
    # nccl-tests' table on stdout (printed under --quiet too: it is the result), read with nccl-tests' parsers
    out = HOROVODRUN_PREFIX.sub("", proc.stdout)
    table = NCCL_ROW_RE.findall(out)
    assert [(int(b), int(c)) for b, c, *_ in table] == [(r["bytes"], r["bytes"] // 4) for r in rec["rows"]], out
    for (_, _, us, algbw, busbw, wrong), r in zip(table, rec["rows"], strict=True):
        assert float(us) == pytest.approx(r["time_median"] * 1e6, rel=0.01, abs=0.01)
        assert float(algbw) == pytest.approx(r["algbw_GBps"], abs=0.006)
        assert float(busbw) == pytest.approx(r["busbw_GBps"], abs=0.006) and int(wrong) == 0
    avg = re.findall(AVG_BUSBW_RE, out)
    assert len(avg) == 1 and float(avg[0]) == pytest.approx(sum(r["busbw_GBps"] for r in rec["rows"]) / 3, rel=1e-4)
    assert re.search(OUT_OF_BOUNDS_OK_RE, out)


@pytest.mark.distributed
@pytest.mark.timing  # asserts on wall-clock figures: run alone (tests/conftest.py)
def test_overhead_benchmark_runs_both_backends():
    """bench/overhead.py is a benchmark, not a timed test: this only checks that it runs and prints its figures
    (both plain loops and both twinbench runs finish, ratios are finite), so it does not rot unnoticed; with the
    ranks bound, the path that needs both sides bound alike."""
    # 2 workers only: the launchers and the bound path (1 worker is a plain process, as in bench.input_paths)
    proc = run([PY, "-m", "bench.overhead", "--preset", "smoke", "--workers", "2", "--repeats", "1", "--steps", "30",
                "--warmup", "5", "--cpu-bind", "cores"], timeout=600)
    ratios = {}
    for line in proc.stdout.splitlines():
        if "median ratio twinbench/plain" in line:
            side = line.split("twinbench/")[1].split()[0]
            ratios[(line.split(":")[0], side)] = float(line.split("=")[1].split()[0])
    assert set(ratios) == {(f"smoke 2w {kind}", side) for kind in registry.names()
                           for side in ("plain-const", "plain-tfdata")}, proc.stdout
    # Sanity only (a broken run gives 0, inf or an exception); the >= 0.98 target is judged by reading the figures.
    assert all(0.2 < r < 5 for r in ratios.values()), ratios
    assert "smoke 2w vs plain-tfdata: tax difference native - horovod" in proc.stdout


def test_step_extras_benchmark_prints_three_variants():
    """bench/step_extras.py runs and prints a finite time per step for each variant (figures are read, not
    asserted); bad sizes are exit 2 before TensorFlow."""
    proc = run([PY, "-m", "bench.step_extras", "--steps", "5", "--repeats", "2"], timeout=300)
    rows = {line.split(":")[0]: float(line.split(":")[1].split()[0]) for line in proc.stdout.splitlines()
            if " us/step median " in line}
    assert set(rows) == {"plain", "+input clock", "+all"}, proc.stdout
    assert all(0 < v < 1e6 for v in rows.values()), rows
    bad = run([PY, "-m", "bench.step_extras", "--steps", "0"], check=False)
    assert bad.returncode == 2 and "must be >= 1" in bad.stderr


def test_overhead_arguments():
    a = overhead.parser().parse_args([])
    assert (a.workers, a.mode, a.frozen, a.worktree, a.preset) == ([1, 2], "ctl", None, False, "smoke,real")
    a = overhead.parser().parse_args(["--workers", "2", "--mode", "fit", "--frozen", "/tmp/x", "--worktree"])
    assert (a.workers, a.mode, str(a.frozen), a.worktree) == ([2], "fit", "/tmp/x", True)
    assert overhead.parse_workers("1,2,4") == [1, 2, 4]
    for bad in ("0", "1,1", "two", ""):
        with pytest.raises(SystemExit):
            overhead.parser().parse_args(["--workers", bad])
    with pytest.raises(SystemExit):
        overhead.parser().parse_args(["--mode", "ps"])


def test_plain_loops_feed_argument():
    p = plain_loops.parser()
    assert p.parse_args(["native", "10", "2"]).feed == "tfdata"
    assert p.parse_args(["horovod", "10", "2", "--feed", "const"]).feed == "const"
    with pytest.raises(SystemExit):
        p.parse_args(["native", "10", "2", "--feed", "distributed"])


def test_overhead_rotation_puts_each_side_first_in_turn():
    sides = overhead.SIDES
    orders = [overhead.rotation(sides, i) for i in range(len(sides))]
    assert [o[0] for o in orders] == list(sides)
    assert all(sorted(o) == sorted(sides) for o in orders)
    assert orders[1] == [*sides[1:], sides[0]]
    assert overhead.rotation(sides, len(sides)) == orders[0]


def test_overhead_summary_arithmetic():
    reps = [{"twinbench": 90.0, "plain-const": 100.0, "plain-tfdata": 90.0},
            {"twinbench": 80.0, "plain-const": 100.0, "plain-tfdata": 100.0},
            {"twinbench": 99.0, "plain-const": 110.0, "plain-tfdata": 90.0}]
    assert overhead.ratios(reps[0]) == pytest.approx({"plain-const": 0.9, "plain-tfdata": 1.0})
    got = overhead.summary(reps)
    assert got["plain-const"] == pytest.approx((0.9, 0.8, 0.9))  # ratios 0.9, 0.8, 0.9
    assert got["plain-tfdata"] == pytest.approx((1.0, 0.8, 1.1))  # ratios 1.0, 0.8, 1.1
    # the 0.95 target is printed only for the real preset against the plain tf.data loop
    assert "0.95" in overhead.targets("real", "plain-tfdata") and "0.95" not in overhead.targets("real", "plain-const")
    assert "0.95" not in overhead.targets("smoke", "plain-tfdata")
    assert "0.98" in overhead.targets("smoke", "plain-const")


def test_overhead_frozen_copy(tmp_path):
    """--frozen: HEAD's files in the directory (the commit measured is named); --worktree: the working tree's
    (not the ignored .venv); a non-empty directory is refused."""
    head = subprocess.run(["git", "-C", str(overhead.REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert overhead.freeze(tmp_path / "head", worktree=False) == head
    assert (tmp_path / "head" / "bench" / "overhead.py").is_file() and not (tmp_path / "head" / ".venv").exists()
    assert overhead.freeze(tmp_path / "tree", worktree=True).startswith(f"{head} + working tree")
    assert (tmp_path / "tree" / "bench" / "overhead.py").read_text() == Path(overhead.__file__).read_text()
    assert not (tmp_path / "tree" / ".venv").exists()
    with pytest.raises(ValueError, match="not empty"):
        overhead.freeze(tmp_path / "head", worktree=False)


@pytest.mark.distributed
def test_plain_keras3_horovod_loop_two_ranks_and_the_families_benchmark():
    """The Keras 3 floor of bench.overhead runs at 2 ranks (Horovod: grouped allreduce of the tape's gradients,
    broadcast of the TensorFlow variables under Keras 3's: Horovod's tape wrapper would fail on them), and
    bench.keras_families prints a ratio per backend; figures are read, not asserted (sanity bounds only)."""
    proc = run([overhead.HVDRUN, "-np", "2", "-H", "localhost:2", "--gloo", PY, "-m", "bench.plain_loops", "horovod",
                "12", "4", "--set", "keras=3", "--set", "mode=ctl"], env=overhead.bench_env(), timeout=300)
    walls = [json.loads(ln.split(">:", 1)[-1]) for ln in proc.stdout.splitlines() if '"wall"' in ln]
    assert sorted(w["rank"] for w in walls) == [0, 1] and all(0 < w["wall"] < 60 for w in walls), proc.stdout
    fam = run([PY, "-m", "bench.keras_families", "--preset", "smoke", "--workers", "1", "--repeats", "1", "--steps",
               "8", "--warmup", "2"], timeout=600)
    ratios = {line.split(":")[0]: float(line.split("keras3/tf_keras ")[1].split()[0])
              for line in fam.stdout.splitlines() if "keras3/tf_keras" in line}
    assert set(ratios) == {f"1w {kind}" for kind in registry.names()}, fam.stdout
    assert all(0.1 < r < 10 for r in ratios.values()), ratios
    bad = run([PY, "-m", "bench.keras_families", "--repeats", "0"], check=False)
    assert bad.returncode == 2 and "need --repeats >= 1" in bad.stderr


def test_every_started_process_logs_its_cpu_also_when_it_ends_by_os_exit(tmp_path):
    """TWINBENCH_TEST_PROC_LOG (tests/aids/proclog.py): a process the tests start writes its line at a normal exit and
    at ``os._exit`` (how a run ends, common.core.errors.exit_now), naming the test that started it and the CPU it
    burnt; bench.suite_processes sums them per test."""
    env = {**base_env(), "TWINBENCH_TEST_PROC_LOG": str(tmp_path), "PYTEST_CURRENT_TEST": "tests/t.py::burn (call)"}
    burn = "import os, time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
    run([PY, "-c", burn], env=env)
    run([PY, "-c", burn + "os._exit(0)"], env=env)
    lines = suite_processes.load(tmp_path)
    assert len(lines) == 2 and all(suite_processes.test_of(ln) == "tests/t.py::burn" for ln in lines), lines
    assert all(0.3 <= ln["cpu"] < 10 and not ln["tf"] for ln in lines), lines
    assert "tests/t.py::burn      2         0 " in suite_processes.table(lines, suite_processes.test_of, 5)
