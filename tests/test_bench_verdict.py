"""bench/verdict_design.py's fit and simulation on a synthetic demo (no TensorFlow): the images/s a run would have
reported at fewer steps is read from its sync marks, a pair's shared drift is told from each run's own noise, and
the printed table has every design. Fast: 100 simulated demos."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench import verdict_design as vd
from tests.test_report import make_run, put


def demo_dir(d: Path, rounds: int = 6, seed: int = 0) -> Path:
    """A demo's runs: horovod 10% slower at 2 replicas, each round's load shared by both backends of a size (sd 8%),
    1% of a run's own; 128 images a step; a sync mark every 25 steps to 200."""
    rng = np.random.default_rng(seed)
    base = {("native", 1): 7000.0, ("horovod", 1): 7000.0, ("native", 2): 7000.0, ("horovod", 2): 6300.0}
    for k in range(rounds):
        load = {1: np.exp(rng.normal(0, 0.08)), 2: np.exp(rng.normal(0, 0.08))}
        for (backend, n), ips in base.items():
            rate = ips * load[n] * np.exp(rng.normal(0, 0.01))
            step = 128 * n / rate
            marks = [[[s, 1.0 + (s - 10) * step if s >= 10 else 0.1 * s] for s in (0, 1, 10, *range(25, 201, 25))]
                     for _ in range(n)]
            rec = make_run(backend, n, rate, run_id=f"{backend}-{n}-{k}", global_batch_size=128 * n, steps=200,
                           per_rank_sync_marks=marks, timed_wall_time=190 * step,
                           started_at=f"2026-12-06T16:{10 + k:02d}:{10 * n + (backend == 'horovod'):02d}+00:00",
                           finished_at=f"2026-12-06T16:{10 + k:02d}:{10 * n + 8 + (backend == 'horovod'):02d}+00:00")
            put(d, rec)
    return d


def test_fit_reads_fewer_steps_from_the_marks_and_tells_drift_from_noise(tmp_path: Path) -> None:
    d = demo_dir(tmp_path / "demo")
    (first,) = [r.record for r in vd.load_runs(d, warn=lambda m: None) if r.record.run_id == "native-1-0"]
    assert vd.ips_at(first, 200) == pytest.approx(first.images_per_sec)  # the whole run: its own figure
    assert vd.ips_at(first, 100) == pytest.approx(first.images_per_sec)  # a steady rate: the same at 100 steps
    assert vd.ips_at(first, 110) is None  # no mark there
    f = vd.fit(d, None)
    assert f.rounds == 6 and set(f.sigma) == {50, 100, 200}
    assert 0.03 < f.drift[2] < 0.2  # the shared load, fitted from 6 rounds
    assert f.sigma[200].max() < 0.03  # each run's own noise, small
    h, n = vd._pair(2)
    assert np.exp(f.mu[200][h] - f.mu[200][n]) == pytest.approx(0.9, abs=0.03)


def test_main_prints_every_design_and_refuses_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = demo_dir(tmp_path / "demo")
    assert vd.main([str(d), "--sims", "100"]) == 0
    out = capsys.readouterr().out
    for design in ("today: 6 rounds, unpaired bootstrap", "paired t, 3 rounds", "welch t, 4 rounds",
                   "paired t, looks 3,4 alpha 0.01/0.04"):
        assert design in out, design
    assert out.count("\nnoise ") == 2  # normal, then Student t
    assert "wall per run (s): native 1: " in out and " -" not in out.split("bench s")[1].split("|")[0]
    assert vd.main([str(tmp_path / "missing")]) == 2
    assert vd.main([str(d), "--sims", "10"]) == 2
