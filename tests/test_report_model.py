"""The report's allreduce section and scaling model, checked against hand-computed numbers."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from common.report.build import ReportOptions, build_report
from common.report.cli import main
from common.report.load import load_runs
from tests.test_report import make_run, put, record

ALPHA, BETA = 100e-6, 2e-9  # fitted exactly from these: 100 us + bytes x 2 ns (0.5 GB/s algbw at 2 ranks)
GRAD = 4_000_000  # gradient bytes per step


def bench(backend: str) -> dict:
    rows = [{"bytes": b, "time_median": ALPHA + BETA * b, "time_p95": ALPHA + BETA * b,
             "algbw_GBps": b / (ALPHA + BETA * b) / 1e9, "busbw_GBps": b / (ALPHA + BETA * b) / 1e9}
            for b in (4096, 1 << 20, 16 << 20)]
    return {"schema": 2, "kind": "allreduce", "backend": backend, "world_size": 2, "num_workers": 2,
            "rows": rows,
            "hosts": ["n0", "n1"], "run_id": f"ar-{backend}", "backend_info": {"communication": "ring"}}


def test_model_and_allreduce_sections(tmp_path: Path):
    d = tmp_path / "res"
    for b in ("native", "horovod"):
        put(d, make_run(b, 1, 100.0, step=(0.010, 0.012), gradient_bytes=GRAD))
        put(d, make_run(b, 2, 150.0, step=(0.015, 0.016), gradient_bytes=GRAD))
        put(d, bench(b), name=f"allreduce-{b}.json")
    out = tmp_path / "out"
    assert main([str(d), "--out", str(out), "-q"]) == 0
    md = (out / "report.md").read_text()
    assert "## Allreduce microbenchmark" in md and (out / "allreduce_busbw.png").read_bytes()[:4] == b"\x89PNG"
    # fit: hop latency = alpha / 2 = 50 us; B = 1/beta (2(n-1)/n = 1) = 0.5 GB/s
    assert "latency 100.0 us (50.00 us per ring hop), bus bandwidth 0.500 GB/s" in md
    # N = 2: 10 ms + 2 x 50 us + 1 x 4 MB / 0.5 GB/s = 10 + 0.1 + 8 = 18.10 ms; efficiency 10 / 18.1 = 55.2%
    row2 = re.search(r"^\| 2 \| 15\.00 \| 18\.10 \| 75\.0% \| 55\.2% \|$", md, re.M)
    assert row2, md
    # N = 8: 10 + 14 x 0.05 + 1.75 x 8 = 10 + 0.7 + 14 = 24.70 ms, allreduce 14.70 ms, efficiency 40.5%
    assert re.search(r"^\| 8 \| 24\.70 \| 14\.70 \| 40\.5% \|$", md, re.M), md
    assert md.count("MODEL, not measured") == 2  # one extrapolation per backend, labelled
    # the allreduce JSONs are not training runs: the scaling table still has exactly 4 rows
    assert build_report(d, out, options=ReportOptions(plots=False)).summaries[0].rows.__len__() == 4


def test_model_missing_inputs_are_said_plainly(tmp_path: Path):
    d = tmp_path / "res"
    put(d, make_run("native", 2, 150.0, gradient_bytes=GRAD))
    put(d, bench("native"), name="allreduce-native.json")
    out = tmp_path / "out"
    assert main([str(d), "--out", str(out), "-q", "--no-plots"]) == 0
    assert "native: no model (a 1-replica run missing)" in (out / "report.md").read_text()


@pytest.mark.parametrize("said", [{"backend_info": {"compression": "fp16"}},  # a file from before capabilities
                                  {"backend_info": {}, "capabilities": {"compression": "fp16"}}])
def test_fp16_compression_is_stated(tmp_path: Path, said: dict[str, Any]):
    d = tmp_path / "res"
    for ws in (1, 2):
        put(d, make_run("horovod", ws, 100.0 * ws, gradient_bytes=GRAD // 2, **said))
    put(d, bench("horovod"), name="allreduce-horovod.json")
    assert main([str(d), "--out", str(tmp_path / "o"), "-q", "--no-plots"]) == 0
    md = (tmp_path / "o" / "report.md").read_text()
    assert f"S = {GRAD // 2:,} (fp16 compression: half of float32)" in md


@pytest.mark.parametrize("bad", [{"rows": "x"}, {"world_size": "2"}])
def test_incomplete_allreduce_json_is_skipped(tmp_path: Path, bad, capsys):
    d = tmp_path / "res"
    put(d, make_run("native", 1, 100.0))
    b = bench("native")
    b.update(bad)
    (d / "allreduce-bad.json").write_text(json.dumps(b))
    assert main([str(d), "--out", str(tmp_path / "o"), "-q", "--no-plots"]) == 0
    assert "incomplete allreduce benchmark" in capsys.readouterr().err


def test_the_report_reads_the_typed_capabilities_and_only_displays_backend_info(tmp_path) -> None:
    """A record with ``capabilities`` is labelled and modelled from it alone, whatever its backend_info says (free
    provenance); an older file without the block still reads as before (tests/test_strategies.py, test_knobs.py)."""
    from common.core.results import AllreduceRecord
    from common.report.model import allreduce_part
    from common.report.render import markdown
    from common.report.summary import row_label

    def format_allreduce(benches: list[AllreduceRecord]) -> str:
        return markdown(allreduce_part(benches))

    def caps(**kw: Any) -> dict[str, Any]:
        return {"controller": None, "compression": "none", "input_path": "per-worker", "variant": None,
                "asynchronous": False, "every_rank_writes_checkpoint": True, **kw}

    misleading = {"strategy": "MirroredStrategy", "asynchronous": True, "compression": "fp16"}
    plain = record("native", 2, 1.0, backend_info=misleading, capabilities=caps())
    assert row_label(plain) == "native"
    assert row_label(record("native", 2, 1.0, backend_info={}, capabilities=caps(variant="central_storage"))) \
        == "native (central_storage)"
    ps = make_run("native", 2, 1.0, backend_info={}, capabilities=caps(variant="parameter_server", asynchronous=True))
    put(tmp_path, ps)
    [loaded] = load_runs(tmp_path)
    assert loaded.record.asynchronous is True
    assert row_label(loaded.record) == "native (parameter_server, asynchronous)"
    bench = AllreduceRecord(backend="horovod", world_size=2, hosts=["a"], rows=[], backend_info={"controller": "x"},
                            collective={"requested": "auto", "used": "gloo", "reason": "r"}, capabilities=caps())
    assert "### horovod, 2 ranks (gloo; hosts" in format_allreduce([bench])
    old = {"schema": 2, "kind": "allreduce", "backend": "native", "world_size": 2, "hosts": ["a"], "rows": [],
           "backend_info": {"communication": "ring"}}  # schema 2, before the collective block
    assert "### native, 2 ranks (ring; hosts" in format_allreduce([AllreduceRecord.from_dict(old)])
    assert AllreduceRecord.from_dict({**old, "schema": 3}).collective_used is None  # schema 3 reads its own block


def test_a_measured_step_above_the_no_overlap_bound_is_flagged(tmp_path: Path) -> None:
    """The model's step is an upper bound (no overlap): a measured step above it means the model misses a cost."""
    d = tmp_path / "res"
    for b, step2 in (("native", 0.0332), ("horovod", 0.015)):  # predicted at 2 replicas: 18.10 ms (see above)
        put(d, make_run(b, 1, 100.0, step=(0.010, 0.012), gradient_bytes=GRAD))
        put(d, make_run(b, 2, 150.0, step=(step2, step2), gradient_bytes=GRAD))
        put(d, bench(b), name=f"allreduce-{b}.json")
    assert main([str(d), "--out", str(tmp_path / "o"), "-q", "--no-plots"]) == 0
    md = (tmp_path / "o" / "report.md").read_text()
    flagged = [p for p in md.split("\n\n") if p.startswith("**Measured above the model's upper bound**")]
    assert len(flagged) == 1 and "2 replicas: 33.20 ms measured vs 18.10 ms" in flagged[0]  # native only
    assert "misses a cost" in flagged[0] and "optimistic" in flagged[0]
    assert md.index("### Model: native") < md.index(flagged[0]) < md.index("### Model: horovod")


# -- the breakdown's comparison: a phase difference only with repeats and an interval that excludes zero ----------
def _breakdowns(backend: str, comm_ms: list[float], compute_ms: list[float]) -> list[Any]:
    from common.core.results import BreakdownRecord

    out = []
    for k, (comm, compute) in enumerate(zip(comm_ms, compute_ms)):
        phases = {"input": 0.2e-3, "compute": compute * 1e-3, "comm": comm * 1e-3, "apply": 0.1e-3, "rest": 0.5e-3}
        out.append(BreakdownRecord(
            backend=backend, world_size=2, num_workers=2, job_hash="h", job={"name": "j"}, steps=100,
            timed_steps=90, warmup_steps=10, phases=phases, step_time=sum(phases.values()),
            host_step_time=sum(phases.values()), run_id=f"{backend}{k}"))
    return out


def test_one_breakdown_run_compares_nothing() -> None:
    from common.report.model import difference_sentence

    # the case: one run each, 75 ms apart in compute on a loaded machine
    h, n = _breakdowns("horovod", [5.0], [207.87]), _breakdowns("native", [5.0], [283.51])
    text = difference_sentence(h, n)
    assert text.startswith("at 2 replicas horovod vs native: one run: no comparison"), text
    assert "spends" not in text and "less" not in text
    text = difference_sentence(h * 3, n * 3)
    assert text.startswith("at 2 replicas horovod vs native: 3 runs each: no comparison"), text
    assert "one run of horovod, 6 of native" in difference_sentence(h, n * 6)
    assert "spends" not in difference_sentence(h, n * 6)


def test_repeated_breakdowns_state_only_the_phase_whose_interval_excludes_zero() -> None:
    from common.report.model import difference_sentence

    # comm: horovod 1.9 ms against native 2.7 ms in every run (a real difference); compute: the same spread on both
    noise = [100.0, 130.0, 95.0, 120.0, 105.0, 140.0]
    h = _breakdowns("horovod", [1.9, 1.95, 1.85, 1.9, 2.0, 1.88], noise)
    n = _breakdowns("native", [2.7, 2.75, 2.65, 2.72, 2.8, 2.68], noise[::-1])
    text = difference_sentence(h, n)
    assert text.startswith("at 2 replicas horovod spends 0.81 ms less per step than native in gradient "
                           "communication (1.90 vs 2.71 ms, difference ["), text
    assert "no significant difference in input, compute, the optimizer update, the rest" in text
    assert "6 runs each" in text
    lo, hi = (float(x) for x in re.search(r"difference \[([-+.\d]+), ([-+.\d]+)\] ms", text).groups())
    assert lo < hi < 0
    # the same compute spread alone: no phase differs, whatever the medians say
    same = difference_sentence(_breakdowns("horovod", [2.0] * 6, noise), _breakdowns("native", [2.0] * 6,
                                                                                      [x + 8 for x in noise]))
    assert same.startswith("at 2 replicas no phase differs significantly between horovod and native (6 runs each"), \
        same
