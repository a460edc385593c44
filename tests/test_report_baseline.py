"""``python -m common.report NEW --baseline OLD``: per cell the change against the baseline, the stacks' differences,
exit 0 / 4 / 2; fake records of two software stacks (tests.test_report's helpers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from common.report.baseline import SAME, SLOWER, judge, parse_tolerance
from common.report.cli import main
from tests.test_report import make_run, put

OLD_STACK = {"python": "3.11.9", "tensorflow": "2.18.1", "tf_keras": "2.18.0"}
NEW_STACK = {"python": "3.11.9", "tensorflow": "2.21.0", "tf_keras": "2.21.0"}


def write_set(d: Path, versions: dict[str, str], slower: float = 1.0, loss: float = 0.5) -> Path:
    """Six repeats of native and horovod at 1 and 2 replicas (one node); native at 2 replicas x ``slower``."""
    for backend, base in (("native", 100.0), ("horovod", 110.0)):
        for ws in (1, 2):
            f = slower if (backend, ws) == ("native", 2) else 1.0
            for i in range(6):
                ips = base * ws * f * (1 + (i - 2.5) * 0.004)
                put(d, make_run(backend, ws, ips, run_id=f"{d.name}-{backend}-{ws}-{i}", hosts=["n0"] * ws,
                                versions=versions, loss=loss))
    return d


def run(argv: list[str], capsys: Any) -> tuple[int, list[str], str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out.strip().splitlines(), out.err


def test_one_cell_slower_by_10_percent_exits_4_naming_it_and_the_stack(tmp_path: Path, capsys: Any) -> None:
    old = write_set(tmp_path / "old", OLD_STACK)
    new = write_set(tmp_path / "new", NEW_STACK, slower=0.9, loss=0.48)
    code, out, _ = run([str(new), "--baseline", str(old), "--no-plots"], capsys)
    assert code == 4
    last = out[-1]
    assert last.startswith("slower than the baseline beyond 5%: small (") and "native 2 replicas (1x2) -10.0% [" in last
    assert "the stacks differ in tensorflow 2.18.1 -> 2.21.0, tf_keras 2.18.0 -> 2.21.0" in last
    assert "horovod" not in last.split(":")[1].split(";")[0]  # only the slower cell is named
    table = [x for x in out if x.startswith("| small (")]
    assert len(table) == 4 and sum(x.endswith("| slower |") for x in table) == 1
    assert sum(x.endswith("| same |") for x in table) == 3
    assert any("loss 0.5 -> 0.48" in x for x in table)
    assert any(x.startswith("Not in the records, so not compared: twinbench's own version") for x in out)
    md = (new / "report" / "report.md").read_text()
    assert md.index("## Verdict") < md.index("## Against the baseline") < md.index("## Method")
    html = (new / "report" / "report.html").read_text()
    assert "<h2>Against the baseline</h2>" in html and "tensorflow 2.18.1 -&gt; 2.21.0" in html


def test_equal_sets_exit_0(tmp_path: Path, capsys: Any) -> None:
    old = write_set(tmp_path / "old", OLD_STACK)
    new = write_set(tmp_path / "new", OLD_STACK)
    code, out, _ = run([str(new), "--baseline", str(old), "--tolerance", "0.02", "--no-plots", "-q"], capsys)
    assert code == 0
    assert out[-1] == "no cell slower than the baseline beyond 2% (4 cells compared); the stacks recorded are identical"


@pytest.mark.parametrize("tol", ["5", "0%", "100%", "x"])
def test_bad_tolerance_exits_2_in_one_line(tmp_path: Path, capsys: Any, tol: str) -> None:
    d = write_set(tmp_path / "d", OLD_STACK)
    code, _, err = run([str(d), "--baseline", str(d), "--tolerance", tol], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--tolerance" in err


def test_bad_baseline_exits_2(tmp_path: Path, capsys: Any) -> None:
    d = write_set(tmp_path / "d", OLD_STACK)
    code, _, err = run([str(d), "--baseline", str(tmp_path / "missing"), "--no-plots"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "missing" in err
    with pytest.raises(SystemExit) as e:
        main([str(d), "--tolerance", "5%"])
    assert e.value.code == 2


def test_the_rule() -> None:
    assert parse_tolerance("5%") == parse_tolerance("0.05") == 0.05
    assert judge(0.9, (0.88, 0.92), 0.05) == SLOWER
    assert judge(0.9, (0.80, 1.02), 0.05) == SAME  # the interval holds 1: not a regression
    assert judge(0.97, (0.96, 0.98), 0.05) == SAME  # real, but within the tolerance
    assert judge(0.9, None, 0.05) == SLOWER  # fewer than 6 runs: the medians decide


def tuned(d: Path, cycle: float, fall: float = 1.0, skip: tuple[str, int] | None = None) -> Path:
    """write_set's cells, Horovod's tuned as HOROVOD_CYCLE_TIME=``cycle`` says (its label, knob and environment),
    its throughput x ``fall``; ``skip``: a (backend, size) cell left out."""
    for backend, base in (("native", 100.0), ("horovod", 110.0)):
        for ws in (1, 2):
            if (backend, ws) == skip:
                continue
            extra: dict[str, Any] = {}
            if backend == "horovod":
                knobs = {"cycle_time_ms": cycle, "fusion_threshold_bytes": 64 << 20}
                env = {"HOROVOD_CYCLE_TIME": str(cycle)} if cycle != 5 else {}
                extra["tuning"] = {"knobs": knobs, "defaults": {"cycle_time_ms": 5, "fusion_threshold_bytes": 64 << 20},
                                   "variant": f"cycle {cycle:g} ms" if cycle != 5 else None, "env": env}
            for i in range(6):
                ips = base * ws * (fall if backend == "horovod" else 1.0) * (1 + (i - 2.5) * 0.004)
                put(d, make_run(backend, ws, ips, run_id=f"{d.name}-{backend}-{ws}-{i}", hosts=["n0"] * ws,
                                versions=OLD_STACK, **extra))
    return d


def test_a_tuning_change_is_compared_cell_by_cell_and_named(tmp_path: Path, capsys: Any) -> None:
    """42.1: NEW's Horovod rows are labelled by their tuning ("cycle 10 ms"): every cell is still compared with
    OLD's, the fall is found, and the knob and its environment variable are what changed."""
    old = tuned(tmp_path / "old", 5)
    new = tuned(tmp_path / "new", 10, fall=0.93)
    code, out, _ = run([str(new), "--baseline", str(old), "--no-plots"], capsys)
    assert code == 4
    table = [x for x in out if x.startswith("| small (")]
    assert len(table) == 4 and not any("only in" in x for x in table)
    assert sum(x.endswith("| slower |") for x in table) == 2  # both Horovod cells
    assert any("| horovod (cycle 10 ms) [OLD horovod] 2 replicas (1x2) |" in x for x in table)
    assert "horovod cycle_time_ms 5 -> 10" in out[-1]
    assert "horovod environment HOROVOD_CYCLE_TIME unset -> 10" in out[-1]


def test_a_cell_without_counterpart_fails_with_its_own_status(tmp_path: Path, capsys: Any) -> None:
    old = tuned(tmp_path / "old", 5)
    new = tuned(tmp_path / "new", 5, skip=("horovod", 2))
    code, out, _ = run([str(new), "--baseline", str(old), "--no-plots", "-q"], capsys)
    assert code == 5
    assert out[-1].startswith("not every cell compared (none slower beyond 5% of 3 compared); 1 cell(s) could not be "
                              "compared: small (") and "horovod 2 replicas (1x2) only in OLD" in out[-1]
    assert out[-1].endswith("the stacks recorded are identical")


def test_identical_only_when_nothing_recorded_differs(tmp_path: Path, capsys: Any) -> None:
    """A knob at another value (same label) is a difference; the versions a record may add are too."""
    old, new = tuned(tmp_path / "old", 5), tuned(tmp_path / "new", 5)
    for p in new.glob("*.json"):
        d = json.loads(p.read_text())
        d["versions"] = {**d["versions"], "twinbench": "abc1234"}
        if d["backend"] == "horovod":
            d["tuning"]["knobs"]["fusion_threshold_bytes"] = 32 << 20
        p.write_text(json.dumps(d))
    code, out, _ = run([str(new), "--baseline", str(old), "--no-plots", "-q"], capsys)
    assert code == 0
    assert "the stacks recorded are identical" not in out[-1]
    assert "twinbench not recorded -> abc1234" in out[-1] and "horovod fusion_threshold_bytes 67108864 -> 33554432" \
        in out[-1]
    code, out, _ = run([str(new), "--baseline", str(old), "--no-plots"], capsys)
    assert not any(x.startswith("Not in the records") and "twinbench's own version" in x for x in out)


def test_a_backends_own_knobs_are_named_on_that_backend_only(tmp_path: Path, capsys: Any) -> None:
    """Issue 47: a sweep that exports HOROVOD_CYCLE_TIME=10 for every backend puts it in native's recorded
    environment too; native never reads it, so the baseline names it on horovod only (a variable no backend's name
    claims, NCCL_*, stays a stack fact of every backend)."""
    old = tuned(tmp_path / "old", 5)
    new = tuned(tmp_path / "new", 10)
    for side, env in ((old, {}), (new, {"HOROVOD_CYCLE_TIME": "10", "NCCL_SOCKET_IFNAME": "eth0"})):
        for p in side.glob("*-native-*.json"):
            d = json.loads(p.read_text())
            d["tuning"] = {"knobs": {}, "defaults": {}, "variant": None, "env": env}
            p.write_text(json.dumps(d))
    code, out, _ = run([str(new), "--baseline", str(old), "--no-plots", "-q"], capsys)
    assert code == 0  # the same throughput: only the stacks differ
    assert "horovod environment HOROVOD_CYCLE_TIME unset -> 10" in out[-1]
    assert "native environment HOROVOD_CYCLE_TIME" not in out[-1]
    assert "native environment NCCL_SOCKET_IFNAME unset -> eth0" in out[-1]
