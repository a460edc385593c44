"""The README's main command (`make demo` = scripts/demo.sh after set-up) works end to end on this machine.

One round of real runs (REPEATS=1, 20 steps): every cell, diagnostic, benchmark and the parity check once. The
repeat path is proven without TensorFlow on the same script: paired rounds named -r<k> and their rows labelled
"min-max (n=2)" (tests/test_demo_finishes.py, REPEATS=2), the rounds' order (tests/test_demo_until.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, base_env

pytestmark = pytest.mark.distributed


def test_demo_compares_both_backends_and_reports(tmp_path):
    env = base_env()
    env["OUT"] = str(tmp_path / "demo")
    env["REPEATS"] = "1"  # one round of real runs; the repeat path: tests/test_demo_finishes.py (no TensorFlow)
    env["STEPS"] = "20"  # 10 timed steps after the 10 untimed warm-up ones
    # what a centre's shell may hold: a secret and a home path in TF_* variables that are Terraform's, not TF's,
    # beside a variable that tunes a collective library
    env.update(TF_VAR_db_password="hunter2-not-published", TF_CLI_CONFIG_FILE=f"{Path.home()}/.terraformrc",
               NCCL_SOCKET_IFNAME="lo")
    proc = subprocess.run(["bash", "scripts/demo.sh"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = [json.loads(p.read_text()) for p in (tmp_path / "demo").glob("*.json")]
    train = sorted((r["backend"], r["world_size"]) for r in runs if r["kind"] == "train")
    assert train == [("horovod", 1), ("horovod", 2), ("native", 1), ("native", 2)]
    assert {r["steps"] for r in runs if r["kind"] == "train"} == {20}
    assert len({r["job_hash"] for r in runs if r["kind"] == "train"}) == 1
    # the breakdown runs the benchmark's job (same mode, same hash): the planner finds its overlap
    assert {r["job_hash"] for r in runs if r["kind"] == "breakdown"} == {r["job_hash"] for r in runs
                                                                        if r["kind"] == "train"}
    # the printed output ends with the verdict, one line per layout
    assert [ln.split(":")[0] for ln in proc.stdout.rstrip().splitlines()[-2:]] == ["  1 node x 1 rank",
                                                                                   "  1 node x 2 ranks"]
    assert sorted(r["backend"] for r in runs if r["kind"] == "allreduce") == ["horovod", "native"]
    # the printed table has a row per backend x world size (one host: layout 1 x ws), and the report names its plots
    for backend in ("native", "horovod"):
        for ws in (1, 2):
            row = next(ln for ln in proc.stdout.splitlines()
                       if ln.startswith(f"| {backend} | {ws} | 1x{ws} | {ws} | 1 |"))
            assert "n=1, no interval" in row  # one repeat: no range claimed, and said so
    md = (tmp_path / "demo" / "report" / "report.md").read_text()
    assert "## Scaling model" in md and "MODEL, not measured" in md
    assert "data:image/png;base64," in (tmp_path / "demo" / "report" / "report.html").read_text()
    assert (tmp_path / "demo" / "report" / "allreduce_busbw.png").stat().st_size > 1000
    # the step-time breakdown (diagnostic runs) of both backends at 1 and 2 workers, with its bar chart
    diag = sorted((r["backend"], r["world_size"]) for r in runs if r["kind"] == "breakdown")
    assert diag == [("horovod", 1), ("horovod", 2), ("native", 1), ("native", 2)]
    assert "## Step-time breakdown" in md and "DIAGNOSTIC" in md
    assert [p.stat().st_size > 1000 for p in (tmp_path / "demo" / "report").glob("breakdown_*.png")] == [True]
    # the parity check of the demo's job (4 short runs under demo/check/, never read as benchmark runs: the train
    # runs above are the 4 of the cells) answers every row of the leave-Horovod table, as the job that was timed
    part = md[md.index("## Can this job leave horovod"):]
    assert "| same math |  |  | yes: 2 pairs agree to 1e-05" in part and "(common.check of this job, " in part
    rows = [ln for ln in part.splitlines() if ln.startswith(("| scales exactly:", "| fit = custom loop |"))]
    assert len(rows) == 2 and not any("not checked" in r for r in rows), rows
    assert sorted(p.name for p in (tmp_path / "demo" / "check").iterdir()) == [
        "check.json", "horovod-ctl-n1", "horovod-ctl-n2", "native-ctl-n1", "native-ctl-n2"]
    # published files: the tuning variable is recorded, the secret, Terraform's variables and the home directory are not
    assert all(r["tuning"]["env"].get("NCCL_SOCKET_IFNAME") == "lo" for r in runs if r["kind"] == "train")
    published = [p for p in (tmp_path / "demo").rglob("*") if p.suffix in (".json", ".md", ".html", ".csv")]
    assert len(published) >= 15, published
    for p in published:
        text = p.read_text()
        for private in ("hunter2-not-published", "TF_VAR_", "TF_CLI_CONFIG_FILE", str(Path.home()) + "/"):
            assert private not in text, f"{p.name} holds {private!r}"


@pytest.mark.parametrize("var,value", [("REPEATS", "0"), ("REPEATS", "x"), ("STEPS", "5")])
def test_demo_refuses_bad_settings(tmp_path, var, value):
    env = base_env()
    env.update(OUT=str(tmp_path / "demo"), **{var: value})
    proc = subprocess.run(["bash", "scripts/demo.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and var in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "demo").exists()
