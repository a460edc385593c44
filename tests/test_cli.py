"""Bad input on the command line: one line on stderr, exit status 2, no traceback, nothing written.

These runs stop before TensorFlow is imported, so they are fast; the test checks that too. The catalogue runs in one
process (tests/aids/refusals.py), a few cases and the broken Horovod each in their own.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from tests.aids.refusals import batch
from tests.conftest import REPO, base_env, env_with_broken_horovod


def _bad_toml(tmp):
    (tmp / "bad.toml").write_text("model = \"mlp\"\nsteps = [\n")
    return ["--job", str(tmp / "bad.toml")], {}


def _corrupt_mnist(tmp):
    (tmp / "mnist.npz").write_bytes(b"this is not a zip archive")
    return ["--set", "dataset=mnist", "--set", f"data_dir={tmp}"], {}


def _other_jobs_checkpoint(tmp):
    ck = tmp / "ck"
    ck.mkdir()
    (ck / "meta.json").write_text(
        '{"job_hash": "0123456789abcdef", "job_name": "other", "world_size": 1, "step": 3}')
    return ["--resume-from", str(ck)], {}


def _slurm(**env):
    def prep(tmp):
        base = {"SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
                "SLURM_STEP_NODELIST": "localhost",
                "SLURM_STEP_TASKS_PER_NODE": "2"}
        base.update(env)
        return [], {k: v for k, v in base.items() if v is not None}
    return prep


def _bound_port(tmp):
    import socket

    s = socket.socket()
    s.bind(("", 0))
    s.listen(1)
    _KEEP.append(s)
    port = s.getsockname()[1]
    args, env = _slurm()(tmp)
    return ["--port-base", str(port)], env


_KEEP: list = []

# name: (arguments or prep(tmp_path) -> (arguments, extra env), what the one line must say, backends it applies to)
BOTH = ("backends.native", "backends.horovod")
NATIVE = ("backends.native",)
HOROVOD = ("backends.horovod",)
CASES = {
    "unknown-set-key": (["--set", "bogus=1"], "unknown job key", BOTH),
    "mistyped-set-key": (["--set", "per_replica_batchsize=4"], "did you mean", BOTH),
    "set-not-typed": (["--set", "steps=ten"], "expected an integer", BOTH),
    "set-without-equals": (["--set", "steps"], "expected key=value", BOTH),
    "zero-batch": (["--set", "per_replica_batch_size=0"], "must be >= 1", BOTH),
    "negative-steps": (["--set", "steps=-5"], "steps must be >= 0", BOTH),
    "unknown-model": (["--set", "model=transformer9000"], "unknown model", BOTH),
    "unknown-dataset": (["--set", "dataset=imagenet21k"], "unknown dataset", BOTH),
    "unknown-optimizer": (["--set", "optimizer=lamb"], "unknown optimizer", BOTH),
    "missing-job-file": (["--job", "jobs/nope.toml"], "not found", BOTH),
    "malformed-toml": (_bad_toml, "not valid TOML", BOTH),
    "missing-data": (["--set", "dataset=mnist", "--set", "data_dir=/nonexistent"], "mnist.npz", BOTH),
    "corrupt-data": (_corrupt_mnist, "mnist.npz", BOTH),
    "batch-too-big": (["--set", "synthetic_samples=10", "--set", "per_replica_batch_size=16"],
                      "fewer than one global batch", BOTH),
    "unknown-flag": (["--frobnicate"], "unrecognized arguments", BOTH),
    "bad-threads": (["--threads", "-3"], "--threads must be >= 0", BOTH),
    "bad-peer-timeout": (["--peer-timeout", "0"], "--peer-timeout must be > 0", BOTH),
    "bad-preempt-check": (["--preempt-check-steps", "0"], "--preempt-check-steps must be >= 1", BOTH),
    "resume-from-nothing": (["--resume-from", "/nonexistent/ckpt"], "no complete checkpoint", BOTH),
    "resume-other-job": (_other_jobs_checkpoint, "belongs to job 'other'", BOTH),
    "bad-nproc": (["--nproc", "0"], "--nproc must be >= 1", NATIVE),
    "nproc-with-mirrored": (["--nproc", "2", "--strategy", "mirrored"], "cannot be combined", NATIVE),
    "bad-strategy": (["--strategy", "parameter_servers"], "invalid choice", NATIVE),
    "slurm-missing-procid": (_slurm(SLURM_PROCID=None), "SLURM_PROCID", NATIVE),
    "slurm-procid-out-of-range": (_slurm(SLURM_PROCID="5"), "SLURM_PROCID=5 with 2 tasks", NATIVE),
    "slurm-bad-ntasks": (_slurm(SLURM_STEP_NUM_TASKS="two"), "SLURM_STEP_NUM_TASKS='two' is not an integer", NATIVE),
    "slurm-batch-step": (_slurm(SLURM_STEP_NUM_TASKS=None), "not an srun step", NATIVE),
    "slurm-layout-not-block": (_slurm(SLURM_STEP_NODELIST="n[1-2]", SLURM_STEP_TASKS_PER_NODE="1(x2)",
                                      SLURM_PROCID="1", SLURM_LOCALID="1"), "srun --distribution=block", NATIVE),
    "slurm-plane-distribution": (_slurm(SLURM_DISTRIBUTION="plane=2"), "'plane' is not supported", NATIVE),
    "port-out-of-range": ((lambda tmp: (["--port-base", "70000"], _slurm()(tmp)[1])), "out of range", NATIVE),
    "port-in-use": (_bound_port, "already in use", NATIVE),
    # Horovod's tuning knobs (backends/horovod_knobs.py); native has none of them: argparse's unknown argument
    "fusion-not-a-number": (["--fusion-threshold-mb", "abc"], "--fusion-threshold-mb: expected a size in MiB >= 0",
                            HOROVOD),
    "fusion-negative": (["--fusion-threshold-mb", "-4"], "--fusion-threshold-mb: expected a size in MiB >= 0",
                        HOROVOD),
    "cycle-time-zero": (["--cycle-time-ms", "0"], "--cycle-time-ms: expected a time in ms > 0", HOROVOD),
    "cycle-time-negative": (["--cycle-time-ms", "-1"], "--cycle-time-ms: expected a time in ms > 0", HOROVOD),
    "cache-capacity-negative": (["--cache-capacity", "-1"], "--cache-capacity: expected a whole number >= 0",
                                HOROVOD),
    "autotune-log-alone": (["--autotune-log", "trials.csv"], "--autotune-log needs --autotune", HOROVOD),
    "hierarchical-on-native": (["--hierarchical-allreduce"], "unrecognized arguments: --hierarchical-allreduce",
                               NATIVE),
}
PAIRS = [(m, c) for c in sorted(CASES) for m in CASES[c][2]]


def _run(module: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m module args`` as its own process, failing if TensorFlow was imported before it exited."""
    code = ("import sys, runpy; sys.argv = ['x'] + sys.argv[1:]; "
            f"rc = 0\ntry:\n    runpy.run_module('{module}', run_name='__main__')\n"
            "except SystemExit as e:\n    rc = e.code\n"
            "assert 'tensorflow' not in sys.modules, 'TensorFlow was imported before the input was checked'\n"
            "sys.exit(rc)")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=env or base_env(),
                          capture_output=True, text=True, timeout=60)


# The cases outside the catalogue, each (module, arguments, extra environment); "{tmp}" is the case's directory.
EXTRA: dict[str, tuple[str, list[str], dict[str, str]]] = {
    "unwritable-results": ("backends.native", ["--results", "{tmp}/file/sub"], {}),
    "malformed-tf-config": ("backends.native", ["--results", "{tmp}"], {"TF_CONFIG": "{not json"}),
    "nproc-with-tf-config": ("backends.native", ["--nproc", "2", "--results", "{tmp}"],
                             {"TF_CONFIG": '{"cluster": {"worker": ["localhost:1"]}, '
                                           '"task": {"type": "worker", "index": 0}}'}),
    "help": ("backends.native", ["--help"], {}),
}


@pytest.fixture(scope="module")
def refused(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every case above run once, all in one process (tests/aids/refusals.py: each case is still its entry point's
    ``__main__`` with its own arguments and environment, checked for TensorFlow after it exits): name -> status,
    stdout, stderr, whether TensorFlow was imported, and the results directory it was given."""
    names, cases, outs = [], [], []
    for module, case in PAIRS:
        tmp = tmp_path_factory.mktemp(case)
        spec = CASES[case][0]
        args, extra_env = spec(tmp) if callable(spec) else (spec, {})
        out = tmp / "res"
        names.append(f"{module}:{case}")
        cases.append({"module": module, "argv": [*args, "--results", str(out)], "env": {**base_env(), **extra_env}})
        outs.append(out)
    for name, (module, args, extra_env) in EXTRA.items():
        tmp = tmp_path_factory.mktemp(name)
        (tmp / "file").write_text("x")  # a file where the unwritable case wants a directory
        names.append(name)
        cases.append({"module": module, "argv": [a.replace("{tmp}", str(tmp)) for a in args],
                      "env": {**base_env(), **extra_env}})
        outs.append(tmp / "res")
    got = batch(cases, base_env())
    return {n: {**g, "out": o} for n, g, o in zip(names, got, outs, strict=True)}


def test_catalogue_is_large_enough():
    assert len(CASES) >= 25


@pytest.mark.parametrize("module, case", PAIRS, ids=[f"{m.split('.')[1]}-{c}" for m, c in PAIRS])
def test_bad_input_exits_2_with_one_line(module, case, refused):
    got = refused[f"{module}:{case}"]
    fragment = CASES[case][1]
    assert got["rc"] == 2, got["stderr"]
    assert not got["tensorflow"], "TensorFlow was imported before the input was checked"
    lines = got["stderr"].strip().splitlines()
    assert len(lines) == 1, got["stderr"]
    assert fragment in lines[0] and "Traceback" not in got["stderr"]
    # nothing half-written: no results, no checkpoint
    out = got["out"]
    assert not out.exists() or not [p for p in out.rglob("*") if p.is_file()]


# Real processes, one per backend: the exit status and the one line as a shell sees them (the batch above captures
# them inside one process), and TensorFlow not imported.
@pytest.mark.parametrize("module, case", [("backends.native", "unknown-set-key"),
                                          ("backends.horovod", "fusion-negative")])
def test_bad_input_as_its_own_process(module, case, tmp_path):
    args, fragment, _ = CASES[case]
    proc = _run(module, [*args, "--results", str(tmp_path / "res")])
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], proc.stderr
    assert not (tmp_path / "res").exists()


def test_unwritable_results_dir(refused):
    got = refused["unwritable-results"]
    assert got["rc"] == 2 and "not writable" in got["stderr"] and not got["tensorflow"]


def test_malformed_tf_config(refused):
    got = refused["malformed-tf-config"]
    assert got["rc"] == 2 and "TF_CONFIG is malformed" in got["stderr"] and not got["tensorflow"]


def test_nproc_with_tf_config_is_refused(refused):
    got = refused["nproc-with-tf-config"]
    assert got["rc"] == 2 and "unset TF_CONFIG" in got["stderr"] and not got["tensorflow"]


def test_help_exits_0(refused):
    got = refused["help"]
    assert got["rc"] == 0 and "--nproc" in got["stdout"]


def test_horovod_not_importable(tmp_path):
    env = env_with_broken_horovod(tmp_path, "built without TensorFlow support")
    proc = subprocess.run([sys.executable, "-m", "backends.horovod", "--results", str(tmp_path / "r")], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("backends.horovod: error: Horovod is not importable")
    assert "Traceback" not in proc.stderr
