"""Scaling sweep on Slurm: submit every backend x world size with identical resources, then follow it.

    python -m common.sweep submit --job jobs/X.toml --results DIR [--sizes 1,2,4,8] [--nodes 1,2]
                                  [--backends native,horovod | --variant LABEL=BACKEND[:ARGS] ...]
                                  [--gres-per-node N] [--cpus-per-task C] [--time T] [--partition P]
                                  [--account A] [--exclusive] [--serial] [--hvd-launch LAUNCHER]
                                  [--repeats R [--order-seed S] [--max-repeats N]] [--hint H] [--srun-mpi TYPE]
                                  [--module-purge] [--one-allocation [--rounds-per-job K]]
                                  [--set KEY=VALUE ...] [--sbatch-arg ARG ...] [--backend-arg ARG ...]
                                  [--native-arg ARG ...] [--horovod-arg ARG ...] [--skip-data-check] [--dry-run]
    python -m common.sweep status DIR [--json] [--wait SECONDS] [--until WIDTH]
    python -m common.sweep extend DIR [--rounds K]
    python -m common.sweep resume DIR [--dry-run]

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

Before anything is submitted (dry run included), each cell's request (its sbatch options over the script's
``#SBATCH`` defaults) is checked against what ``scontrol show node -o`` says the partition's nodes have
(common.sweep.nodes): a cell no node set can hold is one line and exit 2, naming it. The manifest keeps every run the
sweep planned (``planned``): ``status`` counts the ones never submitted (exit 1 until they ran) and names orphaned
checkpoints (a failed or cancelled run's), and ``resume DIR`` submits the runs never submitted and, again, the
failed or cancelled ones into their own directories, each resuming from its checkpoint (common.sweep.resume).

``--one-allocation`` submits one job of the largest layout (``--rounds-per-job K``: one per K whole rounds) that
runs every run as a job step, one after the other, in the same order, each size on the allocation's first nodes for
both backends (common.sweep.allocation); ``status``, ``extend`` and ``resume`` work on it as on the runs' own jobs.

Bad input prints one line on stderr and exits 2, before anything is submitted or written. No TensorFlow here.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import NoReturn

from common import cli
from common.core import registry
from common.core import results as res
from common.sweep import allocation as sa
from common.sweep import layout as sl
from common.sweep import order as so
from common.sweep import resume as rv
from common.sweep.layout import SweepError
from common.sweep.plan import MANIFEST, PROG, load_manifest, plan
from common.sweep.slurm import check_nodes, exit_code, sbatch_command, status_once, submit_runs


def fail(message: str) -> NoReturn:
    cli.fail(PROG, message)


# -- submit and extend --------------------------------------------------------------------------------------------
def submit(a: argparse.Namespace) -> int:
    try:
        runs, header = plan(a)
    except SweepError as e:
        fail(str(e))
    results = Path(a.results).resolve()
    try:
        note = check_nodes(runs, header)
    except SweepError as e:
        fail(str(e))
    if note:
        print(f"[{PROG}] {note}", flush=True)
    env_prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in {"TWINBENCH_REPO": header["repo"],
                                                               **header["launch_env"]}.items())
    if a.dry_run and a.one_allocation:
        for chunk in sa.groups(runs, a.rounds_per_job):
            path = sa.job_path(chunk, results)
            print(f"# {path.name}: {len(chunk)} run(s), one job step each: "
                  + " ".join(f"{r['cell']}#{r['round']}" for r in chunk))
            print(env_prefix, shlex.join(sa.sbatch_command(chunk, header, results, path)))
        print(f"[{PROG}] dry run: nothing submitted or written; the job script(s) would be {results}/jobs/*.sbatch",
              flush=True)
        return 0
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
    return submit_runs(runs, header, results, {**header, "planned": runs, "runs": []})


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
    if manifest.get("planned") is not None:
        manifest["planned"] = [*manifest["planned"], *runs]
    return submit_runs(runs, manifest, root, manifest)


def resume_sweep(a: argparse.Namespace) -> int:
    """``resume DIR``: submit the runs the sweep planned but never submitted, and again the failed or cancelled ones
    into their own results directories (each resumes from its checkpoint there, if it left one)."""
    root = Path(a.results_dir).resolve()
    try:
        manifest = load_manifest(root)
        rows = status_once(root)
        runs = rv.to_resume(manifest, rows)
    except SweepError as e:
        fail(str(e))
    if not runs:
        print(f"[{PROG}] nothing to resume in {root}: every run was submitted and none failed", flush=True)
        return 0
    ckpt = {r.get("name"): row.get("checkpoint") for r, row in zip(rv.planned(manifest), rows, strict=True)}
    for r in runs:
        c = ckpt.get(r["name"])
        how = "never submitted" if not r.get("job_id") else \
            f"job {r['job_id']} failed, resumes from {c['path']} (step {c['step']})" if c else \
            f"job {r['job_id']} failed, no checkpoint: starts again"
        print(f"[{PROG}] {r['name']}: {how}", flush=True)
    if a.dry_run:
        print(f"[{PROG}] dry run: {len(runs)} job(s) not submitted", flush=True)
        return 0
    if shutil.which("sbatch") is None:
        fail("sbatch not found: run this on a Slurm login node")
    return submit_runs(runs, manifest, root, manifest)


# -- status ---------------------------------------------------------------------------------------------------
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
    manifest = load_manifest(root)
    counts = so.cell_counts(rv.planned(manifest), rows)
    missing, orphaned = sum(r["state"] == rv.UNSUBMITTED for r in rows), rv.orphans(rows)
    hint = [f"{missing} run(s) planned but never submitted (a submission stopped part way): python -m common.sweep "
            f"resume {root}"] if missing else []
    hint += [*orphaned, f"resume them in place: python -m common.sweep resume {root}"] if orphaned else []
    if not a.json:
        so.print_table(rows, root)
        print("\n".join([*so.format_cell_counts(counts), *hint]), flush=True)
    code, until = so.until_status(root, width, exit_code(rows), a.json) if width else (exit_code(rows), None)
    if a.json:
        print(json.dumps({"results_dir": str(root), "runs": rows, "cells": counts, "until": until,
                          "unsubmitted": missing, "orphaned_checkpoints": orphaned}, indent=1))
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
    sl.slurm_launch_flags(s)  # --hvd-launch
    so.add_options(s)
    sa.add_options(s)
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
    rs = sub.add_parser("resume", help="submit the runs never submitted, and again the failed or cancelled ones "
                                       "(each from its checkpoint), in place")
    rs.add_argument("results_dir", metavar="DIR", help="the sweep directory given to submit --results")
    rs.add_argument("--dry-run", action="store_true", help="say what would be submitted; submit nothing")
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(sys.argv[1:] if argv is None else argv)
    return {"submit": submit, "extend": extend, "status": status, "resume": resume_sweep}[a.command](a)
