"""The scaling model's arithmetic against hand-computed values."""

from __future__ import annotations

import re

import pytest

from common.diagnostics.scaling import comm_time, fit_alpha_beta, predict
from common.report.cli import main


def test_fit_recovers_alpha_beta_and_bus_bandwidth():
    alpha, beta = 50e-6, 1e-9  # 50 us, 1 GB/s algorithm bandwidth at 2 ranks
    rows = [{"bytes": b, "time_median": alpha + beta * b} for b in (4096, 65536, 1 << 20, 16 << 20)]
    fit = fit_alpha_beta(rows, n_fit=2)
    assert fit.alpha == pytest.approx(alpha) and fit.beta == pytest.approx(beta)
    assert fit.bus_bandwidth == pytest.approx(1e9)  # 2(n-1)/n = 1 at n = 2
    assert fit.alpha_hop == pytest.approx(25e-6)


def test_ring_bound_and_efficiency():
    fit = fit_alpha_beta([{"bytes": 0, "time_median": 20e-6}, {"bytes": 10**9, "time_median": 20e-6 + 1.0}], 2)
    s = 100e6  # 100 MB of gradients
    # N = 8: 14 hops x 10 us + 2*7/8 * 100 MB / 1 GB/s = 140 us + 0.175 s
    assert comm_time(fit, s, 8) == pytest.approx(140e-6 + 0.175)
    p = predict(0.5, s, fit, 8)
    assert p["step_time"] == pytest.approx(0.5 + 140e-6 + 0.175)
    assert p["efficiency"] == pytest.approx(0.5 / p["step_time"])
    assert comm_time(fit, s, 1) == 0.0
    # fp16 compression halves S: the bandwidth term halves
    assert comm_time(fit, s / 2, 8) - 140e-6 == pytest.approx((comm_time(fit, s, 8) - 140e-6) / 2)


def test_unfittable_inputs():
    assert fit_alpha_beta([{"bytes": 4096, "time_median": 1e-3}], 2) is None
    assert fit_alpha_beta([{"bytes": 1, "time_median": 1.0}, {"bytes": 2, "time_median": 2.0}], 1) is None


# -- the planner (python -m common.planner): the same model, stated or measured inputs -----------------------------
def _plan(capsys, argv: list[str]) -> str:
    from common import planner

    assert planner.main(argv) == 0
    return capsys.readouterr().out


def _step_ms(out: str, n: int) -> float:
    """The predicted step (ms) of the row of ``n`` GPUs in a planner table."""
    m = re.search(rf"^\s+{n}\s+\d+\s+([\d.]+)\s", out, re.M)
    assert m, out
    return float(m.group(1))


def test_planner_stated_parameters_print_a_model_table(capsys):
    # 100 ms compute, 100 MB, 8 Gbit/s = 1 GB/s, 10 us per hop; 8 GPUs on 8 nodes:
    # 14 x 10 us + 1.75 x 0.1 s = 0.14 + 175 ms -> 275.14 ms; 8 x 32 / 0.27514 = 930.4 images/s; 36.3%
    out = _plan(capsys, ["--step-ms", "100", "--grad-bytes", "100e6", "--link-gbits", "8", "--latency-us", "10",
                         "--batch", "32", "--sizes", "1,8"])
    assert "MODEL (predicted, not measured)" in out and "not measurements" in out
    assert re.search(r"^\s+8\s+8\s+275\.14\s+175\.14\s+930\.4\s+36\.3%$", out, re.M), out
    assert _step_ms(out, 1) == 100.0


def test_planner_ring_efficiency_falls_as_n_minus_1_over_n(capsys):
    # one link, no latency: comm = 2(n-1)/n x S / B = 2(n-1)/n x 100 ms (100 MB at 1 GB/s); compute 100 ms
    out = _plan(capsys, ["--step-ms", "100", "--grad-bytes", "100e6", "--link-gbits", "8", "--sizes", "2,4,8,64"])
    hand = {2: 200.0, 4: 250.0, 8: 275.0, 64: 296.875}  # 100 + 200 x (n-1)/n
    for n, step in hand.items():
        assert _step_ms(out, n) == pytest.approx(step, abs=0.005)
    assert "50.0%" in out and "40.0%" in out and "36.4%" in out and "33.7%" in out  # 100 / step


def test_planner_hierarchical_one_node_of_8_beats_two_nodes_of_4(capsys):
    # intra 800 Gbit/s (100 GB/s), inter 8 Gbit/s (1 GB/s), 100 MB, no latency, compute 100 ms
    # 1 x 8: ring inside: 1.75 x 1 ms = 1.75 ms; 2 x 4: 1.5 x 1 ms inside + 1 x 100 ms across = 101.5 ms
    common = ["--step-ms", "100", "--grad-bytes", "100e6", "--link-gbits", "8", "--intra-gbits", "800",
              "--sizes", "8"]
    one = _step_ms(_plan(capsys, [*common, "--gpus-per-node", "8"]), 8)
    two = _step_ms(_plan(capsys, [*common, "--gpus-per-node", "4"]), 8)
    assert one == pytest.approx(101.75) and two == pytest.approx(201.5)
    assert one < two


def test_planner_overlap_hides_communication(capsys):
    # compute 100 ms, comm 175 ms at 8: overlap 1 -> max = 175 ms; 0.5 -> 275 - 50 = 225 ms
    base = ["--step-ms", "100", "--grad-bytes", "100e6", "--link-gbits", "8", "--sizes", "8"]
    assert _step_ms(_plan(capsys, [*base, "--overlap", "1"]), 8) == pytest.approx(175.0)
    assert _step_ms(_plan(capsys, [*base, "--overlap", "0.5"]), 8) == pytest.approx(225.0)


@pytest.mark.parametrize("argv", [["--step-ms", "100"], ["--step-ms", "-1", "--grad-bytes", "1", "--link-gbits", "1"],
                                  ["--step-ms", "1", "--grad-bytes", "1", "--link-gbits", "1", "--overlap", "1.5"],
                                  ["--step-ms", "1", "--grad-bytes", "1", "--link-gbits", "1", "--gpus-per-node", "4",
                                   "--sizes", "6"],
                                  ["--step-ms", "1", "--grad-bytes", "1", "--link-gbits", "1", "--sizes", "x"]])
def test_planner_bad_parameters_one_line_exit_2(capsys, argv):
    from common import planner

    with pytest.raises(SystemExit) as e:
        planner.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("common.planner: error:")


def _measured_dir(tmp_path, breakdown: bool = False):
    from tests.test_report import make_run, put
    from tests.test_report_model import GRAD, bench

    d = tmp_path / "res"
    put(d, make_run("native", 1, 100.0, step=(0.010, 0.012), gradient_bytes=GRAD))
    put(d, make_run("native", 2, 150.0, step=(0.015, 0.016), gradient_bytes=GRAD))
    put(d, bench("native"), name="allreduce-native.json")
    if breakdown:  # serialized: 10 + 8 + 1 ms = 19 ms; the training run took 15 ms: 4 of min(10, 8) ms hidden
        run = make_run("native", 2, 150.0)
        rec = {"schema": run["schema"], "kind": "breakdown", "backend": "native", "world_size": 2, "num_workers": 2,
               "job_hash": run["job_hash"], "job": run["job"], "steps": 10, "timed_steps": 8, "warmup_steps": 2,
               "phases": {"input": 0.0005, "compute": 0.010, "comm": 0.008, "apply": 0.0005, "rest": 0.0},
               "step_time": 0.019, "host_step_time": 0.019, "run_id": "bd"}
        put(d, rec, name="breakdown-native.json")
    return d


def test_planner_from_dir_equals_the_reports_model_at_overlap_0(tmp_path, capsys):
    from common.diagnostics.scaling import fit_alpha_beta
    from tests.test_report_model import ALPHA, BETA, GRAD

    d = _measured_dir(tmp_path)
    out = _plan(capsys, ["--from", str(d), "--sizes", "2,8,64"])
    assert "MODEL (predicted, not measured): native" in out and "overlap 0 assumed" in out
    # the report extrapolates to 4x its largest size unless asked: ask for 64 as the planner was
    assert main([str(d), "--out", str(tmp_path / "o"), "-q", "--no-plots", "--extrapolate-to", "64"]) == 0
    md = (tmp_path / "o" / "report.md").read_text()
    fit = fit_alpha_beta([{"bytes": b, "time_median": ALPHA + BETA * b} for b in (4096, 1 << 20)], 2)
    for n in (8, 64):  # the report's extrapolation row and the planner's row: the same numbers
        p = predict(0.010, GRAD, fit, n)
        assert re.search(rf"^\| {n} \| {p['step_time'] * 1e3:.2f} \|", md, re.M), md
        assert _step_ms(out, n) == pytest.approx(round(p["step_time"] * 1e3, 2))
    assert _step_ms(out, 8) == pytest.approx(24.70)  # hand-computed in tests/test_report_model.py
    # per-GPU batch from the job: throughput printed
    assert "(images/s: give --batch" not in out


def test_planner_from_dir_estimates_overlap_from_a_breakdown(tmp_path, capsys):
    out = _plan(capsys, ["--from", str(_measured_dir(tmp_path, breakdown=True)), "--sizes", "8"])
    assert "overlap 0.50 estimated from the 2-replica breakdown" in out  # (19 - 15) / min(10, 8) = 0.5
    # 8 GPUs: comm 14.70 ms, compute 10 ms: 24.70 - 0.5 x 10 = 19.70 ms
    assert _step_ms(out, 8) == pytest.approx(19.70)
