"""Bad input on the command line: one line on stderr, exit status 2, no traceback, nothing written.

These runs stop before TensorFlow is imported, so they are fast; the test checks that too.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO, base_env

CASES = {
    "unknown-set-key": (["--set", "bogus=1"], "unknown job key"),
    "mistyped-set-key": (["--set", "per_replica_batchsize=4"], "did you mean"),
    "set-not-typed": (["--set", "steps=ten"], "expected an integer"),
    "zero-batch": (["--set", "per_replica_batch_size=0"], "must be >= 1"),
    "unknown-model": (["--set", "model=transformer9000"], "unknown model"),
    "missing-job-file": (["--job", "jobs/nope.toml"], "not found"),
    "missing-data": (["--set", "dataset=mnist", "--set", "data_dir=/nonexistent"], "mnist.npz"),
    "unknown-flag": (["--frobnicate"], "unrecognized arguments"),
    "bad-threads": (["--threads", "-3"], "--threads must be >= 0"),
    "batch-too-big": (["--set", "synthetic_samples=10", "--set", "per_replica_batch_size=16"],
                      "fewer than one global batch"),
}


def _run(module: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    code = ("import sys, runpy; sys.argv = ['x'] + sys.argv[1:]; "
            f"rc = 0\ntry:\n    runpy.run_module('{module}', run_name='__main__')\n"
            "except SystemExit as e:\n    rc = e.code\n"
            "assert 'tensorflow' not in sys.modules, 'TensorFlow was imported before the input was checked'\n"
            "sys.exit(rc)")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=env or base_env(),
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("module", ["backends.native", "backends.horovod"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_exits_2_with_one_line(module, case, tmp_path):
    args, fragment = CASES[case]
    out = tmp_path / "res"
    proc = _run(module, [*args, "--results", str(out)])
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert fragment in lines[0] and "Traceback" not in proc.stderr
    assert not list(out.glob("*.json")) if out.exists() else True


def test_unwritable_results_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = _run("backends.native", ["--results", str(blocker / "sub")])
    assert proc.returncode == 2 and "not writable" in proc.stderr


def test_malformed_tf_config(tmp_path):
    env = base_env()
    env["TF_CONFIG"] = "{not json"
    proc = _run("backends.native", ["--results", str(tmp_path)], env=env)
    assert proc.returncode == 2 and "TF_CONFIG is malformed" in proc.stderr


def test_nproc_with_tf_config_is_refused(tmp_path):
    env = base_env()
    env["TF_CONFIG"] = '{"cluster": {"worker": ["localhost:1"]}, "task": {"type": "worker", "index": 0}}'
    proc = _run("backends.native", ["--nproc", "2", "--results", str(tmp_path)], env=env)
    assert proc.returncode == 2 and "unset TF_CONFIG" in proc.stderr


def test_help_exits_0():
    proc = _run("backends.native", ["--help"])
    assert proc.returncode == 0 and "--nproc" in proc.stdout


def test_horovod_not_importable(tmp_path):
    fake = tmp_path / "horovod"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('built without TensorFlow support')\n")
    env = base_env()
    env["PYTHONPATH"] = f"{tmp_path}:{REPO}"
    proc = subprocess.run([sys.executable, "-m", "backends.horovod", "--results", str(tmp_path / "r")], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("backends.horovod: error: Horovod is not importable")
    assert "Traceback" not in proc.stderr
