"""Allreduce microbenchmark on both backends (2 ranks, small sizes) and its bandwidth arithmetic."""

from __future__ import annotations

import json
import re

import pytest

from common.bench import bus_factor, parse_sizes
from tests.conftest import BIN, PY, run

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
def test_overhead_benchmark_runs_both_backends():
    """bench/overhead.py is a benchmark, not a timed test: this only checks that it runs and prints its figures
    (both plain loops and both twinbench runs finish, ratios are finite), so it does not rot unnoticed; with the
    ranks bound, the path that needs both sides bound alike."""
    proc = run([PY, "-m", "bench.overhead", "--preset", "smoke", "--repeats", "1", "--steps", "30", "--warmup", "5",
                "--cpu-bind", "cores"], timeout=600)
    ratios = {}
    for line in proc.stdout.splitlines():
        if "median ratio twinbench/plain" in line:
            ratios[line.split(":")[0]] = float(line.split("=")[1].split()[0])
    assert set(ratios) == {"smoke native", "smoke horovod"}, proc.stdout
    # Sanity only (a broken run gives 0, inf or an exception); the >= 0.98 target is judged by reading the figures.
    assert all(0.2 < r < 5 for r in ratios.values()), ratios
    assert "smoke: tax difference native - horovod" in proc.stdout


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
