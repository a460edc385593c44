"""Scaling sweep on Slurm: submit every backend x world size with identical resources, then follow it.

    python -m common.sweep submit --job jobs/X.toml --results DIR [--sizes 1,2,4,8] [--nodes 1,2]
                                  [--backends native,horovod | --variant LABEL=BACKEND[:ARGS] ...]
                                  [--gres-per-node N] [--cpus-per-task C] [--time T] [--partition P]
                                  [--account A] [--exclusive] [--serial] [--hvd-launch srun|horovodrun]
                                  [--repeats R [--order-seed S] [--max-repeats N]] [--hint H] [--srun-mpi TYPE]
                                  [--module-purge]
                                  [--set KEY=VALUE ...] [--sbatch-arg ARG ...] [--backend-arg ARG ...]
                                  [--native-arg ARG ...] [--horovod-arg ARG ...] [--skip-data-check] [--dry-run]
    python -m common.sweep status DIR [--json] [--wait SECONDS] [--until WIDTH]
    python -m common.sweep extend DIR [--rounds K]

``submit`` runs ``sbatch jobs/slurm/{native,horovod}.sbatch`` once per (world size, backend), both backends of a
size with the same sbatch resource options: one task per GPU, ``--gres=gpu:N`` per node, ``ceil(size / N)``
nodes (``--gres-per-node``, default 4, GPUs per node; 0 = no GPUs, all tasks on one node). Each run writes its
results JSON into its own directory ``DIR/<backend>-n<size>/`` and its log to ``DIR/logs/``; the Slurm job ids
and those paths go into ``DIR/sweep-manifest.json`` (written after every submission, so a partial sweep is
recorded). ``python -m common.report DIR`` reads the results of the whole sweep.

``--variant LABEL=BACKEND[:ARGS]`` (repeatable, instead of ``--backends``) compares ways of running the backends
in one submission: each variant runs at every size, with the same resources as every other run of that size, its
flags after the shared ones, into ``DIR/<label>-n<size>/`` (e.g. ``--variant hvd-fusion32=horovod:--fusion-threshold-mb
32 --variant hvd=horovod``). Each backend's own parser checks a variant's flags before anything is submitted.

``--nodes 1,2`` runs every size at each listed node count that divides it (at most ``--gres-per-node`` ranks per
node): size 2 as ``1x2`` and ``2x1``, cells ``<variant>-<nodes>x<ranks per node>`` kept apart by the report
(common.sweep.layout).

``--repeats R`` submits R runs of every cell (backend or variant x size) into ``DIR/<cell>-r<round>/``, round
robin in a seeded order that changes every round (common.sweep.order); the manifest records each job's cell and
round, and ``status`` counts per cell. ``--hint``, ``--srun-mpi`` and ``--module-purge`` reach the scripts as
TWINBENCH_HINT, TWINBENCH_SRUN_MPI and TWINBENCH_MODULE_PURGE (jobs/slurm/env.sh).

``status`` says for every run whether it finished (a results JSON is there), failed, is running or pending,
from the result files always and from squeue / sacct / scontrol where they answer ("unknown": Slurm no longer
knows the job and there is no result). Exit status 0 when every run finished, 1 when one failed (or is unknown),
3 when runs are still pending or running (``--wait`` polls until they are not). ``--until 5%``: also whether every cell
is within 5% of its median (common.sweep.order; exit 4 when all runs finished but a cell is not).

Bad input prints one line on stderr and exits 2, before anything is submitted or written. No TensorFlow here.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from common import cli
from common.core import registry
from common.core import results as res
from common.sweep import layout as sl
from common.sweep import order as so
from common.sweep import variants as sv
from common.sweep.layout import SweepError
from common.workload.job import JobError, load_job

PROG = "common.sweep"
MANIFEST = "sweep-manifest.json"
MANIFEST_KIND = "sweep"
SCRIPTS = {b: Path(registry.entry(b).slurm_script) for b in registry.names()}
EXIT_FAILED, EXIT_PENDING = 1, 3
SLURM_TIMEOUT = 30  # seconds for one sbatch / squeue / sacct / scontrol call

PENDING_STATES = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SUSPENDED",
                  "STOPPED", "SIGNALING"}
RUNNING_STATES = {"RUNNING", "COMPLETING", "STAGE_OUT"}
FAILED_STATES = {"FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
                 "PREEMPTED", "REVOKED", "SPECIAL_EXIT"}


def fail(message: str) -> NoReturn:
    cli.fail(PROG, message)


# -- submit ---------------------------------------------------------------------------------------------------
def plan(a: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every run of the sweep (not yet submitted) and the manifest header; SweepError on bad input."""
    sizes = sl.parse_sizes(a.sizes)
    nodes = sl.parse_counts(a.nodes, "--nodes", "a node count") if a.nodes else None
    variants = _variants(a)
    chosen = list(dict.fromkeys(v.backend for v in variants))
    if a.gres_per_node < 0:
        raise SweepError(f"--gres-per-node must be >= 0, got {a.gres_per_node}")
    if a.cpus_per_task is not None and a.cpus_per_task < 1:
        raise SweepError(f"--cpus-per-task must be >= 1, got {a.cpus_per_task}")
    job_path = Path(a.job).resolve()
    try:
        job = load_job(job_path, a.sets)
        if not a.skip_data_check:
            from common.workload import data as data_mod

            n, _, _ = data_mod.dataset_info(job)
            for size in sizes:  # every world size must fill at least one global batch
                job.resolve_steps(n, size)
    except JobError as e:
        raise SweepError(str(e)) from None
    except ValueError as e:  # DataError
        raise SweepError(f"{e} (or pass --skip-data-check if the data is only visible on compute nodes)") from None
    lays = {size: sl.layouts(size, a.gres_per_node, nodes) for size in sizes}
    results = Path(a.results).resolve()
    if (results / MANIFEST).exists():
        raise SweepError(f"{results / MANIFEST} exists: {results} already holds a sweep; use a new --results dir")
    if results.exists() and not results.is_dir():
        raise SweepError(f"--results {str(results)!r} is not a directory")
    for b in chosen:
        if not (cli.REPO / SCRIPTS[b]).is_file():
            raise SweepError(f"{cli.REPO / SCRIPTS[b]} is missing")
    cells = _cells(lays, variants, nodes is not None, a)
    try:
        runs = so.ordered_runs(cells, a.repeats, a.order_seed)
        cap = so.repeats_cap(a.repeats, a.max_repeats)
    except ValueError as e:
        raise SweepError(str(e)) from None
    header = {
        "kind": MANIFEST_KIND,
        "schema": 1,
        "created_at": res.now_iso(),
        "command": list(sys.orig_argv),
        "repo": str(cli.REPO),
        "job_file": str(job_path),
        "sets": list(a.sets),
        "job_name": job.name,
        "job_hash": job.job_hash,
        "sizes": sizes,
        "nodes": nodes,  # --nodes: the node counts every size ran at (None: the fewest whole nodes)
        "backends": chosen,
        "variants": [v.to_dict() for v in variants],
        "gres_per_node": a.gres_per_node,
        "hvd_launch": a.hvd_launch,
        "serial": a.serial,
        "repeats": a.repeats,
        "max_repeats": cap,  # the most rounds `extend` may bring the sweep to
        "order_seed": a.order_seed if a.order_seed is not None or a.repeats == 1 else 0,
        "cells": [c["name"] for c in cells],  # size x layout x variant, the order `extend` interleaves again
        "order": [{"cell": r["cell"], "round": r["round"]} for r in runs],
        "launch_env": so.launch_env(a),
        "backend_args": {b: [*a.backend_args, *vars(a)[f"{b}_args"]] for b in registry.names()},
    }
    return runs, header


def _cells(lays: dict[int, list[dict[str, int]]], variants: list[sv.Variant], by_layout: bool,
           a: argparse.Namespace) -> list[dict[str, Any]]:
    """One planned run per size x layout x variant (one repeat), named ``<variant>-n<size>``, or
    ``<variant>-<nodes>x<ranks per node>`` when ``--nodes`` gives a size several layouts."""
    cells = []
    for size, size_lays in lays.items():
        for lay in size_lays:
            for v in variants:
                name = f"{v.label}-{sl.layout_name(lay)}" if by_layout else f"{v.label}-n{size}"
                cells.append({
                    "backend": v.backend,
                    "variant": v.label,
                    "args": list(v.args),  # after the backend's shared flags (header backend_args)
                    "size": size,
                    **lay,
                    "layout": sl.layout_name(lay),
                    "name": name,
                    "results_dir": name,  # relative to the manifest's directory
                    "log": f"logs/{name}-%j.out",
                    "job_id": None,
                    "resources": sl.resource_args(lay, a),
                })
    return cells


def _variants(a: argparse.Namespace) -> list[sv.Variant]:
    """--variant's variants, their flags checked by their backend's parser; without it one per --backends entry."""
    if not a.variants:
        return sv.default_variants(sl.parse_backends(a.backends or ",".join(registry.names())))
    if a.backends is not None:
        raise SweepError("--backends and --variant both choose what runs: give one of them")
    try:
        variants = sv.parse_variants(a.variants)
        for v in variants:
            sv.check_flags(v, [*a.backend_args, *vars(a)[f"{v.backend}_args"]])
    except ValueError as e:
        raise SweepError(str(e)) from None
    return variants


def sbatch_command(run: dict[str, Any], header: dict[str, Any], results: Path,
                   depends_on: str | None) -> list[str]:
    cmd = ["sbatch", "--parsable", f"--job-name=tb-{run['name']}", f"--chdir={header['repo']}",
           f"--output={results / run['log']}", *run["resources"]]
    if depends_on:
        cmd.append(f"--dependency=afterany:{depends_on}")
    cmd += [str(Path(header["repo"]) / SCRIPTS[run["backend"]]), header["job_file"],
            str(results / run["results_dir"]), "--quiet"]
    for s in header["sets"]:
        cmd += ["--set", s]
    return cmd + list(header["backend_args"][run["backend"]]) + list(run.get("args", []))


def submit(a: argparse.Namespace) -> int:
    try:
        runs, header = plan(a)
    except SweepError as e:
        fail(str(e))
    results = Path(a.results).resolve()
    env_prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in {"TWINBENCH_REPO": header["repo"],
                                                               **header["launch_env"]}.items())
    if a.dry_run:
        prev = None
        for i, run in enumerate(runs):
            dep = prev if a.serial else None
            print(f"# job {i + 1}: cell {run['cell']}, round {run['round']}")
            print(env_prefix, shlex.join(sbatch_command(run, header, results, dep)))
            prev = f"<job {i + 1}>"
        if a.repeats > 1:
            print(f"[{PROG}] order seed {header['order_seed']}: " + " ".join(f"{o['cell']}#{o['round']}"
                                                                            for o in header["order"]))
        rounds = "-r<round>" if runs and runs[0]["name"] != runs[0]["cell"] else ""
        where = "<nodes>x<ranks per node>" if header["nodes"] else "n<size>"
        print(f"[{PROG}] dry run: {len(runs)} job(s) not submitted; results would land in "
              f"{results}/<variant>-{where}{rounds}/, the manifest in {results / MANIFEST}", flush=True)
        return 0
    if shutil.which("sbatch") is None:
        fail("sbatch not found: run this on a Slurm login node (or pass --dry-run to see the commands)")
    try:
        res.check_results_dir(results)
        (results / "logs").mkdir(exist_ok=True)
    except OSError as e:
        fail(str(e))
    return submit_runs(runs, header, results, {**header, "runs": []})


def submit_runs(runs: list[dict[str, Any]], header: dict[str, Any], results: Path, manifest: dict[str, Any]) -> int:
    """sbatch every run in order, each recorded in ``manifest`` (written after every submission) as it goes."""
    env = {**os.environ, "TWINBENCH_REPO": header["repo"], **header["launch_env"]}
    prev = str(manifest["runs"][-1]["job_id"]) if manifest["runs"] else None
    for run in runs:
        cmd = sbatch_command(run, header, results, prev if header["serial"] else None)
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=SLURM_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as e:
            proc = subprocess.CompletedProcess(cmd, 1, "", str(e))
        job_id = proc.stdout.strip().split(";")[0] if proc.returncode == 0 else ""
        if not job_id:
            msg = (proc.stderr.strip().splitlines() or ["no job id"])[-1]
            print(f"{PROG}: error: sbatch refused {run['name']}: {msg}"
                  + (f" ({len(manifest['runs'])} job(s) submitted, recorded in {results / MANIFEST})"
                     if manifest["runs"] else ""), file=sys.stderr, flush=True)
            return EXIT_FAILED
        run = {**run, "job_id": job_id, "log": run["log"].replace("%j", job_id), "sbatch": cmd,
               "submitted_at": res.now_iso()}
        manifest["runs"].append(run)
        res.write_json_atomic(results / MANIFEST, manifest)
        prev = job_id
        print(f"[{PROG}] {run['name']}: job {job_id} ({run['nodes']} node(s) x {run['ntasks_per_node']} task(s)) "
              f"-> {results / run['results_dir']}", flush=True)
    print(f"[{PROG}] {len(runs)} job(s) submitted ({manifest.get('repeats', 1)} round(s) in all); manifest "
          f"{results / MANIFEST}; follow with: python -m common.sweep status {results}", flush=True)
    return 0


def extend(a: argparse.Namespace) -> int:
    """``extend DIR --rounds K``: K more interleaved rounds into the sweep's manifest (common.sweep.order)."""
    root = Path(a.results_dir).resolve()
    try:
        manifest = load_manifest(root)
        runs = so.more_rounds(manifest, a.rounds)
    except (SweepError, ValueError) as e:
        fail(str(e))
    if shutil.which("sbatch") is None:
        fail("sbatch not found: run this on a Slurm login node")
    manifest["repeats"], manifest["order"] = runs[-1]["round"], [*manifest.get("order", []), *(
        {"cell": r["cell"], "round": r["round"]} for r in runs)]
    return submit_runs(runs, manifest, root, manifest)


# -- status ---------------------------------------------------------------------------------------------------
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


def load_manifest(root: Path) -> dict[str, Any]:
    path = root / MANIFEST
    if not root.is_dir():
        raise SweepError(f"{str(root)!r} is not a directory")
    if not path.is_file():
        raise SweepError(f"no sweep here: {path} not found (made by `python -m common.sweep submit`)")
    try:
        manifest = json.loads(path.read_text())
        assert manifest.get("kind") == MANIFEST_KIND and isinstance(manifest["runs"], list)
        for r in manifest["runs"]:
            assert all(k in r for k in ("backend", "size", "job_id", "results_dir", "log"))
    except (OSError, ValueError, AssertionError, KeyError, TypeError, AttributeError):
        raise SweepError(f"{path} is not a sweep manifest (unreadable or malformed)") from None
    return manifest


def status_once(root: Path) -> list[dict[str, Any]]:
    manifest = load_manifest(root)
    runs = manifest["runs"]
    states = slurm_states([str(r["job_id"]) for r in runs if r.get("job_id")])
    return [classify(r, root, states.get(str(r["job_id"]))) for r in runs]


def exit_code(rows: list[dict[str, Any]]) -> int:
    states = {r["state"] for r in rows}
    if "failed" in states:
        return EXIT_FAILED
    if states & {"pending", "running"}:
        return EXIT_PENDING
    if "unknown" in states:
        return EXIT_FAILED
    return 0


def status(a: argparse.Namespace) -> int:
    root = Path(a.results_dir).resolve()
    if a.wait is not None and a.wait < 0:
        fail(f"--wait must be >= 0 seconds, got {a.wait}")
    deadline = time.monotonic() + (a.wait or 0)
    try:
        width = so.until_width(a.until)
        rows = status_once(root)
        while a.wait and any(r["state"] in ("pending", "running") for r in rows) and time.monotonic() < deadline:
            time.sleep(min(a.poll, max(deadline - time.monotonic(), 0.1)))
            rows = status_once(root)
    except (SweepError, ValueError) as e:
        fail(str(e))
    counts = so.cell_counts(load_manifest(root)["runs"], rows)
    if not a.json:
        so.print_table(rows, root)
        print("\n".join(so.format_cell_counts(counts)), flush=True)
    code, until = so.until_status(root, width, exit_code(rows), a.json) if width else (exit_code(rows), None)
    if a.json:
        print(json.dumps({"results_dir": str(root), "runs": rows, "cells": counts, "until": until}, indent=1))
    return code


# -- command line -----------------------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = cli.OneLineParser(prog=PROG, description="Submit and follow a native-vs-Horovod scaling sweep on Slurm.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=cli.OneLineParser)
    s = sub.add_parser("submit", help="submit every backend x world size (identical resources)")
    s.add_argument("--job", required=True, help="job TOML file")
    s.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="job override passed to every run (repeatable)")
    s.add_argument("--sizes", default="1,2,4,8", help="world sizes (GPUs = tasks), comma separated (default 1,2,4,8)")
    s.add_argument("--backends", default=None,
                   help=f"comma separated (default {','.join(registry.names())}, each with its default flags)")
    s.add_argument("--variant", dest="variants", action="append", default=[], metavar="LABEL=BACKEND[:ARGS]",
                   help="instead of --backends: a backend run with its own flags, at every size, into LABEL-nSIZE "
                        "(repeatable), e.g. --variant 'hvd-fusion32=horovod:--fusion-threshold-mb 32'")
    s.add_argument("--results", required=True, help="sweep directory: results, logs and the manifest")
    s.add_argument("--gres-per-node", type=int, default=4,
                   help="GPUs per node (default 4): a size above it takes size/N whole nodes; 0 = no GPUs")
    s.add_argument("--nodes", default=None, metavar="LIST",
                   help="node counts to run every size at, e.g. 1,2: size 2 as 1x2 and as 2x1 (each count that divides "
                        "the size with at most --gres-per-node ranks per node; default: the fewest whole nodes)")
    s.add_argument("--cpus-per-task", type=int, default=None, help="sbatch --cpus-per-task (default: the script's)")
    s.add_argument("--time", default=None, help="sbatch --time (default: the script's)")
    s.add_argument("--partition", default=None, help="sbatch --partition")
    s.add_argument("--account", default=None, help="sbatch --account")
    s.add_argument("--exclusive", action="store_true", help="whole nodes for every run (sbatch --exclusive)")
    s.add_argument("--serial", action="store_true",
                   help="one run at a time: each job depends on the previous one (afterany)")
    s.add_argument("--hvd-launch", choices=("srun", "horovodrun"), default="srun",
                   help="how horovod.sbatch starts ranks (default srun --mpi=pmix)")
    so.add_options(s)
    s.add_argument("--sbatch-arg", dest="sbatch_args", action="append", default=[], metavar="ARG",
                   help="extra sbatch option for every run, e.g. --sbatch-arg=--qos=normal (repeatable)")
    s.add_argument("--backend-arg", dest="backend_args", action="append", default=[], metavar="ARG",
                   help="extra flag for every backend process, e.g. --backend-arg=--threads=4 (repeatable)")
    for b in registry.names():  # --native-arg, --horovod-arg: one flag per registered backend
        s.add_argument(f"--{b}-arg", dest=f"{b}_args", action="append", default=[], metavar="ARG",
                       help=f"extra flag for the {b} runs only (repeatable), e.g. --{b}-arg=--threads=2")
    s.add_argument("--skip-data-check", action="store_true", help="do not check the job's data files here")
    s.add_argument("--dry-run", action="store_true", help="print the sbatch commands; submit and write nothing")
    st = sub.add_parser("status", help="which runs finished, failed or are pending")
    st.add_argument("results_dir", metavar="DIR", help="the sweep directory given to submit --results")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.add_argument("--wait", type=float, default=None, metavar="SECONDS",
                    help="poll until no run is pending or running, at most this long")
    st.add_argument("--poll", type=float, default=10.0, help=argparse.SUPPRESS)
    so.add_status_options(st)
    ex = sub.add_parser("extend", help="submit more interleaved rounds of every cell into a sweep (up to its cap)")
    ex.add_argument("results_dir", metavar="DIR", help="the sweep directory given to submit --results")
    ex.add_argument("--rounds", type=int, default=1, help="rounds to add (default 1), up to submit's --max-repeats")
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(sys.argv[1:] if argv is None else argv)
    return {"submit": submit, "extend": extend, "status": status}[a.command](a)
