"""--cpu-bind cores: local ranks that no launcher bound take disjoint shares of the host's CPUs; a mask a launcher
narrowed (srun --cpu-bind, mpirun) is kept and recorded as the launcher's; the default binds nothing. Real processes,
no TensorFlow (``common.cluster.placement.bind_cpus``); the same through both backends in tests/test_netif.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from common.cluster.placement import cpu_share
from tests.conftest import REPO

CPUS = sorted(os.sched_getaffinity(0))


@pytest.mark.parametrize("rank, size, cpus, expected", [
    (0, 2, [0, 1], [0]), (1, 2, [0, 1], [1]),
    (1, 2, [0, 1, 2, 3], [2, 3]), (1, 2, [4, 5, 6, 7, 8], [6, 7]),  # remainder idle, like the thread budget
    (2, 4, [0, 1], [0]), (3, 4, [0, 1], [1]),  # more ranks than CPUs: round robin
    (0, 1, [0, 1], [0, 1]),
])
def test_cpu_share(rank, size, cpus, expected):
    assert cpu_share(rank, size, cpus) == expected


# A thread started before the binding (as Horovod's background thread is, by hvd.init) must end up bound too.
CHILD = """
import json, os, threading
from common.cluster.placement import bind_cpus
started, done = threading.Event(), threading.Event()
seen = {}
def early():
    seen["tid"] = threading.get_native_id()
    started.set()
    done.wait()
t = threading.Thread(target=early)
t.start()
started.wait()
cpus, how = bind_cpus(%d, %d, %r)
masks = {sorted(os.sched_getaffinity(int(tid))).__repr__() for tid in os.listdir("/proc/self/task")}
done.set()
t.join()
assert len(masks) == 1, masks  # every thread, the early one included, has the same mask
print(json.dumps([cpus, how, sorted(os.sched_getaffinity(0))]))
"""


def _bind_in_child(rank: int, size: int, mode: str,
                   prefix: list[str] | None = None) -> tuple[list[int], str, list[int]]:
    """(CPUs bind_cpus returned, who bound, the actual mask afterwards) in a fresh child process, whose threads all
    share that mask."""
    code = CHILD % (rank, size, mode)
    out = subprocess.run([*(prefix or []), sys.executable, "-c", code], cwd=REPO, check=True, capture_output=True,
                         text=True, env=dict(os.environ, PYTHONPATH=str(REPO))).stdout
    cpus, how, actual = json.loads(out)
    return cpus, how, actual


@pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 CPUs to share")
def test_unbound_local_ranks_bind_themselves_to_disjoint_shares():
    got = [_bind_in_child(r, 2, "cores") for r in range(2)]
    for r, (cpus, how, actual) in enumerate(got):
        assert how == "self" and cpus == actual == cpu_share(r, 2, CPUS), got
    assert not set(got[0][0]) & set(got[1][0])


@pytest.mark.skipif(len(CPUS) < 2 or not shutil.which("taskset"), reason="needs 2 CPUs and taskset")
def test_a_launchers_binding_is_kept():
    for mode in ("cores", "none"):
        cpus, how, actual = _bind_in_child(1, 2, mode, ["taskset", "-c", str(CPUS[0])])
        assert (cpus, how, actual) == ([CPUS[0]], "launcher", [CPUS[0]]), mode


def test_default_and_single_rank_leave_the_mask_alone():
    assert _bind_in_child(1, 2, "none") == (CPUS, "none", CPUS)
    assert _bind_in_child(0, 1, "cores") == (CPUS, "none", CPUS)
