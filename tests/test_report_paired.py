"""Runs in rounds on the same nodes (a sweep's allocation, the demo's hosts): the report pairs them
(stats.paired_t_interval, the t interval of the per-round ratios, from 3 rounds) and says so; a simulation shows
why: with a per-round node effect the paired interval is far narrower than the unpaired one, and it covers the true
ratio as a 95% interval should, with or without one (bench/verdict_design.py does the same on a real demo's spread).
Fast: numpy and JSON files, no TensorFlow."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from common.report.load import load_runs
from common.report.stats import paired_t_interval, ratio_interval
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
        v.text.endswith("(6 rounds, paired: every round on the same nodes, t interval of the per-round ratios)"), \
        v.text
    # the same figures on different nodes: unpaired, and the node effect swamps the 3%
    s, q = _ratio(sweep_set(tmp_path / "apart", same_nodes=False))
    assert q.same_nodes == "no" and not q.paired
    assert q.ratio_ci[0] < 1 < q.ratio_ci[1], q.ratio_ci
    text = job_verdicts(s)[0].text
    assert "no significant difference" in text and "paired" not in text
    assert text.endswith("(6 runs each, bootstrap interval of the ratio of medians)"), text


def test_three_paired_rounds_give_a_verdict_two_do_not(tmp_path: Path) -> None:
    s, q = _ratio(sweep_set(tmp_path / "three", rounds=3))
    assert q.paired and q.ratio_ci is not None and 1.0 < q.ratio_ci[0] <= TRUE_RATIO <= q.ratio_ci[1]
    assert job_verdicts(s)[0].text.endswith("(3 rounds, paired: every round on the same nodes, t interval of the "
                                            "per-round ratios)")
    s, q = _ratio(sweep_set(tmp_path / "two", rounds=2))
    assert q.paired and q.ratio_ci is None
    assert "needs 3 paired rounds to say (2 rounds, paired" in job_verdicts(s)[0].text
    # unpaired, three runs a cell give no interval at all
    s, q = _ratio(sweep_set(tmp_path / "three-apart", rounds=3, same_nodes=False))
    assert q.ratio_ci is None and "needs 6 runs per cell to say" in job_verdicts(s)[0].text


def test_runs_outside_slurm_pair_by_their_hosts(tmp_path: Path) -> None:
    # no nodelist (a workstation, the demo): a round's runs on the same hosts pair
    d = sweep_set(tmp_path / "local")
    for p in d.rglob("*.json"):
        p.write_text(p.read_text().replace('"nodelist": "node[1-2]"', '"nodelist": null'))
    s, q = _ratio(d)
    assert q.same_nodes == "every round" and q.paired
    # a round's runs on other hosts do not
    for p in d.rglob("horovod*.json"):
        p.write_text(p.read_text().replace('"hosts": ["n0", "n0"]', '"hosts": ["n7", "n7"]'))
    s, q = _ratio(d)
    assert q.same_nodes == "no" and not q.paired
    # runs with no round at all (one flat directory, no -r<k>): no such column, the unpaired interval as ever
    flat = tmp_path / "flat"
    for i, p in enumerate((tmp_path / "local").rglob("*.json")):
        put(flat, json.loads(p.read_text()), name=f"run{i}.json")
    s, q = _ratio(flat)
    assert q.same_nodes is None and not q.paired


def test_the_demos_round_in_the_file_name_pairs(tmp_path: Path) -> None:
    # scripts/demo.sh names each benchmark run's file ...-r<k>.json in one flat directory
    flat = tmp_path / "demo"
    for p in sweep_set(tmp_path / "sweep").rglob("*.json"):
        rec = json.loads(p.read_text())
        rec["nodelist"] = None
        put(flat, rec, name=f"{p.stem}-20261206T164220Z-f738c1-r{p.parent.name.rsplit('-r', 1)[1]}.json")
    s, q = _ratio(flat)
    assert q.same_nodes == "every round" and q.paired and 1.0 < q.ratio_ci[0]


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


def _simulate(node_sigma: float, noise_sigma: float, trials: int, seed: int, rounds: int = 6,
              unpaired: bool = True) -> dict[str, tuple[float, float]]:
    """Coverage of TRUE_RATIO and median width of both intervals over ``trials`` sweeps: each round's nodes scale
    both backends alike (lognormal ``node_sigma``), each run has its own noise (``noise_sigma``); the unpaired
    interval from 6 runs a cell (it needs 6), the paired one from ``rounds``."""
    rng = np.random.default_rng(seed)
    hits = {"paired": 0, "unpaired": 0}
    widths: dict[str, list[float]] = {"paired": [], "unpaired": []}
    for _ in range(trials):
        node = np.exp(rng.normal(0, node_sigma, 6))
        den = 100 * node * np.exp(rng.normal(0, noise_sigma, 6))
        num = 100 * TRUE_RATIO * node * np.exp(rng.normal(0, noise_sigma, 6))
        for name, ci in (("paired", paired_t_interval(num[:rounds], den[:rounds])),
                         *((("unpaired", ratio_interval(num, den)),) if unpaired else ())):
            assert ci is not None
            hits[name] += ci[0] <= TRUE_RATIO <= ci[1]
            widths[name].append(ci[1] - ci[0])
    return {k: (hits[k] / trials, float(np.median(widths[k]))) for k in hits if widths[k]}


def test_the_paired_interval_is_narrower_with_a_node_effect_and_covers_without() -> None:
    strong = _simulate(node_sigma=0.15, noise_sigma=0.01, trials=300, seed=1)
    three = _simulate(node_sigma=0.15, noise_sigma=0.01, trials=300, seed=3, rounds=3, unpaired=False)
    none = _simulate(node_sigma=0.0, noise_sigma=0.03, trials=300, seed=2, unpaired=False)
    print(f"node effect 15%, noise 1%: coverage / median width paired {strong['paired']} (3 rounds: "
          f"{three['paired']}), unpaired {strong['unpaired']}; no node effect, noise 3%: paired {none['paired']}")
    assert strong["paired"][1] < 0.25 * strong["unpaired"][1]  # the node effect cancels in the pairs
    assert three["paired"][1] < 0.5 * strong["unpaired"][1]  # even from 3 rounds against 6 runs a cell
    # the t interval is exact for normal log ratios: 95% within the binomial margin of 300 trials (+-2.5 points)
    for got in (strong, three, none):
        assert got["paired"][0] >= 0.92, got
    assert strong["unpaired"][0] >= 0.9


def test_a_round_with_one_side_missing_is_left_out_not_the_pairing(tmp_path: Path) -> None:
    # a failed horovod run in round 6: rounds 1-5 still pair; the verdict says what it left out
    d = sweep_set(tmp_path / "failed")
    (victim,) = (d / "horovod-1x2-r6").glob("*.json")
    victim.unlink()
    s, q = _ratio(d)
    assert q.same_nodes == "every round" and q.paired and q.pairs == 5
    assert 1.0 < q.ratio_ci[0] <= TRUE_RATIO <= q.ratio_ci[1]
    assert job_verdicts(s)[0].text.endswith("(5 rounds, paired: every round on the same nodes, t interval of the "
                                            "per-round ratios; 1 run without its pair left out)")
