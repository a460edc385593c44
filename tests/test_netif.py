"""The data interface option (``--iface`` / ``TWINBENCH_IFACE``, ``common.cluster.netif``): checked before TensorFlow
starts, handed to every launcher, turned into the MWMS workers' addresses, and recorded with the run's topology.

Unit tests on this host (loopback is the one interface certain to exist) plus one run per backend at 2 local ranks;
across nodes, with the interface every emulated node has, in tests/test_cluster.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from backends import horovod, native_cluster
from common.cluster import netif
from common.cluster.placement import cpu_share
from common.core.errors import UsageError
from tests.conftest import REPO, base_env, only_result, run

distributed = pytest.mark.distributed
IFACE_VARS = ("TWINBENCH_IFACE", "HOROVOD_GLOO_IFACE", "NCCL_SOCKET_IFNAME", "OMPI_MCA_btl_tcp_if_include",
              "OMPI_MCA_oob_tcp_if_include")


@pytest.fixture
def clean_env(monkeypatch):
    for v in (*IFACE_VARS, "TF_CONFIG", "TWINBENCH_LOCAL_RANK", "TWINBENCH_LOCAL_SIZE"):
        monkeypatch.delenv(v, raising=False)
    for v in [v for v in os.environ if v.startswith("SLURM_")]:
        monkeypatch.delenv(v)
    return monkeypatch


def test_loopback_address_and_prefix():
    assert str(netif.ipv4("lo")) == "127.0.0.1/8"


@pytest.mark.parametrize("name, message", [
    ("nosuch0", "no such network interface"),
    ("a/b", "not a network interface name"),
    ("x" * 16, "not a network interface name"),
    ("", "not a network interface name"),
])
def test_bad_interface_names(name, message):
    with pytest.raises(UsageError, match=message) as err:
        netif.ipv4(name)
    assert "\n" not in str(err.value)
    if "no such" in message:
        assert "lo" in str(err.value)  # the message lists what the host has


def test_select_points_every_launcher_at_the_interface(clean_env):
    assert netif.select(None) is None and netif.selected() is None
    clean_env.setenv("HOROVOD_GLOO_IFACE", "eth7")  # what horovodrun on localhost sets: the rank's choice wins
    assert netif.select("lo") == "lo"
    assert {v: os.environ[v] for v in IFACE_VARS} == dict.fromkeys(IFACE_VARS, "lo")
    assert netif.selected() == "lo"


def test_addresses_on_the_interface_subnet():
    assert netif.address_on("localhost", "lo") == "127.0.0.1"
    assert netif.workers_on(["localhost:2000", "127.0.0.5:2001"], "lo") == ["127.0.0.1:2000", "127.0.0.5:2001"]
    with pytest.raises(UsageError, match=r"192\.0\.2\.7 has no address on lo's subnet 127\.0\.0\.0/8"):
        netif.address_on("192.0.2.7", "lo")
    with pytest.raises(UsageError, match="cannot resolve host"):
        netif.address_on("no-such-host.invalid", "lo")
    with pytest.raises(UsageError, match="not host:port"):
        netif.workers_on(["localhost"], "lo")


def test_this_hosts_own_name_must_resolve_to_its_own_address(clean_env):
    # This host's name resolving to another address of the subnet: peers would look for it there.
    clean_env.setattr(socket, "gethostname", lambda: "localhost")
    clean_env.setattr(socket, "getaddrinfo", lambda *a, **k: [(0, 0, 0, "", ("127.0.0.9", 0))])
    with pytest.raises(UsageError, match=r"localhost \(this host\) resolves to 127\.0\.0\.9 but lo here is "
                                         r"127\.0\.0\.1"):
        netif.address_on("localhost", "lo")


def test_tf_config_rewritten_to_interface_addresses(clean_env):
    clean_env.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["localhost:2000", "localhost:2001"]},
                                              "task": {"type": "worker", "index": 1}}))
    clean_env.setenv("TWINBENCH_IFACE", "lo")
    native_cluster.check_tf_config()
    assert json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"] == ["127.0.0.1:2000",
                                                                                      "127.0.0.1:2001"]
    clean_env.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["127.0.0.1:2000", "127.0.0.2:2001"]},
                                              "task": {"type": "worker", "index": 1}}))
    with pytest.raises(UsageError, match="not on this host's lo address 127.0.0.1"):
        native_cluster.check_tf_config()


@pytest.mark.parametrize("workers, index, expected", [
    (["node1:1", "node1:2", "node2:1", "node2:2"], 3, (1, 2)),
    (["node1:1", "node2:1", "node1:2"], 2, (1, 2)),
    (["a:1"], 0, (0, 1)),
])
def test_local_place_from_tf_config(clean_env, workers, index, expected):
    clean_env.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": workers},
                                              "task": {"type": "worker", "index": index}}))
    assert native_cluster.local_place() == expected


def test_local_place_from_slurm_layout(clean_env):
    env = {"SLURM_NTASKS": "3", "SLURM_STEP_NUM_TASKS": "3", "SLURM_PROCID": "2", "SLURM_LOCALID": "0",
           "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "2,1", "SLURMD_NODENAME": "n2"}
    for k, v in env.items():
        clean_env.setenv(k, v)
    # The old rule read the first number of "2,1" for every node; n2 has one task.
    assert native_cluster.local_place() == (0, 1)
    clean_env.setenv("TWINBENCH_LOCAL_RANK", "1")  # a local launcher's own variables win
    clean_env.setenv("TWINBENCH_LOCAL_SIZE", "4")
    assert native_cluster.local_place() == (1, 4)


def test_horovodrun_command_names_the_interface_for_remote_hosts(clean_env):
    across = horovod.horovodrun_command("node1:2,node2:2", 4, ["--iface", "tb0", "--quiet"], python="/p/python")
    assert across[across.index("--network-interface") + 1] == "tb0"
    assert across[-6:] == ["/p/python", "-m", "backends.horovod", "--iface", "tb0", "--quiet"]
    assert across[:5] == ["/p/horovodrun", "-np", "4", "-H", "node1:2,node2:2"]
    clean_env.setenv("TWINBENCH_IFACE", "ib0")
    assert "ib0" in horovod.horovodrun_command("a:1,b:1", 2, [], python="/p/python")
    # horovodrun with local hosts only accepts loopback interfaces: the ranks' --iface sets Gloo's instead
    assert "--network-interface" not in horovod.local_command(2, ["--iface", "eth0"], python="/p/python")
    clean_env.delenv("TWINBENCH_IFACE")
    assert "--network-interface" not in horovod.horovodrun_command("a:1,b:1", 2, [], python="/p/python")


def test_topology_and_network_records():
    everyone = [{"host": h, "local_rank": lr, "local_size": 2, "endpoint": {"interface": "tb0", "address": a},
                 "cpus": [lr], "cpu_bind": "self"}
                for h, lr, a in (("n1", 0, "10.0.0.1"), ("n1", 1, "10.0.0.1"), ("n2", 0, "10.0.0.2"),
                                 ("n2", 1, "10.0.0.2"))]
    assert netif.topology(everyone) == {"hosts": ["n1", "n1", "n2", "n2"], "local_rank": [0, 1, 0, 1],
                                        "local_size": [2, 2, 2, 2], "cross_size": 2,
                                        "cpus": [[0], [1], [0], [1]], "cpu_bind": ["self"] * 4}
    net = netif.network("tb0", everyone)
    assert net["interface"] == "tb0" and net["addresses"] == ["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"]


def test_watchdog_probes_the_interface_address_not_the_host_name():
    """With --iface the watchdog reaches peers at their data address: a host name that does not resolve (or points
    at another network) must not make a live peer look lost, and without an address the host name is used."""
    from common.training import reliability as rel

    assert netif.reach_address("lo") == "127.0.0.1"  # what start_watchdog and the link probe publish
    assert netif.reach_address(None) == netif.own_address()
    beat = rel.Heartbeat()
    try:
        live = {"rank": 1, "port": beat.port, "pid": 1}
        by_address = rel.Watchdog(0, [{**live, "host": "no-such-node.invalid", "address": netif.reach_address("lo")}])
        assert by_address.lost_peers() == []
        # a live host name does not help a peer whose published address does not answer: the address is probed
        bad_address = rel.Watchdog(0, [{**live, "host": "127.0.0.1", "address": "no-such-node.invalid"}])
        assert [p["rank"] for p in bad_address.lost_peers()] == [1]
        by_name = rel.Watchdog(0, [{**live, "host": "x", "address": netif.reach_address(None)}])
        assert by_name.lost_peers() == []
    finally:
        beat.close()


def _no_name_resolves(monkeypatch) -> None:
    """As in an image without /etc/hosts run by a runtime that binds none (Charliecloud's ch-run): no name
    resolves, the host's own and ``localhost`` included; IP literals still work."""
    real_getaddrinfo = socket.getaddrinfo

    def literal_only(host, *args, **kwargs):
        try:
            socket.inet_aton(host)
        except (OSError, TypeError):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known") from None
        return real_getaddrinfo(host, *args, **kwargs)

    def no_name(host):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", literal_only)
    monkeypatch.setattr(socket, "gethostbyname", no_name)


def test_watchdog_reaches_a_live_peer_where_no_host_name_resolves(clean_env):
    """Without --iface a rank publishes an address, never its host name: where no name resolves, a live peer
    must answer the watchdog (publishing the host name, both ranks of a healthy run were killed as lost peers)."""
    from common.training import reliability as rel

    _no_name_resolves(clean_env)
    published = netif.reach_address(None)
    socket.inet_aton(published)  # an IPv4 literal
    beat = rel.Heartbeat()
    try:
        dog = rel.Watchdog(0, [{"rank": 1, "host": socket.gethostname(), "address": published, "port": beat.port,
                                "pid": 1}])
        assert dog.lost_peers() == []
    finally:
        beat.close()


def test_own_address_follows_the_route_to_the_coordinator(clean_env):
    """The source address towards the coordinator: loopback when TF_CONFIG's workers are on loopback (all ranks on
    this host), else this host's address on the route there; without a coordinator, an address of this host."""
    _no_name_resolves(clean_env)
    local = {"TF_CONFIG": json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}})}
    assert netif.own_address(local) == "127.0.0.1"
    mine = netif.own_address({})
    assert netif._holds(mine)
    assert netif.own_address({"HOROVOD_GLOO_RENDEZVOUS_ADDR": mine}) == mine
    named = {"TF_CONFIG": json.dumps({"cluster": {"worker": ["node1:1", "node2:2"]}})}  # a name: not resolved
    assert netif.own_address(named) == mine
    assert netif._route_source("127.0.0.2") == "127.0.0.1"


@pytest.mark.parametrize("module", ["backends.native", "backends.horovod"])
@pytest.mark.parametrize("how", ["flag", "env"])
def test_missing_interface_exits_2_before_tensorflow(module, how, tmp_path):
    code = ("import sys, runpy; sys.argv = ['x'] + sys.argv[1:]; rc = 0\n"
            f"try:\n    runpy.run_module('{module}', run_name='__main__')\n"
            "except SystemExit as e:\n    rc = e.code\n"
            "assert 'tensorflow' not in sys.modules\nsys.exit(rc)")
    env = base_env()
    args = ["--results", str(tmp_path / "r")]
    if how == "flag":
        args += ["--iface", "nosuch0"]
    else:
        env["TWINBENCH_IFACE"] = "nosuch0"
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "--iface nosuch0: no such network interface" in proc.stderr


@distributed
@pytest.mark.parametrize("kind", ["native", "horovod"])
def test_two_local_ranks_record_interface_addresses_and_topology(kind, tmp_path):
    from common.core import registry

    cmd = registry.load(kind).local_command(2, ["--results", str(tmp_path), "--quiet", "--iface", "lo",
                                                "--cpu-bind", "cores", "--set", "steps=4"], python=sys.executable)
    run(cmd)
    r = only_result(tmp_path)
    assert r["network"] == {"interface": "lo", "source": "--iface", "addresses": ["127.0.0.1"] * 2,
                            "interfaces": ["lo", "lo"]}
    host = socket.gethostname()
    topo = r["topology"]
    assert {k: topo[k] for k in ("hosts", "local_rank", "local_size", "cross_size")} == {
        "hosts": [host, host], "local_rank": [0, 1], "local_size": [2, 2], "cross_size": 1}
    # --cpu-bind cores: neither launcher binds, so each rank took its own share of this host's CPUs
    mine = sorted(os.sched_getaffinity(0))
    assert topo["cpu_bind"] == ["self", "self"]
    assert topo["cpus"] == [cpu_share(i, 2, mine) for i in range(2)], topo
    if kind == "native":
        assert r["backend_info"]["cluster"]["workers"][0].startswith("127.0.0.1:")
    else:
        assert r["backend_info"]["cross_size"] == 1 and r["backend_info"]["local_size"] == 2
