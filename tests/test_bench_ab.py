"""bench/ab_checkouts.py, the throughput A/B of two checkouts: its run order, its arithmetic, the record it reads and
its refusals, with a fake run function (no TensorFlow process: the checkouts' own answers it asks for, backend
names, the job's check and launch lines, import no TensorFlow)."""

from __future__ import annotations

import dataclasses
import json
import subprocess

import pytest

from bench import ab_checkouts as ab
from common.core.results import RunRecord
from tests.conftest import PY, REPO

NX1, HX1, NX2, HX2 = (ab.Config(b, n) for n in (1, 2) for b in ("native", "horovod"))


def test_schedule_pairs_a_and_b_and_alternates_which_goes_first():
    order = ab.schedule([NX1, HX1, NX2, HX2], 3)
    assert len(order) == 3 * 4 * 2
    pairs = [order[i:i + 2] for i in range(0, len(order), 2)]
    # each configuration's A and B back to back, in the same round
    assert all(a[:2] == b[:2] and {a[2], b[2]} == {"A", "B"} for a, b in pairs)
    # A B B A ... within and across rounds: as many A-first as B-first pairs in every round
    assert "".join(side for _, _, side in order) == "ABBAABBA" * 3
    # the configurations in scripts/demo.sh's order, reversed every other round
    assert [cfg for _, cfg, _ in order[:8:2]] == [NX1, HX1, NX2, HX2]
    assert [cfg for _, cfg, _ in order[8:16:2]] == [HX2, NX2, HX1, NX1]
    # every configuration alternates A-first and B-first from round to round, for an odd number of them too
    for configs in ([NX1, HX1, NX2, HX2], [NX1, HX1, NX2]):
        firsts = {}
        for _, cfg, side in ab.schedule(configs, 4)[::2]:
            firsts.setdefault(cfg, []).append(side)
        assert all(f in (["A", "B", "A", "B"], ["B", "A", "B", "A"]) for f in firsts.values()), firsts


def fake_run(table: dict[tuple[str, ab.Config], list[float | None]], calls: list[tuple[int, ab.Config, str]]) -> ab.Run:
    """Images/s from ``table`` per (side, configuration) and round; None: that run fails."""
    def run(side: ab.Checkout, cfg: ab.Config, r: int) -> ab.Measure:
        calls.append((r, cfg, side.label))
        ips = table[(side.label, cfg)][r]
        if ips is None:
            raise ab.RunFailed("exit 1")
        return ab.Measure(ips, 0.128 / ips, f"hash-{side.label}")
    return run


def checkouts() -> dict[str, ab.Checkout]:
    return {s: ab.Checkout(s, REPO, PY, "") for s in ab.SIDES}


def test_execute_and_summarize_arithmetic():
    table: dict[tuple[str, ab.Config], list[float | None]] = {
        ("A", NX1): [100.0, 110.0, 90.0], ("B", NX1): [101.0, 99.0, 95.0],  # B/A 1.01, 0.9, 1.0556
        ("A", HX1): [200.0, 200.0, 200.0], ("B", HX1): [210.0, None, 190.0],  # B/A 1.05, -, 0.95
    }
    calls: list[tuple[int, ab.Config, str]] = []
    said: list[str] = []
    results = ab.execute(checkouts(), [NX1, HX1], 3, fake_run(table, calls), say=said.append)
    assert calls == ab.schedule([NX1, HX1], 3)  # every run, in the schedule's order, a failure not the end
    assert any("round 2/3 horovod x1 B: FAILED: exit 1" == s for s in said), said
    assert "B" not in results[HX1][1] and results[HX1][1]["A"].images_per_sec == 200.0
    assert ab.ratios(results[NX1]) == pytest.approx([1.01, 0.9, 95 / 90])
    assert ab.ratios(results[HX1]) == pytest.approx([1.05, 0.95])
    lines = ab.summarize(results)
    assert lines[0] == ("native x1: A 100.0 img/s, step 1.28 ms; B 99.0 img/s, step 1.29 ms; "
                        "B/A 1.010 (min 0.900, max 1.056, 3 rounds)")
    assert lines[1] == ("horovod x1: A 200.0 img/s, step 0.64 ms; B 200.0 img/s, step 0.64 ms; "
                        "B/A 1.000 (min 0.950, max 1.050, 2 rounds)")
    # over the five pairs: 0.9, 0.95, 1.01, 1.05, 1.0556
    assert lines[2] == ("summary: B/A of images/s over 5 pairs: median 1.010, min 0.900, max 1.056; "
                        "per configuration medians 1.000-1.010")
    assert ab.job_hashes(results) == {"A": {"hash-A"}, "B": {"hash-B"}}
    none = ab.summarize({NX1: [{"A": ab.Measure(1.0, 1.0)}]})
    assert none == ["native x1: A 1.0 img/s, step 1000.00 ms; B no run finished; B/A: no round with both sides",
                    "summary: no pair of runs finished"]


def record(backend: str, workers: int, twinbench: str, ips: float = 5000.0) -> dict:
    return RunRecord(backend=backend, world_size=workers, num_workers=workers, job_hash="577d871c2366e642",
                     job={"name": "demo"}, images_per_sec=ips, step_time={"median": 0.025, "p95": 0.03},
                     time_to_first_step=3.0, versions={"twinbench": twinbench}).to_dict()


def test_read_measure_takes_the_runs_own_record(tmp_path):
    side = ab.Checkout("B", REPO, PY, "0123456789ab")
    (tmp_path / "native-ctl-n2-x.json").write_text(json.dumps(record("native", 2, "0123456789ab+modified")))
    (tmp_path / ".native-ctl-n2-y.json.tmp").write_text("{")  # a write in progress is not a record
    assert ab.read_measure(tmp_path, side, NX2) == ab.Measure(5000.0, 0.025, "577d871c2366e642")
    with pytest.raises(ab.RunFailed, match="a record of native x2, not of horovod x2"):
        ab.read_measure(tmp_path, side, HX2)
    with pytest.raises(ab.RunFailed, match="ran twinbench 0123456789ab.*not checkout A's fedcba987654"):
        ab.read_measure(tmp_path, ab.Checkout("A", REPO, PY, "fedcba987654"), NX2)
    (tmp_path / "native-ctl-n2-z.json").write_text(json.dumps(record("native", 2, "0123456789ab")))
    with pytest.raises(ab.RunFailed, match="expected one results JSON"):
        ab.read_measure(tmp_path, side, NX2)


def test_launch_line_is_the_checkouts_own():
    side = ab.Checkout("A", REPO, PY, "", ab.run_env(REPO, PY))
    assert ab.launch_line(side, NX2, ["--job", "j.toml"]) == [PY, "-m", "backends.native", "--nproc", "2", "--job",
                                                               "j.toml"]


def test_merged_sets_keep_the_demos_unless_given():
    assert ab.merged_sets([]) == ["steps=200", "timing_warmup_steps=10"]
    assert ab.merged_sets(["steps=40", "mode=fit"]) == ["steps=40", "timing_warmup_steps=10", "mode=fit"]


@pytest.mark.parametrize("argv, said", [
    (["/nonexistent-ab", "."], "checkout A: /nonexistent-ab is not a directory"),
    ([".", "tests"], "checkout B: tests is not a twinbench checkout"),
    ([".", ".", "--workers", "0"], "worker counts must be distinct and >= 1"),
    ([".", ".", "--workers", "1,1"], "worker counts must be distinct and >= 1"),
    ([".", ".", "--rounds", "0"], "--rounds must be >= 1"),
    ([".", ".", "--set", "steps"], "--set 'steps': expected key=value"),
    ([".", ".", "--backends", "native,gpudirect"], "unknown backend 'gpudirect' in checkout A"),
    ([".", ".", "--set", "steps=10"], "steps=10 must exceed the 10 untimed warm-up steps"),
    ([".", ".", "--set", "stpes=40"], "--set stpes: unknown job key"),
    ([".", ".", "--job", "jobs/none.toml"], "not found"),
    ([".", "."], "--out"),  # a non-empty --out, added below
])
def test_bad_input_is_one_line_and_exit_2_before_any_run(tmp_path, capsys, monkeypatch, argv, said):
    monkeypatch.chdir(REPO)
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("")
    calls: list[tuple[int, ab.Config, str]] = []
    extra = ["--out", str(full)] if said == "--out" else ["--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as e:
        ab.main([*argv, *extra], run=fake_run({}, calls))
    err = capsys.readouterr().err
    assert e.value.code == 2 and calls == [] and not (tmp_path / "out").exists()
    assert len(err.splitlines()) == 1 and err.startswith("bench.ab_checkouts: ") and said in err, err


def test_main_checks_each_checkout_then_runs_the_schedule(tmp_path, capsys, monkeypatch):
    """The whole command with a fake run: each checkout's own answers (backend names, the job's hash; its launch-env
    replaced by a fixed Horovod controller, as the real one's probe loads TensorFlow's libraries), the schedule, the
    summary; a failed run is exit 1."""
    monkeypatch.setattr(ab, "with_launch_env", lambda side: (
        dataclasses.replace(side, env=ab.run_env(side.root, side.python, {"TWINBENCH_HOROVOD_CONTROLLER": "gloo"})),
        ["horovod ranks: fixed"]))
    table: dict[tuple[str, ab.Config], list[float | None]] = {
        (s, c): [1000.0 * (1 + (s == "B") * 0.1)] for s in ab.SIDES for c in (NX1, HX1, NX2, HX2)}
    calls: list[tuple[int, ab.Config, str]] = []
    assert ab.main([str(REPO), str(REPO), "--rounds", "1", "--out", str(tmp_path / "o"), "--set", "steps=30"],
                   run=fake_run(table, calls)) == 0
    out = capsys.readouterr().out
    assert calls == ab.schedule([NX1, HX1, NX2, HX2], 1) and (tmp_path / "o" / "logs").is_dir()
    assert "job: --job jobs/demo.toml --set steps=30 --set timing_warmup_steps=10; native x1, horovod x1" in out
    assert out.count("job hash 09c555eee299e606") == 2 and "A: horovod ranks: fixed" in out, out
    assert "summary: B/A of images/s over 4 pairs: median 1.100, min 1.100, max 1.100" in out
    assert "note: the records' job hashes differ" in out  # the fake's hashes differ by side
    table[("A", HX2)] = [None]
    assert ab.main([str(REPO), str(REPO), "--rounds", "1", "--out", str(tmp_path / "p"), "--backends", "horovod",
                    "--workers", "2"], run=fake_run(table, calls)) == 1
    out = capsys.readouterr().out
    assert "round 1/1 horovod x2 A: FAILED: exit 1" in out and "1 runs finished, 1 failed" in out, out
    assert calls[-2:] == [(0, HX2, "A"), (0, HX2, "B")]


def test_the_command_never_imports_tensorflow():
    code = ("import sys, bench.ab_checkouts; print(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('tensorflow', 'horovod', 'keras', 'tf_keras')))")
    assert subprocess.run([PY, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout == "[]\n"
