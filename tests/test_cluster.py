"""The emulated multi-node cluster (tests/cluster/cluster.sh): nodes as network + UTS + mount namespaces on one
machine, each with its own host name, address, slurmd and sshd (twinbench across it: tests/test_cluster_runs.py).

One 2-node cluster (2 CPUs and 2 fake GPUs per node) serves the whole suite (the session fixture ``emu``,
tests/cluster/emulated.py; the tests that change it undo the change); the tests that stop or break a cluster start their
own (helpers in tests/cluster/emulated.py). Root and Linux namespaces are needed (else skipped with the reason); the
packages come with ``TWINBENCH_WITH_SLURM=1 make setup``, and their absence is a failure, not a skip.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest
from horovod.runner.util.remote import get_ssh_command

from common.cluster.placement import cpu_share
from tests.cluster.emulated import CLUSTER, IMMEDIATE, NODES, Emulated, cluster, sh, start
from tests.conftest import PY, REPO, base_env

TCP_PROBE_PORT = 5201  # inside the node namespaces: nothing else can be listening there

# One TCP transfer between two nodes: the receiver prints the Mbit/s it saw from accept to EOF.
RECEIVER = f"""
import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", {TCP_PROBE_PORT})); s.listen(1); s.settimeout(20)
c, _ = s.accept(); n = 0; t0 = time.monotonic()
while b := c.recv(1 << 20):
    n += len(b)
print(n * 8 / (time.monotonic() - t0) / 1e6)
"""
SENDER = f"""
import socket, sys, time
end = time.monotonic() + 10
while True:  # until the receiver listens
    try:
        c = socket.create_connection((sys.argv[1], {TCP_PROBE_PORT}), timeout=5); break
    except ConnectionRefusedError:
        if time.monotonic() > end: raise
        time.sleep(0.05)
buf = b"x" * (1 << 20); end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    c.sendall(buf)
c.close()
"""
# exit 0 if a TCP connection to HOST:PORT opens within TIMEOUT seconds, else 1
CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
except OSError as e:
    print(repr(e)); sys.exit(1)
"""


def _recorded(directory: Path) -> list[str]:
    """Pid files and created objects a cluster directory still lists."""
    found = [f"pid file {f.name}" for f in (directory / "pids").glob("*.pid")]
    if (directory / "created").exists() and (directory / "created").read_text().strip():
        found.append(f"created: {(directory / 'created').read_text()}")
    return found


def _leftovers(directory: Path, netbase: str, prefix: str) -> list[str]:
    """What a stopped cluster must not leave behind: recorded state, its namespaces, its route."""
    found = _recorded(directory)
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    found += [f"namespace {n}" for n in names if n.startswith(f"{prefix}-")]
    route = subprocess.run(["ip", "-4", "route", "show", f"{netbase}.0/24"], capture_output=True, text=True)
    if route.stdout.strip():
        found.append(f"route {route.stdout.strip()}")
    return found


def _recorded_pids(directory: Path) -> dict[str, int]:
    return {f.name: int(f.read_text().split()[0]) for f in (directory / "pids").glob("*.pid")}


# -- the nodes --------------------------------------------------------------------------------------------------------
def test_starts_quickly_with_one_host_name_and_address_per_node(emu):
    assert emu.started_in < 30, f"start took {emu.started_in:.1f} s"
    for member in ["login", *NODES]:
        assert emu.run(member, "hostname").stdout.strip() == member
        # The same data interface name on every node, with the node's own address; nothing else but loopback.
        links = emu.run(member, "ip", "-o", "-4", "addr", "show").stdout
        assert re.findall(r"^\d+: (\S+)\s+inet (\S+)/", links, re.M) == [
            ("lo", "127.0.0.1"), ("tb0", emu.addr(member))], links
        # Names resolve to the bridge addresses (a node's own name too, as on a real cluster).
        assert emu.run(member, "getent", "hosts", "node2").stdout.split()[0] == emu.addr("node2")
    # The root namespace holds no interface of the cluster.
    assert "tb0" not in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout


def test_root_namespace_cannot_reach_the_subnet(emu):
    """The guard: a client run outside the namespaces by mistake fails at once, nothing leaves the machine."""
    route = subprocess.run(["ip", "-4", "route", "show", f"{emu.settings['NETBASE']}.0/24"], capture_output=True,
                           text=True).stdout
    assert route.startswith("unreachable "), route
    get = subprocess.run(["ip", "route", "get", emu.addr("node1")], capture_output=True, text=True)
    assert get.returncode != 0 and "No route to host" in get.stderr, get.stdout + get.stderr
    t0 = time.monotonic()
    with pytest.raises(OSError) as err:
        socket.create_connection((emu.addr("node1"), 22), timeout=5)
    assert err.value.errno == errno.EHOSTUNREACH and time.monotonic() - t0 < 1, err.value


def test_srun_places_two_tasks_per_node(emu):
    out = emu.run("login", "srun", IMMEDIATE, "-N2", "-n4", "--label", "hostname").stdout
    assert sorted(out.split("\n")[:-1]) == ["0: node1", "1: node1", "2: node2", "3: node2"], out
    info = emu.run("login", "sinfo", "-h", "-N", "-o", "%N %T %c %G").stdout.split("\n")[:-1]
    assert [ln.split()[:3] for ln in info] == [["node1", "idle", "2"], ["node2", "idle", "2"]], info
    assert all(ln.split()[3].startswith("gpu:2") for ln in info), info


def test_gres_gpus_per_node(emu):
    """Slurm binds one fake GPU per task on every node, and refuses more GPUs than a node has."""
    out = emu.run("login", "srun", IMMEDIATE, "-N2", "-n4", "--gres=gpu:2", "--gpus-per-task=1", "--label",
                  "bash", "-c", "echo $(hostname) $CUDA_VISIBLE_DEVICES").stdout
    assert sorted(out.split("\n")[:-1]) == ["0: node1 0", "1: node1 1", "2: node2 0", "3: node2 1"], out
    too_many = emu.run("login", "srun", "--immediate=5", "-N1", "--gres=gpu:3", "true", check=False, timeout=60)
    assert too_many.returncode != 0, too_many.stdout


def test_ssh_between_nodes_as_horovodrun_does(emu):
    """horovodrun's own ssh command line (plain `ssh`, no key or port given) from node1 to node2 and back."""
    dot_ssh = Path.home() / ".ssh"
    had_dot_ssh = dot_ssh.exists()
    for src, dst in (("node1", "node2"), ("node2", "node1")):
        proc = emu.run(src, "bash", "-c", get_ssh_command("hostname", dst), timeout=30)
        assert proc.stdout.strip() == dst, proc.stderr
    proc = emu.run("login", "ssh", "node2", "hostname; echo $SSH_CONNECTION", timeout=30)
    assert proc.stdout.split()[:2] == ["node2", emu.addr("login")], proc.stdout
    assert dot_ssh.exists() == had_dot_ssh, "ssh inside the cluster must not create ~/.ssh"


def _throughput(emu: Emulated, seconds: float = 1.0) -> float:
    """Mbit/s of one TCP transfer node1 -> node2."""
    receiver = subprocess.Popen(["bash", str(CLUSTER), "run", str(emu.dir), "node2", PY, "-c", RECEIVER],
                                cwd=REPO, env=base_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        emu.run("node1", PY, "-c", SENDER, "node2", str(seconds), timeout=60)
        out, err = receiver.communicate(timeout=30)
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
    assert receiver.returncode == 0, err
    return float(out)


@pytest.mark.timing  # asserts on wall-clock figures: run alone (tests/conftest.py)
def test_shape_limits_every_link(emu):
    try:
        free = _throughput(emu)
        emu.sh("shape", "200mbit")
        shaped = _throughput(emu)
        emu.sh("shape", "100mbit")
        half = _throughput(emu)
    finally:
        emu.sh("shape", "off")
    assert shaped < free / 2, f"200mbit: {shaped:.0f} Mbit/s vs {free:.0f} unshaped"
    assert 150 < shaped <= 210, f"shaped to 200mbit, measured {shaped:.0f} Mbit/s"
    assert 0.4 < half / shaped < 0.6, f"100mbit: {half:.0f} Mbit/s vs 200mbit: {shaped:.0f} Mbit/s"
    back = _throughput(emu)
    assert back > 2 * shaped, f"after shape off: {back:.0f} Mbit/s"


def _allowed(emu: Emulated, how: str) -> dict[str, str]:
    """Host -> the CPUs a process started there may use: by srun (a job step under slurmd), over ssh from the
    login node (a session under sshd) and by ``run`` on the node."""
    show = "echo $(hostname) $(grep Cpus_allowed_list /proc/self/status | cut -f2)"
    if how == "srun":
        out = emu.run("login", "srun", IMMEDIATE, "-N2", "-n2", "bash", "-c", show).stdout
    elif how == "ssh":
        out = "".join(emu.run("login", "ssh", node, show, timeout=30).stdout for node in NODES)
    else:
        out = "".join(emu.run(node, "bash", "-c", show).stdout for node in NODES)
    return dict(line.split() for line in out.strip().split("\n"))


def test_cpus_split_gives_each_node_its_own_share(emu):
    """`cpus split`: every way a process gets onto a node (srun, ssh, run) puts it on that node's own CPUs, the
    nodes' shares are disjoint when the host has a CPU per node; `cpus shared` gives all of them back."""
    host = sorted(os.sched_getaffinity(0))
    try:
        emu.sh("cpus", "split")
        split = {how: _allowed(emu, how) for how in ("srun", "ssh", "run")}
        assert "cpus split" in emu.sh("status").stdout
    finally:
        emu.sh("cpus", "shared")
    for how, got in split.items():
        assert sorted(got) == NODES and got == split["run"], f"{how}: {got} (run: {split['run']})"
    # the same shares a rank takes under --cpu-bind cores (common.cluster.placement.cpu_share), nodes for local ranks
    assert [_cpu_list(split["run"][node]) for node in NODES] == [cpu_share(k, len(NODES), host) for k in range(2)]
    if len(host) >= len(NODES):
        assert not set(_cpu_list(split["run"]["node1"])) & set(_cpu_list(split["run"]["node2"])), split["run"]
    for how in ("srun", "run"):
        assert all(_cpu_list(c) == host for c in _allowed(emu, how).values()), f"after shared ({how})"


def test_cpus_split_with_more_nodes_than_cores_goes_round_robin(tmp_path):
    """3 nodes: node K's CPUs are cpu_share(K-1, 3, host) (on 2 cores: node3 shares node1's)."""
    gen = cluster(tmp_path / "c3", "--nodes", "3")
    emu = next(gen)
    try:
        emu.sh("cpus", "split")
        show = "grep Cpus_allowed_list /proc/self/status | cut -f2"
        got = [_cpu_list(emu.run(f"node{k}", "bash", "-c", show).stdout.strip()) for k in (1, 2, 3)]
    finally:
        next(gen, None)
    host = sorted(os.sched_getaffinity(0))
    assert got == [cpu_share(k, 3, host) for k in range(3)], got


def _cpu_list(text: str) -> list[int]:
    """'0-2,5' -> [0, 1, 2, 5]"""
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out


def test_cut_and_heal(emu):
    ssh_port = ["node2", "22"]
    assert emu.run("node1", PY, "-c", CONNECT, *ssh_port, "2").returncode == 0
    emu.sh("cut", "node2")
    try:
        cut = emu.run("node1", PY, "-c", CONNECT, *ssh_port, "2", check=False)
        assert cut.returncode == 1, f"node2 still reachable after cut: {cut.stdout}"
        # Only node2 is off: node1 still answers the login node.
        assert emu.run("login", PY, "-c", CONNECT, "node1", "22", "2").returncode == 0
    finally:
        emu.sh("heal", "node2")
    assert emu.run("node1", PY, "-c", CONNECT, *ssh_port, "5").returncode == 0
    assert emu.run("node1", "ssh", "node2", "hostname", timeout=30).stdout.strip() == "node2"
    out = emu.run("login", "srun", IMMEDIATE, "-N2", "-n2", "hostname", timeout=120).stdout
    assert sorted(out.split()) == NODES


# -- start and stop ---------------------------------------------------------------------------------------------------
def test_stop_leaves_nothing_and_is_idempotent(emu, tmp_path):
    """A second cluster beside the first (its own subnet), stopped while a job step runs: nothing remains."""
    proc = start(tmp_path / "c", "--nodes", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    other = Emulated(tmp_path / "c", 0)
    netbase, prefix = other.settings["NETBASE"], other.settings["PREFIX"]
    assert netbase != emu.settings["NETBASE"] and prefix != emu.settings["PREFIX"]
    pids = _recorded_pids(other.dir)
    assert len(pids) == 2 + 2 + 2, pids  # a holder each for login and node1, munged, slurmctld, slurmd, sshd
    step = subprocess.Popen(["bash", str(CLUSTER), "run", str(other.dir), "login", "srun", "-N1", "sleep", "300"],
                            cwd=REPO, env=base_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):  # until the step runs
            if other.run("login", "squeue", "-h", "-s", "-o", "%i").stdout.strip():
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the job step did not start")
        sh("stop", str(other.dir), timeout=120)
        step.wait(timeout=30)
    finally:
        if step.poll() is None:
            step.kill()
    alive = [f"{name} ({pid})" for name, pid in pids.items() if Path(f"/proc/{pid}").exists()]
    assert alive == [], f"recorded processes still running after stop: {alive}"
    assert _leftovers(other.dir, netbase, prefix) == []
    again = sh("stop", str(other.dir))
    assert "nothing running" in again.stderr
    # The first cluster did not notice.
    assert emu.run("node1", "ssh", "node2", "hostname", timeout=30).stdout.strip() == "node2"


def test_refuses_a_subnet_in_use(emu, tmp_path):
    net = emu.settings["NETBASE"].rsplit(".", 1)[1]
    proc = start(tmp_path / "c", "--net", net)
    assert proc.returncode != 0 and "in use" in proc.stderr, proc.stderr
    assert _recorded(tmp_path / "c") == []   # nothing made, nothing to undo
    # The running cluster keeps its route and namespaces, and works.
    assert _leftovers(emu.dir, emu.settings["NETBASE"], emu.settings["PREFIX"]) != []
    assert emu.run("login", "sinfo", "-h", "-o", "%T").stdout.split() == ["idle"]


def test_failed_start_cleans_up(emu, tmp_path):
    """slurmd fails to start (a stand-in that exits 1): start fails and removes all it made, route included."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "slurmd").write_text("#!/bin/sh\necho 'fake slurmd: failing on purpose' >&2\nexit 1\n")
    (fake / "slurmd").chmod(0o755)
    env = base_env()
    env["PATH"] = f"{fake}:{env['PATH']}"
    proc = start(tmp_path / "c", env=env)
    assert proc.returncode != 0 and "slurmd on node1 did not start" in proc.stderr, proc.stderr[-3000:]
    settings = dict(re.findall(r"^(\w+)=(\S+)$", (tmp_path / "c" / "cluster.env").read_text(), re.M))
    assert _leftovers(tmp_path / "c", settings["NETBASE"], settings["PREFIX"]) == []
    assert "nothing running" in sh("stop", str(tmp_path / "c")).stderr
