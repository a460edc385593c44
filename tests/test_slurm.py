"""Both backends under a real single-node Slurm (tests/slurm/start_cluster.sh): srun, sbatch, mpirun in an
allocation, per-task GPU binding, the sweep, and the same losses as ever.

The cluster is Debian's slurm-wlm 22.05 with munge, started once per session in a temporary directory and
stopped at the end; the node advertises 8 CPUs and 8 fake GPUs (character devices), so Slurm sets
CUDA_VISIBLE_DEVICES per task although TensorFlow sees no GPU. Runs are serial (2 cores) and cached for the
session. Without slurm-wlm and munge installed (``TWINBENCH_WITH_SLURM=1 make setup``) or without root,
these tests are skipped with the reason.
"""

from __future__ import annotations

import ast
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from common.report.load import load_runs
from tests.aids.refusals import batch
from tests.aids.signal_aid import ENV
from tests.conftest import BIN, JOB_TIMEOUT, PY, REPO, SMOKE, base_env, first_divergence, only_result, run

RTOL = 1e-5
IMMEDIATE = "--immediate=120"  # srun/salloc: fail instead of queueing forever when the node is busy
distributed = pytest.mark.distributed


def backend(kind: str, results: Path, *extra: str) -> list[str]:
    return [PY, "-m", f"backends.{kind}", "--job", SMOKE, "--results", str(results), "--quiet", *extra]


# -- the session's runs (each once) --------------------------------------------------------------------------------
def _srun_two_tasks(cluster, tmp_path_factory, name: str, srun_extra: list[str], kind: str,
                    *extra: str) -> dict[str, Any]:
    """srun -n 2, one GPU per task (--gres=gpu:2 --gpus-per-task=1), run once per session; its results record."""
    def make():
        out = tmp_path_factory.mktemp(name)
        cluster.run(["srun", IMMEDIATE, "--kill-on-bad-exit=1", *srun_extra, "-n", "2", "--gres=gpu:2",
                     "--gpus-per-task=1", *backend(kind, out, *extra)])
        return only_result(out)
    return cluster.once(name, make)


@pytest.fixture(scope="session")
def srun_native(cluster, tmp_path_factory):
    return _srun_two_tasks(cluster, tmp_path_factory, "srun_native", [], "native", "--port-base", "12600")


@pytest.fixture(scope="session")
def srun_horovod(cluster, tmp_path_factory):
    return _srun_two_tasks(cluster, tmp_path_factory, "srun_horovod", ["--mpi=pmix"], "horovod")


@pytest.fixture(scope="session")
def sweep(cluster, tmp_path_factory):
    """python -m common.sweep submit at world sizes 1 and 2, both backends, one job at a time; then status."""
    def make():
        out = tmp_path_factory.mktemp("sweep")
        submitted = cluster.run([PY, "-m", "common.sweep", "submit", "--job", SMOKE, "--sizes", "1,2",
                                 "--backends", "native,horovod", "--results", str(out), "--gres-per-node", "2",
                                 "--cpus-per-task", "2", "--time", "00:10:00", "--serial"])
        early = subprocess.run([PY, "-m", "common.sweep", "status", str(out), "--json"], cwd=REPO,
                               env=cluster.env(), capture_output=True, text=True, timeout=60)
        final = subprocess.run([PY, "-m", "common.sweep", "status", str(out), "--wait", str(JOB_TIMEOUT * 2),
                                "--poll", "1"], cwd=REPO, env=cluster.env(), capture_output=True, text=True,
                               timeout=JOB_TIMEOUT * 2 + 60)
        return {"dir": out, "submit": submitted, "early": early, "final": final,
                "manifest": json.loads((out / "sweep-manifest.json").read_text())}
    return cluster.once("sweep", make)


def sweep_result(sw: dict[str, Any], backend_name: str, size: int) -> dict[str, Any]:
    return only_result(sw["dir"] / f"{backend_name}-n{size}")


# -- the cluster itself -----------------------------------------------------------------------------------------------
@distributed
def test_cluster_is_up_with_gpus(cluster):
    proc = cluster.run(["sinfo", "-h", "-N", "-o", "%N %T %c %G"])
    node, state, cpus, gres = proc.stdout.split()[:4]
    assert node == cluster.node and state == "idle" and cpus == "8" and gres.startswith("gpu:8"), proc.stdout
    # Slurm binds GPUs per task (what the backends rely on), although there is no GPU behind them.
    proc = cluster.run(["srun", IMMEDIATE, "-n", "2", "--gres=gpu:2", "--gpus-per-task=1", "--label",
                        "printenv", "CUDA_VISIBLE_DEVICES"])
    assert sorted(ln.replace(" ", "") for ln in proc.stdout.splitlines()) == ["0:0", "1:1"], proc.stdout


@distributed
def test_impossible_request_fails_instead_of_waiting(cluster):
    t0 = time.monotonic()
    proc = subprocess.run(["srun", "--immediate=2", "-n", "64", "true"], env=cluster.env(), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0 and time.monotonic() - t0 < 30, proc.stderr


# -- srun -------------------------------------------------------------------------------------------------------------
@distributed
def test_srun_native_two_tasks(cluster, srun_native):
    r = srun_native
    assert r["backend"] == "native" and r["world_size"] == 2 and r["num_workers"] == 2
    info = r["backend_info"]
    assert info["cluster_source"] == "slurm", "the cluster must come from SlurmClusterResolver under srun"
    assert len(info["cluster"]["workers"]) == 2
    assert all(w.startswith(f"{cluster.node}:") for w in info["cluster"]["workers"])
    assert r["hosts"] == [cluster.node] * 2
    assert r["weights_consistent"] and r["step_losses"][-1] < r["step_losses"][0]
    slurm = r["machine"]["shared"]["slurm"]  # the machine block names the Slurm job the run was
    assert slurm["job_id"].isdigit() and slurm["ntasks"] == 2 and slurm["num_nodes"] == 1, slurm
    assert slurm["nodelist"] == cluster.node


@distributed
def test_srun_native_cyclic_distribution(cluster, tmp_path):
    """Slurm's real SLURM_DISTRIBUTION value is understood (one node: cyclic places tasks as block does)."""
    cmd = ["srun", IMMEDIATE, "--kill-on-bad-exit=1", "-n", "2", "--distribution=cyclic"]
    dist = cluster.run([*cmd, "printenv", "SLURM_DISTRIBUTION"]).stdout.split()
    assert dist and all(d.startswith("cyclic") for d in dist), dist
    cluster.run([*cmd, *backend("native", tmp_path, "--port-base", "12700")])
    r = only_result(tmp_path)
    assert r["world_size"] == 2 and r["backend_info"]["cluster_source"] == "slurm"


@distributed
def test_srun_horovod_pmix_two_tasks(cluster, srun_horovod):
    r = srun_horovod
    assert r["backend"] == "horovod" and r["world_size"] == 2 and r["num_workers"] == 2
    assert r["backend_info"]["controller"] == "mpi", "srun --mpi=pmix starts Horovod's MPI controller"
    assert r["hosts"] == [cluster.node] * 2
    assert r["weights_consistent"]


@distributed
@pytest.mark.parametrize("which", ["srun_native", "srun_horovod"])
def test_one_gpu_per_task_each_rank_records_its_own(which, request):
    """--gres=gpu:2 --gpus-per-task=1: Slurm gives rank i GPU i; the results name it per rank."""
    devices = request.getfixturevalue(which)["devices"]
    assert len(devices) == 2 and devices[0] != devices[1], devices
    assert devices == ["cpu (CUDA_VISIBLE_DEVICES=0)", "cpu (CUDA_VISIBLE_DEVICES=1)"], devices


@distributed
def test_srun_native_and_horovod_same_losses(srun_native, srun_horovod):
    assert srun_native["job_hash"] == srun_horovod["job_hash"]
    assert srun_native["initial_weights_digest"] == srun_horovod["initial_weights_digest"]
    msg = first_divergence(srun_native["step_losses"], srun_horovod["step_losses"], RTOL)
    assert msg is None, f"srun native vs srun --mpi=pmix horovod: {msg}"


def _stream_job_args(tmp_path: Path) -> list[str]:
    """examples/stream_job.toml's TFRecord files written into ``tmp_path``, and the flags that point the job at them."""
    data = tmp_path / "stream-data"
    run([PY, str(REPO / "examples" / "streampkg" / "records.py"), str(data)])
    return ["--set", f"dataset_args={json.dumps({'data_dir': str(data)})}", "--set", "steps=12"]


@distributed
@pytest.mark.parametrize("example", ["stream_job", "keras3_job"])
def test_srun_runs_the_users_own_job_on_both_backends(cluster, tmp_path, example):
    """A user package found through the job's pythonpath, nothing exported, under srun -n 2 (native:
    SlurmClusterResolver; Horovod: --mpi=pmix), and for the streamed one also horovodrun inside salloc, gives the
    same losses and validation numbers: examples/stream_job.toml (an input function streaming each worker's own
    TFRecord files) and examples/keras3_job.toml (mypkg's arrays, a Keras 3 model, the user's AdamW and cosine
    schedule, the custom loop). examples/my_job.toml would add nothing (its code loads by the same pythonpath; its
    loss: tests/test_usercode_parity.py), nor Keras 3 under horovodrun (tests/test_keras3.py). The streamed example's
    only fit runs at 2 workers (tests/test_inputfn.py checks it in the custom loop); the Keras 3 example's only
    native = Horovod comparison (tests/test_keras3.py checks it on native)."""
    extra = {"stream_job": _stream_job_args, "keras3_job": lambda _: ["--set", "steps=16"]}[example](tmp_path)
    got = {}
    # (srun's own flags, the backend's flags): native takes its ports from --port-base, Horovod its PMIx from srun
    for kind, srun_flags, flags in (("native", [], ["--port-base", "12800"]), ("horovod", ["--mpi=pmix"], [])):
        out = tmp_path / kind
        cmd = [PY, "-m", f"backends.{kind}", "--job", str(REPO / "examples" / f"{example}.toml"), "--results",
               str(out), "--quiet", *flags, *extra]
        cluster.run(["srun", IMMEDIATE, "--kill-on-bad-exit=1", *srun_flags, "-n", "2", *cmd])
        got[kind] = only_result(out)
    if example == "stream_job":  # each rank's own files under a third launcher: horovodrun in an allocation
        out = tmp_path / "horovodrun"
        cluster.run(["salloc", IMMEDIATE, "-n", "2", str(BIN / "horovodrun"), "-np", "2", "-H", f"{cluster.node}:2",
                     PY, "-m", "backends.horovod", "--job", str(REPO / "examples" / f"{example}.toml"), "--results",
                     str(out), "--quiet", *extra])
        got["horovodrun"] = only_result(out)
    nat = got["native"]
    assert nat["job"]["code_digest"] and len({r["job_hash"] for r in got.values()}) == 1
    for name, other in got.items():
        msg = first_divergence(nat["step_losses"], other["step_losses"], RTOL)
        assert msg is None, f"srun native vs {name} on {example}: {msg}"
    accuracy = [[e["accuracy"] for e in r["evaluations"]] for r in got.values()]
    assert accuracy[0] and all(a == pytest.approx(accuracy[0]) for a in accuracy), accuracy
    if example == "stream_job":  # each worker read its own files, the same ones on both backends and launchers
        fps = [[p["fingerprint"] for p in r["input"]["pipeline"]["per_rank"]] for r in got.values()]
        assert all(f == fps[0] for f in fps) and len(set(fps[0])) == 2, fps


@distributed
def test_srun_runs_a_horovod_scripts_mwms_port(cluster, tmp_path):
    """A port's <stem>_mwms.py (common.port_mwms) as `srun -n 2 python FILE`: its strategy from
    SlurmClusterResolver (no TF_CONFIG here), so the two tasks are one cluster of 2 replicas, printed by the chief
    alone. keras_benchmark: no checkpoint to write, its own small defaults. Its only 2-worker run in the suite
    (tests/test_port_mwms.py runs the ports that write a checkpoint)."""
    from common.port_mwms import write_mwms

    script = REPO / "tests" / "fixtures" / "horovod" / "keras_benchmark.py"
    source = script.read_text()
    write_mwms(source, ast.parse(source), script, tmp_path)
    proc = cluster.run(["srun", IMMEDIATE, "--kill-on-bad-exit=1", f"--chdir={tmp_path}", "-n", "2", PY,
                        str(tmp_path / "keras_benchmark_mwms.py")])
    assert proc.stdout.count("Number of workers: 2") == 1 and "Number of workers: 1" not in proc.stdout, proc.stdout


# -- sbatch scripts ----------------------------------------------------------------------------------------------------
def test_sbatch_scripts_differ_only_in_the_launch():
    """Identical resources and environment: everything before the launch section is the same text."""
    nat = (REPO / "jobs" / "slurm" / "native.sbatch").read_text().split("# -- launch")
    hvd = (REPO / "jobs" / "slurm" / "horovod.sbatch").read_text().split("# -- launch")
    assert len(nat) == len(hvd) == 2
    assert nat[0] == hvd[0]
    hint = '${TB_SRUN_HINT[@]+"${TB_SRUN_HINT[@]}"}'
    # one container per task (TWINBENCH_CONTAINER: srun's own options, then the runtime's prefix), else none
    container = '${TB_CT_SRUN[@]+"${TB_CT_SRUN[@]}"} \\\n  ${TB_CT_PREFIX[@]+"${TB_CT_PREFIX[@]}"} "$TB_PY"'
    assert f'tb_run srun {hint} {container} -m backends.native --port-base' in nat[1]
    assert f'tb_run srun --mpi="$TWINBENCH_SRUN_MPI" {hint} {container.replace("  ", "    ")} -m backends.horovod' \
        in hvd[1]
    assert 'horovodrun -np "$SLURM_NTASKS" -H "$(tb_hvd_hosts)"' in hvd[1]
    for script in ("native.sbatch", "horovod.sbatch", "env.sh"):
        subprocess.run(["bash", "-n", str(REPO / "jobs" / "slurm" / script)], check=True)


@distributed
def test_sbatch_native_script(cluster, tmp_path_factory):
    """native.sbatch with the 2-GPU preset and Slurm's per-task binding, submitted and polled."""
    def make():
        out = tmp_path_factory.mktemp("sbatch_native")
        info = cluster.sbatch(["--ntasks-per-node=2", "--gres=gpu:2", "--gpus-per-task=1", "--cpus-per-task=2",
                               str(REPO / "jobs" / "slurm" / "native.sbatch"), SMOKE, str(out / "res"), "--quiet"],
                              out / "job.out", TWINBENCH_REPO=str(REPO))
        return info, out
    info, out = cluster.once("sbatch_native", make)
    assert info["JobState"] == "COMPLETED", info["log"][-3000:]
    assert "[twinbench] knobs:" in info["log"] and "SLURM_KILL_BAD_EXIT=1" in info["log"]
    port = 12000 + int(info["JobId"]) % 250 * 32
    assert f"launch: srun --hint=nomultithread python -m backends.native --port-base {port}" in info["log"]
    r = only_result(out / "res")
    assert r["backend"] == "native" and r["world_size"] == 2
    assert r["devices"] == ["cpu (CUDA_VISIBLE_DEVICES=0)", "cpu (CUDA_VISIBLE_DEVICES=1)"]


@distributed
def test_sbatch_horovod_script_with_horovodrun(cluster, tmp_path_factory, srun_horovod):
    """horovod.sbatch with HVD_LAUNCH=horovodrun: -H from scontrol show hostnames; tasks see the job's GPUs."""
    def make():
        out = tmp_path_factory.mktemp("sbatch_horovodrun")
        info = cluster.sbatch(["--ntasks-per-node=2", "--gres=gpu:2", "--cpus-per-task=2",
                               str(REPO / "jobs" / "slurm" / "horovod.sbatch"), SMOKE, str(out / "res"), "--quiet"],
                              out / "job.out", TWINBENCH_REPO=str(REPO), HVD_LAUNCH="horovodrun")
        return info, out
    info, out = cluster.once("sbatch_horovodrun", make)
    assert info["JobState"] == "COMPLETED", info["log"][-3000:]
    assert f"launch: horovodrun -np 2 -H {cluster.node}:2 python -m backends.horovod" in info["log"]
    r = only_result(out / "res")
    assert r["backend"] == "horovod" and r["world_size"] == 2
    # No per-task binding under horovodrun: both ranks see the job's two GPUs (and would pin by local_rank).
    assert r["devices"] == ["cpu (CUDA_VISIBLE_DEVICES=0,1)"] * 2
    msg = first_divergence(r["step_losses"], srun_horovod["step_losses"], RTOL)
    assert msg is None, f"horovodrun vs srun: {msg}"


@distributed
def test_sbatch_bad_hvd_launch_fails_cleanly(cluster, tmp_path):
    info = cluster.sbatch([str(REPO / "jobs" / "slurm" / "horovod.sbatch"), SMOKE, str(tmp_path / "res")],
                          tmp_path / "job.out", TWINBENCH_REPO=str(REPO), HVD_LAUNCH="ssh")
    assert info["JobState"] == "FAILED"
    assert "HVD_LAUNCH must be srun or horovodrun" in info["log"]


@distributed
def test_sbatch_preempted_run_requeues_itself_and_resumes(cluster, tmp_path_factory, sweep):
    """SIGTERM mid-run (tests/aids/signal_aid.py): checkpoint, exit 75, the script requeues the job, the same
    command resumes and ends with the losses and weights of the uninterrupted run (the sweep's horovod-n1)."""
    def make():
        out = tmp_path_factory.mktemp("sbatch_requeue")
        info = cluster.sbatch(["--cpus-per-task=2", str(REPO / "jobs" / "slurm" / "horovod.sbatch"), SMOKE,
                               str(out / "res"), "--quiet", "--preempt-check-steps", "2"],
                              out / "job.out", TWINBENCH_REPO=str(REPO), **{ENV: "3"})
        return info, out
    info, out = cluster.once("sbatch_requeue", make)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", info["log"][-3000:]
    assert "exit status 75" in info["log"] and "requeueing job" in info["log"]
    r = only_result(out / "res")
    assert r["resumed_from_step"] > 0
    ref = sweep_result(sweep, "horovod", 1)
    assert r["weights_digest"] == ref["weights_digest"]
    msg = first_divergence(r["step_losses"], ref["step_losses"], RTOL)
    assert msg is None, f"resumed vs uninterrupted: {msg}"


# -- mpirun inside an allocation -------------------------------------------------------------------------------------
@distributed
def test_mpirun_horovod_inside_salloc(cluster, tmp_path_factory, srun_horovod):
    def make():
        out = tmp_path_factory.mktemp("salloc_mpirun")
        cluster.run(["salloc", IMMEDIATE, "-n", "2", "mpirun", "-np", "2", *backend("horovod", out)])
        return only_result(out)
    r = cluster.once("salloc_mpirun", make)
    assert r["backend"] == "horovod" and r["world_size"] == 2
    assert r["backend_info"]["controller"] == "mpi"
    msg = first_divergence(r["step_losses"], srun_horovod["step_losses"], RTOL)
    assert msg is None, f"mpirun in salloc vs srun --mpi=pmix: {msg}"


# -- the sweep -------------------------------------------------------------------------------------------------------
@distributed
def test_sweep_submits_and_finishes_both_backends(sweep):
    m = sweep["manifest"]
    assert sweep["submit"].returncode == 0
    assert [(r["backend"], r["size"]) for r in m["runs"]] == [
        ("native", 1), ("horovod", 1), ("native", 2), ("horovod", 2)]
    assert all(r["job_id"] for r in m["runs"])
    # Identical resources for the two backends of a size.
    by_size: dict[int, list[list[str]]] = {}
    for r in m["runs"]:
        by_size.setdefault(r["size"], []).append(r["resources"])
    for size, res in by_size.items():
        assert res[0] == res[1], f"size {size}: {res}"
        assert f"--ntasks-per-node={size}" in res[0] and f"--gres=gpu:{size}" in res[0]
    # Right after submission (--serial) the later jobs are still waiting for the earlier ones.
    early = json.loads(sweep["early"].stdout)
    assert sweep["early"].returncode == 3, sweep["early"].stdout
    assert {r["state"] for r in early["runs"]} <= {"pending", "running", "finished"}
    assert early["runs"][-1]["state"] == "pending"
    final = sweep["final"]
    assert final.returncode == 0, final.stdout + final.stderr
    assert "4 run(s): 4 finished" in final.stdout
    for r in m["runs"]:
        rec = sweep_result(sweep, r["backend"], r["size"])
        assert rec["backend"] == r["backend"] and rec["world_size"] == r["size"]
        assert rec["job_hash"] == m["job_hash"]


@distributed
@pytest.mark.parametrize("size", [1, 2])
def test_sweep_native_and_horovod_same_losses(sweep, size):
    nat, hvd = sweep_result(sweep, "native", size), sweep_result(sweep, "horovod", size)
    msg = first_divergence(nat["step_losses"], hvd["step_losses"], RTOL)
    assert msg is None, f"sweep n{size}: native vs horovod: {msg}"


@distributed
def test_sweep_runs_match_srun_runs_and_see_the_jobs_gpus(sweep, srun_native):
    nat2 = sweep_result(sweep, "native", 2)
    msg = first_divergence(nat2["step_losses"], srun_native["step_losses"], RTOL)
    assert msg is None, f"sbatch (sweep) vs srun native: {msg}"
    # --gres=gpu:2 without per-task binding: every task sees the job's two GPUs (and picks SLURM_LOCALID-th).
    assert nat2["devices"] == ["cpu (CUDA_VISIBLE_DEVICES=0,1)"] * 2
    assert sweep_result(sweep, "horovod", 1)["devices"] == ["cpu (CUDA_VISIBLE_DEVICES=0)"]


@distributed
def test_sweep_report_reads_the_sweep(sweep):
    proc = run([PY, "-m", "common.report", str(sweep["dir"]), "--no-plots", "--quiet"], check=False)
    assert proc.returncode == 0, proc.stderr
    runs = load_runs(sweep["dir"], warn=lambda _m: None)
    assert sorted((r.record.backend, r.record.world_size) for r in runs) == [
        ("horovod", 1), ("horovod", 2), ("native", 1), ("native", 2)]


@distributed
def test_sweep_with_variants_reports_variant_rows_and_best_vs_best(cluster, tmp_path):
    """Four variants at one task each, on identical resources, one after another: default and tuned native and
    Horovod; the report keeps the tuned runs in rows of their own and sets the fastest against the defaults."""
    out = tmp_path / "variants"
    variants = ["nat=native", "nat-packs=native:--bytes-per-pack 16384", "hvd=horovod",
                "hvd-fusion1=horovod:--fusion-threshold-mb 1"]
    cluster.run([PY, "-m", "common.sweep", "submit", "--job", SMOKE, "--sizes", "1", "--results", str(out),
                 "--gres-per-node", "1", "--cpus-per-task", "2", "--time", "00:10:00", "--serial",
                 *(x for v in variants for x in ("--variant", v))])
    manifest = json.loads((out / "sweep-manifest.json").read_text())
    assert [r["variant"] for r in manifest["runs"]] == ["nat", "nat-packs", "hvd", "hvd-fusion1"]
    assert len({tuple(r["resources"]) for r in manifest["runs"]}) == 1, "identical resources for every variant"
    final = subprocess.run([PY, "-m", "common.sweep", "status", str(out), "--wait", str(JOB_TIMEOUT * 4), "--poll",
                            "1"], cwd=REPO, env=cluster.env(), capture_output=True, text=True,
                           timeout=JOB_TIMEOUT * 4 + 60)
    assert final.returncode == 0, final.stdout + final.stderr
    packed = only_result(out / "nat-packs-n1")
    assert packed["tuning"]["knobs"]["bytes_per_pack"] == 16384 and packed["machine"]["shared"]["slurm"]["job_id"]
    proc = run([PY, "-m", "common.report", str(out), "--no-plots", "--out", str(tmp_path / "report")], check=False)
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "report" / "report.md").read_text()
    assert "| native (packs 16 KiB) | 1 |" in text and "| horovod (fusion 1 MiB) | 1 |" in text
    assert "# Best vs best" in text


@distributed
def test_sweep_status_reports_failed_runs(cluster, tmp_path):
    """A run that exits non-zero without a results JSON is 'failed' (status exit 1); no TensorFlow starts."""
    out = tmp_path / "sw"
    cluster.run([PY, "-m", "common.sweep", "submit", "--job", SMOKE, "--sizes", "1", "--results", str(out),
                 "--gres-per-node", "2", "--cpus-per-task", "1", "--serial", "--backend-arg=--threads=-1"])
    proc = subprocess.run([PY, "-m", "common.sweep", "status", str(out), "--wait", str(JOB_TIMEOUT), "--poll", "1",
                           "--json"], cwd=REPO, env=cluster.env(), capture_output=True, text=True,
                          timeout=JOB_TIMEOUT + 60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = json.loads(proc.stdout)["runs"]
    assert [r["state"] for r in rows] == ["failed", "failed"], rows
    assert all(r["slurm_state"] == "FAILED" for r in rows), rows
    for r in rows:
        assert "--threads must be >= 0" in Path(r["log"]).read_text()


# -- the sweep without Slurm: planning and bad input ----------------------------------------------------------------
def _sweep(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "common.sweep", *args], cwd=REPO, env=env or base_env(), capture_output=True,
                          text=True, timeout=60)


def test_sweep_dry_run_plans_identical_resources(tmp_path):
    out = tmp_path / "sw"
    proc = _sweep("submit", "--job", SMOKE, "--sizes", "1,2,4,8", "--results", str(out), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if " sbatch " in ln]
    assert len(lines) == 8
    assert not out.exists(), "a dry run writes nothing"

    def resources(line: str) -> list[str]:
        return [w for w in line.split() if w.startswith(("--nodes=", "--ntasks-per-node=", "--gres="))]

    for i in range(0, 8, 2):
        assert "native.sbatch" in lines[i] and "horovod.sbatch" in lines[i + 1]
        assert resources(lines[i]) == resources(lines[i + 1])
    assert resources(lines[6]) == ["--nodes=2", "--ntasks-per-node=4", "--gres=gpu:4"]  # 8 = 2 nodes x 4
    assert resources(lines[4]) == ["--nodes=1", "--ntasks-per-node=4", "--gres=gpu:4"]
    assert f"{out}/native-n8" in lines[6]


BAD_SWEEPS = [
    (["submit", "--job", "jobs/nope.toml", "--results", "R"], "not found"),
    (["submit", "--job", SMOKE, "--results", "R", "--sizes", "1,two"], "not an integer"),
    (["submit", "--job", SMOKE, "--results", "R", "--sizes", "6"], "does not fill whole nodes"),
    (["submit", "--job", SMOKE, "--results", "R", "--backends", "native,pytorch"], "unknown backend"),
    (["submit", "--job", SMOKE, "--results", "R", "--set", "bogus=1"], "unknown job key"),
    (["submit", "--job", SMOKE, "--results", "R", "--gres-per-node", "-1"], "--gres-per-node"),
    (["submit", "--job", SMOKE, "--results", "R", "--hvd-launch", "ssh"], "invalid choice"),
    (["status", "/nonexistent-twinbench"], "not a directory"),
    (["status", "E"], "no sweep here"),
    (["frobnicate"], "invalid choice"),
]


@pytest.fixture(scope="module")
def refused_sweeps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict[str, Any], Path]]:
    """The bad sweeps above ("R": a new path, "E": an empty directory) in one process, checked for TensorFlow after
    each (tests/aids/refusals.py; the sweep's CLI runs on login nodes): arguments -> (outcome, the "R" path)."""
    dirs = [tmp_path_factory.mktemp("bad-sweep") for _ in BAD_SWEEPS]
    got = batch([{"module": "common.sweep", "argv": [{"R": str(d / "R"), "E": str(d)}.get(a, a) for a in args]}
                 for (args, _), d in zip(BAD_SWEEPS, dirs, strict=True)], base_env())
    return {" ".join(args): (g, d / "R") for (args, _), g, d in zip(BAD_SWEEPS, got, dirs, strict=True)}


@pytest.mark.parametrize("args, message", BAD_SWEEPS)
def test_sweep_bad_input_is_one_line_exit_2(args, message, refused_sweeps):
    got, results = refused_sweeps[" ".join(args)]
    assert got["rc"] == 2 and len(got["stderr"].strip().splitlines()) == 1, got["stdout"] + got["stderr"]
    assert message in got["stderr"] and not got["tensorflow"] and not results.exists(), got["stderr"]


def test_sweep_refuses_submit_without_sbatch(tmp_path):
    no_sbatch = {**base_env(), "PATH": str(Path(PY).parent)}  # the venv only: no sbatch
    proc = _sweep("submit", "--job", SMOKE, "--results", str(tmp_path / "R"), env=no_sbatch)
    assert proc.returncode == 2 and "sbatch not found" in proc.stderr, proc.stderr
