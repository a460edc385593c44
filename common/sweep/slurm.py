"""A sweep's dealings with Slurm: each run's sbatch command, submitting the runs (recorded in the manifest as they
go), and the state of the submitted jobs (squeue, then sacct, then scontrol) told apart with the result files.
No TensorFlow here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from common.core import results as res
from common.sweep import allocation, nodes, resume
from common.sweep.plan import MANIFEST, PROG, load_manifest, sbatch_script

EXIT_FAILED, EXIT_PENDING = 1, 3
SLURM_TIMEOUT = 30  # seconds for one sbatch / squeue / sacct / scontrol call

PENDING_STATES = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SUSPENDED",
                  "STOPPED", "SIGNALING"}
RUNNING_STATES = {"RUNNING", "COMPLETING", "STAGE_OUT"}
FAILED_STATES = {"FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
                 "PREEMPTED", "REVOKED", "SPECIAL_EXIT"}


def sbatch_command(run: dict[str, Any], header: dict[str, Any], results: Path,
                   depends_on: str | None) -> list[str]:
    cmd = ["sbatch", "--parsable", f"--job-name=tb-{run['name']}", f"--chdir={header['repo']}",
           f"--output={results / run['log']}", *run["resources"]]
    if depends_on:
        cmd.append(f"--dependency=afterany:{depends_on}")
    cmd += [str(Path(header["repo"]) / sbatch_script(run["backend"])), header["job_file"],
            str(results / run["results_dir"]), "--quiet"]
    for s in header["sets"]:
        cmd += ["--set", s]
    return cmd + list(header["backend_args"][run["backend"]]) + list(run.get("args", []))


def check_nodes(runs: list[dict[str, Any]], header: dict[str, Any]) -> str | None:
    """SweepError naming the first cell the partition's nodes cannot hold (common.sweep.nodes), before anything
    is submitted; else None, or the line saying Slurm could not be asked."""
    cells = {r.get("cell", r["name"]): r for r in runs}
    asks = [(c, r["resources"], Path(header["repo"]) / sbatch_script(r["backend"])) for c, r in cells.items()]
    if header.get("one_allocation"):  # and the allocation holding the largest layout, cells' options over theirs
        for chunk in allocation.groups(runs, header.get("rounds_per_job"))[:1]:
            asks.append(("allocation", allocation.request(chunk),
                         Path(header["repo"]) / sbatch_script(chunk[0]["backend"])))
    return nodes.check(asks, _run_quiet)


def _record(manifest: dict[str, Any], run: dict[str, Any]) -> None:
    """Put a submitted run into the manifest: a run of that name already there (a failed one resubmitted) is
    replaced, its earlier job ids kept in ``previous_jobs``; any other is added."""
    runs = manifest["runs"]
    for i, old in enumerate(runs):
        if old.get("name", old["results_dir"]) == run["name"]:
            runs[i] = {**run, "previous_jobs": [*old.get("previous_jobs", []), old["job_id"]]}
            return
    runs.append(run)


def _sbatch(cmd: list[str], env: dict[str, str]) -> tuple[str, str]:
    """(job id, "") of a submission, or ("", sbatch's last line of complaint)."""
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=SLURM_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as e:
        proc = subprocess.CompletedProcess(cmd, 1, "", str(e))
    job_id = proc.stdout.strip().split(";")[0] if proc.returncode == 0 else ""
    return job_id, "" if job_id else (proc.stderr.strip().splitlines() or ["no job id"])[-1]


def _refused(what: str, msg: str, submitted: int, results: Path) -> int:
    print(f"{PROG}: error: sbatch refused {what}: {msg}"
          + (f" ({submitted} job(s) submitted, recorded in {results / MANIFEST}; the rest: python -m "
             f"common.sweep resume {results})" if submitted else ""), file=sys.stderr, flush=True)
    return EXIT_FAILED


def submit_runs(runs: list[dict[str, Any]], header: dict[str, Any], results: Path, manifest: dict[str, Any]) -> int:
    """sbatch every run in order, each recorded in ``manifest`` (written after every submission) as it goes."""
    env = {**os.environ, "TWINBENCH_REPO": header["repo"], **header["launch_env"]}
    if header.get("one_allocation"):
        return submit_allocations(runs, header, results, manifest, env)
    prev = str(manifest["runs"][-1]["job_id"]) if manifest["runs"] else None
    submitted = 0
    for run in runs:
        cmd = sbatch_command(run, header, results, prev if header["serial"] else None)
        job_id, msg = _sbatch(cmd, env)
        if not job_id:
            return _refused(run["name"], msg, submitted, results)
        log = re.sub(r"-(\d+|%j)\.out$", f"-{job_id}.out", run["log"])
        _record(manifest, {**run, "job_id": job_id, "log": log, "sbatch": cmd, "submitted_at": res.now_iso()})
        res.write_json_atomic(results / MANIFEST, manifest)
        prev, submitted = job_id, submitted + 1
        print(f"[{PROG}] {run['name']}: job {job_id} ({run['nodes']} node(s) x {run['ntasks_per_node']} task(s)) "
              f"-> {results / run['results_dir']}", flush=True)
    print(f"[{PROG}] {len(runs)} job(s) submitted ({manifest.get('repeats', 1)} round(s) in all); manifest "
          f"{results / MANIFEST}; follow with: python -m common.sweep status {results}", flush=True)
    return 0


def submit_allocations(runs: list[dict[str, Any]], header: dict[str, Any], results: Path, manifest: dict[str, Any],
                       env: dict[str, str]) -> int:
    """--one-allocation: write and sbatch one script per group of whole rounds (common.sweep.allocation); every run
    is recorded with its job's id, its script and its step position, the manifest written after each job."""
    jobs = allocation.groups(runs, header.get("rounds_per_job"))
    for k, chunk in enumerate(jobs):
        path = allocation.job_path(chunk, results)
        path.parent.mkdir(exist_ok=True)
        path.write_text(allocation.script(chunk, header, results))
        cmd = allocation.sbatch_command(chunk, header, results, path)
        job_id, msg = _sbatch(cmd, env)
        if not job_id:
            return _refused(path.name, msg, k, results)
        for i, r in enumerate(chunk):
            _record(manifest, {**r, "job_id": job_id, "log": f"logs/{r['name']}-{job_id}.out", "sbatch": cmd,
                               "allocation": str(path.relative_to(results)), "step": i + 1,
                               "submitted_at": res.now_iso()})
        res.write_json_atomic(results / MANIFEST, manifest)
        print(f"[{PROG}] {path.name}: job {job_id}, {len(chunk)} run(s) one job step after the other", flush=True)
    print(f"[{PROG}] {len(jobs)} job(s) submitted for {len(runs)} run(s); manifest {results / MANIFEST}; follow "
          f"with: python -m common.sweep status {results}", flush=True)
    return 0


def _run_quiet(cmd: list[str]) -> str | None:
    """stdout of a Slurm client command, or None if it is missing, fails or hangs."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=SLURM_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 or proc.stdout.strip() else None


def slurm_states(job_ids: list[str]) -> dict[str, dict[str, str]]:
    """job id -> {"state": ..., "reason"/"exit_code": ..., "source": ...}: squeue, then sacct, then scontrol."""
    out: dict[str, dict[str, str]] = {}
    if not job_ids:
        return out
    text = _run_quiet(["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i|%T|%r"])
    for line in (text or "").splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3 and parts[0] in job_ids:
            out[parts[0]] = {"state": parts[1], "reason": parts[2], "source": "squeue"}
    rest = [j for j in job_ids if j not in out]
    if rest:
        text = _run_quiet(["sacct", "-n", "-P", "-X", "-j", ",".join(rest), "-o", "JobID,State,ExitCode"])
        for line in (text or "").splitlines():
            parts = line.strip().split("|")
            if len(parts) == 3 and parts[0] in rest:
                state = parts[1].split()[0] if parts[1] else ""  # "CANCELLED by 0"
                out[parts[0]] = {"state": state, "exit_code": parts[2], "source": "sacct"}
    for j in [j for j in job_ids if j not in out]:
        text = _run_quiet(["scontrol", "-o", "show", "job", j])
        fields = dict(f.split("=", 1) for f in (text or "").split() if "=" in f)
        if fields.get("JobState"):
            out[j] = {"state": fields["JobState"], "exit_code": fields.get("ExitCode", ""),
                      "reason": fields.get("Reason", ""), "source": "scontrol"}
    return out


def classify(run: dict[str, Any], root: Path, slurm: dict[str, str] | None) -> dict[str, Any]:
    """finished | failed | running | pending | unknown, with the result files, the evidence, and the run's
    checkpoint when it has no result (common.sweep.resume)."""
    row = _classify(run, root, slurm)
    if run.get("allocation") and not row["results"]:  # one allocation's runs share a job: its step says more
        step = allocation.step_state(run, root)
        if step and "exit" in step:  # the step ended without a results JSON; the job went on with the next one
            row.update(state="failed", detail=f"step exit {step['exit']} on {step.get('nodelist') or '?'}, no "
                                              "results JSON")
        elif row["state"] == "running" and not step:
            row.update(state="pending", detail=f"waits its turn in job {run['job_id']}")
        elif step and row["state"] == "running":
            row["detail"] = f"step running on {step.get('nodelist')}"
    row["checkpoint"] = None if row["results"] else resume.checkpoint(root / run["results_dir"])
    return row


def _classify(run: dict[str, Any], root: Path, slurm: dict[str, str] | None) -> dict[str, Any]:
    """finished | failed | running | pending | unknown, with the result files and the evidence."""
    rdir = root / run["results_dir"]
    files = sorted(str(p) for p in rdir.glob("*.json") if not p.name.startswith(".")) if rdir.is_dir() else []
    sstate = (slurm or {}).get("state", "")
    if files:
        state = "finished"
    elif sstate in PENDING_STATES:
        state = "pending"
    elif sstate in RUNNING_STATES:
        state = "running"
    elif sstate in FAILED_STATES or sstate == "COMPLETED":
        state = "failed"  # COMPLETED without a results JSON: the run did not write one
    else:
        state = "unknown"  # Slurm forgot the job (or cannot be asked) and there is no result
    detail = ""
    if state == "pending" and (slurm or {}).get("reason"):
        detail = slurm["reason"]
    elif state == "failed":
        detail = "no results JSON" + (f", exit {slurm['exit_code']}" if (slurm or {}).get("exit_code") else "")
    return {"backend": run["backend"], "variant": run.get("variant", run["backend"]), "size": run["size"],
            "layout": run.get("layout") or f"{run.get('nodes', 1)}x{run.get('ntasks_per_node', run['size'])}",
            "job_id": run["job_id"], "state": state,
            "slurm_state": sstate or None, "detail": detail, "results": files, "log": str(root / run["log"])}


def status_once(root: Path) -> list[dict[str, Any]]:
    """A row per run the sweep planned (common.sweep.resume.planned): submitted ones as Slurm and the result files
    say, the others ``unsubmitted``."""
    runs = resume.planned(load_manifest(root))
    states = slurm_states([str(r["job_id"]) for r in runs if r.get("job_id")])
    return [classify(r, root, states.get(str(r["job_id"]))) if r.get("job_id") else resume.unsubmitted_row(r, root)
            for r in runs]


def exit_code(rows: list[dict[str, Any]]) -> int:
    states = {r["state"] for r in rows}
    if states & {"failed", resume.UNSUBMITTED}:
        return EXIT_FAILED
    if states & {"pending", "running"}:
        return EXIT_PENDING
    if "unknown" in states:
        return EXIT_FAILED
    return 0

