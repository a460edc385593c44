"""The scaling model's arithmetic against hand-computed values."""

from __future__ import annotations

import pytest

from common.diagnostics.scaling import comm_time, fit_alpha_beta, predict


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
