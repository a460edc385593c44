"""NCCL's network on record (common.cluster.nccl): one process's log at NCCL_DEBUG=INFO, in NCCL's own line format
(host:pid:tid [device] NCCL INFO ...), read into the transport, interfaces and plugin it used; its log file asked
for only on GPU ranks whose user set neither NCCL_DEBUG nor NCCL_DEBUG_FILE; a rank reading its own file; and the
report's rule for two backends that used different networks. No GPU here, no TensorFlow."""

from __future__ import annotations

import pytest

from common.cluster import nccl

# NCCL 2.18-style logs (the lines NCCL prints at INFO, subsystem INIT), one process each
SOCKET = """\
gpu01:4711:4711 [0] NCCL INFO Bootstrap : Using eth0:10.0.1.1<0>
gpu01:4711:4711 [0] NCCL INFO NET/Plugin : Plugin load (libnccl-net.so) returned 2 : libnccl-net.so: cannot open \
shared object file: No such file or directory
gpu01:4711:4711 [0] NCCL INFO NET/Plugin : No plugin found, using internal implementation
gpu01:4711:4711 [0] NCCL INFO cudaDriverVersion 12020
NCCL version 2.18.5+cuda12.2
gpu01:4711:4790 [0] NCCL INFO NET/IB : No device found.
gpu01:4711:4790 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.1.1<0> [1]eth1:10.0.2.1<0>
gpu01:4711:4790 [0] NCCL INFO Using network Socket
gpu01:4711:4790 [0] NCCL INFO comm 0x55d0 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1b000 commId 0x9a - Init START
"""
IB = """\
gpu01:4712:4712 [1] NCCL INFO Bootstrap : Using ib0:10.1.0.1<0>
gpu01:4712:4712 [1] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so), using internal implementation
gpu01:4712:4791 [1] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.1.0.1<0>
gpu01:4712:4791 [1] NCCL INFO Using network IB
"""
OLD_IB = """\
gpu02:515:515 [0] NCCL INFO NET/Socket : Using [0]enp41s0f1:<0>
gpu02:515:515 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so).
gpu02:515:515 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB enp41s0f1:<0>
NCCL version 2.7.8+cuda11.0
"""
PLUGIN = """\
gpu03:77:77 [0] NCCL INFO NET/Plugin: Successfully loaded external plugin libnccl-net.so
gpu03:77:90 [0] NCCL INFO Using network AWS Libfabric
"""


def test_the_network_each_log_says():
    assert nccl.parse(SOCKET) == {"transport": "Socket", "interfaces": ["eth0", "eth1"], "plugin": None,
                                  "inferred": False}
    assert nccl.parse(IB) == {"transport": "IB", "interfaces": ["mlx5_0:1/IB", "mlx5_1:1/IB"], "plugin": None,
                              "inferred": False, "oob": "ib0"}
    # before "Using network": both initialised, IB wins when it has a device
    assert nccl.parse(OLD_IB) == {"transport": "IB", "interfaces": ["mlx5_0:1/IB"], "plugin": None,
                                  "inferred": True, "oob": "enp41s0f1"}
    assert nccl.parse(PLUGIN) == {"transport": "AWS Libfabric", "interfaces": [], "plugin": "libnccl-net.so",
                                  "inferred": False}
    assert nccl.parse("gpu01:1:1 [0] NCCL INFO cudaDriverVersion 12020\nnot NCCL at all\n") is None
    assert nccl.parse("") is None


def test_the_log_file_is_asked_for_only_on_gpus_and_never_over_the_users_choice(tmp_path):
    assert nccl.debug_env({}, gpu=False) == {}
    assert nccl.debug_env({"NCCL_DEBUG": "WARN"}, gpu=True) == {}
    assert nccl.debug_env({"NCCL_DEBUG_FILE": "/x/%h"}, gpu=True) == {}
    assert nccl.debug_env({}, gpu=True, directory=tmp_path) == {
        "NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": f"{tmp_path}/nccl-%h-%p.log"}
    env: dict[str, str] = {"NCCL_SOCKET_IFNAME": "ib0"}
    nccl.enable(False, env)
    assert env == {"NCCL_SOCKET_IFNAME": "ib0"}  # CPU: untouched
    nccl.enable(True, env)
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_FILE"].endswith("nccl-%h-%p.log")
    assert env["NCCL_SOCKET_IFNAME"] == "ib0" and nccl.log_dir().is_dir()
    assert nccl.users_env(env) == {"NCCL_SOCKET_IFNAME": "ib0"}  # the record's tuning environment: the user's
    assert nccl.users_env({**env, "NCCL_DEBUG": "TRACE"})["NCCL_DEBUG"] == "TRACE"


def test_a_rank_reads_its_own_file(tmp_path):
    (tmp_path / "nccl-gpu01-4711.log").write_text(SOCKET)
    (tmp_path / "nccl-gpu01-4712.log").write_text(IB)
    env = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": str(tmp_path / "nccl-%h-%p.log")}
    assert nccl.own_finding(env, host="gpu01.cluster.example", pid=4712)["transport"] == "IB"
    assert nccl.own_finding(env, host="gpu01", pid=4711)["interfaces"] == ["eth0", "eth1"]
    assert nccl.own_finding(env, host="gpu01", pid=1) is None  # no file
    assert nccl.own_finding({**env, "NCCL_DEBUG": "WARN"}, host="gpu01", pid=4711) is None  # no INFO lines
    assert nccl.own_finding({}, host="gpu01", pid=4711) is None
    assert nccl.per_rank([None, None]) is None and nccl.per_rank([None, {"transport": "IB"}]) == [None,
                                                                                                 {"transport": "IB"}]


@pytest.mark.parametrize("hvd, native, says", [
    ([IB, IB], [SOCKET, SOCKET], "NCCL used IB (mlx5_0:1/IB,mlx5_1:1/IB) for horovod but Socket (eth0,eth1) for "
                                 "native"),
    ([IB, IB], [IB, IB], None),
    ([IB], [IB, SOCKET], "for horovod but IB (mlx5_0:1/IB,mlx5_1:1/IB) / Socket (eth0,eth1) for native"),
    ([IB], [], None),  # a side without a finding (a CPU run) says nothing
])
def test_the_reports_rule_for_two_backends(hvd, native, says):
    runs = [[nccl.parse(t) for t in hvd]], [[nccl.parse(t) for t in native]] if native else [None]
    got = nccl.mismatch(*runs)
    assert got == says if says is None else says in got
