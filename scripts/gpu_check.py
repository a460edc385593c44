"""``make gpu-check``: the first thing a centre runs on a GPU node. It runs twinbench's GPU paths once and prints
what passed and what did not:

- the doctor's facts (``common.doctor``): TensorFlow sees at least 2 GPUs, every backend can run, Horovod was built
  with NCCL (``HOROVOD_GPU_OPERATIONS=NCCL``, docs/cluster.md#environment);
- every backend at 2 ranks on this node (its own local launcher): each run chose NCCL and recorded it
  (``collective.used``), each rank kept one GPU of its own (``devices``), and the two backends' per-step losses
  agree to 1e-5 (parity);
- the step-time breakdown of every backend at 2 ranks: its phases were timed on the device clock (GPU stamps) and
  add up to the step;
- ``python -m common.report`` reads the results directory.

    python scripts/gpu_check.py [--results DIR] [--job JOB.toml]     # DIR default gpu-check-results/

The results directory holds the runs' results JSONs (``python -m common.report DIR`` reads them), ``logs/`` (each
run's output, ``summary.json`` and ``summary.txt``) and ``report/``. Exit status: 0 every check passed, 1 one
failed, 2 bad input, 3 no GPU on this machine (said in one line; nothing else runs). **Not run on a GPU here**: the
development machine has none; the pass/fail logic is unit-tested with fake results (tests/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from common import launches  # noqa: E402
from common.core import registry  # noqa: E402  (no TensorFlow: the backends' modules load lazily)
from common.core.errors import UsageError  # noqa: E402

NO_GPU = 3
RANKS = 2
RTOL = 1e-5  # twinbench's parity tolerance (docs/parity.md)
RUN_TIMEOUT = 900  # seconds for one run; a hang is a failure, not a stuck check
DOCTOR_PY = "import json; from common import doctor; print(json.dumps(doctor.check(), default=str))"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool | None  # None: could not be checked (what it needs did not run)
    detail: str

    @property
    def word(self) -> str:
        return {True: "PASS", False: "FAIL", None: "NOT RUN"}[self.ok]


def gpu_count(facts: dict[str, Any]) -> int:
    gpus = facts.get("gpus")
    return len(gpus) if isinstance(gpus, list) else 0


def _doctor_checks(facts: dict[str, Any]) -> list[Check]:
    n = gpu_count(facts)
    backends = facts.get("backends") or {}
    missing = facts.get("missing") or []
    nccl = (facts.get("horovod_ops") or {}).get("nccl")
    return [
        Check("doctor: GPUs", n >= RANKS, f"TensorFlow {facts.get('tensorflow')} sees {n} GPU(s), needs {RANKS}"),
        Check("doctor: backends", bool(backends) and all(backends.values()),
              ", ".join(f"{b} {'ok' if ok else 'cannot run'}" for b, ok in backends.items())
              + (f"; missing: {'; '.join(missing)}" if missing else "")),
        Check("doctor: Horovod built with NCCL", nccl is True,
              f"horovod {facts.get('horovod')}, nccl_built {nccl}, patch {facts.get('horovod_patch')}"),
    ]


def _gpu_of(device: Any) -> str | None:
    """The GPU a rank's ``devices`` entry names (its own text, e.g. '/physical_device:GPU:0 (...)'), else None."""
    return device if isinstance(device, str) and "GPU" in device else None


def _run_checks(name: str, rec: dict[str, Any] | None) -> list[Check]:
    if rec is None:
        return [Check(f"{name}: ran at {RANKS} ranks", False, "no results JSON (see logs/)")]
    used = (rec.get("collective") or {}).get("used")
    devices = rec.get("devices") or []
    hosts = rec.get("hosts") or []
    gpus = [_gpu_of(d) for d in devices]
    own = len(devices) == RANKS and all(gpus) and len(set(zip(hosts, gpus, strict=False))) == RANKS
    return [
        Check(f"{name}: ran at {RANKS} ranks", rec.get("world_size") == RANKS,
              f"world size {rec.get('world_size')}, {rec.get('images_per_sec', 0):.1f} img/s"),
        Check(f"{name}: NCCL chosen and recorded", used == "nccl",
              f"collective {rec.get('collective')}"),
        Check(f"{name}: one GPU per rank", own, f"devices {devices}"),
    ]


def _parity_check(runs: dict[str, dict[str, Any] | None]) -> Check:
    names = list(runs)
    if any(runs[n] is None for n in names) or len(names) < 2:
        return Check("parity: per-step losses agree", None, "needs every backend's run")
    ref = runs[names[0]]
    for other in names[1:]:
        r = runs[other]
        a, b = ref.get("step_losses") or [], r.get("step_losses") or []
        if ref.get("job_hash") != r.get("job_hash") or not a or len(a) != len(b):
            return Check("parity: per-step losses agree", False, f"{other} vs {names[0]}: different job or steps")
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if abs(x - y) > RTOL * max(abs(x), abs(y), 1e-12):
                return Check("parity: per-step losses agree", False,
                             f"{other} vs {names[0]}: step {i + 1} {y!r} vs {x!r}")
    return Check("parity: per-step losses agree", True, f"{len(ref['step_losses'])} steps within {RTOL:g}")


def _rank_gpus(machine: dict[str, Any]) -> list[Any]:
    """Each rank's ``gpu`` facts from a record's ``machine`` block (common/cluster/machine.py: the GPU is always
    listed per rank; source "none" when the rank kept none)."""
    per_rank = (machine.get("per_rank") or {}).get("gpu")
    return list(per_rank) if isinstance(per_rank, list) else []


def _breakdown_check(name: str, rec: dict[str, Any] | None) -> Check:
    label = f"{name}: breakdown timed on the device"
    if rec is None:
        return Check(label, False, "no breakdown JSON (see logs/)")
    gpus = [g for g in _rank_gpus(rec.get("machine") or {}) if isinstance(g, dict) and g.get("source") != "none"]
    phases = rec.get("phases") or {}
    step = rec.get("step_time") or 0.0
    adds_up = step > 0 and abs(sum(phases.values()) - step) <= 0.01 * step
    ok = len(gpus) == RANKS and adds_up and rec.get("world_size") == RANKS
    parts = ", ".join(f"{k} {v * 1e3:.3f}" for k, v in phases.items())
    host = float(rec.get("host_step_time") or 0)
    return Check(label, ok, f"device step {step * 1e3:.3f} ms (phases in ms: {parts}), host clock "
                 f"{host * 1e3:.3f} ms, ranks with a GPU recorded: {len(gpus)}")


def evaluate(facts: dict[str, Any], runs: dict[str, dict[str, Any] | None],
             breakdowns: dict[str, dict[str, Any] | None], report_ok: bool | None = None) -> list[Check]:
    """Every check, from the doctor's facts and each backend's training run and breakdown record (None: none)."""
    checks = _doctor_checks(facts)
    for name, rec in runs.items():
        checks += _run_checks(name, rec)
    checks.append(_parity_check(runs))
    checks += [_breakdown_check(name, rec) for name, rec in breakdowns.items()]
    checks.append(Check("report reads the results", report_ok,
                        {True: "python -m common.report exited 0", False: "python -m common.report failed (logs/)",
                         None: "not run"}[report_ok]))
    return checks


def exit_status(checks: list[Check]) -> int:
    return 0 if checks and all(c.ok is True for c in checks) else 1


def summary_lines(checks: list[Check]) -> list[str]:
    width = max(len(c.name) for c in checks)
    lines = [f"{c.word:<7} {c.name:<{width}}  {c.detail}" for c in checks]
    passed = sum(c.ok is True for c in checks)
    lines.append(f"gpu-check: {passed} of {len(checks)} checks passed"
                 + ("" if passed == len(checks) else
                    f"; failed: {', '.join(c.name for c in checks if c.ok is False) or 'none'}"
                    f"; not run: {', '.join(c.name for c in checks if c.ok is None) or 'none'}"))
    return lines


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
                "PYTHONPATH": f"{REPO}{os.pathsep}{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(REPO)})
    return env


def _run(cmd: list[str], log: Path) -> int:
    """``cmd`` from the repository root, its output into ``log``; its exit status (124 after RUN_TIMEOUT)."""
    with open(log, "wb") as f:
        f.write(("$ " + " ".join(cmd) + "\n").encode())
        f.flush()
        try:
            return subprocess.run(cmd, cwd=REPO, env=_env(), stdout=f, stderr=subprocess.STDOUT,
                                  timeout=RUN_TIMEOUT).returncode
        except subprocess.TimeoutExpired:
            return 124


def doctor_facts(log: Path) -> dict[str, Any]:
    """``common.doctor.check()`` in a process of its own (it imports TensorFlow), as a dict."""
    proc = subprocess.run([sys.executable, "-c", DOCTOR_PY], cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT)
    log.write_text(proc.stdout + proc.stderr)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"tensorflow": None, "gpus": [], "backends": {}, "missing": [f"the doctor failed: {log}"]}


def _one_run(name: str, extra: list[str], results: Path, log: Path, kind: str) -> dict[str, Any] | None:
    """Run ``name`` at RANKS ranks with ``extra``; the record of ``kind`` it added to ``results`` (None: none)."""
    before = set(results.glob("*.json"))
    cmd = registry.load(name).local_command(RANKS, [*extra, "--results", str(results)], python=sys.executable)
    status = _run(cmd, log)
    for path in sorted(set(results.glob("*.json")) - before):
        data = json.loads(path.read_text())
        if status == 0 and data.get("kind", "train") == kind and data.get("backend") == name:
            return data
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/gpu_check.py", description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=REPO / "gpu-check-results", help="an empty or new directory")
    p.add_argument("--job", type=Path, default=REPO / "jobs" / "smoke.toml")
    args = p.parse_args(argv)
    results, job = args.results.resolve(), args.job.resolve()
    if not job.is_file():
        print(f"gpu-check: --job {args.job}: no such file", file=sys.stderr)
        return 2
    if results.exists() and (not results.is_dir() or any(results.iterdir())):
        print(f"gpu-check: --results {args.results} is not empty: give a new directory", file=sys.stderr)
        return 2
    try:
        env, said = launches.resolve(registry.names(), sys.executable)
    except UsageError as e:  # e.g. a Horovod without a controller: one line, before anything starts
        print(f"gpu-check: {e}", file=sys.stderr)
        return 2
    made = not results.exists()
    logs = results / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    facts = doctor_facts(logs / "doctor.log")
    if gpu_count(facts) == 0:
        if made:  # nothing ran: leave no directory behind, so the same command works on a GPU node
            shutil.rmtree(results)
        print(f"gpu-check: no GPU on this machine (TensorFlow {facts.get('tensorflow')} sees none): run it on a GPU "
              "node", file=sys.stderr)
        return NO_GPU
    print("\n".join(f"gpu-check: {line}" for line in said), flush=True)
    runs, breakdowns = {}, {}
    with launches.exported(env):  # the runs' launch lines (Horovod's controller, resolved once above)
        for name in registry.names():
            print(f"gpu-check: {name} at {RANKS} ranks ...", flush=True)
            runs[name] = _one_run(name, ["--job", str(job)], results, logs / f"{name}.log", "train")
        for name in registry.names():
            print(f"gpu-check: {name} breakdown at {RANKS} ranks ...", flush=True)
            diag = ["--job", str(job), "--set", "mode=ctl", "--diagnose", "breakdown"]
            breakdowns[name] = _one_run(name, diag, results, logs / f"breakdown-{name}.log", "breakdown")
    report_ok = _run([sys.executable, "-m", "common.report", str(results), "--out", str(results / "report")],
                     logs / "report.log") == 0
    checks = evaluate(facts, runs, breakdowns, report_ok)
    lines = summary_lines(checks)
    print("\n".join(lines))
    (logs / "summary.txt").write_text("\n".join(lines) + "\n")
    (logs / "summary.json").write_text(json.dumps([asdict(c) for c in checks], indent=2) + "\n")
    print(f"gpu-check: results in {results} (python -m common.report {results}), logs in {logs}")
    return exit_status(checks)


if __name__ == "__main__":
    sys.exit(main())
