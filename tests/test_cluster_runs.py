"""twinbench across two emulated nodes (tests/cluster/cluster.sh), 2 tasks per node, by every launcher: native by
srun (SlurmClusterResolver) and by TF_CONFIG (one rank per task started on its node), Horovod by srun --mpi=pmix, by
horovodrun --gloo over ssh from a node and by mpirun inside an allocation, and both sbatch scripts with the
2-node preset. Every run records its ranks' hosts, local size 2 and cross size 2, and all of them compute the same
per-step losses. The runs given ``--iface tb0`` (every node's data interface) record that interface's addresses.

One cluster per suite (the session fixture ``emu``, tests/cluster/emulated.py); each run once per session (TensorFlow
processes are slow to start on 2 cores).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from backends import horovod
from common.cluster import localcluster
from common.diagnostics import scaling
from tests.cluster.emulated import IMMEDIATE, JOB_TIMEOUT, NODES, Emulated, wait_all
from tests.conftest import PY, SMOKE, base_env, only_result, pause_vars, same_losses

pytestmark = pytest.mark.distributed
IFACE = "tb0"  # the data interface cluster.sh gives every node
RUN = ["--job", SMOKE, "--quiet"]
HOSTS = ["node1", "node1", "node2", "node2"]  # rank order: block distribution, 2 per node
TF_CONFIG_PORT = 12700  # inside the node namespaces: nothing else listens there


# -- the launchers ----------------------------------------------------------------------------------------------
def _srun_native(emu: Emulated, out: Path) -> None:
    emu.run("login", "srun", IMMEDIATE, "--kill-on-bad-exit=1", "-N2", "-n4", PY, "-m", "backends.native", *RUN,
            "--results", str(out), "--port-base", "12600", timeout=JOB_TIMEOUT)


def _srun_horovod(emu: Emulated, out: Path) -> None:
    emu.run("login", "srun", IMMEDIATE, "--kill-on-bad-exit=1", "--mpi=pmix", "-N2", "-n4", PY, "-m",
            "backends.horovod", *RUN, "--results", str(out), timeout=JOB_TIMEOUT)


def _tf_config_native(emu: Emulated, out: Path) -> None:
    """One process per task, each started on its node with its TF_CONFIG (host names; --iface makes addresses)."""
    workers = [f"{node}:{TF_CONFIG_PORT + i}" for node in NODES for i in range(2)]
    procs, logs = [], []
    for index, worker in enumerate(workers):
        env = base_env()
        env["TF_CONFIG"] = localcluster.tf_config(workers, index)
        logs.append(out.parent / f"{out.name}-worker{index}.log")
        procs.append(emu.popen(worker.split(":")[0], [PY, "-m", "backends.native", *RUN, "--results", str(out),
                                                      "--iface", IFACE], logs[-1], env))
    status = wait_all(procs, logs)
    assert status == [0] * 4, "\n".join(f"--- worker {i}: {s}\n{log.read_text()[-2000:]}"
                                        for i, (s, log) in enumerate(zip(status, logs)))


def _horovodrun(emu: Emulated, out: Path) -> None:
    cmd = horovod.horovodrun_command("node1:2,node2:2", 4, [*RUN, "--results", str(out), "--iface", IFACE], PY)
    assert cmd[cmd.index("--network-interface") + 1] == IFACE
    emu.run("node1", *cmd, timeout=JOB_TIMEOUT)


def _mpirun(emu: Emulated, out: Path) -> None:
    # mpirun on the login node starts its daemons on the allocation's nodes through Slurm; -x: what the ranks need
    # from this environment (over ssh they would not inherit it); the interface for the wire-up and the data path.
    emu.run("login", "salloc", IMMEDIATE, "-N2", "-n4", "mpirun", "-np", "4", "--bind-to", "none",
            "--mca", "btl_tcp_if_include", IFACE, "--mca", "oob_tcp_if_include", IFACE,
            "-x", "PATH", "-x", "PYTHONPATH", "-x", "TF_USE_LEGACY_KERAS",
            PY, "-m", "backends.horovod", *RUN, "--results", str(out), "--iface", IFACE, timeout=JOB_TIMEOUT)


SWEEP_SEED = 3  # the sweep's order is seeded as a user's would be (its shuffle: tests/test_sweep_allocation.py)


def _sweep(emu: Emulated) -> Path:
    """``python -m common.sweep`` from the login node at size 4 on 2 nodes of 2 GPUs (2x2, the sbatch scripts' 2-node
    preset), both backends, one job each (Horovod by horovodrun inside the sbatch script), TWINBENCH_IFACE exported;
    its directory once the sweep has ended. What ``--nodes 1,2`` does to a size (1x2 and 2x1 kept apart, the seeded
    order, the same losses in both layouts) is tests/test_sweep_allocation.py's, on the same cluster."""
    def make() -> Path:
        out = emu.dir / f"sweep-{os.getpid()}"  # the cluster may outlive this session (make test)
        env = base_env()
        env["TWINBENCH_IFACE"] = IFACE
        emu.run("login", PY, "-m", "common.sweep", "submit", "--job", SMOKE, "--sizes", "4", "--nodes", "2",
                "--backends", "native,horovod", "--results", str(out), "--gres-per-node", "2",
                "--cpus-per-task", "1", "--time", "00:10:00", "--serial", "--order-seed", str(SWEEP_SEED),
                "--hvd-launch", "horovodrun", "--backend-arg=--quiet", env=env, timeout=120)
        status = emu.run("login", PY, "-m", "common.sweep", "status", str(out), "--wait", str(JOB_TIMEOUT * 5),
                         "--poll", "1", env=env, check=False, timeout=JOB_TIMEOUT * 5 + 60)
        logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in (out / "logs").glob("*"))
        assert status.returncode == 0, status.stdout + status.stderr + logs
        return out
    return emu.once("sweep", make)


def _sweep_run(backend_name: str) -> Callable[[Emulated, Path], None]:
    """The sweep's 4-rank run of ``backend_name`` (the sbatch script with the 2-node preset), copied to ``out``."""
    def go(emu: Emulated, out: Path) -> None:
        sweep = _sweep(emu)
        log = "\n".join(p.read_text(errors="replace") for p in (sweep / "logs").glob(f"{backend_name}-2x2-*"))
        assert f"TWINBENCH_IFACE={IFACE}" in log and f"NCCL_SOCKET_IFNAME={IFACE}" in log, log[-3000:]
        if backend_name == "horovod":
            assert f"--network-interface {IFACE}" in log, log[-3000:]
        out.mkdir(parents=True)
        src = only_result(sweep / f"{backend_name}-2x2-r1")
        (out / "result.json").write_text(json.dumps(src))
    return go


LAUNCHERS: dict[str, tuple[Callable[[Emulated, Path], None], str | None]] = {
    # name: (how to run it, the --iface it was given)
    "native srun": (_srun_native, None),
    "horovod srun --mpi=pmix": (_srun_horovod, None),
    "native TF_CONFIG": (_tf_config_native, IFACE),
    "horovod horovodrun --gloo": (_horovodrun, IFACE),
    "horovod mpirun": (_mpirun, IFACE),
    # the sbatch scripts with the 2-node preset: the 4-rank (2x2) runs of the sweep
    "native.sbatch": (_sweep_run("native"), IFACE),
    "horovod.sbatch (horovodrun)": (_sweep_run("horovod"), IFACE),
}


@pytest.fixture(scope="module")
def result(emu, tmp_path_factory) -> Callable[[str], dict[str, Any]]:
    def get(name: str) -> dict[str, Any]:
        def make() -> dict[str, Any]:
            out = tmp_path_factory.mktemp("run") / "results"
            LAUNCHERS[name][0](emu, out)
            return only_result(out)
        return emu.once(name, make)
    return get


# -- what every run records --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(LAUNCHERS))
def test_placement_and_network_recorded(emu, result, name):
    r = result(name)
    assert r["world_size"] == r["num_workers"] == 4 and r["weights_consistent"]
    assert r["hosts"] == HOSTS
    topo = r["topology"]
    assert {k: topo[k] for k in ("hosts", "local_rank", "local_size", "cross_size")} == {
        "hosts": HOSTS, "local_rank": [0, 1, 0, 1], "local_size": [2] * 4, "cross_size": 2}
    # the binding is recorded: no launcher here binds (srun with task/none, horovodrun, mpirun --bind-to none,
    # TF_CONFIG) and no --cpu-bind was given, so each rank kept its node's whole mask
    assert topo["cpu_bind"] == ["none"] * 4 and topo["cpus"][0] == topo["cpus"][1], topo
    if r["backend"] == "horovod":  # Horovod's own view agrees
        assert (r["backend_info"]["local_size"], r["backend_info"]["cross_size"]) == (2, 2)
    iface = LAUNCHERS[name][1]
    net = r["network"]
    # Without --iface the addresses are what the host names resolve to on each node: here the data interface too.
    assert net["interface"] == iface and net["source"] == ("--iface" if iface else "host name")
    assert net["addresses"] == [emu.addr(h) for h in HOSTS] and net["interfaces"] == [IFACE] * 4, net


def test_native_cluster_addresses(emu, result):
    by_name = result("native srun")["backend_info"]
    assert by_name["cluster_source"] == "slurm"
    assert by_name["cluster"]["workers"] == ["node1:12600", "node1:12601", "node2:12600", "node2:12601"]
    # With --iface the workers reach each other at the interface's addresses, not at the names.
    by_iface = result("native TF_CONFIG")["backend_info"]
    assert by_iface["cluster_source"] == "tf_config"
    assert by_iface["cluster"]["workers"] == [f"{emu.addr(h)}:{TF_CONFIG_PORT + i % 2}" for i, h in enumerate(HOSTS)]
    sbatch = result("native.sbatch")["backend_info"]
    assert sbatch["cluster_source"] == f"slurm, addresses on {IFACE}"
    assert [w.rpartition(":")[0] for w in sbatch["cluster"]["workers"]] == [emu.addr(h) for h in HOSTS]


@pytest.mark.parametrize("name, controller", [
    ("horovod srun --mpi=pmix", "mpi"), ("horovod horovodrun --gloo", "gloo"), ("horovod mpirun", "mpi"),
    ("horovod.sbatch (horovodrun)", "mpi"),  # horovodrun without --gloo: mpirun over ssh, told the interface
])
def test_horovod_controller(result, name, controller):
    assert result(name)["backend_info"]["controller"] == controller


def test_same_losses_by_every_launcher_and_backend(result):
    runs = {name: result(name) for name in LAUNCHERS}
    assert {r["backend"] for r in runs.values()} == {"native", "horovod"}
    msg = same_losses(runs)
    assert msg is None, f"2 nodes x 2 tasks: {msg}"


# -- the allreduce benchmark and the scaling model against a link of known rate -----------------------------------
BIG_GRADIENTS = ["--set", "mlp_hidden=[1024]", "--set", "steps=40"]  # 814,090 parameters: 3.3 MB per allreduce
# Relative error allowed between the model's 2-node step and the measured one: the 15% target, for both.
# The shaped runs give each emulated node its own CPU (`cluster.sh cpus split`), as separate machines have: with
# the two nodes sharing the 2 cores, Open MPI's busy-polling inside each collective took CPU from the other node
# and from the kernel's packet path, and Horovod's step (recursive doubling) came out at 159-239 ms in four runs,
# single steps at 2x the wire, against 141.6-143.8 ms on a core per node (138-141 ms predicted; docs/findings.md
# "Against a link of known rate"). The runs sync every step (PER_STEP): the median is one of single steps.
MODEL_TOLERANCE = 0.15
PER_STEP = ["--set", "sync_every_steps=1"]
# Open MPI's default allreduce for these sizes ran at 51-100% of the shaped wire from one run to the next (as did
# the ring algorithm forced), with or without a core per node; recursive doubling at 92-100% (Gloo: 96-99%):
# docs/findings.md "Against a link of known rate". The benchmark and the run both use it, as a user following
# those findings would.
HOROVOD_MPI_ENV = ["OMPI_MCA_coll_tuned_use_dynamic_rules=1", "OMPI_MCA_coll_tuned_allreduce_algorithm=3"]


def _model_vs_measured(out: Path) -> tuple[float, float]:
    """(predicted, measured) 2-replica step time in s: the report's scaling model (``common.diagnostics.scaling``:
    compute =
    the 1-replica median step, the link fitted to the allreduce benchmark) against the 2-replica run's median."""
    runs = {r["world_size"]: r for r in map(json.loads, (p.read_text() for p in out.glob("*-fit-n*.json")))}
    bench = json.loads(next(out.glob("allreduce-*.json")).read_text())
    fit = scaling.fit_alpha_beta(bench["rows"], bench["world_size"])
    assert fit is not None, bench["rows"]
    predicted = scaling.predict(runs[1]["step_time"]["median"], runs[1]["gradient_bytes"], fit, 2)["step_time"]
    return predicted, runs[2]["step_time"]["median"]


def _shaped_runs(emu: Emulated, kind: str, out: Path) -> str:
    """In ``out``: the allreduce benchmark and the job at 2 ranks across the nodes (1 per node), and the job on
    one worker; returns the srun output of the benchmark."""
    mpi = ["--mpi=pmix"] if kind == "horovod" else []
    env = ["env", *HOROVOD_MPI_ENV] if kind == "horovod" else []  # srun passes its environment on to the ranks
    srun = [*env, "srun", IMMEDIATE, "--kill-on-bad-exit=1", *mpi, "-N2", "-n2", PY, "-m", f"backends.{kind}",
            "--results", str(out), "--iface", IFACE]
    # 30 timed iterations per size: with 10, one slow run of the benchmark (85% of the link where 88-100% is usual)
    # put native's fitted link, and so the model's step, 17% off (2026-11-25)
    bench = emu.run("login", *srun, "--bench", "allreduce", "--sizes", "1M,2M,4M", "--iters", "30", "--warmup-iters",
                    "3", timeout=JOB_TIMEOUT)
    emu.run("login", *srun, *RUN, *BIG_GRADIENTS, *PER_STEP, timeout=JOB_TIMEOUT)
    emu.run("node1", PY, "-m", f"backends.{kind}", "--results", str(out), *RUN, *BIG_GRADIENTS, *PER_STEP,
            timeout=JOB_TIMEOUT)
    return bench.stdout


@pytest.mark.timing  # asserts on wall-clock figures: run alone (tests/conftest.py)
def test_shaped_link_busbw_share_and_scaling_model(emu, tmp_path):
    """Every node's egress shaped to 200 Mbit/s: twinbench's own point-to-point probe sees that rate, each
    backend's allreduce bus bandwidth is reported as a share of it (1 rank per node: every byte crosses the link),
    and the report's scaling model (common.diagnostics.scaling), fitted from the 1-worker run and the benchmark,
    predicts the 2-node step time of a job allreducing 3.3 MB per step within 15% (Horovod over MPI with recursive
    doubling:
    HOROVOD_MPI_ENV); every node on its own CPU, as separate machines (MODEL_TOLERANCE)."""
    outputs = {}
    emu.sh("shape", "200mbit")
    emu.sh("cpus", "split")
    try:
        for kind in ("native", "horovod"):
            outputs[kind] = _shaped_runs(emu, kind, tmp_path / kind)
    finally:
        emu.sh("cpus", "shared")
        emu.sh("shape", "off")
    for kind, stdout in outputs.items():
        assert "% of it" in stdout, stdout[-2000:]
        r = json.loads(next((tmp_path / kind).glob("allreduce-*.json")).read_text())
        link = r["link"]
        assert link["error"] is None and link["hosts"] == NODES and link["address"] == emu.addr("node2"), link
        assert 150 < link["bytes_per_s"] * 8 / 1e6 <= 210, f"{kind}: probe {link['bytes_per_s'] * 8 / 1e6:.0f} Mbit/s"
        big = r["rows"][-1]
        share = big["busbw_pct_of_link"]
        assert share == pytest.approx(100 * big["busbw_GBps"] * 1e9 / link["bytes_per_s"])
        assert 75 < share < 110, f"{kind}: busbw {share:.0f}% of the link"  # 88-100% measured (docs/findings.md)
        predicted, measured = _model_vs_measured(tmp_path / kind)
        two = json.loads(next((tmp_path / kind).glob("*-fit-n2-*.json")).read_text())
        if len(os.sched_getaffinity(0)) >= 2:  # the ranks ran on their own node's CPU (cpus split reached them)
            assert not set(two["topology"]["cpus"][0]) & set(two["topology"]["cpus"][1]), two["topology"]
        print(f"{kind}: link {link['bytes_per_s'] / 1e6:.1f} MB/s, busbw at 4 MiB {big['busbw_GBps'] * 1e3:.1f} "
              f"MB/s = {share:.0f}%; 2-node step {measured * 1e3:.1f} ms measured, {predicted * 1e3:.1f} ms "
              "predicted")
        assert abs(predicted - measured) <= MODEL_TOLERANCE * measured, \
            f"{kind}: predicted {predicted} s, measured {measured} s"


def _breakdown(emu: Emulated, out: Path) -> dict[str, Any]:
    emu.run("login", "srun", IMMEDIATE, "--kill-on-bad-exit=1", "-N2", "-n2", PY, "-m", "backends.native",
            "--diagnose", "breakdown", "--set", "mode=ctl", *RUN, *BIG_GRADIENTS, "--results", str(out), "--iface",
            IFACE, timeout=JOB_TIMEOUT)
    return json.loads(next(out.glob("breakdown-*.json")).read_text())


@pytest.mark.timing  # asserts on wall-clock figures: run alone (tests/conftest.py)
def test_breakdown_comm_share_grows_as_the_link_predicts(emu, tmp_path):
    """The step-time breakdown of native at 2 ranks across the nodes (3.3 MB allreduced per step), on the bare
    emulated link and with every node's egress shaped to 200 Mbit/s: the communication share grows, and on the
    shaped link the comm phase takes what the wire needs for a ring allreduce (2 (n-1)/n x S bytes per rank)."""
    free = _breakdown(emu, tmp_path / "free")
    emu.sh("shape", "200mbit")
    try:
        shaped = _breakdown(emu, tmp_path / "shaped")
    finally:
        emu.sh("shape", "off")
    share = {k: r["phases"]["comm"] / r["step_time"] for k, r in (("free", free), ("shaped", shaped))}
    wire = shaped["gradient_bytes"] * 2 * (2 - 1) / 2 / (200e6 / 8)  # s per step at the shaped rate
    print(f"comm share {share['free']:.0%} -> {share['shaped']:.0%}; shaped comm "
          f"{shaped['phases']['comm'] * 1e3:.1f} ms per step, the wire needs {wire * 1e3:.1f} ms; compute "
          f"{free['phases']['compute'] * 1e3:.2f} -> {shaped['phases']['compute'] * 1e3:.2f} ms")
    # measured 71-77% -> 97%: the free link's share already dominates (2 shared cores), so the growth is asserted
    # on the comm time (about 10x measured) and the shaped share must be the comm-bound one
    assert share["shaped"] > share["free"] and share["shaped"] > 0.9, share
    assert shaped["phases"]["comm"] > 3 * free["phases"]["comm"], (free["phases"], shaped["phases"])
    # no faster than the wire; at most 2x it (native RING reached 90-93% of the probed link in the benchmark)
    assert 0.95 * wire <= shaped["phases"]["comm"] <= 2.0 * wire, (shaped["phases"], wire)
    # The link's cost lands in comm, not in compute. Compute itself is not unchanged: a phase that follows a long
    # wait runs 1.3-1.7x slower here with no network at all (`python -m bench.cold_compute`, docs/findings.md), and
    # the shaped run's compute phase follows a 130 ms all-reduce (measured 1.40 -> 2.16 ms). What must hold is that
    # compute takes no real share of what the slow link added: a breakdown that let the all-reduce's tail leak
    # into the next step's compute would move a good part of the ~100 ms the comm phase grew by.
    grew = {p: shaped["phases"][p] - free["phases"][p] for p in ("compute", "comm")}
    assert grew["compute"] < 0.05 * grew["comm"], (free["phases"], shaped["phases"])


# -- a partition mid-run (last: it leaves node2 re-registering with Slurm) -----------------------------------------
def _twinbench_pids(emu: Emulated, node: str) -> list[str]:
    """Twinbench processes still inside ``node``'s network namespace (only this cluster's can be there)."""
    ns = f"{emu.settings['PREFIX']}-{node}"
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    found = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue  # already gone
        if "backends." in cmd:
            found.append(f"{pid}: {cmd[:120]}")
    return found


def _wait_for(logs: list[Path], text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all(text in log.read_text(errors="replace") for log in logs):
        if time.monotonic() > deadline:
            raise AssertionError(f"no {text!r} within {timeout:.0f} s\n" + "\n".join(
                f"--- {log.name}\n{log.read_text(errors='replace')[-2000:]}" for log in logs))
        time.sleep(0.5)


@pytest.mark.timing  # asserts on wall-clock figures: run alone (tests/conftest.py)
def test_cut_node_ends_both_backends_on_the_other_node(emu, tmp_path):
    """node2's link cut mid-run, both backends at once (2 x 2 ranks each): the ranks on node1 exit 3 within 60 s
    naming a lost rank on node2, with the default peer timeout; nothing is left running on either node."""
    long_run = ["--job", SMOKE, "--set", "steps=100000", "--iface", IFACE]
    # a long run of slow steps (tests/aids/pause_aid.py): horovodrun passes its environment on to every rank, the
    # remote ones included (`env NAME=VALUE ...` over ssh), and the native ranks on node2 inherit theirs
    paused = {**base_env(), **pause_vars(0.05)}
    workers = [f"{node}:{TF_CONFIG_PORT + 100 + i}" for node in NODES for i in range(2)]
    native, logs = [], []
    for index, worker in enumerate(workers):
        env = dict(paused)
        env["TF_CONFIG"] = localcluster.tf_config(workers, index)
        logs.append(tmp_path / f"native{index}.log")
        native.append(emu.popen(worker.split(":")[0], [PY, "-m", "backends.native", *long_run, "--results",
                                                       str(tmp_path / "n")], logs[-1], env))
    logs.append(tmp_path / "horovodrun.log")
    hvd = emu.popen("node1", horovod.horovodrun_command("node1:2,node2:2", 4, [*long_run, "--results",
                                                                               str(tmp_path / "h")], PY), logs[-1],
                    paused)
    try:
        _wait_for([logs[0], logs[-1]], "first step done", JOB_TIMEOUT)  # both chiefs are in the loop
        emu.sh("cut", "node2")
        t_cut = time.monotonic()
        status = wait_all([native[0], native[1], hvd], [logs[0], logs[1], logs[-1]], timeout=60)
        took = time.monotonic() - t_cut
        # node2's ranks lose their peers the same way; then nothing of twinbench is left in either namespace
        wait_all(native[2:], logs[2:4], timeout=60)
        deadline = time.monotonic() + 60
        while (left := _twinbench_pids(emu, "node1") + _twinbench_pids(emu, "node2")) and time.monotonic() < deadline:
            time.sleep(1)
    finally:
        emu.sh("heal", "node2")
    assert status[:2] == [3, 3], [log.read_text()[-1500:] for log in logs[:2]]
    assert status[2] != 0 and "Exit code: 3" in logs[-1].read_text(), logs[-1].read_text()[-3000:]
    for log in (logs[0], logs[1], logs[-1]):
        assert re.search(r"lost rank [23] \(host node2", log.read_text()), log.read_text()[-2000:]
    assert took < 60, f"the ranks on node1 took {took:.0f} s to end"
    print(f"node1's ranks (native and Horovod) ended {took:.1f} s after node2's link was cut")
    assert left == [], left
