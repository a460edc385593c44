"""Test helpers around tests/cluster/cluster.sh: start, drive and stop an emulated cluster, run processes on its
nodes. Shared by tests/test_cluster.py (the cluster itself) and tests/test_cluster_runs.py (twinbench across it).

One 2-node cluster per suite: the session fixture ``emu`` (below; a plugin of tests/conftest.py) takes the one named by
$TWINBENCH_EMULATED_CLUSTER when it runs (`make test` starts it once for both pytest sessions:
``python -m tests.cluster.emulated start|stop DIR``), else starts its own and stops it at the session's end.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, base_env, skip_or_fail

CLUSTER = REPO / "tests" / "cluster" / "cluster.sh"
NODES = ["node1", "node2"]
IMMEDIATE = "--immediate=120"  # srun/salloc: fail instead of queueing forever
SHARED = "TWINBENCH_EMULATED_CLUSTER"  # the directory of a 2-node cluster started before pytest (make test)
STARTED_IN = "started_in"  # file in a shared cluster's directory: how many seconds its start took
JOB_TIMEOUT = 300  # s for one batch job or multi-process run across the nodes; then it is cancelled, the test fails


def why_no_cluster() -> str | None:
    """Why this machine cannot run the emulated cluster (a skip reason), or None."""
    if os.geteuid() != 0:
        return "the emulated cluster needs root (network namespaces, routes, daemons as root)"
    probe = subprocess.run(["unshare", "--net", "--uts", "--mount", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"Linux namespaces are not available here (unshare --net --uts --mount: {probe.stderr.strip()})"
    return None


def sh(*args: str, timeout: int = 120, check: bool = True,
       env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``cluster.sh ARGS...`` from the repository root; a failure (with check) shows its output."""
    proc = subprocess.run(["bash", str(CLUSTER), *args], cwd=REPO, env=env or base_env(), capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"cluster.sh {' '.join(args)} exited {proc.returncode}\n--- stdout\n"
                             f"{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-5000:]}")
    return proc


class Emulated:
    """A started cluster: its directory, settings (cluster.env) and a per-module cache of expensive runs."""

    def __init__(self, directory: Path, started_in: float) -> None:
        self.dir = directory
        self.started_in = started_in
        self.settings = dict(re.findall(r"^(\w+)=(\S+)$", (directory / "cluster.env").read_text(), re.M))
        self.cache: dict[str, Any] = {}

    def sh(self, verb: str, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return sh(verb, str(self.dir), *args, **kw)

    def run(self, member: str, *cmd: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return self.sh("run", member, *cmd, **kw)

    def popen(self, member: str, cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
        """``cmd`` on ``member`` in the background, stdout and stderr into ``log`` (never a pipe that can fill)."""
        with open(log, "wb") as f:
            return subprocess.Popen(["bash", str(CLUSTER), "run", str(self.dir), member, *cmd], cwd=REPO,
                                    env=env or base_env(), stdout=f, stderr=subprocess.STDOUT)

    def addr(self, member: str) -> str:
        base = self.settings["NETBASE"]
        return f"{base}.1" if member == "login" else f"{base}.{10 + int(member[4:])}"

    def once(self, key: str, make: Any) -> Any:
        if key not in self.cache:
            self.cache[key] = make()
        return self.cache[key]

    def sbatch(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> dict[str, str]:
        """Submit from the login node, wait for the job to end (cancelled after JOB_TIMEOUT); scontrol's fields,
        plus the log."""
        job = self.run("login", "sbatch", "--parsable", f"--output={log}", *args, env=env).stdout.strip()
        job = job.split(";")[0]
        deadline = time.monotonic() + JOB_TIMEOUT
        while True:
            out = self.run("login", "scontrol", "-o", "show", "job", job).stdout
            info = dict(f.split("=", 1) for f in out.split() if "=" in f)
            if info.get("JobState") not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", None):
                break
            if time.monotonic() > deadline:
                self.run("login", "scancel", job, check=False)
                raise AssertionError(f"job {job} still {info.get('JobState')} after {JOB_TIMEOUT} s; cancelled\n"
                                     f"{log.read_text()[-3000:] if log.exists() else ''}")
            time.sleep(0.5)
        info["log"] = log.read_text() if log.exists() else ""
        return info


def wait_all(procs: list[subprocess.Popen], logs: list[Path], timeout: float = JOB_TIMEOUT) -> list[int]:
    """Exit statuses of ``procs``; any still running after ``timeout`` s is killed (by its own PID) and the
    test fails with the logs."""
    deadline = time.monotonic() + timeout
    try:
        return [p.wait(timeout=max(deadline - time.monotonic(), 0.1)) for p in procs]
    except subprocess.TimeoutExpired:
        tails = "\n".join(f"--- {log.name}\n{log.read_text()[-2000:]}" for log in logs)
        raise AssertionError(f"processes still running after {timeout:.0f} s\n{tails}") from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def start(directory: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = env or base_env()
    env["TWINBENCH_CLUSTER_INSTALL"] = "0"  # a test never installs packages; a missing one is a failure
    return sh("start", *extra, str(directory), env=env, check=False)


def cluster(directory: Path, *extra: str) -> Iterator[Emulated]:
    """A fixture's body: skip without root or namespaces, fail when the cluster does not start, always stop it."""
    why = why_no_cluster()
    if why:
        skip_or_fail(why)
    t0 = time.monotonic()
    proc = start(directory, *extra)
    if proc.returncode != 0:
        sh("stop", str(directory), check=False)
        pytest.fail(f"cluster.sh start failed ({proc.returncode}):\n{proc.stderr[-5000:]}")
    try:
        yield Emulated(directory, time.monotonic() - t0)
    finally:
        sh("stop", str(directory), check=False)


@pytest.fixture(scope="session")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulated]:
    """The emulated 2-node cluster of tests/test_cluster.py and tests/test_cluster_runs.py, one per suite: the
    running cluster $TWINBENCH_EMULATED_CLUSTER names (its starter stops it), else one of this session's own. Tests
    that change it (shape, cpus, cut) undo the change."""
    shared = os.environ.get(SHARED)
    if shared and (Path(shared) / STARTED_IN).exists() and (Path(shared) / "cluster.env").exists():
        yield Emulated(Path(shared), float((Path(shared) / STARTED_IN).read_text()))
        return
    yield from cluster(tmp_path_factory.mktemp("cluster"), "--nodes", "2")


def main(argv: list[str]) -> int:
    """``start DIR``: a 2-node cluster in DIR (nothing started, and a message, where it cannot start: the tests then
    report why); ``stop DIR``: stop it (its recorded PIDs; idempotent)."""
    verb, directory = argv
    if verb == "stop":
        return sh("stop", directory, check=False).returncode
    why = why_no_cluster()
    if why:
        print(f"no shared emulated cluster: {why}", file=sys.stderr)
        return 0
    t0 = time.monotonic()
    proc = start(Path(directory), "--nodes", "2")
    if proc.returncode != 0:
        sh("stop", directory, check=False)
        print(f"no shared emulated cluster: cluster.sh start failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
        return 0
    (Path(directory) / STARTED_IN).write_text(f"{time.monotonic() - t0:.2f}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
