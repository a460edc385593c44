"""One allocation on the emulated 2-node cluster (tests/cluster/cluster.sh): ``common.sweep submit --one-allocation``
submits one sbatch job that runs 2 rounds of both backends at world size 2 on one node (1x2) and across both
(2x1) as job steps (srun inside the job); every run finishes, every record names that job, its own step and its
nodes, and in every round the two backends of a layout ran on the same nodes, which the report says ("every round
(paired)" per layout, "paired" in the verdict). Two rounds prove the pairing as three would (the report pairs any
number of rounds; the paired interval, which needs 6, is tests/test_report_paired.py's), and 1x2 is the one-node
layout (a 1x1 run adds no other node; that size 1 has only that layout is tests/test_sweep_layout.py's).

The same sweep proves what ``--nodes 1,2`` does to a sweep's runs (tests/test_cluster_runs.py's sweep, one sbatch job
per run, runs 2x2 only): size 2 once on one node and once across both, in the seeded shuffled order the manifest
records, both backends and both layouts computing the same per-step losses, and the report's 1x2 and 2x1 rows kept
apart for each backend (the plan's per-run resources of each layout: tests/test_sweep_layout.py).
8 runs of 2 ranks; the suite's emulated cluster (`emu`, tests/cluster/emulated.py)."""

from __future__ import annotations

import json
import os
import re

import pytest

from common.report.build import load_set
from common.report.cli import main as report
from common.report.summary import summarize
from common.sweep.order import interleave
from tests.cluster.emulated import JOB_TIMEOUT, Emulated
from tests.conftest import PY, SMOKE, base_env, same_losses

pytestmark = pytest.mark.distributed
ROUNDS = 2  # "every round" means more than one round; more add nothing to the proof
SEED = 3  # the rounds' seeded shuffle: the manifest records an interleaved order, not size-major
NODELISTS = {"1x2": "node1", "2x1": "node[1-2]"}  # the first n nodes of the allocation
HOSTS = {"1x2": ["node1", "node1"], "2x1": ["node1", "node2"]}  # each rank's host, in rank order
BACKENDS = ("native", "horovod")


def test_one_sbatch_runs_every_round_of_both_backends_on_the_same_nodes(emu: Emulated):
    out = emu.dir / f"alloc-{os.getpid()}"  # the cluster may outlive this session (a suite-wide one)
    env = base_env()
    emu.run("login", PY, "-m", "common.sweep", "submit", "--job", SMOKE, "--sizes", "2", "--nodes", "1,2",
            "--backends", ",".join(BACKENDS), "--results", str(out), "--gres-per-node", "2", "--cpus-per-task", "1",
            "--time", "00:03:00", "--repeats", str(ROUNDS), "--order-seed", str(SEED), "--one-allocation",
            "--backend-arg=--quiet", env=env, timeout=120)
    manifest = json.loads((out / "sweep-manifest.json").read_text())
    jobs = {r["job_id"] for r in manifest["runs"]}
    assert len(manifest["runs"]) == 4 * ROUNDS and len(jobs) == 1  # one Slurm job instead of 8
    cells = [f"{b}-{lay}" for lay in NODELISTS for b in BACKENDS]
    assert manifest["cells"] == cells
    assert [(o["cell"], o["round"] - 1) for o in manifest["order"]] == interleave(cells, ROUNDS, SEED) != [
        (c, r) for r in range(ROUNDS) for c in cells], "the submission order is the seeded shuffle, not size-major"
    assert [r["cell"] for r in manifest["runs"]] == [o["cell"] for o in manifest["order"]]
    status = emu.run("login", PY, "-m", "common.sweep", "status", str(out), "--wait", str(JOB_TIMEOUT * 4), "--poll",
                     "2", env=env, check=False, timeout=JOB_TIMEOUT * 4 + 60)
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1200:]}" for p in sorted((out / "logs").glob("*")))
    assert status.returncode == 0, status.stdout + status.stderr + logs

    records = {}
    for run in manifest["runs"]:
        files = [p for p in (out / run["results_dir"]).glob("*.json") if not p.name.startswith(".")]
        assert len(files) == 1, run["name"]
        records[run["name"]] = json.loads(files[0].read_text())
    job = jobs.pop()
    assert {r["slurm_job"] for r in records.values()} == {job}
    assert len({r["slurm_step"] for r in records.values()}) == 4 * ROUNDS  # a job step each
    for run in manifest["runs"]:
        rec = records[run["name"]]
        assert rec["nodelist"] == NODELISTS[run["layout"]], (run["name"], rec["nodelist"])
        assert rec["world_size"] == 2 and rec["weights_consistent"], run["name"]
        assert rec["hosts"] == HOSTS[run["layout"]], (run["name"], rec["hosts"])
        assert rec["topology"]["cross_size"] == len(set(HOSTS[run["layout"]])), run["name"]
    for rnd in range(1, ROUNDS + 1):
        for layout in NODELISTS:
            pair = [records[f"{b}-{layout}-r{rnd}"] for b in BACKENDS]
            assert pair[0]["nodelist"] == pair[1]["nodelist"] and pair[0]["hosts"] == pair[1]["hosts"]
            assert same_losses(dict(zip(BACKENDS, pair))) is None, (layout, rnd)
    size2 = {f"{b} {lay}": records[f"{b}-{lay}-r1"] for b in BACKENDS for lay in NODELISTS}
    assert same_losses(size2) is None, same_losses(size2)  # and across the two layouts
    steps = [int(records[r["name"]]["slurm_step"]) for r in manifest["runs"]]
    assert steps == sorted(steps)  # in the sweep's interleaved order
    [s] = summarize(load_set([out], warn=lambda _m: None))
    rows = {(r.identity.plain, r.identity.world_size, r.identity.layout) for r in s.rows}  # labels add "[2 nodes]"
    assert rows == {(b, 2, lay) for lay in NODELISTS for b in BACKENDS}, rows
    # the report pairs each round's two runs: same nodes for every size, "paired" in every verdict line
    assert report([str(out), "--out", str(out / "report"), "--no-plots", "-q"]) == 0
    md = (out / "report" / "report.md").read_text()
    for layout in NODELISTS:
        nodes, per_node = map(int, layout.split("x"))
        row = next(ln for ln in md.splitlines() if ln.startswith(f"| {nodes * per_node} | {layout} |"))
        assert "| every round (paired) |" in row, row
    verdicts = [ln for ln in md.splitlines() if re.match(r"- \d+ nodes? x \d+ ranks?", ln)]
    assert len(verdicts) == len(NODELISTS), verdicts
    assert all("paired: every round on the same nodes" in v for v in verdicts), verdicts
