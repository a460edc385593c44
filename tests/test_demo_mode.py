"""scripts/demo.sh keeps the job's own mode unless MODE= is given, runs the step-time breakdown of that same job
or says in one line why a fit job has none, and says (and exports once) how Horovod's ranks are launched; a launch
that cannot run is one line and exit 2 before any run. Fake runs (tests/test_demo_until.py's ``fake_demo``): no
TensorFlow."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import REPO
from tests.test_demo_until import fake_demo


def fit_job(tmp_path: Path) -> Path:
    job = tmp_path / "fit.toml"
    text = (REPO / "jobs" / "demo.toml").read_text()
    assert 'mode = "ctl"' in text
    job.write_text(text.replace('mode = "ctl"', 'mode = "fit"'))
    return job


def commands(tmp_path: Path) -> list[str]:
    return (tmp_path / "commands.txt").read_text().splitlines()


def test_a_fit_job_stays_fit_and_its_missing_breakdown_is_said_once(tmp_path: Path) -> None:
    proc, out = fake_demo(tmp_path, REPEATS="1", STEPS="20", JOB=str(fit_job(tmp_path)))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0].startswith(f"twinbench demo: {tmp_path / 'fit.toml'}, mode fit (the job's), ")
    ran = commands(tmp_path)
    assert len(ran) == 4 + 2 and not any("mode=" in c for c in ran)  # 4 cells, 2 allreduce; no mode forced
    assert not any("--diagnose" in c for c in ran)  # no breakdown of another (ctl) job
    skipped = [ln for ln in proc.stdout.splitlines() if ln.startswith("[demo] skipped")]
    assert skipped == ["[demo] skipped the step-time breakdown: --diagnose breakdown splits the custom loop's step "
                       "into phases: use MODE=ctl (the job has mode fit)"]
    assert (out / "report" / "report.md").is_file()


def test_mode_given_is_every_runs_mode_and_the_breakdown_is_of_that_job(tmp_path: Path) -> None:
    proc, _ = fake_demo(tmp_path, REPEATS="1", STEPS="20", JOB=str(fit_job(tmp_path)), MODE="ctl")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert ", mode ctl (MODE=ctl), " in proc.stdout.splitlines()[0]
    ran = commands(tmp_path)
    breakdowns = [c for c in ran if "--diagnose breakdown" in c]
    assert len(breakdowns) == 4 and all("--set mode=ctl" in c for c in ran if "--bench" not in c)
    assert not any(ln.startswith("[demo] skipped") for ln in proc.stdout.splitlines())


def test_the_demo_says_how_horovod_ranks_are_launched(tmp_path: Path) -> None:
    proc, _ = fake_demo(tmp_path, REPEATS="1", STEPS="20", TWINBENCH_HOROVOD_CONTROLLER="mpi")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.splitlines()[1] == \
        "[demo] horovod ranks: mpirun (MPI controller; TWINBENCH_HOROVOD_CONTROLLER=mpi)"


def test_a_launch_that_cannot_run_is_one_line_before_any_run(tmp_path: Path) -> None:
    proc, out = fake_demo(tmp_path, TWINBENCH_HOROVOD_CONTROLLER="gloo+mpi")
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        "demo: TWINBENCH_HOROVOD_CONTROLLER='gloo+mpi': must be one of auto, gloo, mpi"]
    assert not out.exists() and not (tmp_path / "commands.txt").exists()
