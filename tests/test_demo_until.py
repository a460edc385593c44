"""scripts/demo.sh's UNTIL=5% loop, with every benchmark run replaced by tests/fake_demo_run.py (a fake
venv whose python answers ``-m backends command`` with it, and writes each command it was asked for to
commands.txt; ``-m common.check``, the demo's parity check, is the same script's ``check``, its command in
check_commands.txt): fast, no TensorFlow. And its bad settings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, base_env
from tests.test_report import make_run

HOSTS = ["native 1", "horovod 1", "native 2", "horovod 2"]  # the demo's cells: sizes 1, 2, registry order


def fake_demo(tmp_path: Path, **settings: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)  # a second demo in the same folder: the same fake venv
    (venv / "bin" / "python").write_text(f"""#!/usr/bin/env bash
if [[ $1 == -m && $2 == backends && $3 == command ]]; then
  echo "${{*:4}}" >> {tmp_path / "commands.txt"}
  printf '%s\\n' {sys.executable} {REPO / "tests" / "fake_demo_run.py"} "${{@:4}}"; exit 0
fi
if [[ $1 == -m && $2 == common.check ]]; then
  echo "${{*:3}}" >> {tmp_path / "check_commands.txt"}
  exec {sys.executable} {REPO / "tests" / "fake_demo_run.py"} check "${{@:3}}"
fi
exec {sys.executable} "$@"
""")
    (venv / "bin" / "python").chmod(0o755)
    template = tmp_path / "template.json"
    template.write_text(json.dumps(make_run("native", 1, 100.0)))
    env = base_env()
    env.update(VENV=str(venv), OUT=str(tmp_path / "demo"), FAKE_DEMO_TEMPLATE=str(template), **settings)
    proc = subprocess.run(["bash", "scripts/demo.sh"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    return proc, tmp_path / "demo"


def test_until_adds_interleaved_rounds_and_stops_at_six_when_every_cell_is_tight(tmp_path: Path) -> None:
    proc, out = fake_demo(tmp_path, UNTIL="5%", REPEATS="2", MAX_REPEATS="8")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[demo] every cell within 5% of its median after 6 repeats" in proc.stdout
    assert [ln for ln in proc.stdout.splitlines() if ln.startswith("[demo] round")][0].startswith(
        "[demo] round 3 (not yet within 5%: native 1 replica (1x1) 2 of 6 runs")
    order = (out / "order.txt").read_text().splitlines()
    forward = [f"{b} {n}" for n in (1, 2) for b in ("native", "horovod")]
    assert order == (forward + forward[::-1]) * 3, "the rounds alternate forward and reverse, as the REPEATS rounds"
    assert sorted(p.name for p in (out / "logs").glob("until-r*.log")) == [f"until-r{r}.log" for r in range(2, 7)]
    assert (out / "logs" / "native-2-r6.log").is_file() and (out / "report" / "report.md").is_file()


def test_until_stops_at_the_cap_and_names_the_wide_cell(tmp_path: Path) -> None:
    proc, out = fake_demo(tmp_path, UNTIL="0.05", REPEATS="1", MAX_REPEATS="7", FAKE_DEMO_SPREAD="native 2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = [ln for ln in proc.stdout.splitlines() if ln.startswith("[demo] stopped")]
    assert last == ["[demo] stopped at the cap of 7 repeats, not every cell within 5% of its median: "
                    "native 2 replicas (2x1) 50.0% wide"]  # 80 x 4, 120 x 3: median 80, CI [80, 120]
    assert len((out / "order.txt").read_text().splitlines()) == 4 * 7


@pytest.mark.parametrize("settings", [{"UNTIL": "5"}, {"UNTIL": "0%"}, {"UNTIL": "abc"}, {"MAX_REPEATS": "8"},
                                      {"UNTIL": "5%", "MAX_REPEATS": "x"}, {"UNTIL": "5%", "MAX_REPEATS": "5"},
                                      {"UNTIL": "5%", "REPEATS": "9", "MAX_REPEATS": "8"}])
def test_demo_refuses_bad_until_settings(tmp_path: Path, settings: dict[str, str]) -> None:
    env = base_env()
    env.update(OUT=str(tmp_path / "demo"), **settings)
    proc = subprocess.run(["bash", "scripts/demo.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert ("UNTIL" if "MAX_REPEATS" not in settings else "MAX_REPEATS") in proc.stderr
    assert not (tmp_path / "demo").exists() and proc.stdout == ""


def test_default_demo_runs_four_paired_rounds_and_its_verdict_says_so(tmp_path: Path) -> None:
    proc, out = fake_demo(tmp_path)  # REPEATS unset: the default design
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "4 paired round(s)" in proc.stdout.splitlines()[0]
    forward = [f"{b} {n}" for n in (1, 2) for b in ("native", "horovod")]
    assert (out / "order.txt").read_text().splitlines() == (forward + forward[::-1]) * 2
    # every benchmark run's file names its round, as the log line says
    names = sorted(p.name for p in out.glob("*.json"))
    assert len(names) == 16 and all(n.endswith(tuple(f"-r{k}.json" for k in range(1, 5))) for n in names), names
    assert all(f"{p.parent}/{p.name}" in proc.stdout for p in out.glob("*.json"))
    # the report pairs each round's runs (same hosts) and the verdict names the design
    verdicts = [ln for ln in proc.stdout.splitlines() if ln.startswith(("  1 node x ", "  2 nodes x "))]
    assert len(verdicts) == 2 and all("(4 rounds, paired: every round on the same nodes, t interval of the "
                                      "per-round ratios)" in v for v in verdicts), verdicts
