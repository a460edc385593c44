"""Reliability: a dead rank ends the run everywhere, and a preempted run resumes to identical weights.

Real processes on CPU over loopback. Kill tests measure the time from SIGKILL of one rank to the last rank gone.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from common.cluster.localcluster import loopback_workers, tf_config
from tests import bn_model
from tests.conftest import BIN, PY, REPO, SMOKE, backend_cmd, base_env, first_divergence, only_result, run, signal_env

pytestmark = pytest.mark.distributed
EXIT_PREEMPTED = 75
EXIT_PEER_LOST = 3
LOST_WITHIN = 60.0  # the promise: every other rank exits within 60 s


def _cmd(kind: str, results: Path, *extra: str) -> list[str]:
    body = ["-m", f"backends.{kind}", "--job", SMOKE, "--results", str(results), "--quiet", *extra]
    if kind == "native":
        return [PY, *body[:2], "--nproc", "2", *body[2:]]
    return [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", PY, *body]


def _preempt_extra(mode: str) -> tuple[str, ...]:
    return ("--set", f"mode={mode}", "--preempt-check-steps", "1")


# The preempted Horovod run of this mode runs under horovodrun (its exit status naming the rank's code, and the
# resume under it, are asserted); the other mode's ranks run under mpirun, the tests' launcher (the resume math is
# the property there, and mpirun saves horovodrun's start-up and its TensorFlow-importing check process).
HOROVODRUN_PREEMPT_MODE = "ctl"


def _preempt_cmd(kind: str, mode: str, results: Path) -> list[str]:
    if kind == "horovod" and mode != HOROVODRUN_PREEMPT_MODE:
        return backend_cmd(kind, results, *_preempt_extra(mode))
    return _cmd(kind, results, *_preempt_extra(mode))


@pytest.fixture(scope="module")
def preempted(tmp_path_factory: pytest.TempPathFactory):
    """``(kind, mode)`` -> (the run preempted at step 5, its results dir, a copy of its checkpoints dir), each run
    once per module. The results dir is the resume test's (resuming deletes the checkpoint); tests that only need
    a checkpoint read the copy, taken before anything resumed."""
    cache: dict[tuple[str, str], tuple[subprocess.CompletedProcess[str], Path, Path]] = {}

    def go(kind: str, mode: str) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
        if (kind, mode) not in cache:
            out = tmp_path_factory.mktemp(f"preempted-{kind}-{mode}")
            # The chief alone gets SIGTERM after step 5: the others learn it at the next agreement (step 5 as well).
            first = run(_preempt_cmd(kind, mode, out), check=False, env=signal_env(5))
            kept = tmp_path_factory.mktemp(f"kept-checkpoints-{kind}-{mode}")
            if (out / "checkpoints").is_dir():
                shutil.copytree(out / "checkpoints", kept, dirs_exist_ok=True)
            cache[(kind, mode)] = (first, out, kept)
        return cache[(kind, mode)]

    return go


@pytest.mark.parametrize("kind", ["native", "horovod"])
@pytest.mark.parametrize("mode", ["fit", "ctl"])
def test_preempt_and_resume_gives_identical_weights(runner, preempted, kind, mode):
    """Preempted after step 5 of 12, the same command resumes to the straight run's weights and losses, bit for
    bit. Horovod under horovodrun in mode HOROVODRUN_PREEMPT_MODE, under mpirun in the other (``_preempt_cmd``)."""
    first, results, _ = preempted(kind, mode)
    if kind == "horovod" and mode == HOROVODRUN_PREEMPT_MODE:
        # horovodrun reports any failing rank as its own status 1, naming the rank's code
        assert first.returncode == 1 and "Exit code: 75" in first.stderr, first.stderr[-4000:]
    else:  # the native launcher, and mpirun, pass on the ranks' status
        assert first.returncode == EXIT_PREEMPTED, first.stdout[-2000:] + first.stderr[-4000:]
    ckpts = list((results / "checkpoints").iterdir())
    assert len(ckpts) == 1 and (ckpts[0] / "meta.json").exists()
    meta = json.loads((ckpts[0] / "meta.json").read_text())
    assert meta["step"] == 5 and meta["signal"] == "SIGTERM"
    assert not list(results.glob("*.json")), "an interrupted run must not leave a results file"

    run(_preempt_cmd(kind, mode, results))  # the same command again resumes
    resumed = only_result(results)
    assert resumed["resumed_from_step"] == 5
    assert not (results / "checkpoints").exists() or not any((results / "checkpoints").iterdir())
    straight = runner(kind, "--set", f"mode={mode}")
    assert resumed["weights_digest"] == straight["weights_digest"]
    assert first_divergence(resumed["step_losses"], straight["step_losses"], 0.0) is None


@pytest.mark.parametrize("kind", ["native", "horovod"])
def test_batchnorm_model_resumes_to_the_same_trainable_weights(runner, tmp_path, kind):
    """A BatchNorm model (tests/bn_model.py), fit, preempted after step 2 of 4: the checkpoint holds the moving
    statistics' mean over replicas, so only the trainable weights can be bit-identical after a resume; they must be,
    and the losses too. Horovod's ranks by mpirun (the tests' launcher): the resume math is what is tested here;
    horovodrun's exit status and its resume: test_preempt_and_resume_gives_identical_weights."""
    job = ("--set", "mode=fit", *bn_model.JOB)  # as in test_parity: one cached straight run per backend
    extra = (*job, "--preempt-check-steps", "1")
    first = run(backend_cmd(kind, tmp_path, *extra), check=False, env=signal_env(2))
    assert first.returncode == EXIT_PREEMPTED, first.stderr[-3000:]  # mpirun passes on the rank's status
    meta = json.loads(next((tmp_path / "checkpoints").glob("*/meta.json")).read_text())
    assert meta["step"] == 2
    run(backend_cmd(kind, tmp_path, *extra))
    resumed = only_result(tmp_path)
    straight = runner(kind, *job)
    assert resumed["resumed_from_step"] == 2 and resumed["all_weights_consistent"]
    assert resumed["trainable_weights_digest"] == straight["trainable_weights_digest"]
    assert first_divergence(resumed["step_losses"], straight["step_losses"], 0.0) is None


def test_resume_refuses_another_world_size(preempted, tmp_path):
    # the 2-worker checkpoint of the resume test's native fit run (a copy: that test resumes the original)
    first, _, kept = preempted("native", "fit")
    assert first.returncode == EXIT_PREEMPTED
    ckpt = next(kept.iterdir())
    proc = run([PY, "-m", "backends.native", "--job", SMOKE, "--results", str(tmp_path / "other"), "--quiet",
                "--resume-from", str(ckpt)], check=False)
    assert proc.returncode == 2
    assert "written with 2 replicas, this run has 1" in proc.stderr and "Traceback" not in proc.stderr


def _wait_for(proc: subprocess.Popen[str], needle: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                break
            continue
        seen.append(line)
        if needle in line:
            return
    raise AssertionError(f"never saw {needle!r}; output:\n{''.join(seen)[-3000:]}")


def _pids_with(marker: str) -> dict[int, dict[str, str]]:
    """pid -> environment of the python processes whose command line contains ``marker``."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().decode().split("\0")
            cmd = " ".join(argv)
            if marker in cmd and "-m backends." in cmd and "python" in Path(argv[0]).name and "--nproc" not in cmd:
                env = dict(kv.split("=", 1) for kv in (d / "environ").read_bytes().decode().split("\0") if "=" in kv)
                if "HOROVOD_RANK" in env or "TWINBENCH_LOCAL_RANK" in env:  # a rank, not a launcher or shell
                    out[int(d.name)] = env
        except (OSError, ValueError):
            continue
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        return state != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("mode", ["ctl", "fit"])
def test_native_dead_worker_stops_the_other_by_watchdog(tmp_path, mode):
    """No launcher to rescue it: two TF_CONFIG workers, one killed; the survivor's watchdog must end it."""
    workers = loopback_workers(2)
    procs = []
    for i in range(2):
        env = base_env()
        env["TF_CONFIG"] = tf_config(workers, i)
        env["TWINBENCH_LOCAL_SIZE"] = "2"
        procs.append(subprocess.Popen(
            [PY, "-m", "backends.native", "--job", SMOKE, "--set", "steps=100000", "--set", f"mode={mode}",
             "--results", str(tmp_path / f"r{i}")],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        _wait_for(procs[0], "first step done")
        time.sleep(1.0)
        procs[1].kill()
        t0 = time.monotonic()
        rc = procs[0].wait(timeout=LOST_WITHIN + 30)
        elapsed = time.monotonic() - t0
        err = procs[0].stderr.read()
    finally:
        for p in procs:
            p.kill()
    print(f"survivor exited {rc} {elapsed:.1f} s after the kill")
    assert rc == EXIT_PEER_LOST, err[-2000:]
    assert elapsed < LOST_WITHIN
    assert "lost rank 1" in err


@pytest.mark.parametrize(("kind", "mode"), [("native", "ctl"), ("horovod", "fit")])
def test_killed_rank_under_launcher_ends_everything(tmp_path, kind, mode):
    """--nproc and horovodrun: kill -9 one rank mid-run; every rank and the launcher are gone within 60 s.
    One mode per launcher (the two modes between them): what ends the survivor is the launcher, which sees a child
    exit and kills the rest (--nproc: common.cluster.localcluster.supervise; horovodrun likewise), whatever the
    survivor's training loop is doing. The survivor's own way out, its watchdog, is per mode:
    test_native_dead_worker_stops_the_other_by_watchdog."""
    marker = str(tmp_path)
    log = tmp_path / "launcher.log"  # a file, not a pipe: read while the run goes on, never full
    # not --quiet: the chief's "first step done" line says when training has started (below)
    cmd = [a for a in _cmd(kind, tmp_path, "--set", "steps=100000", "--set", f"mode={mode}") if a != "--quiet"]
    with open(log, "w") as out:
        launcher = subprocess.Popen(cmd, cwd=REPO, env=base_env(), stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        ranks = {}
        while time.monotonic() < deadline and len(ranks) < 2:
            ranks = _pids_with(marker)
            time.sleep(0.5)
        assert len(ranks) == 2, f"expected 2 rank processes, found {ranks}"
        # Kill mid-run: once training has started, which the chief's progress line says (hence no --quiet).
        # A fixed 8 s (native) or 12 s (Horovod) sleep stood here, a guess at how long 2 ranks take to start here.
        while "first step done" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline and launcher.poll() is None, \
                f"no 'first step done' (exit {launcher.poll()}):\n{log.read_text(errors='replace')[-3000:]}"
            time.sleep(0.2)
        time.sleep(1.0)
        victim = next(pid for pid, env in ranks.items()
                      if env.get("HOROVOD_RANK", env.get("TWINBENCH_LOCAL_RANK")) == "1")
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        rc = launcher.wait(timeout=LOST_WITHIN + 30)
        while any(_alive(p) for p in ranks) and time.monotonic() - t0 < LOST_WITHIN:
            time.sleep(0.2)
        elapsed = time.monotonic() - t0
        output = log.read_text(errors="replace")
    finally:
        launcher.kill()
    print(f"{kind}: launcher exited {rc}, all ranks gone {elapsed:.1f} s after the kill")
    assert rc != 0
    assert not any(_alive(p) for p in ranks)
    assert elapsed < LOST_WITHIN
    if kind == "native":
        assert "worker 1" in output and "SIGKILL" in output


def test_no_results_file_without_a_finished_run(runner):
    """Atomic writes: the results dir holds only complete JSONs (hidden temp files are never left behind)."""
    results = runner.results_dir("native")  # the session's plain native run (--nproc 2), only read here
    names = sorted(p.name for p in results.iterdir())
    # one complete JSON, beside the run's TensorBoard scalars (written after the record)
    assert len(names) == 2 and names[0].endswith(".json") and names[1] == "tensorboard", names
    hidden = [p for p in results.rglob(".*")]
    assert not hidden, hidden


def test_a_peer_that_closes_its_port_after_the_failed_collective_is_still_named_lost():
    """The race a killed peer makes: the collective fails on its closed connection while its heartbeat port still
    answers for a moment (its threads still exiting). With no grace the peer looks alive and the failure would be a
    plain error (exit 1); within the grace the port closes and the peer is named (exit 3)."""
    import threading

    from common.training import reliability as rel

    def peer_closing_in(seconds: float) -> tuple[rel.Watchdog, threading.Timer]:
        beat = rel.Heartbeat()
        dog = rel.Watchdog(0, [{"rank": 1, "host": "h", "address": "127.0.0.1", "port": beat.port, "pid": 1}])
        timer = threading.Timer(seconds, beat.close)
        timer.start()
        return dog, timer

    dog, timer = peer_closing_in(1.5)
    assert dog.lost_peers() == []  # answers now: without a grace, not lost
    timer.join()
    dog, timer = peer_closing_in(1.5)
    t0 = time.monotonic()
    assert [p["rank"] for p in dog.lost_peers(grace=6.0)] == [1]
    assert time.monotonic() - t0 < 6.0
    timer.join()


def test_a_peer_never_reached_is_a_set_up_error_and_one_that_stops_answering_is_lost(monkeypatch):
    """A peer whose published address fails from the first probe never was reachable from here (a name that does
    not resolve, another network): exit 2 naming the address and --iface, not exit 3 and "lost rank". A peer that
    answered and then stopped is lost (exit 3)."""
    from common.training import reliability as rel

    monkeypatch.setattr(rel, "PROBE_INTERVAL", 0.2)  # the same rule, five times faster

    def watch(beat: rel.Heartbeat, address: str, close_after: float | None) -> tuple[int, str]:
        ended: list[tuple[int, str]] = []
        done = threading.Event()

        def record(code: int, message: str) -> None:
            ended.append((code, message))
            done.set()

        peer = {"rank": 1, "host": "h", "address": address, "port": beat.port, "pid": 7}
        dog = rel.Watchdog(0, [peer], peer_timeout=20.0, exit_fn=record).start()
        if close_after is not None:
            time.sleep(close_after)
            beat.close()
        assert done.wait(30), "the watchdog never ended the rank"
        dog.stop()
        return ended[0]

    beat = rel.Heartbeat()
    try:
        code, message = watch(beat, "no-such-node.invalid", None)  # a name that does not resolve
    finally:
        beat.close()
    assert code == rel.EXIT_USAGE, message
    assert message.startswith("set-up: rank 0 cannot reach rank 1 (host h, pid 7) at no-such-node.invalid port ")
    assert "--iface" in message and "lost" not in message
    code, message = watch(rel.Heartbeat(), "127.0.0.1", close_after=1.0)  # answered, then gone
    assert code == rel.EXIT_PEER_LOST, message
    assert message.startswith("lost rank 1 (host h, pid 7): it no longer answers")
