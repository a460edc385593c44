"""GPU energy (common.cluster.energy): NVML's energy counter over the timed steps, summed over ranks, "GPU only";
absent, never zero, without a GPU or a counter. The fake NVML of tests/test_machine.py, with a counter."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

from common.cluster import energy, machine
from common.report.build import ReportOptions, build_report
from common.report.summary import summarize
from common.training.hostsync import At, FirstStep, TrainingClock
from common.training.inputwait import NotMeasured
from tests.test_machine import HOST_GPUS, FakeNVMLError, fake_pynvml, fake_tf, one_rank_run
from tests.test_report import make_run, put


def counting_nvml(mj_per_read: int = 5000, supported: bool = True) -> types.ModuleType:
    """The fake NVML whose energy counter (mJ) grows by ``mj_per_read`` per read of each device; ``supported``
    False: the counter raises as on a GPU older than Volta."""
    nvml = fake_pynvml(HOST_GPUS)
    counters = [1_000_000 * (i + 1) for i in range(len(HOST_GPUS))]

    def total_energy(h: int) -> int:
        if not supported:
            raise FakeNVMLError("Not Supported")
        counters[h] += mj_per_read
        return counters[h]

    nvml.nvmlDeviceGetTotalEnergyConsumption = total_energy
    return nvml


def test_counter_delta_over_the_timed_steps() -> None:
    nvml = counting_nvml()
    meter = energy.rank_meter(fake_tf("/physical_device:GPU:1"), {"CUDA_VISIBLE_DEVICES": "2,3"}, nvml)
    assert meter is not None and meter.gpu == "3"  # the rank's GPU, as machine.visible_id maps it
    for done in (0, 1, 2, 4, 6):  # warm-up ends at step 2, the run's last step is 6
        meter.at_mark(done, 2, 6)
    assert meter.result() == {"gpu": "3", "joules": 5.0}  # one read apart: 5000 mJ
    assert nvml.calls[-1] == "shutdown"


def test_absent_without_gpu_nvml_or_counter() -> None:
    assert energy.rank_meter(fake_tf(None), {}, counting_nvml()) is None  # a CPU run
    assert energy.open_meter(0, None, None) is None  # no pynvml
    assert energy.open_meter(0, None, fake_pynvml(HOST_GPUS, init_error=True)) is None  # no driver
    old = counting_nvml(supported=False)
    assert energy.open_meter(0, None, old) is None and old.calls == ["init", "shutdown"]  # pre-Volta
    meter = energy.open_meter(0, None, counting_nvml())
    meter.at_mark(0, 2, 6)
    assert meter.result() is None  # the run stopped before its timed window ended (e.g. preempted)


def test_combine_sums_distinct_gpus_and_needs_every_rank() -> None:
    a, b = {"gpu": "0", "joules": 10.0}, {"gpu": "1", "joules": 12.0}
    block = energy.combine([a, b], ["n0", "n0"], 440.0)
    assert block["gpu_joules"] == 22.0 and block["scope"] == "GPU only" and block["joules_per_image"] == 0.05
    assert energy.combine([a, a], ["n0", "n0"], None)["gpu_joules"] == 10.0  # two ranks on one GPU: counted once
    assert energy.combine([a, b], ["n0", "n1"], None)["gpu_joules"] == 22.0
    assert energy.combine([a, None], ["n0", "n1"], 1.0) is None  # a rank without a counter: no partial sum
    assert energy.combine([], [], 1.0) is None


def gpu_block(ranks: int) -> dict[str, Any]:
    return machine.combine([{"host": "n0", "cpu": {"model": "C"}, "gpu": {**machine.NO_GPU, "model": "H100"},
                             "memory": {"peak_rss_bytes": 2**30, "peak_gpu_bytes": 3 * 2**30}} for _ in range(ranks)])


def test_report_shows_energy_gpu_hours_and_gpu_memory(tmp_path: Path) -> None:
    d = tmp_path / "r"
    gpu = {"devices": ["/physical_device:GPU:0"] * 2, "hosts": ["n0", "n0"], "machine": gpu_block(2)}
    for i in range(2):
        # 10 timed steps of 32 images, 0.01 s each, 4 steps per epoch (tests.test_report.make_run)
        put(d, make_run("native", 2, 3200.0 + i, run_id=f"n{i}", energy={"gpu_joules": 64.0, "scope": "GPU only"},
                        **gpu))
        put(d, make_run("horovod", 2, 3300.0 + i, run_id=f"h{i}", **gpu))  # measured nothing
    put(d, make_run("native", 1, 50.0, run_id="cpu", job=make_cpu_job()))  # a CPU run of another job
    build_report(d, options=ReportOptions(plots=False))
    md = (d / "report" / "report.md").read_text()
    table = md.split("### Memory and energy")[1].split("###")[0]
    native = next(x for x in table.splitlines() if x.startswith("| native | 2 |"))
    assert "| 3.0 GiB GPU | 64.0 | 200 |" in native  # 64 J / 320 images = 200 mJ per image
    assert native.endswith(f"| {2 * 0.01 * 4 / 3600:.3g} | n/a |")  # GPU-hours per epoch; no target
    horovod = next(x for x in table.splitlines() if x.startswith("| horovod | 2 |"))
    assert "| 3.0 GiB GPU | n/a | n/a |" in horovod  # not measured: n/a, not zero
    assert "GPU only" in table and "MLPerf Power" in table
    cpu_section = md.split("Job `cpu`")[1].split("Job `small`")[0]
    assert "### Memory and energy" not in cpu_section  # no GPU and no memory recorded: no table at all
    (s,) = [x for x in summarize(json.loads(p.read_text()) for p in d.glob("*.json")) if x.name == "cpu"]
    assert s.rows[0].resources.energy_j is None and s.rows[0].resources.gpu_hours_per_epoch is None


def make_cpu_job() -> Any:
    from common.workload.job import Job

    return Job(name="cpu", per_replica_batch_size=8, steps=12)


def test_gather_and_make_record_carry_the_energy() -> None:
    """common.training.train: each rank's meter result is gathered and summed into RunRecord.energy; a run without
    a meter writes none."""
    from common.training import train
    from common.training.context import Plan, RunContext

    job, backend, built = one_rank_run("gpu")
    opts = types.SimpleNamespace(iface=None, t_process_start=0.0, command=("python",))
    resume = types.SimpleNamespace(previous={}, start_step=0)
    ctx = RunContext(job, backend, opts, Plan(4, 2, 2, 1))  # type: ignore[arg-type]
    meter = energy.open_meter(0, None, counting_nvml())
    records = []
    for m in (meter, None):
        parts = [FirstStep(0.0, False), NotMeasured("no input clock here")] + ([m] if m is not None else [])
        hooks = types.SimpleNamespace(clock_marks=lambda: [[0, 0.0], [1, 0.5], [2, 1.0]], warm=1, losses=[1.0, 0.5],
                                      measured=lambda parts=parts: {k: v for p in parts
                                                                    for k, v in p.measured().items()})
        if m is not None:  # as StepHooks calls its parts: at the clock's start, then at each sync (after its mark)
            m.start(At(0, 0, 1, 2, TrainingClock()))
            for done in (1, 2):
                m.at_sync(At(done, 0, 1, 2, TrainingClock()))
        records.append(train.make_record(ctx, built, resume, train.gather(ctx, built, hooks, resume, "d")))
    assert records[0].energy["gpu_joules"] == 5.0 and records[0].energy["joules_per_image"] == 5.0 / 4
    assert records[1].energy is None and "energy" in records[1].to_dict()
