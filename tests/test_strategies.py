"""The native strategies beyond MWMS: central_storage (the same math as mirrored) and parameter_server
(asynchronous: chief + workers + parameter servers; roles, bad combinations, its loop, no process left behind)."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from backends import native_cluster
from backends.native_ps import _Syncs
from common.cluster import localcluster
from common.core.errors import UsageError
from common.core.results import RunRecord
from common.report.load import load_runs
from common.report.render import format_section
from common.report.summary import row_label, summarize
from tests.conftest import PY, REPO, SMOKE, base_env, only_result, run, signal_env

PS_TF_CONFIG = ('{"cluster": {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]}, '
                '"task": {"type": "%s", "index": %d}}')


# -- pure: no TensorFlow -------------------------------------------------------------------------------------
class _Remote:
    def fetch(self) -> float:
        return 1.0


@pytest.mark.parametrize("steps,warm,every,joins", [(12, 2, 25, [1, 2, 12]), (60, 2, 25, [1, 2, 25, 50, 60]),
                                                    (1, 0, 25, [1])])
def test_parameter_server_chief_joins_where_every_loop_syncs(steps, warm, every, joins):
    """The chief joins its workers where every loop syncs (StepHooks: after the first step, at the warm-up's end,
    every sync_every_steps, after the last), after a global step's worker steps (2 workers) are all scheduled."""
    from common.training.hostsync import StepHooks
    from common.training.reliability import Preemption
    from common.training.runconfig import RunOptions
    from tests.test_clock import FakeBackend, run_context

    backend = FakeBackend()
    opts = RunOptions(t_process_start=0.0, command=(), verbose=False)
    hooks = StepHooks(run_context(backend, opts, steps, every, warm), 0, Preemption())
    backend.hooks = hooks
    seen: list[int] = []

    class Coordinator:
        def join(self) -> None:
            seen.append(hooks.dispatched)

    syncs = _Syncs(Coordinator(), hooks, 2, float, None)
    hooks.start_clock()
    scheduled = 0
    while not syncs.add(_Remote()):
        scheduled += 1
    assert seen == joins
    assert scheduled + 1 == 2 * steps and hooks.losses == [1.0] * steps


def _slurm_env(monkeypatch: pytest.MonkeyPatch, procid: int) -> None:
    for k in [k for k in os.environ if k.startswith("SLURM")] + ["TF_CONFIG"]:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "4")
    monkeypatch.setenv("SLURM_STEP_NODELIST", "n[1-2]")
    monkeypatch.setenv("SLURM_STEP_TASKS_PER_NODE", "2(x2)")
    monkeypatch.setenv("SLURM_PROCID", str(procid))
    monkeypatch.setenv("SLURM_LOCALID", str(procid % 2))


def test_slurm_roles_come_from_the_task_index(monkeypatch):
    """srun -n 4 ... --ps 1 over 2 nodes (block): task 0 chief, task 1 the ps, tasks 2-3 the workers."""
    base = localcluster.free_ports(1)[0]  # check_slurm_env binds base + SLURM_LOCALID on this host
    roles = []
    for procid in range(4):
        _slurm_env(monkeypatch, procid)
        role = native_cluster.ps_role(1, base)
        roles.append((role.task_type, role.task_index))
    assert roles == [("chief", 0), ("ps", 0), ("worker", 0), ("worker", 1)]
    assert role.cluster == {"chief": [f"n1:{base}"], "ps": [f"n1:{base + 1}"],
                            "worker": [f"n2:{base}", f"n2:{base + 1}"]}
    assert role.source == "slurm"
    with pytest.raises(UsageError, match="leaves no worker"):
        native_cluster.ps_role(3, base)


@pytest.mark.parametrize("cluster, task, fragment", [
    ('{"chief": ["h:1"], "worker": ["h:2"], "ps": ["h:3"]}', '"worker", "index": 0', None),
    ('{"chief": ["h:1"], "ps": ["h:3"]}', '"chief", "index": 0', "no worker"),
    ('{"chief": ["h:1"], "worker": ["h:2"]}', '"chief", "index": 0', "at least one ps"),
    ('{"chief": ["h:1", "h:4"], "worker": ["h:2"], "ps": ["h:3"]}', '"chief", "index": 0', "exactly one chief"),
    ('{"chief": ["h:1"], "worker": ["h:2"], "ps": ["h:3"]}', '"worker", "index": 1', "not in the cluster"),
    ('{"chief": ["h:1"], "worker": ["h:2"], "ps": ["h:3"], "evaluator": ["h:5"]}', '"chief", "index": 0',
     "evaluator"),
])
def test_tf_config_roles(monkeypatch, cluster, task, fragment):
    monkeypatch.setenv("TF_CONFIG", f'{{"cluster": {cluster}, "task": {{"type": {task}}}}}')
    if fragment is None:
        role = native_cluster.ps_role(0, 12345)
        assert (role.task_type, role.task_index, role.chief, role.source) == ("worker", 0, "h:1", "tf_config")
        return
    with pytest.raises(UsageError, match=fragment):
        native_cluster.ps_role(0, 12345)


def _slurm_two_tasks() -> dict[str, str]:
    return {"SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
            "SLURM_STEP_NODELIST": "localhost", "SLURM_STEP_TASKS_PER_NODE": "2"}


BAD = {  # name: (arguments, extra environment, what the one line must say)
    "no-ps": (["--strategy", "parameter_server"], {}, "needs parameter servers"),
    "no-ps-with-workers": (["--strategy", "parameter_server", "--nproc", "2"], {}, "needs parameter servers"),
    "ps-without-strategy": (["--ps", "1"], {}, "needs --strategy parameter_server"),
    "negative-ps": (["--strategy", "parameter_server", "--ps", "-1"], {}, "--ps must be >= 0"),
    "ps-without-workers-tf-config": (["--strategy", "parameter_server"], {
        "TF_CONFIG": '{"cluster": {"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]}, '
                     '"task": {"type": "chief", "index": 0}}'}, "no worker"),
    "ps-without-workers-srun": (["--strategy", "parameter_server", "--ps", "1", "--port-base", "0"],
                                _slurm_two_tasks(), "leaves no worker"),
    "ps-with-tf-config": (["--strategy", "parameter_server", "--ps", "1"], {"TF_CONFIG": PS_TF_CONFIG % ("chief", 0)},
                          "unset TF_CONFIG"),
    "ps-tf-config-under-mwms": ([], {"TF_CONFIG": PS_TF_CONFIG % ("worker", 0)}, "--strategy parameter_server"),
    "ps-warmup": (["--strategy", "parameter_server", "--ps", "1", "--set", "warmup_epochs=1"], {}, "warmup_epochs"),
    "ps-bench": (["--strategy", "parameter_server", "--ps", "1", "--bench", "allreduce"], {}, "--bench allreduce"),
    "central-storage-nproc": (["--strategy", "central_storage", "--nproc", "2"], {}, "cannot be combined"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_combinations_are_one_line_status_2_before_tensorflow(case, tmp_path):
    args, extra, fragment = BAD[case]
    env = base_env()
    env.update(extra)
    if "--port-base" in args:  # a free port for the srun checks, so the error is the one under test
        args = [*args[:-1], str(localcluster.free_ports(1)[0])]
    code = ("import sys, runpy; sys.argv = ['x'] + sys.argv[1:]\nrc = 0\ntry:\n"
            "    runpy.run_module('backends.native', run_name='__main__')\nexcept SystemExit as e:\n    rc = e.code\n"
            "assert 'tensorflow' not in sys.modules, 'TensorFlow imported before the check'\nsys.exit(rc)")
    proc = subprocess.run([PY, "-c", code, *args, "--results", str(tmp_path / "r")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert fragment in lines[0] and lines[0].startswith("backends.native: error: ")


def test_launcher_kills_a_server_that_outlives_the_chief():
    """The safety net behind the servers' own exit: nothing outlives the chief by more than ``linger``."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}  # supervise forwards these
    procs = [subprocess.Popen([PY, "-c", "import time; time.sleep(0.5)"]),
             subprocess.Popen([PY, "-c", "import time; time.sleep(120)"])]
    t0 = time.monotonic()
    try:
        status = localcluster.supervise(procs, "test", linger=1.0)
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
        for p in procs:
            p.kill()
    assert status == 0 and procs[1].returncode is not None and time.monotonic() - t0 < 30


def test_worker_slots_are_the_synchronous_pipelines():
    """Each parameter-server worker gets exactly what MWMS pipeline ``index`` gets (1 and 2 replicas per worker)."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf

    from backends.native import worker_slots
    from common.workload.data import make_train_dataset
    from common.workload.job import load_job

    job = load_job(SMOKE, [])

    def batches(ds: tf.data.Dataset) -> list[bytes]:
        return [x.numpy().tobytes() + y.numpy().tobytes() for x, y in ds.take(5)]

    for workers, per in ((2, 1), (2, 2)):
        gb = job.per_replica_batch_size * workers * per
        for index in range(workers):
            tf.keras.utils.set_random_seed(job.seed)
            mine = batches(worker_slots(make_train_dataset(job, gb, 0, 1, workers * per), workers, per,
                                        tf.constant(index, tf.int64)))
            tf.keras.utils.set_random_seed(job.seed)
            assert mine == batches(make_train_dataset(job, gb, index, workers, per)), (workers, per, index)


def test_report_labels_asynchronous_runs_and_keeps_them_out_of_the_ratio():
    from tests.test_report import make_run

    ps_info = {"strategy": "parameter_server", "asynchronous": True}
    runs = [make_run("native", 1, 100.0), make_run("native", 2, 180.0), make_run("horovod", 2, 190.0),
            make_run("native", 1, 50.0, backend_info=ps_info), make_run("native", 2, 80.0, backend_info=ps_info)]
    [s] = summarize(runs)
    label = "native (parameter_server, asynchronous)"
    ps2 = next(r for r in s.rows if r.identity.label == label and r.identity.world_size == 2)
    nat2 = next(r for r in s.rows if r.identity.label == "native" and r.identity.world_size == 2)
    assert nat2.throughput.repeats == 1 and nat2.scaling.ratio == pytest.approx(190 / 180)  # PS: not a repeat
    assert ps2.scaling.ratio is None and ps2.scaling.speedup == pytest.approx(80 / 50)  # against its own 1-worker
    assert [q.world_size for q in s.ratios if q.ratio is not None] == [2]
    assert any(n.startswith(label) and "no parity claim" in n for n in s.notes)
    assert f"| {label} | 2 | 2x1 | 2 |" in format_section(s)


def test_report_never_merges_strategies_and_reads_the_asynchronous_field(tmp_path):
    """Native runs of different strategies at the same world size: one row each, labelled by the --strategy name;
    only the default (mwms) row pairs with horovod. ``asynchronous`` is read from the record's own field, and an
    older file that said so only in backend_info is still labelled asynchronous."""
    from tests.test_report import make_run, put

    classes = {"mirrored": "MirroredStrategy", "central_storage": "CentralStorageStrategy",
               "one_device": "OneDeviceStrategy"}
    # what --strategy mwms records (the class behind tf.distribute.MultiWorkerMirroredStrategy), in two repeats
    runs = [make_run("native", 2, 100.0, backend_info={"strategy": "CollectiveAllReduceStrategy"}, run_id="m1"),
            make_run("native", 2, 100.0, backend_info={"strategy": "MultiWorkerMirroredStrategy"}, run_id="m2"),
            make_run("horovod", 2, 120.0)]
    runs += [make_run("native", 2, 90.0 + i, backend_info={"strategy": c}, run_id=f"r{i}")
             for i, c in enumerate(classes.values())]
    # new field only (backend_info without the key): still asynchronous
    runs.append(make_run("native", 2, 50.0, backend_info={"strategy": "parameter_server"}, asynchronous=True,
                         run_id="ps"))
    [s] = summarize(runs)
    labels = {r.identity.label: r for r in s.rows}
    assert set(labels) == {"native", "horovod", "native (parameter_server, asynchronous)",
                           *(f"native ({k})" for k in classes)}
    assert labels["native"].throughput.repeats == 2
    assert all(r.throughput.repeats == 1 for r in s.rows if r.identity.label != "native")
    assert labels["native"].throughput.median == 100.0 and labels["native"].scaling.ratio == pytest.approx(1.2)
    assert all(labels[f"native ({k})"].scaling.ratio is None for k in classes)
    assert any(n.startswith("native (mirrored)") and "rows of their own" in n for n in s.notes)
    md = format_section(s)
    assert "| native (central_storage) | 2 | 2x1 | 2 |" in md and "| native (one_device) | 2 | 2x1 | 2 |" in md
    # an older file: asynchronous only in backend_info, read through load_runs
    old = make_run("native", 2, 60.0, backend_info={"strategy": "parameter_server", "asynchronous": True})
    put(tmp_path, old)
    [loaded] = load_runs(tmp_path)
    assert loaded.record.asynchronous is True
    assert summarize([loaded])[0].rows[0].identity.label == "native (parameter_server, asynchronous)"
    # a synchronous run is never labelled asynchronous, whatever its strategy
    assert summarize([make_run("native", 1, 9.0, asynchronous=False)])[0].rows[0].identity.label == "native"


def test_checkpoint_dir_names_a_strategy_other_than_the_default(tmp_path):
    from backends import native
    from common.training import reliability as rel

    plain = rel.ckpt_dir(tmp_path, "native", 2, "0123456789abcdef")
    # the default strategy names no variant: checkpoints written before variants existed still resume
    from tests.test_comm import set_up

    default = set_up(native.NativeBackend(native.Options())).capabilities().variant
    assert default is None and rel.ckpt_dir(tmp_path, "native", 2, "0123456789abcdef", default) == plain
    mirrored = set_up(native.NativeBackend(native.Options(strategy="mirrored")), 2)
    assert mirrored.capabilities().variant == "mirrored"
    dirs = {rel.ckpt_dir(tmp_path, "native", 2, "0123456789abcdef", s) for s in
            ("mirrored", "central_storage", "one_device", "parameter_server")}
    assert len(dirs) == 4 and plain not in dirs
    assert rel.ckpt_dir(tmp_path, "native", 2, "0123456789abcdef", "mirrored").name.endswith("-mirrored")


def test_a_run_of_another_strategy_never_resumes_its_checkpoint(tmp_path):
    """one_device preempted at step 2 leaves its checkpoint; the default strategy's run of the same job and world
    size in the same results dir starts from step 0 (and leaves that checkpoint alone); one_device then resumes.
    Also one_device's baseline (formerly tests/test_backends.py::test_one_device_baseline): OneDeviceStrategy at
    world size 1, and it trains."""
    base = [PY, "-m", "backends.native", "--job", SMOKE, "--set", "mode=ctl", "--results", str(tmp_path), "--quiet"]
    first = run([*base, "--strategy", "one_device", "--preempt-check-steps", "1"], check=False, env=signal_env(2))
    assert first.returncode == 75, first.stderr[-3000:]
    [ckpt] = (tmp_path / "checkpoints").iterdir()
    assert ckpt.name.endswith("-one_device")
    run(base)
    default = only_result(tmp_path)
    assert default["resumed_from_step"] == 0 and ckpt.exists()
    for f in tmp_path.glob("*.json"):
        f.unlink()
    run([*base, "--strategy", "one_device"])
    resumed = only_result(tmp_path)
    assert resumed["resumed_from_step"] > 0 and len(resumed["step_losses"]) == resumed["steps"]
    assert not ckpt.exists()  # deleted once its run completed
    assert resumed["backend_info"]["strategy"] == "OneDeviceStrategy" and resumed["world_size"] == 1
    assert resumed["step_losses"][-1] < resumed["step_losses"][0]


# -- central_storage: one process, variables on the CPU, compute on every local device -------------------------
@pytest.mark.parametrize("mode", ["fit", "ctl"])
def test_central_storage_computes_what_mirrored_computes(runner, mode):
    """Two logical CPUs: the same per-step losses and final weights as mirrored on the same devices (bit for bit:
    both sum the two replicas' gradients, one on the variables' device, one per copy)."""
    extra = ("--logical-cpus", "2", "--set", f"mode={mode}")
    cs = runner("native", "--strategy", "central_storage", *extra, workers=1)
    mir = runner("native", "--strategy", "mirrored", *extra, workers=1)
    assert cs["backend_info"]["strategy"] == "CentralStorageStrategy"
    assert cs["backend_info"]["variables_on"] == "/cpu:0"
    assert cs["world_size"] == mir["world_size"] == 2 and cs["num_workers"] == 1
    assert cs["step_losses"] == mir["step_losses"]
    assert cs["weights_digest"] == mir["weights_digest"]
    assert cs["step_losses"][-1] < cs["step_losses"][0]  # it trained: equal frozen losses would prove nothing
    read = RunRecord.from_dict
    assert (row_label(read(cs)), row_label(read(mir))) == ("native (central_storage)", "native (mirrored)")


# -- parameter_server: chief + workers + ps on loopback --------------------------------------------------------
def _processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes (other than this one) that contain ``text``."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            found.append(f"{d.name}: {cmd}")
    return found


@pytest.fixture(scope="module")
def ps_run(tmp_path_factory: pytest.TempPathFactory):
    """``--strategy parameter_server --ps 1 --nproc W`` once per (W, mode): (record, launcher process, results)."""
    cache: dict[tuple[int, str], tuple[dict, subprocess.CompletedProcess[str], Path]] = {}

    def go(workers: int, mode: str) -> tuple[dict, subprocess.CompletedProcess[str], Path]:
        if (workers, mode) not in cache:
            out = tmp_path_factory.mktemp(f"ps{workers}{mode}")
            proc = run([PY, "-m", "backends.native", "--strategy", "parameter_server", "--ps", "1", "--nproc",
                        str(workers), "--job", SMOKE, "--set", f"mode={mode}", "--results", str(out), "--quiet"])
            cache[(workers, mode)] = (only_result(out), proc, out)
        return cache[(workers, mode)]

    return go


@pytest.mark.distributed
@pytest.mark.parametrize("mode", ["fit", "ctl"])
def test_parameter_server_one_ps_two_workers(ps_run, runner, mode):
    rec, proc, out = ps_run(2, mode)
    info = rec["backend_info"]
    assert info["strategy"] == "parameter_server" and info["asynchronous"] is True
    assert (info["num_ps"], info["num_workers"], info["worker_steps_per_step"]) == (1, 2, 2)
    assert rec["world_size"] == rec["num_workers"] == 2 and rec["global_batch_size"] == 32
    losses = rec["step_losses"]
    assert len(losses) == rec["steps"] == 12 and all(math.isfinite(v) for v in losses)
    # Asynchronous: no trajectory to match, nor a falling loss to expect on so few steps (stale updates at this
    # learning rate make it jump for a while, in both modes); but the variables on the ps were trained.
    assert rec["weights_digest"] != rec["initial_weights_digest"]
    # the same model from the same start as the synchronous runs of this job
    assert rec["initial_weights_digest"] == runner("native", "--strategy", "mirrored", "--logical-cpus", "2",
                                                   "--set", f"mode={mode}", workers=1)["initial_weights_digest"]
    # the servers exited by themselves once the chief had (the launcher killed nothing), and none is left
    assert "killing it" not in proc.stderr and "stopping the others" not in proc.stderr, proc.stderr[-2000:]
    assert _processes_mentioning(str(out)) == []


PS_PREEMPT_MODE = "ctl"  # the mode whose one-worker run is the preempted and resumed one (ps_preempted)


@pytest.fixture(scope="module")
def ps_preempted(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """``--strategy parameter_server --ps 1`` with one worker in PS_PREEMPT_MODE, its chief sent SIGTERM after step
    2, then the same command again, which resumes: {"first": the first run, "checkpoints": what it left,
    "left_behind": its processes still alive after it, "resumed": the resumed run's record}. Host syncs every 5
    steps: the chief checks for a preemption there (steps 1, 2, 5, 10, 12; never between 2 and 12 at the default)."""
    out = tmp_path_factory.mktemp("ps-preempted")
    cmd = [PY, "-m", "backends.native", "--strategy", "parameter_server", "--ps", "1", "--job", SMOKE, "--set",
           f"mode={PS_PREEMPT_MODE}", "--set", "sync_every_steps=5", "--results", str(out), "--quiet"]
    first = run(cmd, check=False, env=signal_env(2))
    checkpoints = sorted(p.name for p in (out / "checkpoints").iterdir()) if (out / "checkpoints").is_dir() else []
    left_behind = _processes_mentioning(str(out))
    if first.returncode == 75:
        run(cmd)
    return {"first": first, "checkpoints": checkpoints, "left_behind": left_behind,
            "resumed": only_result(out) if first.returncode == 75 else None}


@pytest.mark.distributed
@pytest.mark.parametrize("mode", ["fit", "ctl"])
def test_parameter_server_with_one_worker_is_the_synchronous_run(ps_run, ps_preempted, runner, mode):
    """One worker steps in sequence: the loop must then compute exactly the 1-worker synchronous job (a check of
    its math and its data, not a parity claim about asynchronous training). In PS_PREEMPT_MODE the run is the
    preempted and resumed one (ps_preempted): its steps before the preemption and after the resume all equal the
    synchronous run's, which is the loop's math and the resume's at once (one run instead of two)."""
    if mode == PS_PREEMPT_MODE:
        rec = ps_preempted["resumed"]
        assert rec is not None, ps_preempted["first"].stderr[-3000:]
    else:
        rec, _, _ = ps_run(1, mode)
    sync = runner("native", "--set", f"mode={mode}", workers=1)
    assert rec["backend_info"]["num_workers"] == 1 and rec["world_size"] == sync["world_size"] == 1
    assert rec["step_losses"] == sync["step_losses"]
    assert rec["weights_digest"] == sync["weights_digest"]
    read = RunRecord.from_dict
    assert (row_label(read(sync)), row_label(read(rec))) == ("native", "native (parameter_server, asynchronous)")
    assert rec["asynchronous"] is True and sync["asynchronous"] is False
    assert rec["input"]["method"] is None and "parameter-server" in rec["input"]["reason"]


@pytest.mark.distributed
def test_parameter_server_preempted_chief_checkpoints_and_resumes(ps_preempted, runner):
    """SIGTERM: the chief checkpoints (reading the variables from the ps) and exits 75, its servers follow it out;
    the same command resumes. With one worker the resumed run must end as the uninterrupted one: the uninterrupted
    synchronous run, which a one-worker parameter-server run equals (the test above, fit's run uninterrupted)."""
    first = ps_preempted["first"]
    assert first.returncode == 75, first.stderr[-3000:]
    assert ps_preempted["checkpoints"] and ps_preempted["left_behind"] == []
    rec = ps_preempted["resumed"]
    whole = runner("native", "--set", f"mode={PS_PREEMPT_MODE}", workers=1)
    assert 0 < rec["resumed_from_step"] < rec["steps"]
    assert rec["step_losses"] == whole["step_losses"] and rec["weights_digest"] == whole["weights_digest"]


def test_free_ports_are_drawn_below_the_ephemeral_range(tmp_path, monkeypatch):
    """The native launcher's ports come from below the kernel's ephemeral range, where no outgoing connection of
    another process can take them between the probe and the workers' bind; a port in use is never handed out."""
    import socket

    first = int(localcluster.EPHEMERAL_RANGE.read_text().split()[0])
    band = localcluster.port_band()
    assert band == ((localcluster.BAND_START, first) if first - localcluster.BAND_START >= 1000 else None)
    if band:
        ports = localcluster.free_ports(8)
        assert len(set(ports)) == 8 and all(band[0] <= p < band[1] for p in ports), ports
    # a band of two ports, one of them held: the other one every time
    low = next(p for p in range(localcluster.BAND_START, localcluster.BAND_START + 500, 2) if _bindable(p))
    fake = tmp_path / "ip_local_port_range"
    fake.write_text(f"{low + 2}\t60999\n")
    monkeypatch.setattr(localcluster, "EPHEMERAL_RANGE", fake)
    monkeypatch.setattr(localcluster, "BAND_START", low)
    monkeypatch.setattr(localcluster, "MIN_BAND", 2)
    assert localcluster.port_band() == (low, low + 2)
    held = socket.socket()
    held.bind((localcluster.LOOPBACK, low))
    try:
        assert {localcluster.free_ports(1)[0] for _ in range(20)} == {low + 1}
    finally:
        held.close()
    monkeypatch.setattr(localcluster, "MIN_BAND", 3)  # too small a band: the kernel chooses (port 0)
    assert localcluster.port_band() is None and min(localcluster.free_ports(2)) >= first


def _bindable(port: int) -> bool:
    """Both ``port`` and ``port + 1`` can be bound on loopback right now."""
    import socket

    socks = []
    try:
        for p in (port, port + 1):
            s = socket.socket()
            socks.append(s)
            s.bind((localcluster.LOOPBACK, p))
        return True
    except OSError:
        return False
    finally:
        for s in socks:
            s.close()
