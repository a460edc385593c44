"""common.cluster.machine (every record's ``machine`` block) and how the report uses it (rows kept apart by machine, the
Machine section, plot subtitles, paths without a home directory).

Single process. GPUs, NVML, nvidia-smi, mpirun, Slurm and sysfs are fakes that answer as the real ones document;
one test reads this machine itself (and imports TensorFlow).
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from common.cluster import machine
from common.core.contract import Capabilities, Collective
from common.core.results import BreakdownRecord
from common.report import machines
from common.report.build import ReportOptions, build_report
from common.report.machines import short_command
from common.report.render import format_ratio_table
from common.report.summary import summarize
from common.training.context import Plan, RunContext
from common.training.inputwait import rank_measure
from common.workload.job import Job
from tests.test_report import make_run, put

A100, H100 = "NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3"


# -- fakes ----------------------------------------------------------------------------------------------------
class FakeNVMLError(Exception):
    pass


def fake_pynvml(devices: list[tuple[str, str, int, tuple[int, int]]], driver: str = "550.54.15",
                init_error: bool = False) -> types.ModuleType:
    """A pynvml module over ``devices`` (uuid, name, memory bytes, compute capability), indexed as NVML does: all of
    the host's GPUs, whatever CUDA_VISIBLE_DEVICES says. ``init_error``: nvmlInit fails as without a driver."""
    m = types.ModuleType("pynvml")
    m.NVMLError = FakeNVMLError
    m.calls = []

    def init() -> None:
        m.calls.append("init")
        if init_error:
            raise FakeNVMLError("NVML Shared Library Not Found")

    def by_uuid(uuid: str) -> int:
        for i, d in enumerate(devices):
            if d[0] == uuid:
                return i
        raise FakeNVMLError("Not Found")  # NVML matches whole UUIDs only

    def by_index(i: int) -> int:
        if not 0 <= i < len(devices):
            raise FakeNVMLError("Invalid Argument")
        return i

    m.nvmlInit = init
    m.nvmlShutdown = lambda: m.calls.append("shutdown")
    m.nvmlDeviceGetCount = lambda: len(devices)
    m.nvmlDeviceGetHandleByIndex = by_index
    m.nvmlDeviceGetHandleByUUID = by_uuid
    m.nvmlDeviceGetUUID = lambda h: devices[h][0]
    m.nvmlDeviceGetName = lambda h: devices[h][1].encode()  # older pynvml versions return bytes
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=devices[h][2], free=0, used=0)
    m.nvmlDeviceGetCudaComputeCapability = lambda h: devices[h][3]
    m.nvmlSystemGetDriverVersion = lambda: driver
    return m


# GPU 3 differs from the others: reading the wrong index gives the wrong model
HOST_GPUS = [(f"GPU-{c * 8}-0000", A100, 40 * 2**30, (8, 0)) for c in "abc"] + [("GPU-dddddddd-0000", H100,
                                                                                   80 * 2**30, (9, 0))]


def fake_command(tmp_path: Path, name: str, body: str) -> Path:
    """An executable ``name`` in tmp_path/bin that records its arguments in tmp_path/NAME.args and runs ``body``."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    path = bindir / name
    path.write_text(f'#!/bin/sh\necho "$@" > "{tmp_path}/{name}.args"\n{body}\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


SMI_BODY = """case "$*" in
  *"-i 3"*) echo "NVIDIA H100 80GB HBM3, 81559, 9.0, 550.54.15" ;;
  *"-i GPU-dddddddd-0000"*) echo "NVIDIA H100 80GB HBM3, [N/A], 9.0, 550.54.15" ;;
  *) echo "NVIDIA A100-SXM4-40GB, 40960, 8.0, 550.54.15" ;;
esac"""  # nvidia-smi's documented csv,noheader,nounits output: memory.total in MiB


def fake_tf(gpu: str | None = None, peak: int = 123456) -> Any:
    """The few TensorFlow calls rank_machine makes, with one visible GPU named ``gpu`` (None: a CPU run)."""
    gpus = [types.SimpleNamespace(name=gpu, device_type="GPU")] if gpu else []
    exp = types.SimpleNamespace(get_memory_info=lambda d: {"current": 1, "peak": peak},
                                get_device_details=lambda d: {"device_name": H100, "compute_capability": (9, 0)})
    return types.SimpleNamespace(
        sysconfig=types.SimpleNamespace(get_build_info=lambda: {"cuda_version": "12.5.1", "cudnn_version": "9"}),
        config=types.SimpleNamespace(get_visible_devices=lambda kind: gpus, experimental=exp))


# -- this machine ---------------------------------------------------------------------------------------------
def test_this_machine_block() -> None:
    import tensorflow as tf

    status = Path("/proc/self/status").read_text()
    rss_before = int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024
    rec = machine.rank_machine(None)
    with open("/proc/cpuinfo") as f:
        names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    assert rec["cpu"]["model"] == " ".join(names[0].split())
    assert rec["cpu"]["logical_cores"] == os.cpu_count()
    assert rec["cpu_mask"] == len(os.sched_getaffinity(0))
    assert rec["memory"]["peak_rss_bytes"] >= rss_before > 0  # the peak is at least what the process held before
    if not tf.config.list_physical_devices("GPU"):
        assert rec["gpu"] == machine.NO_GPU and rec["memory"]["peak_gpu_bytes"] is None
    build = tf.sysconfig.get_build_info()
    assert rec["libraries"]["cuda"] == build.get("cuda_version") and rec["libraries"]["cudnn"] == build.get(
        "cudnn_version")
    block = machine.combine([rec])
    assert json.loads(json.dumps(block)) == block
    assert block["distinct_cpu_models"] == [rec["cpu"]["model"]] and block["num_nodes"] == 1


def one_rank_run(device: str) -> tuple[Job, Any, Any]:
    """A 2-step job, a one-process chief backend on ``device`` and a model without weights: what
    ``train.gather`` and ``train.make_record`` read, without TensorFlow."""
    job = Job(name="m", per_replica_batch_size=4, steps=2)
    backend = types.SimpleNamespace(
        name="native", num_workers=1, is_chief=True, allgather=lambda x: [x],
        info=types.SimpleNamespace(local_rank=0, local_size=1, cpus=(0,), cpu_bind="none", device=device),
        describe=lambda: {}, capabilities=lambda: Capabilities(Collective("auto", "n/a", "one process")))
    from common.training import compiled, train

    built = train.Built(types.SimpleNamespace(weights=[], trainable_weights=[], trainable_variables=[]), None, None,
                        compiled.recipe(job, None, 1))
    return job, backend, built


def test_records_carry_the_block_through_gather_and_make_record() -> None:
    """common.training.train.gather adds each rank's facts, make_record combines them into RunRecord.machine."""
    from common.training import train

    job, backend, built = one_rank_run("cpu")
    hooks = types.SimpleNamespace(clock_marks=lambda: [[0, 0.0], [1, 0.5], [2, 1.0]], warm=1, losses=[1.0, 0.5],
                                  measured=lambda: {"time_to_first_step": 1.0, "input": rank_measure(None)})
    opts = types.SimpleNamespace(iface=None, t_process_start=0.0, command=("python",))
    resume = types.SimpleNamespace(previous={}, start_step=0)
    ctx = RunContext(job, backend, opts, Plan(4, 2, 2, 1))  # type: ignore[arg-type]
    gathered = train.gather(ctx, built, hooks, resume, "d")
    everyone = gathered.everyone
    assert everyone[0]["machine"]["cpu"]["logical_cores"] == os.cpu_count()
    rec = train.make_record(ctx, built, resume, gathered)
    assert rec.machine == machine.combine([everyone[0]["machine"]])
    assert rec.to_dict()["machine"]["shared"]["cpu"]["model"] == everyone[0]["machine"]["cpu"]["model"]


def test_allreduce_record_carries_the_block(tmp_path: Path) -> None:
    from common.diagnostics import allreduce as bench
    from common.training.runconfig import BenchOptions

    backend = types.SimpleNamespace(name="native", num_workers=1, num_replicas=1, rank=0, is_chief=True,
                                    allgather=lambda x: [x], allreduce_fn=lambda: (lambda t: t), describe=lambda: {},
                                    capabilities=lambda: Capabilities(Collective("auto", "n/a", "one process")))
    rec = bench.run_allreduce(backend, BenchOptions((16,), iters=2, warmup_iters=0), str(tmp_path), ["python"],
                              verbose=False)
    written = json.loads(next(tmp_path.glob("allreduce-*.json")).read_text())
    assert written["machine"] == rec.machine and written["machine"]["num_ranks"] == 1
    assert written["machine"]["distinct_cpu_models"] == [machine.cpu_facts()["model"]]


def test_breakdown_record_keeps_the_block() -> None:
    phases = dict.fromkeys(("input", "compute", "comm", "apply", "rest"), 0.001)
    d = {"schema": 2, "kind": "breakdown", "backend": "native", "world_size": 1, "num_workers": 1, "job_hash": "h",
         "job": {}, "steps": 3, "timed_steps": 2, "warmup_steps": 1, "phases": phases, "step_time": 0.005,
         "host_step_time": 0.005, "machine": {"num_nodes": 1}}
    assert BreakdownRecord.from_dict(d).machine == {"num_nodes": 1}
    assert BreakdownRecord.from_dict({k: v for k, v in d.items() if k != "machine"}).machine is None


# -- GPU: NVML, nvidia-smi, TensorFlow ------------------------------------------------------------------------
@pytest.mark.parametrize("visible, ordinal, want", [
    (None, 3, "3"),  # nothing hidden: the CUDA ordinal is the NVML index
    ("2,3", 1, "3"),  # NVML ignores CUDA_VISIBLE_DEVICES: the ordinal-th entry names the device
    ("3,0", 0, "3"),  # in the order listed
    ("GPU-dddddddd-0000,GPU-aaaaaaaa-0000", 0, "GPU-dddddddd-0000"),
    ("0,-1,3", 1, None),  # CUDA stops at an invalid entry: no such device
    ("0", 1, None),
])
def test_visible_id_maps_cuda_ordinals(visible: str | None, ordinal: int, want: str | None) -> None:
    assert machine.visible_id(ordinal, visible) == want


@pytest.mark.parametrize("visible", ["2,3", "GPU-aaaaaaaa-0000,GPU-dddddddd-0000", "GPU-cccccccc-0000,GPU-dddd"])
def test_nvml_answers_for_the_kept_gpu(visible: str) -> None:
    nvml = fake_pynvml(HOST_GPUS)
    gpu = machine.gpu_facts(1, visible, nvml=nvml)
    assert gpu == {"source": "nvml", "id": visible.split(",")[1], "model": H100, "memory_bytes": 80 * 2**30,
                   "compute_capability": "9.0", "driver": "550.54.15"}
    assert nvml.calls == ["init", "shutdown"]


def test_rank_machine_takes_pynvml_from_sys_modules(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(HOST_GPUS))
    env = {"CUDA_VISIBLE_DEVICES": "1,3"}
    rec = machine.rank_machine(None, environ=env, tf=fake_tf("/physical_device:GPU:1"), sysfs=str(tmp_path))
    assert rec["gpu"]["source"] == "nvml" and rec["gpu"]["model"] == H100 and rec["gpu"]["id"] == "3"
    assert rec["memory"]["peak_gpu_bytes"] == 123456
    assert rec["libraries"]["cuda"] == "12.5.1" and rec["libraries"]["cudnn"] == "9"
    cpu_run = machine.rank_machine(None, environ=env, tf=fake_tf(None), sysfs=str(tmp_path))
    assert cpu_run["gpu"]["source"] == "none" and cpu_run["memory"]["peak_gpu_bytes"] is None


@pytest.mark.parametrize("nvml", ["missing", "no driver"])
def test_nvidia_smi_answers_when_nvml_does_not(nvml: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_command(tmp_path, "nvidia-smi", SMI_BODY)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setitem(sys.modules, "pynvml", None if nvml == "missing" else fake_pynvml([], init_error=True))
    gpu = machine.gpu_facts(1, "2,3", nvml=machine.load_nvml())
    assert gpu == {"source": "nvidia-smi", "id": "3", "model": H100, "memory_bytes": 81559 * 2**20,
                   "compute_capability": "9.0", "driver": "550.54.15"}
    assert (tmp_path / "nvidia-smi.args").read_text().split() == [
        "--query-gpu=name,memory.total,compute_cap,driver_version", "--format=csv,noheader,nounits", "-i", "3"]
    by_uuid = machine.gpu_facts(0, "GPU-dddddddd-0000", nvml=machine.load_nvml())
    assert by_uuid["model"] == H100 and by_uuid["memory_bytes"] is None  # "[N/A]" is unknown, not zero


def test_tensorflow_answers_last_then_none(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    details = fake_tf("/physical_device:GPU:0").config.experimental.get_device_details
    gpu = machine.gpu_facts(0, None, nvml=fake_pynvml([], init_error=True), details=lambda: details(None))
    assert gpu == {"source": "tensorflow", "id": "0", "model": H100, "memory_bytes": None,
                   "compute_capability": "9.0", "driver": None}
    assert machine.gpu_facts(0, None, nvml=None, details=None) == {**machine.NO_GPU, "id": "0"}


# -- libraries, Slurm, network ----------------------------------------------------------------------------------
def test_nccl_version_from_horovod(monkeypatch: pytest.MonkeyPatch) -> None:
    assert machine.nccl_version(21805) == "2.18.5" and machine.nccl_version(2708) == "2.7.8"
    monkeypatch.delitem(sys.modules, "horovod.tensorflow", raising=False)
    assert machine.horovod_nccl() is None  # this process runs no Horovod
    monkeypatch.setitem(sys.modules, "horovod.tensorflow", types.SimpleNamespace(nccl_built=lambda: 23203))
    assert machine.horovod_nccl() == "2.32.3"
    monkeypatch.setitem(sys.modules, "horovod.tensorflow", types.SimpleNamespace(nccl_built=lambda: 0))
    assert machine.horovod_nccl() is None  # built without NCCL


def test_mpi_version_from_mpi4py_else_mpirun(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    try:
        import mpi4py

        mpi4py.rc.initialize = False
        from mpi4py import MPI

        assert machine.mpi_version() == MPI.Get_library_version().replace("\x00", "").splitlines()[0].strip()
    except ImportError:
        pass  # no MPI library here: only the command fallback below is checked
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    fake_command(tmp_path, "mpirun", 'printf "mpirun (Open MPI) 9.8.7\\n\\nReport bugs to nobody\\n"')
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert machine.mpi_version() == "mpirun (Open MPI) 9.8.7"
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert machine.mpi_version() is None


def test_reading_the_mpi_version_does_not_start_mpi() -> None:
    """A native rank has no MPI job to join: reading the library's version must leave MPI uninitialised."""
    pytest.importorskip("mpi4py")
    code = ("from common.cluster import machine; v = machine.mpi_version(); from mpi4py import MPI; "
            "print(v is not None, MPI.Is_initialized())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[1], check=True).stdout.split()
    if out[0] == "True":  # an MPI library answered
        assert out[1] == "False"


def test_slurm_fields_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(k)
    assert machine.slurm_facts() is None  # outside Slurm
    for k, v in {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "3", "SLURM_JOB_NODELIST": "node[1-2]",
                 "SLURM_NNODES": "2", "SLURM_NTASKS": "4", "SLURM_CPUS_PER_TASK": "8",
                 "SLURM_JOB_PARTITION": "gpu"}.items():
        monkeypatch.setenv(k, v)
    assert machine.slurm_facts() == {"job_id": "4242", "step_id": "3", "nodelist": "node[1-2]", "num_nodes": 2,
                                     "ntasks": 4, "cpus_per_task": 8, "partition": "gpu"}
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "3")  # the newer name wins over SLURM_NNODES
    assert machine.slurm_facts()["num_nodes"] == 3


def test_link_speed_and_rdma_devices_from_sysfs(tmp_path: Path) -> None:
    for name, speed in (("ib0", "100000\n"), ("eth0", "-1\n"), ("bad", "x\n")):
        (tmp_path / "class" / "net" / name).mkdir(parents=True)
        (tmp_path / "class" / "net" / name / "speed").write_text(speed)
    sysfs = str(tmp_path)
    assert machine.network_facts("ib0", sysfs) == {"interface": "ib0", "link_speed_mbps": 100000, "rdma_devices": []}
    for ib in ("mlx5_1", "mlx5_0"):
        (tmp_path / "class" / "infiniband" / ib).mkdir(parents=True)
    assert machine.rdma_devices(sysfs) == ["mlx5_0", "mlx5_1"]
    assert [machine.link_speed(i, sysfs) for i in ("eth0", "bad", "missing", None)] == [None] * 4


def test_combine_keeps_equal_facts_once_and_lists_per_rank_ones() -> None:
    def rank(host: str, cpu: str, mask: int) -> dict[str, Any]:
        return {"host": host, "cpu": {"model": cpu, "logical_cores": 8}, "cpu_mask": mask, "gpu": dict(machine.NO_GPU),
                "libraries": {"cuda": None}, "slurm": None, "network": {"interface": "ib0"},
                "memory": {"peak_rss_bytes": mask}}

    same = machine.combine([rank("a", "X", 4), rank("b", "X", 2)])
    assert same["num_nodes"] == 2 and same["distinct_cpu_models"] == ["X"] and same["distinct_gpu_models"] == []
    assert set(same["shared"]) == {"cpu", "libraries", "slurm", "network"}
    assert same["per_rank"]["cpu_mask"] == [4, 2] and machine.section(same, "cpu") == [same["shared"]["cpu"]] * 2
    mixed = machine.combine([rank("a", "X", 4), rank("a", "Y", 4)])
    assert mixed["num_nodes"] == 1 and mixed["distinct_cpu_models"] == ["X", "Y"]
    assert [c["model"] for c in machine.section(mixed, "cpu")] == ["X", "Y"]


# -- the report ---------------------------------------------------------------------------------------------------
def block(cpu: str, gpu: str | None = None, nodes: int = 1, ranks: int = 1, job_id: str | None = None,
          nccl: str | None = None) -> dict[str, Any]:
    per = [{"host": f"n{i % nodes}", "cpu": {"model": cpu, "logical_cores": 64}, "cpu_mask": 8,
            "gpu": {**machine.NO_GPU, **({"source": "nvml", "id": "0", "model": gpu, "memory_bytes": 40 * 2**30,
                                          "compute_capability": "8.0", "driver": "550.54.15"} if gpu else {})},
            "libraries": {"cuda": "12.5.1", "cudnn": "9", "nccl": nccl, "mpi": "Open MPI v4.1.4"},
            "slurm": {"job_id": job_id, "step_id": "0", "partition": "p"} if job_id else None,
            "network": {"interface": "ib0", "link_speed_mbps": 100000, "rdma_devices": ["mlx5_0"]},
            "memory": {"peak_rss_bytes": 1, "peak_gpu_bytes": None}} for i in range(ranks)]
    return machine.combine(per)


def test_runs_on_different_cpus_get_rows_of_their_own(tmp_path: Path) -> None:
    d = tmp_path / "results"
    for cpu, ips in (("Intel(R) Xeon(R) Gold 6248", 100.0), ("AMD EPYC 7742", 150.0)):
        put(d, make_run("native", 1, ips, run_id=f"n1-{ips}", machine=block(cpu, job_id="11")))
        put(d, make_run("native", 2, 1.8 * ips, run_id=f"n2-{ips}", machine=block(cpu, ranks=2, job_id="12")))
    (s,) = summarize(json.loads(p.read_text()) for p in d.glob("*.json"))
    rows = {(r.identity.label, r.identity.world_size): r for r in s.rows}
    assert set(rows) == {("native [AMD EPYC 7742]", 1), ("native [AMD EPYC 7742]", 2),
                         ("native [Intel Xeon Gold 6248]", 1), ("native [Intel Xeon Gold 6248]", 2)}
    assert rows[("native [AMD EPYC 7742]", 2)].scaling.speedup == pytest.approx(1.8)  # against its own CPU's baseline
    build_report(d, options=ReportOptions(plots=False))
    md = (d / "report" / "report.md").read_text()
    section = md.split("### Machine")[1].split("### Environment")[0]
    lines = [x for x in section.splitlines() if x.startswith("- ")]
    assert len(lines) == 2
    # a CPU machine with a GPU build of TensorFlow: what TF was built for, never read as the machine's CUDA
    assert "Intel(R) Xeon(R) Gold 6248 x 64 logical cores; no GPU; 1 node; TF built for CUDA 12.5.1, cuDNN 9; MPI " \
        "Open MPI" in lines[0] + lines[1] and any("AMD EPYC 7742 x 64" in x for x in lines)
    assert all("Slurm job(s) 11.0 (p), 12.0 (p)" in x for x in lines)


def test_node_counts_split_only_the_rows_they_would_merge() -> None:
    runs = [make_run("native", 1, 100.0, run_id="a", machine=block("C", A100)),
            make_run("native", 2, 190.0, run_id="b", machine=block("C", A100, ranks=2)),
            make_run("native", 2, 150.0, run_id="c", machine=block("C", A100, nodes=2, ranks=2)),
            make_run("horovod", 1, 100.0, run_id="d", machine=block("C", A100, nccl="2.18.5")),
            make_run("horovod", 2, 180.0, run_id="e", machine=block("C", A100, nodes=2, ranks=2, nccl="2.18.5"))]
    (s,) = summarize(runs)
    labels = [(r.identity.label, r.identity.world_size) for r in s.rows]
    assert labels == [("native [1 node]", 1), ("native [1 node]", 2), ("native [2 nodes]", 2), ("horovod", 1),
                      ("horovod", 2)]
    assert s.rows[2].scaling.speedup == pytest.approx(1.5)  # the 2-node row's baseline is the series' 1-replica run
    ratio = {q.machine: q.ratio for q in s.ratios if q.world_size == 2}
    assert ratio == {"1 node": None, "2 nodes": pytest.approx(180 / 150)}  # each pair on the same node count
    assert "| machine |" in format_ratio_table(s)
    assert machines.subtitle(s.records) == "A100-SXM4-40GB; 1-2 nodes"


def test_ratio_never_pairs_different_gpus() -> None:
    runs = [make_run("native", 2, 100.0, run_id="a", machine=block("C", A100, ranks=2)),
            make_run("horovod", 2, 300.0, run_id="b", machine=block("C", H100, ranks=2))]
    (s,) = summarize(runs)
    assert [r.identity.label for r in s.rows] == ["native [A100-SXM4-40GB]", "horovod [H100 80GB HBM3]"]
    assert all(q.ratio is None for q in s.ratios)


def test_old_records_still_report_as_before(tmp_path: Path) -> None:
    d = tmp_path / "results"
    put(d, make_run("native", 1, 100.0, run_id="old"))
    put(d, make_run("native", 2, 190.0, run_id="old2"))
    build_report(d, options=ReportOptions(plots=True))
    md = (d / "report" / "report.md").read_text()
    assert "| native | 1 |" in md and "| native | 2 |" in md and "machine not recorded" in md
    put(d, make_run("native", 2, 150.0, run_id="new", machine=block("C", ranks=2)))
    (s,) = summarize(json.loads(p.read_text()) for p in d.glob("*.json"))
    assert [r.identity.label for r in s.rows] == ["native [C]", "native [machine not recorded]",
                                           "native [machine not recorded]"]  # never merged with unknown machines


def test_environment_paths_are_relative_and_name_no_home(tmp_path: Path) -> None:
    d = tmp_path / "results"
    home = str(Path.home())
    cmd = ["/root/tb/.venv/bin/python3", "-m", "backends.native", "--job", f"{home}/jobs/smoke.toml",
           "--results", str(d.resolve()), "--profile-dir=/home/alice/x"]
    put(d, make_run("native", 1, 100.0, command=cmd, backend_info={"timeline": f"{d.resolve()}/tl.json"}))
    assert short_command(cmd, d) == ("python3 -m backends.native --job ~/jobs/smoke.toml --results . "
                                     "--profile-dir=~/x")
    build_report(d, options=ReportOptions(plots=False))
    md = (d / "report" / "report.md").read_text()
    env = md.split("### Environment")[1]
    assert "--results ." in env and "./tl.json" in env
    assert "/root" not in md and "/home/" not in md and (home in ("/", "") or home not in md)


def test_machine_line_says_what_tensorflow_was_built_for() -> None:
    gpu_build = machines.describe(block("C"))
    assert "; no GPU; 1 node; TF built for CUDA 12.5.1, cuDNN 9; MPI Open MPI v4.1.4" in gpu_build
    cpu = block("C")
    for libs in machine.section(cpu, "libraries"):
        libs.update(cuda=None, cudnn=None)  # a CPU build of TensorFlow: no CUDA in its build info
    assert machines.describe(cpu).endswith("; no GPU; 1 node; TF built without CUDA; MPI Open MPI v4.1.4")
    assert "driver 550.54.15" in machines.describe(block("C", A100))  # the machine's own: the GPU's driver
