"""Tuning knobs: Horovod's flags and the variables they set, the knob records, the report's variant rows,
collectives and best vs best, and the sweep's --variant.

Fast and single-process: no hvd.init, no TensorFlow (the one multi-process check is in tests/test_parity.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from backends import horovod, horovod_knobs
from common.core.contract import Knob, tuning_record
from common.report.build import ReportOptions, build_report
from common.report.load import load_runs
from common.report.summary import row_label, summarize
from common.sweep import cli, plan, slurm
from tests.conftest import SMOKE
from tests.test_report import make_run, md_row, put, record

MIB = 1024 * 1024


def flags(*argv: str) -> horovod_knobs.KnobFlags:
    return horovod_knobs.KnobFlags.from_args(horovod.parser().parse_args(list(argv)))


def values(knobs: list[Knob]) -> dict[str, Any]:
    return {k.name: k.value for k in knobs}


# -- Horovod: flags -> variables -> knobs ------------------------------------------------------------------------
def test_flags_set_horovods_variables_and_the_knobs_read_them_back(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env: dict[str, str] = {}
    replaced = horovod_knobs.apply(flags("--fusion-threshold-mb", "32", "--cycle-time-ms", "5", "--cache-capacity",
                                         "0", "--hierarchical-allreduce", "--autotune", "--autotune-log", "at.csv"),
                                   env, "test")
    assert replaced == []  # nothing was set before
    assert env == {"HOROVOD_FUSION_THRESHOLD": str(32 * MIB), "HOROVOD_CYCLE_TIME": "5.0",
                   "HOROVOD_CACHE_CAPACITY": "0", "HOROVOD_HIERARCHICAL_ALLREDUCE": "1", "HOROVOD_AUTOTUNE": "1",
                   "HOROVOD_AUTOTUNE_LOG": str(tmp_path / "at.csv")}  # absolute: rank 0 may run elsewhere
    knobs = horovod_knobs.knobs(env)
    assert values(knobs) == {"fusion_threshold_bytes": 33554432, "cycle_time_ms": 5.0, "cache_capacity": 0,
                             "hierarchical_allreduce": True, "autotune": True}
    rec = tuning_record(knobs, {"HOROVOD_CYCLE_TIME": "5.0", "NCCL_DEBUG": "WARN"})
    assert rec["variant"] == "fusion 32 MiB, cycle 5 ms, no response cache, hierarchical allreduce, autotune"
    assert rec["defaults"] == {"fusion_threshold_bytes": 134217728, "cycle_time_ms": 1.0, "cache_capacity": 1024,
                               "hierarchical_allreduce": False, "autotune": False}
    assert rec["env"] == {"HOROVOD_CYCLE_TIME": "5.0", "NCCL_DEBUG": "WARN"}
    json.dumps(rec)  # the record is JSON


def test_without_flags_the_defaults_are_horovods_and_the_launchers_values_count():
    env: dict[str, str] = {}
    assert horovod_knobs.apply(flags(), env, "test") == [] and env == {}
    defaults = horovod_knobs.knobs({})
    assert all(k.is_default for k in defaults) and tuning_record(defaults, {})["variant"] is None
    assert values(defaults) == {"fusion_threshold_bytes": 128 * MIB, "cycle_time_ms": 1.0, "cache_capacity": 1024,
                                "hierarchical_allreduce": False, "autotune": False}
    # what `horovodrun --fusion-threshold-mb 64 --cycle-time-ms 3.5` exports, read as Horovod reads it
    launched = {"HOROVOD_FUSION_THRESHOLD": "67108864", "HOROVOD_CYCLE_TIME": "3.5"}
    assert tuning_record(horovod_knobs.knobs(launched), {})["variant"] == "fusion 64 MiB, cycle 3.5 ms"
    # HOROVOD_ENABLE_XLA_OPS moves the cycle time's default to 0 ms (operations.cc:529-533)
    xla = {k.name: k for k in horovod_knobs.knobs({"HOROVOD_ENABLE_XLA_OPS": "1"})}["cycle_time_ms"]
    assert xla.value == xla.default == 0.0


@pytest.mark.parametrize("name, raw, knob, expected", [
    ("HOROVOD_FUSION_THRESHOLD", "abc", "fusion_threshold_bytes", 0),  # strtol finds no number: fusion off
    ("HOROVOD_FUSION_THRESHOLD", "", "fusion_threshold_bytes", 0),
    ("HOROVOD_FUSION_THRESHOLD", " 1048576bytes", "fusion_threshold_bytes", MIB),
    ("HOROVOD_CYCLE_TIME", "2.5ms", "cycle_time_ms", 2.5),
    ("HOROVOD_CYCLE_TIME", "1e1", "cycle_time_ms", 10.0),
    ("HOROVOD_CACHE_CAPACITY", "-1", "cache_capacity", 2**32 - 1),  # a uint32 in Horovod
    ("HOROVOD_HIERARCHICAL_ALLREDUCE", "0", "hierarchical_allreduce", False),
    ("HOROVOD_HIERARCHICAL_ALLREDUCE", "true", "hierarchical_allreduce", False),  # strtol("true") = 0
    ("HOROVOD_AUTOTUNE", "2", "autotune", True),
])
def test_environment_values_are_parsed_as_horovods_cpp_does(name, raw, knob, expected):
    assert values(horovod_knobs.knobs({name: raw}))[knob] == expected


def test_a_flag_overrides_the_launchers_variable_and_rank_0_says_so_once(capsys):
    env = {"HOROVOD_FUSION_THRESHOLD": str(128 * MIB), "HOROVOD_CYCLE_TIME": "1", "HOROVOD_RANK": "0"}
    replaced = horovod_knobs.apply(flags("--fusion-threshold-mb", "32", "--cycle-time-ms", "1"), env, "prog")
    err = capsys.readouterr().err.strip().splitlines()
    assert env["HOROVOD_FUSION_THRESHOLD"] == str(32 * MIB) and env["HOROVOD_CYCLE_TIME"] == "1.0"
    assert replaced == [f"HOROVOD_FUSION_THRESHOLD={128 * MIB} -> {32 * MIB}", "HOROVOD_CYCLE_TIME=1 -> 1.0"]
    assert len(err) == 1 and err[0].startswith("[prog] flags override the launcher's environment:")
    assert "HOROVOD_FUSION_THRESHOLD=134217728 -> 33554432" in err[0]
    for rank_var in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):  # another rank: the same, silently
        env = {"HOROVOD_FUSION_THRESHOLD": "1", rank_var: "1"}
        assert horovod_knobs.apply(flags("--fusion-threshold-mb", "32"), env, "prog")
        assert env["HOROVOD_FUSION_THRESHOLD"] == str(32 * MIB) and capsys.readouterr().err == ""
    # the same value as the launcher's: nothing overridden, nothing said
    assert horovod_knobs.apply(flags("--fusion-threshold-mb", "32"), {"HOROVOD_FUSION_THRESHOLD": str(32 * MIB)},
                               "prog") == []
    assert capsys.readouterr().err == ""


def test_horovod_backend_records_knobs_and_the_collective_used():
    b = horovod.HorovodBackend(horovod.Options(knobs=flags("--fusion-threshold-mb", "32")))
    b.knob_env = {"HOROVOD_FUSION_THRESHOLD": str(32 * MIB)}  # what _connect snapshots before hvd.init
    b.hvd = SimpleNamespace(gloo_enabled=lambda: True, mpi_enabled=lambda: False, nccl_built=lambda: 0,
                            ccl_built=lambda: False)
    b.gpu = False
    assert values(list(b.capabilities().knobs))["fusion_threshold_bytes"] == 32 * MIB

    def hvd(gloo: bool, mpi: bool, nccl: int) -> SimpleNamespace:
        return SimpleNamespace(gloo_enabled=lambda: gloo, mpi_enabled=lambda: mpi, nccl_built=lambda: nccl,
                               ccl_built=lambda: False)

    cases = [(False, hvd(True, False, 0), "gloo"), (False, hvd(False, True, 0), "mpi"),
             (True, hvd(True, False, 2000), "nccl"), (True, hvd(False, True, 0), "mpi")]
    for gpu, fake, used in cases:
        b.gpu, b.hvd = gpu, fake
        c = b.capabilities().collective.to_dict()
        assert c["requested"] == "auto" and c["used"] == used and c["reason"], (gpu, c)
    assert "without NCCL" in c["reason"]  # a GPU rank whose Horovod has no NCCL: its tensors go through the host


# Bad values (one line, exit 2, before TensorFlow): tests/test_cli.py's catalogue, cases fusion-*, cycle-time-*,
# cache-capacity-negative, autotune-log-alone and hierarchical-on-native.


# -- the report: variant rows, collectives, best vs best -----------------------------------------------------------
def hvd_tuning(**env: str) -> dict[str, Any]:
    return tuning_record(horovod_knobs.knobs(env), env)


def native_tuning(packs: int) -> dict[str, Any]:
    # what native's knobs() gives (backends/native.py, the lead's): bytes_per_pack, 0 = TensorFlow's own choice
    return tuning_record([Knob("bytes_per_pack", packs, 0, f"packs {packs // MIB} MiB")], {})


FUSION32 = {"HOROVOD_FUSION_THRESHOLD": str(32 * MIB)}
CPU_RING = {"collective": {"requested": "auto", "used": "ring", "reason": "r"}}
CPU_GLOO = {"collective": {"requested": "auto", "used": "gloo", "reason": "r"}}


def variant_runs(d: Path) -> None:
    """native 1: 100, 2: 180 (default) and 2: 190 (packs 32 MiB); horovod 1: 110, 2: 200 (default; one of the two
    repeats an older file without tuning), 1: 120, 2: 230 (fusion 32 MiB)."""
    put(d, make_run("native", 1, 100.0, tuning=native_tuning(0), **CPU_RING))
    put(d, make_run("native", 2, 180.0, tuning=native_tuning(0), **CPU_RING))
    put(d, make_run("native", 2, 190.0, tuning=native_tuning(32 * MIB), **CPU_RING))
    put(d, make_run("horovod", 1, 110.0, tuning=hvd_tuning(), **CPU_GLOO))
    put(d, make_run("horovod", 2, 196.0, tuning=hvd_tuning(), **CPU_GLOO))
    put(d, make_run("horovod", 2, 204.0, run_id="old-file-without-tuning", **CPU_GLOO))
    put(d, make_run("horovod", 1, 120.0, tuning=hvd_tuning(**FUSION32), **CPU_GLOO))
    put(d, make_run("horovod", 2, 230.0, tuning=hvd_tuning(**FUSION32), **CPU_GLOO))


def test_runs_with_other_knobs_get_rows_of_their_own(tmp_path):
    variant_runs(tmp_path / "r")
    (s,) = summarize(load_runs(tmp_path / "r"))
    rows = {(r.identity.label, r.identity.world_size): r for r in s.rows}
    assert set(rows) == {("native", 1), ("native", 2), ("native (packs 32 MiB)", 2), ("horovod", 1), ("horovod", 2),
                         ("horovod (fusion 32 MiB)", 1), ("horovod (fusion 32 MiB)", 2)}
    assert rows[("horovod", 2)].throughput.ips == [196.0, 204.0]  # the older file counts as default knobs
    assert rows[("horovod (fusion 32 MiB)", 2)].throughput.ips == [230.0]
    assert rows[("native", 2)].throughput.ips == [180.0]
    # the backend ratio compares the defaults only; a variant's speedup is against its own 1-replica run
    assert {q.world_size: q.ratio for q in s.ratios} == pytest.approx({1: 1.1, 2: 200 / 180})
    assert rows[("horovod (fusion 32 MiB)", 2)].scaling.speedup == pytest.approx(230 / 120)
    assert any(n.startswith("horovod (fusion 32 MiB): rows of their own") for n in s.notes)
    assert row_label(record("native", 2, 1.0, backend_info={"strategy": "MirroredStrategy"},
                            tuning=native_tuning(32 * MIB))) == "native (mirrored, packs 32 MiB)"


def test_best_vs_best_table(tmp_path):
    variant_runs(tmp_path / "r")
    build_report(tmp_path / "r", tmp_path / "o", ReportOptions(plots=False))
    md = (tmp_path / "o" / "report.md").read_text()
    best = md.split("### Best vs best", 1)[1].split("###", 1)[0]
    assert "| native | 2 | 2x1 | 180.0 | packs 32 MiB | 190.0 | 1.056 |" in best
    assert "| native | 1 | 1x1 | 100.0 | default | 100.0 | 1.000 |" in best
    assert "| horovod | 2 | 2x1 | 200.0 | fusion 32 MiB | 230.0 | 1.150 |" in best
    # horovod/native: defaults 200 / 180, fastest 230 / 190
    assert f"| 2 | 2x1 | {200 / 180:.3f} | {230 / 190:.3f} | packs 32 MiB | fusion 32 MiB |" in best
    assert f"| 1 | 1x1 | {110 / 100:.3f} | {120 / 100:.3f} | default | fusion 32 MiB |" in best
    import csv

    with open(tmp_path / "o" / "report.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {"collective", "variant"} <= set(rows[0])
    assert any(r["collective"] == "gloo" and r["variant"] == "fusion 32 MiB" for r in rows)


def test_no_variants_no_best_vs_best(tmp_path):
    put(tmp_path / "r", make_run("native", 1, 100.0, tuning=native_tuning(0)))
    put(tmp_path / "r", make_run("horovod", 1, 110.0, tuning=hvd_tuning()))
    build_report(tmp_path / "r", tmp_path / "o", ReportOptions(plots=False))
    assert "Best vs best" not in (tmp_path / "o" / "report.md").read_text()


GPU = [f"/physical_device:GPU:0 (CUDA_VISIBLE_DEVICES=0,1, GPU {i})" for i in range(2)]


@pytest.mark.parametrize("native_used, hvd_used, devices, like", [
    ("ring", "nccl", GPU, "no: native ring vs horovod nccl on GPUs"),
    ("nccl", "nccl", GPU, "yes"),
    ("ring", "gloo", ["cpu (CUDA_VISIBLE_DEVICES=0)", "cpu (CUDA_VISIBLE_DEVICES=1)"], "yes"),
])
def test_collectives_in_the_tables_and_ring_vs_nccl_on_gpus_is_not_like_for_like(tmp_path, native_used, hvd_used,
                                                                                 devices, like):
    d = tmp_path / "r"
    for b, used in (("native", native_used), ("horovod", hvd_used)):
        put(d, make_run(b, 2, 200.0, devices=devices, collective={"requested": "auto", "used": used, "reason": "r"}))
    build_report(d, tmp_path / "o", ReportOptions(plots=False))
    md = (tmp_path / "o" / "report.md").read_text()
    assert md_row(md, "native", 2)[-1] == native_used and md_row(md, "horovod", 2)[-1] == hvd_used
    assert (f"| 2 | 2x1 | 200.0 | 200.0 | 1.000 (needs 6 runs per cell) | 2 / 2 | {native_used} / {hvd_used} | "
            f"{like} |") in md
    assert ("not like for like" in md) == like.startswith("no")


def test_records_without_a_collective_show_na(tmp_path):
    put(tmp_path / "r", make_run("native", 1, 100.0))
    put(tmp_path / "r", make_run("horovod", 1, 100.0))
    build_report(tmp_path / "r", tmp_path / "o", ReportOptions(plots=False))
    md = (tmp_path / "o" / "report.md").read_text()
    assert md_row(md, "native", 1)[-1] == "n/a"
    assert "| 1 | 1x1 | 100.0 | 100.0 | 1.000 (needs 6 runs per cell) | 1 / 1 | n/a / n/a | n/a |" in md


# -- the sweep's --variant ------------------------------------------------------------------------------------------
def submit(tmp_path: Path, *extra: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    a = cli.parser().parse_args(["submit", "--job", SMOKE, "--results", str(tmp_path / "sw"), "--sizes", "1,2",
                                   "--gres-per-node", "0", *extra])
    return plan.plan(a)


def test_sweep_variants_run_at_every_size_on_identical_resources(tmp_path):
    runs, header = submit(tmp_path, "--variant", "hvd-fusion32=horovod:--fusion-threshold-mb 32 --cycle-time-ms 2",
                          "--variant", "native-default=native", "--horovod-arg=--threads=1")
    assert [(r["variant"], r["backend"], r["size"]) for r in runs] == [
        ("hvd-fusion32", "horovod", 1), ("native-default", "native", 1),
        ("hvd-fusion32", "horovod", 2), ("native-default", "native", 2)]
    for size in (1, 2):
        assert len({tuple(r["resources"]) for r in runs if r["size"] == size}) == 1  # identical resources
    assert header["variants"][0] == {"label": "hvd-fusion32", "backend": "horovod",
                                     "args": ["--fusion-threshold-mb", "32", "--cycle-time-ms", "2"]}
    results = tmp_path / "sw"
    cmd = slurm.sbatch_command(runs[2], header, results, None)
    assert cmd[-5:] == ["--threads=1", "--fusion-threshold-mb", "32", "--cycle-time-ms", "2"]  # shared, then own
    assert str(results / "hvd-fusion32-n2") in cmd and "--job-name=tb-hvd-fusion32-n2" in cmd
    assert slurm.sbatch_command(runs[1], header, results, None)[-1] == "--quiet"  # the native default: no flags


def test_sweep_without_variants_runs_what_it_always_ran(tmp_path):
    runs, header = submit(tmp_path)
    assert [r["name"] for r in runs] == [f"{b}-n{n}" for n in (1, 2) for b in ("native", "horovod")]
    assert all(r["args"] == [] and r["variant"] == r["backend"] for r in runs)
    assert [v["args"] for v in header["variants"]] == [[], []]


@pytest.mark.parametrize("extra, message", [
    (["--variant", "nolabel"], "expected LABEL=BACKEND[:ARGS]"),
    (["--variant", "=native"], "expected LABEL=BACKEND[:ARGS]"),
    (["--variant", "x=pytorch"], "unknown backend 'pytorch'"),
    (["--variant", "a/b=native"], "label 'a/b' must be"),
    (["--variant", "logs=native"], "label 'logs' must be"),
    (["--variant", "x=native", "--variant", "x=horovod"], "label 'x' is used twice"),
    (["--variant", "x=native:--hierarchical-allreduce"], "native refuses its flags: unrecognized arguments"),
    (["--variant", "x=horovod:--fusion-threshold-mb abc"], "horovod refuses its flags: argument --fusion-thr"),
    (["--variant", "x=horovod:--autotune-log a.csv"], "--autotune-log needs --autotune"),
    (["--variant", "x=horovod:'open"], "cannot split its flags"),
    (["--variant", "x=native", "--backends", "native"], "--backends and --variant"),
])
def test_sweep_bad_variant_is_one_line_exit_2(tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as e:
        cli.main(["submit", "--job", SMOKE, "--results", str(tmp_path / "R"), "--dry-run", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "R").exists()
