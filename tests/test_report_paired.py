"""Runs in rounds on the same nodes: the report pairs them (stats.paired_ratio_interval, a bootstrap over rounds)
and says so; a simulation shows why: with a per-round node effect the paired interval is far narrower than the
unpaired one, and without one both cover the true ratio alike. Fast: numpy and JSON files, no TensorFlow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from common.report.load import load_runs
from common.report.stats import paired_ratio_interval, ratio_interval
from common.report.summary import summarize
from common.report.verdict import job_verdicts
from tests.test_report import make_run, put
from tests.test_report_verdict import KEPT_UP

TRUE_RATIO = 1.03  # horovod / native in the simulations and the fixture


def sweep_set(d: Path, *, same_nodes: bool = True, rounds: int = 6) -> Path:
    """A sweep's run directories (<backend>-1x2-r<k>): in round k both backends ran on nodes whose speed is that
    round's (a slow node, another job's traffic), horovod 3% faster than native on the same nodes."""
    speed = [1.00, 0.80, 1.15, 0.90, 1.25, 0.85, 1.05, 0.95][:rounds]
    for k, f in enumerate(speed, 1):
        for i, (backend, base) in enumerate((("native", 100.0), ("horovod", 100.0 * TRUE_RATIO))):
            base *= 1 + 0.002 * ((3 * k + 2 * i) % 5 - 2)  # a run's own noise, +-0.4%
            nodes = "node[1-2]" if same_nodes or backend == "native" else "node[3-4]"
            rec = make_run(backend, 2, base * f, run_id=f"{backend}-r{k}", hosts=["n0", "n0"], nodelist=nodes,
                           input=KEPT_UP)
            put(d / f"{backend}-1x2-r{k}", rec)
    return d


def _ratio(d: Path) -> Any:
    (s,) = summarize(load_runs(d))
    return s, next(q for q in s.ratios if q.world_size == 2)


def test_rounds_on_the_same_nodes_are_paired_and_say_so(tmp_path: Path) -> None:
    s, q = _ratio(sweep_set(tmp_path / "paired"))
    assert q.same_nodes == "every round" and q.paired
    lo, hi = q.ratio_ci
    assert 1.0 < lo <= TRUE_RATIO <= hi < 1.06, q.ratio_ci  # the node effect cancels: a verdict
    (v,) = job_verdicts(s)
    assert v.text.startswith("1 node x 2 ranks: horovod is ") and "faster than native [" in v.text and \
        v.text.endswith("(6 runs each, paired: every round on the same nodes)"), v.text
    # the same figures on different nodes: unpaired, and the node effect swamps the 3%
    s, q = _ratio(sweep_set(tmp_path / "apart", same_nodes=False))
    assert q.same_nodes == "no" and not q.paired
    assert q.ratio_ci[0] < 1 < q.ratio_ci[1], q.ratio_ci
    assert "no significant difference" in job_verdicts(s)[0].text and "paired" not in job_verdicts(s)[0].text
    # runs outside a sweep (no nodes recorded): no such column, the unpaired interval as ever
    s, q = _ratio(sweep_set(tmp_path / "local", same_nodes=True, rounds=6))
    assert q.paired
    for p in (tmp_path / "local").rglob("*.json"):
        p.write_text(p.read_text().replace('"nodelist": "node[1-2]"', '"nodelist": null'))
    s, q = _ratio(tmp_path / "local")
    assert q.same_nodes is None and not q.paired


def test_report_tables_say_same_nodes(tmp_path: Path) -> None:
    from common.report.build import ReportOptions, build_report

    d = sweep_set(tmp_path / "sweep")
    build_report([d], tmp_path / "out", ReportOptions(plots=False))
    md = (tmp_path / "out" / "report.md").read_text()
    header = next(ln for ln in md.splitlines() if ln.startswith("| replicas | layout | native"))
    assert header.rstrip(" |").endswith("same nodes")
    row = next(ln for ln in md.splitlines() if ln.startswith("| 2 | 1x2 |"))
    assert row.endswith("| every round (paired) |"), row
    assert "the interval is paired" in md  # the Method section says which and why
    assert "every round (paired)" in (tmp_path / "out" / "report.html").read_text()


def _simulate(node_sigma: float, noise_sigma: float, trials: int, seed: int) -> dict[str, tuple[float, float]]:
    """Coverage of TRUE_RATIO and median width of both intervals over ``trials`` sweeps of 6 rounds: each round's
    nodes scale both backends alike (lognormal ``node_sigma``), each run has its own noise (``noise_sigma``)."""
    rng = np.random.default_rng(seed)
    hits = {"paired": 0, "unpaired": 0}
    widths: dict[str, list[float]] = {"paired": [], "unpaired": []}
    for _ in range(trials):
        node = np.exp(rng.normal(0, node_sigma, 6))
        den = 100 * node * np.exp(rng.normal(0, noise_sigma, 6))
        num = 100 * TRUE_RATIO * node * np.exp(rng.normal(0, noise_sigma, 6))
        for name, ci in (("paired", paired_ratio_interval(num, den)), ("unpaired", ratio_interval(num, den))):
            assert ci is not None
            hits[name] += ci[0] <= TRUE_RATIO <= ci[1]
            widths[name].append(ci[1] - ci[0])
    return {k: (hits[k] / trials, float(np.median(widths[k]))) for k in hits}


def test_the_paired_interval_is_narrower_with_a_node_effect_and_covers_alike_without() -> None:
    strong = _simulate(node_sigma=0.15, noise_sigma=0.01, trials=150, seed=1)
    none = _simulate(node_sigma=0.0, noise_sigma=0.03, trials=150, seed=2)
    print(f"node effect 15%, noise 1%: coverage / median width paired {strong['paired']}, unpaired "
          f"{strong['unpaired']}; no node effect, noise 3%: paired {none['paired']}, unpaired {none['unpaired']}")
    assert strong["paired"][1] < 0.25 * strong["unpaired"][1]  # the node effect cancels in the pairs
    assert strong["paired"][0] >= 0.85 and strong["unpaired"][0] >= 0.85
    assert abs(none["paired"][0] - none["unpaired"][0]) <= 0.08  # no node effect: pairing costs no coverage
    assert none["paired"][0] >= 0.85
