"""The ReFrame check's options as a centre passes them (``-S``), without a cluster: ReFrame's ``--dry-run`` writes
each test's job script, read here (job overrides that survive ReFrame's list parsing, the repeats, the job hash the
sanity expects), and a bad value is one line and exit 2 instead of ReFrame's warning and no test. No TensorFlow."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import BIN, REPO, base_env

CHECK = REPO / "jobs" / "reframe" / "twinbench_check.py"
SETTINGS = REPO / "jobs" / "reframe" / "settings.py"


def _reframe(tmp_path: Path, *options: str, action: str = "--dry-run") -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "reframe"), "-C", str(SETTINGS), "-c", str(CHECK), "--prefix",
                           str(tmp_path / "rfm"), "-n", "TwinbenchCheck.*native", "-S", "num_tasks_per_node=1",
                           *options, action], cwd=tmp_path, env=base_env(), capture_output=True, text=True,
                          timeout=120)


def _script(tmp_path: Path, *options: str) -> str:
    proc = _reframe(tmp_path, *options)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    (script,) = (tmp_path / "rfm" / "stage").rglob("rfm_job.sh")
    return script.read_text()


def test_job_overrides_survive_reframes_list_parsing_and_every_repeat_gets_them(tmp_path):
    text = _script(tmp_path, "-S", "backend_args=--set,steps=200", "-S", "sets=per_replica_batch_size=16,name=x",
                   "-S", "repeats=3")
    runs = [ln for ln in text.splitlines() if ln.startswith("srun ")]
    assert len(runs) == 3 and len({ln.split(";")[0] for ln in runs}) == 1, runs  # the same launch, three times
    assert all(ln.split(";")[0].endswith("--set per_replica_batch_size=16 --set name=x --set steps=200")
               for ln in runs), runs
    assert runs[0].startswith("srun --cpus-per-task=4 --hint=nomultithread python -m backends.native")
    # the hash the sanity expects is the job file's with the same overrides
    assert "print(load_job('" in text and "sys.argv[1:]).job_hash)\" per_replica_batch_size=16 name=x steps=200" \
        in text
    assert 'for tb_rc in $tb_rcs; do echo "[reframe] twinbench exit status $tb_rc"; done' in text


def test_a_value_holding_a_comma_goes_in_a_json_list(tmp_path):
    text = _script(tmp_path, "-S", 'sets=["dataset_args={\\"a\\": 1, \\"b\\": 2}"]', "-S", "repeats=1")
    (run,) = [ln for ln in text.splitlines() if ln.startswith("srun ")]
    assert run.endswith("--set 'dataset_args={\"a\": 1, \"b\": 2}'"), run


@pytest.mark.parametrize("option, message", [
    ("num_nodes=0", "-S num_nodes=0: must be >= 1"),
    ("repeats=0", "-S repeats=0: must be >= 1"),
    ("sets=steps", "-S sets: 'steps' is not KEY=VALUE"),
    ("reference_tolerance=1.5", "-S reference_tolerance=1.5: must be a fraction in (0, 1)"),
])
def test_a_bad_value_is_one_line_and_exit_2(tmp_path, option, message):
    proc = _reframe(tmp_path, "-S", option, action="-l")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"twinbench_check: error: {message}"), line
