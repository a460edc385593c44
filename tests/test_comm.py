"""Collectives and tuning knobs: what each backend is given is what the record says, and knobs keep the arithmetic."""

from __future__ import annotations

import types

import pytest

from backends import native
from common.cluster.placement import Pinning
from common.core.contract import Collective, RankInfo, tuning_record
from tests.conftest import PY, SMOKE, first_divergence, run


@pytest.mark.parametrize(("requested", "has_gpu", "used"), [
    ("auto", True, "nccl"), ("auto", False, "ring"), ("nccl", True, "nccl"), ("nccl", False, "ring"),
    ("ring", True, "ring"), ("ring", False, "ring"),
])
def test_resolve_comm(requested, has_gpu, used):
    got = native.resolve_comm(requested, has_gpu)
    assert (got.requested, got.used) == (requested, used) and got.reason


def set_up(backend: native.NativeBackend, replicas_per_worker: int = 1) -> native.NativeBackend:
    """The backend as ``setup`` leaves it, without TensorFlow: capabilities() describes a set-up backend."""
    backend._info = RankInfo(rank=0, num_workers=1, local_rank=0, local_size=1,
                             replicas_per_worker=replicas_per_worker, device="cpu", threads=1)
    return backend


class _Captured(Exception):
    """Raised by the fake strategy class: carries the CommunicationOptions MWMS would have been created with."""


def _fake_tf(tf):
    """The real tf.distribute option types, but a MultiWorkerMirroredStrategy that only captures its options."""

    def mwms(cluster_resolver=None, communication_options=None):
        raise _Captured(communication_options)

    distribute = types.SimpleNamespace(experimental=tf.distribute.experimental, MultiWorkerMirroredStrategy=mwms)
    return types.SimpleNamespace(distribute=distribute)


@pytest.mark.parametrize(("gpus", "impl"), [(["/physical_device:GPU:0"], "NCCL"), ([], "RING")])
def test_auto_gives_mwms_nccl_with_a_gpu_and_ring_without(monkeypatch, gpus, impl):
    """A faked visible GPU: ``--comm auto`` creates MWMS with NCCL (TF's own AUTO would run RING); none: RING."""
    tf = pytest.importorskip("tensorflow")
    monkeypatch.delenv("SLURM_STEP_NUM_TASKS", raising=False)
    monkeypatch.delenv("SLURM_NTASKS", raising=False)
    opts = native.Options(comm="auto", bytes_per_pack=1 << 20, comm_timeout=30.0)
    with pytest.raises(_Captured) as got:
        native.make_strategy(_fake_tf(tf), opts, gpus, Pinning("cpu", None, None))
    options = got.value.args[0]
    assert options.implementation == getattr(tf.distribute.experimental.CommunicationImplementation, impl)
    assert options.bytes_per_pack == 1 << 20 and options.timeout_seconds == 30.0
    assert native.resolve_comm("auto", bool(gpus)).used == impl.lower()


def test_knobs_record_values_defaults_and_variant():
    default = set_up(native.NativeBackend(native.Options()))
    rec = tuning_record(list(default.capabilities().knobs), {"NCCL_DEBUG": "INFO"})
    assert rec["knobs"] == {"bytes_per_pack": 0, "comm_timeout_seconds": 0.0} == rec["defaults"]
    assert rec["variant"] is None and rec["env"] == {"NCCL_DEBUG": "INFO"}
    packed = set_up(native.NativeBackend(native.Options(bytes_per_pack=32 << 20)))
    assert tuning_record(list(packed.capabilities().knobs), {})["variant"] == "packs 32 MiB"
    mirrored = set_up(native.NativeBackend(native.Options(strategy="mirrored")), 2)
    assert mirrored.capabilities().knobs == ()  # not MWMS: no such knob


@pytest.mark.parametrize(("flags", "says"), [
    (["--bytes-per-pack", "-1"], "--bytes-per-pack must be >= 0"),
    (["--comm-timeout", "-5"], "--comm-timeout must be >= 0"),
    (["--bytes-per-pack", "abc"], "invalid int value"),
    (["--hierarchical-allreduce"], "unrecognized arguments: --hierarchical-allreduce"),
])
def test_bad_native_knobs_exit_2_before_tensorflow(tmp_path, flags, says):
    proc = run([PY, "-X", "importtime", "-m", "backends.native", "--job", SMOKE, "--results", str(tmp_path / "r"),
                *flags], check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if not ln.startswith("import time:")]
    assert len(lines) == 1 and says in lines[0], lines
    assert "tensorflow" not in proc.stderr  # refused before TensorFlow was imported
    assert not (tmp_path / "r").exists()


def test_collective_record_default():
    assert Collective("auto", "ring", "x").to_dict() == {"requested": "auto", "used": "ring", "reason": "x"}


@pytest.mark.distributed
def test_bytes_per_pack_changes_grouping_not_arithmetic(runner):
    """2 MWMS workers, gradients all-reduced in ~16 KiB packs: the same per-step losses, bit for bit, and the record
    says which packs and which collective ran."""
    packed = runner("native", "--set", "mode=ctl", "--bytes-per-pack", "16384")
    plain = runner("native", "--set", "mode=ctl")
    assert packed["step_losses"] == plain["step_losses"]
    assert packed["trainable_weights_digest"] == plain["trainable_weights_digest"]
    assert packed["tuning"]["knobs"]["bytes_per_pack"] == 16384 and packed["tuning"]["variant"] == "packs 16 KiB"
    assert plain["tuning"]["variant"] is None and plain["tuning"]["knobs"]["bytes_per_pack"] == 0
    for rec in (packed, plain):  # auto on this GPU-less machine: RING, requested and used both recorded
        assert rec["collective"] == {"requested": "auto", "used": "ring", "reason": "--comm auto and no GPU is visible"}


@pytest.mark.distributed
def test_horovod_knobs_change_when_gradients_travel_not_what_they_sum(runner):
    """``--fusion-threshold-mb 0.125 --cycle-time-ms 2`` repack and retime Horovod's allreduces: at 2 ranks every
    sum is a + b, exact in any grouping, so the per-step losses must be bit-identical to the run at Horovod's
    defaults (the smoke job's plain run, which the parity tests share). Its first kernel (784 x 64 float32, 196 KiB)
    is above the 128 KiB threshold: it travels alone instead of fused with the rest (under 3 KiB), so the knob really
    changes the packing. The record holds the knobs; the job (and hash) is the same."""
    plain = runner("horovod")
    tuned = runner("horovod", "--fusion-threshold-mb", "0.125", "--cycle-time-ms", "2")
    assert tuned["job_hash"] == plain["job_hash"], "knobs are not job keys"
    assert tuned["initial_weights_digest"] == plain["initial_weights_digest"]
    assert tuned["step_losses"] == plain["step_losses"], first_divergence(plain["step_losses"],
                                                                          tuned["step_losses"], 0.0)
    assert tuned["weights_digest"] == plain["weights_digest"]
    t, p = tuned["tuning"], plain["tuning"]
    assert t["knobs"]["fusion_threshold_bytes"] == 128 * 1024 and t["knobs"]["cycle_time_ms"] == 2.0
    assert t["defaults"]["fusion_threshold_bytes"] == 128 * 1024 * 1024 and t["defaults"]["cycle_time_ms"] == 1.0
    assert t["variant"] == "fusion 0.125 MiB, cycle 2 ms"
    assert t["env"]["HOROVOD_FUSION_THRESHOLD"] == "131072" and t["env"]["HOROVOD_CYCLE_TIME"] == "2.0"
    assert p["variant"] is None and p["knobs"] == p["defaults"] and "HOROVOD_FUSION_THRESHOLD" not in p["env"]
    assert tuned["collective"]["used"] == plain["collective"]["used"] == "mpi"  # mpirun (the tests' launcher), CPU
    assert tuned["step_losses"][-1] < tuned["step_losses"][0]  # it trained
