"""The data network interface (``--iface NAME`` / ``TWINBENCH_IFACE``): checked, handed to every launcher's own
setting, and turned into the addresses MWMS workers are given. No TensorFlow here: all of it runs before TF starts.

On a cluster every node's data interface (InfiniBand, a second Ethernet) usually has the same name, but each
launcher picks interfaces its own way: horovodrun intersects the names it finds routable on every host, Gloo binds
``HOROVOD_GLOO_IFACE``, Open MPI takes the first interfaces it likes (``btl_tcp_if_include`` /
``oob_tcp_if_include``), NCCL ``NCCL_SOCKET_IFNAME``, and MWMS workers reach each other at whatever address their
host names resolve to. One name sets all of them. For MWMS the cluster's host names are replaced by their addresses
on the interface's subnet (an interface of the same name on every node sits on one subnet: that is the data
network), so a host name that resolves only to a management address cannot send the collectives there.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import socket
import struct
from collections.abc import Mapping
from typing import Any

from common.core.errors import UsageError

ENV = "TWINBENCH_IFACE"  # the default for --iface, and how a launcher hands the choice to the ranks it starts
SIOCGIFADDR = 0x8915  # Linux ioctls: an interface's IPv4 address and netmask
SIOCGIFNETMASK = 0x891B
IFNAMSIZ = 16  # interface names hold at most 15 bytes


def launcher_env(iface: str) -> dict[str, str]:
    """The variables by which each launcher and library is told to use ``iface``."""
    return {
        "HOROVOD_GLOO_IFACE": iface,  # Gloo's transport device (horovodrun --gloo sets it from --network-interface)
        "NCCL_SOCKET_IFNAME": iface,  # NCCL's bootstrap and socket transport
        "OMPI_MCA_btl_tcp_if_include": iface,  # Open MPI's TCP data path
        "OMPI_MCA_oob_tcp_if_include": iface,  # Open MPI's run-time wire-up (mpirun <-> orted)
        ENV: iface,  # processes started from this one (the --nproc launcher's workers) inherit the choice
    }


def ipv4(iface: str) -> ipaddress.IPv4Interface:
    """The IPv4 address (with its prefix) of ``iface`` on this host; UsageError (one line) if it has none."""
    if not iface or len(iface.encode()) >= IFNAMSIZ or "/" in iface or any(c.isspace() for c in iface):
        raise UsageError(f"--iface {iface!r} is not a network interface name")
    names = sorted(name for _, name in socket.if_nameindex())
    if iface not in names:
        raise UsageError(f"--iface {iface}: no such network interface on {socket.gethostname()} "
                         f"(it has: {', '.join(names)})")
    try:
        addr = _ioctl(iface, SIOCGIFADDR)
        mask = _ioctl(iface, SIOCGIFNETMASK)
    except OSError:
        raise UsageError(f"--iface {iface}: the interface has no IPv4 address on {socket.gethostname()}") from None
    return ipaddress.IPv4Interface(f"{addr}/{mask}")


def _ioctl(iface: str, request: int) -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        packed = fcntl.ioctl(s.fileno(), request, struct.pack("256s", iface.encode()))
    return socket.inet_ntoa(packed[20:24])  # struct ifreq: name (16 bytes), then sockaddr_in (family, port, addr)


def select(iface: str | None) -> str | None:
    """Check ``iface`` (None or "": none chosen) and point every launcher's setting at it in this process's
    environment, before any of them reads it (Horovod, MPI and NCCL read theirs at init). Returns the name."""
    if not iface:
        return None
    ipv4(iface)
    # --iface wins over what a launcher set: horovodrun on localhost can only name loopback interfaces, and the
    # rank's own choice is then what Gloo must bind.
    os.environ.update(launcher_env(iface))
    return iface


def selected() -> str | None:
    """The interface chosen for this run (``select`` exports it), or None."""
    return os.environ.get(ENV) or None


def address_on(host: str, iface: str) -> str:
    """``host``'s IPv4 address on the subnet of this host's ``iface`` (an IP literal must lie in it). For this
    host's own name the address must be the interface's own: the one its peers will connect to."""
    mine = ipv4(iface)
    try:
        candidates = [ipaddress.IPv4Address(host)]
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
        except socket.gaierror as e:
            raise UsageError(f"--iface {iface}: cannot resolve host {host!r} ({e.strerror})") from None
        candidates = sorted({ipaddress.IPv4Address(i[4][0]) for i in infos})
    inside = [a for a in candidates if a in mine.network]
    if not inside:
        raise UsageError(f"--iface {iface}: {host} has no address on {iface}'s subnet {mine.network} (it resolves "
                         f"to {', '.join(map(str, candidates))}): list the data network's addresses for the node "
                         "names in DNS or /etc/hosts, or give addresses")
    if _names_this_host(host) and mine.ip not in inside:
        raise UsageError(f"--iface {iface}: {host} (this host) resolves to {inside[0]} but {iface} here is "
                         f"{mine.ip}")
    return str(mine.ip if mine.ip in inside else inside[0])


def _names_this_host(host: str) -> bool:
    short = socket.gethostname().split(".")[0]
    return host.split(".")[0] in (short, os.environ.get("SLURMD_NODENAME", short).split(".")[0])


def workers_on(workers: list[str], iface: str) -> list[str]:
    """``host:port`` entries with each host replaced by its address on ``iface``'s subnet (ports kept)."""
    out = []
    for w in workers:
        host, sep, port = w.rpartition(":")
        if not sep or not port.isdigit():
            raise UsageError(f"cluster address {w!r} is not host:port")
        out.append(f"{address_on(host, iface)}:{port}")
    return out


def own_endpoint(iface: str | None) -> dict[str, str | None]:
    """This rank's interface and address: the chosen interface's, or (none chosen) the address its host name
    resolves to here and the interface holding it (None when no interface does, e.g. a 127.0.1.1 hosts entry)."""
    if iface:
        return {"interface": iface, "address": str(ipv4(iface).ip)}
    try:
        address = socket.gethostbyname(socket.gethostname())
    except OSError:
        return {"interface": None, "address": None}
    for _, name in socket.if_nameindex():
        try:
            if _ioctl(name, SIOCGIFADDR) == address:
                return {"interface": name, "address": address}
        except OSError:
            continue  # an interface without an IPv4 address
    return {"interface": None, "address": address}


def reach_address(iface: str | None) -> str:
    """Where this rank's peers connect to it (watchdog heartbeat, link probe), as an address they can use without
    resolving any name: its address on ``iface``, the data network, when one was chosen; else ``own_address()``."""
    return str(ipv4(iface).ip) if iface else own_address()


ROUTE_PROBE = "192.0.2.1"  # TEST-NET-1 (RFC 5737): where the default route leads, never a real peer


def own_address(environ: Mapping[str, str] | None = None) -> str:
    """This host's address for its peers, found without depending on name resolution (an image without
    /etc/hosts, run by a runtime that does not bind the host's, resolves neither its own name nor ``localhost``).
    In order: the source address of the route towards the run's coordinator (TF_CONFIG's first worker, Gloo's
    rendezvous address), which is where the collectives' traffic leaves from and is loopback exactly when the
    coordinator is, i.e. all ranks are on this host; the address the host name resolves to, if this host holds it
    on a non-loopback interface (Debian's 127.0.1.1 entry is not reachable from another host); the source address
    of the default route; any non-loopback interface's address; loopback."""
    env = os.environ if environ is None else environ
    for target in _coordinators(env):
        found = _route_source(target)
        if found:
            return found
    try:
        named = socket.gethostbyname(socket.gethostname())
    except OSError:
        named = None
    if named and not ipaddress.IPv4Address(named).is_loopback and _holds(named):
        return named
    found = _route_source(ROUTE_PROBE)
    if found and not ipaddress.IPv4Address(found).is_loopback:
        return found
    for _, name in socket.if_nameindex():
        try:
            address = _ioctl(name, SIOCGIFADDR)
        except OSError:
            continue  # an interface without an IPv4 address
        if not ipaddress.IPv4Address(address).is_loopback:
            return address
    return "127.0.0.1"


def _coordinators(env: Mapping[str, str]) -> list[str]:
    """The IPv4 literals this rank knows its coordinator by (names are left out: they may not resolve here)."""
    hosts = []
    try:
        workers = json.loads(env.get("TF_CONFIG") or "{}").get("cluster", {}).get("worker") or []
        hosts.append(str(workers[0]).rpartition(":")[0])
    except (ValueError, AttributeError, IndexError, TypeError):
        pass  # no TF_CONFIG (Horovod), or one MWMS will reject itself
    hosts.append(env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR", ""))
    out = []
    for h in hosts:
        try:
            out.append(str(ipaddress.IPv4Address(h)))
        except ValueError:
            continue
    return out


def _route_source(target: str) -> str | None:
    """The address the kernel would send from towards ``target`` (a UDP connect only chooses the route; nothing
    is sent), or None when there is no route."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((target, 9))
            found = s.getsockname()[0]
    except OSError:
        return None
    return None if found == "0.0.0.0" else found


def _holds(address: str) -> bool:
    """Whether ``address`` is one of this host's own (binding to it succeeds only then)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((address, 0))
    except OSError:
        return False
    return True


def network(iface: str | None, everyone: list[Mapping[str, Any]]) -> dict[str, Any]:
    """RunRecord.network from every rank's ``own_endpoint`` (in rank order)."""
    return {
        "interface": iface,  # the --iface choice; None: each launcher picked its own
        "source": "--iface" if iface else "host name",  # how the addresses below were found
        "addresses": [r["endpoint"]["address"] for r in everyone],
        "interfaces": [r["endpoint"]["interface"] for r in everyone],
    }


def topology(everyone: list[Mapping[str, Any]]) -> dict[str, Any]:
    """RunRecord.topology from every rank's host, local rank and local size (in rank order). ``cross_size``: the
    ranks sharing the chief's local rank, i.e. one per host, Horovod's ``cross_size()`` on the chief."""
    chief_local = everyone[0]["local_rank"]
    return {
        "hosts": [r["host"] for r in everyone],
        "local_rank": [r["local_rank"] for r in everyone],
        "local_size": [r["local_size"] for r in everyone],
        "cross_size": sum(1 for r in everyone if r["local_rank"] == chief_local),
        "cpus": [r.get("cpus") for r in everyone],  # each rank's CPU mask once bound (None: not recorded)
        "cpu_bind": [r.get("cpu_bind") for r in everyone],  # "self" (--cpu-bind cores), "launcher" or "none"
    }
