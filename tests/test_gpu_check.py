"""scripts/gpu_check.py (`make gpu-check`): its pass/fail summary from fake doctor facts and fake results, and what
it does on a machine without a GPU (this one): one line, exit 3. It has never run on a GPU here."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from common.core import registry
from scripts import gpu_check

BACKENDS = list(registry.names())
HOSTS = ["gpu01", "gpu01"]


def _facts(**over: Any) -> dict[str, Any]:
    facts = {"tensorflow": "2.21.0", "gpus": ["/physical_device:GPU:0", "/physical_device:GPU:1"],
             "backends": {b: True for b in BACKENDS}, "missing": [], "horovod": "0.28.1",
             "horovod_ops": {"nccl": True, "mpi": True, "gloo": True}, "horovod_patch": "patched"}
    facts.update(over)
    return facts


def _run(backend: str, losses: list[float] | None = None, **over: Any) -> dict[str, Any]:
    rec = {"kind": "train", "backend": backend, "world_size": 2, "job_hash": "h", "images_per_sec": 812.5,
           "step_losses": losses or [2.3, 2.1, 1.9], "hosts": HOSTS,
           "collective": {"requested": "auto", "used": "nccl", "reason": "GPU"},
           "devices": ["/physical_device:GPU:0 (CUDA_VISIBLE_DEVICES=0,1, GPU 0)",
                       "/physical_device:GPU:1 (CUDA_VISIBLE_DEVICES=0,1, GPU 1)"]}
    rec.update(over)
    return rec


def _breakdown(backend: str, **over: Any) -> dict[str, Any]:
    rec = {"kind": "breakdown", "backend": backend, "world_size": 2, "step_time": 0.010, "host_step_time": 0.011,
           "phases": {"forward": 0.003, "backward": 0.004, "comm": 0.002, "update": 0.0005, "rest": 0.0005},
           "machine": {"num_ranks": 2, "per_rank": {"gpu": [{"source": "nvml", "id": "0", "model": "A100"},
                                                            {"source": "nvml", "id": "1", "model": "A100"}]}}}
    rec.update(over)
    return rec


def _all_good() -> tuple[dict, dict, dict]:
    return _facts(), {b: _run(b) for b in BACKENDS}, {b: _breakdown(b) for b in BACKENDS}


def _by_name(checks: list[gpu_check.Check]) -> dict[str, gpu_check.Check]:
    return {c.name: c for c in checks}


def test_everything_passes():
    checks = gpu_check.evaluate(*_all_good(), report_ok=True)
    assert all(c.ok is True for c in checks), [c for c in checks if c.ok is not True]
    assert gpu_check.exit_status(checks) == 0
    # 3 doctor checks, 3 per backend's run, parity, a breakdown per backend, the report
    assert len(checks) == 3 + 3 * len(BACKENDS) + 1 + len(BACKENDS) + 1
    lines = gpu_check.summary_lines(checks)
    assert lines[-1] == f"gpu-check: {len(checks)} of {len(checks)} checks passed"
    assert all(ln.startswith("PASS ") for ln in lines[:-1])


@pytest.mark.parametrize(("change", "failed"), [
    (lambda f, r, b: f.update(gpus=["/physical_device:GPU:0"]), "doctor: GPUs"),
    (lambda f, r, b: f["horovod_ops"].update(nccl=False), "doctor: Horovod built with NCCL"),
    (lambda f, r, b: f["backends"].update({BACKENDS[-1]: False}), "doctor: backends"),
    (lambda f, r, b: r[BACKENDS[0]]["collective"].update(used="ring"), f"{BACKENDS[0]}: NCCL chosen and recorded"),
    (lambda f, r, b: r[BACKENDS[-1]].update(devices=[r[BACKENDS[-1]]["devices"][0]] * 2),
     f"{BACKENDS[-1]}: one GPU per rank"),
    (lambda f, r, b: r[BACKENDS[0]].update(devices=["/physical_device:CPU:0"] * 2), f"{BACKENDS[0]}: one GPU per rank"),
    (lambda f, r, b: r[BACKENDS[0]].update(world_size=1), f"{BACKENDS[0]}: ran at 2 ranks"),
    (lambda f, r, b: r[BACKENDS[-1]].update(step_losses=[2.3, 2.1, 1.95]), "parity: per-step losses agree"),
    (lambda f, r, b: r[BACKENDS[-1]].update(job_hash="other"), "parity: per-step losses agree"),
    (lambda f, r, b: b[BACKENDS[0]]["machine"]["per_rank"]["gpu"][1].update(source="none"),
     f"{BACKENDS[0]}: breakdown timed on the device"),
    (lambda f, r, b: b[BACKENDS[-1]].update(step_time=0.02), f"{BACKENDS[-1]}: breakdown timed on the device"),
])
def test_one_failure_is_named_and_fails_the_check(change, failed):
    facts, runs, breakdowns = copy.deepcopy(_all_good())
    change(facts, runs, breakdowns)
    checks = gpu_check.evaluate(facts, runs, breakdowns, report_ok=True)
    assert [c.name for c in checks if c.ok is not True] == [failed]
    assert gpu_check.exit_status(checks) == 1
    lines = gpu_check.summary_lines(checks)
    assert f"failed: {failed}; not run: none" in lines[-1]
    assert any(ln.startswith("FAIL ") and failed in ln for ln in lines)


def test_a_run_that_wrote_nothing_fails_and_parity_is_not_run():
    facts, runs, breakdowns = _all_good()
    runs[BACKENDS[-1]] = None
    checks = _by_name(gpu_check.evaluate(facts, runs, breakdowns, report_ok=None))
    assert checks[f"{BACKENDS[-1]}: ran at 2 ranks"].ok is False
    assert checks["parity: per-step losses agree"].ok is None
    assert checks["report reads the results"].ok is None
    summary = gpu_check.summary_lines(list(checks.values()))
    assert "NOT RUN" in "\n".join(summary) and "not run: parity: per-step losses agree" in summary[-1]


def test_parity_tolerance_is_relative_1e5():
    facts, runs, breakdowns = _all_good()
    runs[BACKENDS[-1]]["step_losses"] = [2.3 * (1 + 5e-6), 2.1, 1.9]
    assert _by_name(gpu_check.evaluate(facts, runs, breakdowns, True))["parity: per-step losses agree"].ok is True
    runs[BACKENDS[-1]]["step_losses"] = [2.3 * (1 + 5e-5), 2.1, 1.9]
    check = _by_name(gpu_check.evaluate(facts, runs, breakdowns, True))["parity: per-step losses agree"]
    assert check.ok is False and "step 1" in check.detail


def test_without_a_gpu_one_line_and_exit_3(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "doctor_facts", lambda log: _facts(gpus=[]))
    out = tmp_path / "new"
    assert gpu_check.main(["--results", str(out)]) == gpu_check.NO_GPU == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["gpu-check: no GPU on this machine (TensorFlow 2.21.0 sees none): run it on a GPU node"]
    assert not out.exists()  # nothing ran, nothing left


def test_bad_input_is_exit_2(tmp_path, capsys):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x.json").write_text("{}")
    assert gpu_check.main(["--results", str(tmp_path / "full")]) == 2
    assert gpu_check.main(["--job", str(tmp_path / "nope.toml"), "--results", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"gpu-check: --results {tmp_path / 'full'} is not empty: give a new directory",
                   f"gpu-check: --job {tmp_path / 'nope.toml'}: no such file"]


def test_a_horovod_launch_that_cannot_run_is_one_line_before_the_doctor(tmp_path, monkeypatch, capsys):
    def doctor(log):
        raise AssertionError("the doctor (TensorFlow) must not start")

    monkeypatch.setattr(gpu_check, "doctor_facts", doctor)
    monkeypatch.setenv("TWINBENCH_HOROVOD_CONTROLLER", "nccl")
    out = tmp_path / "new"
    assert gpu_check.main(["--results", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "gpu-check: TWINBENCH_HOROVOD_CONTROLLER='nccl': must be one of auto, gloo, mpi"]
    assert not out.exists()
