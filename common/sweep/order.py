"""Repeated, interleaved sweeps (``common.sweep submit --repeats R``): the submission order and the per-cell count.

A cell is one backend (or variant) at one size. R repeats of every cell are submitted round by round: each round
is a permutation of the cells, shuffled with a seeded generator (``--order-seed``, recorded in the manifest), a
different order each round, and the first job of a round never repeats the cell of the previous round's last job
(when there are at least two cells), so consecutive jobs always change cell: a drift of the machine over the sweep
(another job's traffic, a thermal state, a file system's load) spreads over every cell instead of biasing one.
``status --until 5%`` adds the report's convergence check (common.report.converge: every cell's 95% interval of the
median within 5% of it, never before 6 repeats) to the status; exit 4 when every run finished but a cell is not yet
within it (more rounds needed), else status' own exit. ``extend DIR --rounds K`` then submits K more rounds
(``more_rounds``: the order continues the seeded one, as if submit had been given R + K repeats) into the same
manifest, up to its cap ``max_repeats`` (``submit --max-repeats``, default 12). No TensorFlow here.
"""

from __future__ import annotations

import argparse
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common.core.text import text_table
from common.sweep import layout

DEFAULT_MAX_REPEATS = 12  # submit --max-repeats: the cap of `extend`
EXIT_NOT_CONVERGED = 4  # status --until: every run finished, a cell is not yet within the width
SRUN_MPI = ("pmix", "pmi2", "pmix_v4", "none")  # srun --mpi types of the Horovod launch (jobs/slurm/env.sh)


def interleave(cells: Sequence[str], repeats: int, seed: int) -> list[tuple[str, int]]:
    """(cell, round) of every job in submission order: ``repeats`` rounds, each a seeded permutation of ``cells``;
    consecutive jobs differ in cell across round boundaries too (when there are >= 2 cells)."""
    if repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {repeats}")
    if len(set(cells)) != len(cells):
        raise ValueError(f"cells are not distinct: {list(cells)}")
    rng = random.Random(seed)
    out: list[tuple[str, int]] = []
    for rnd in range(repeats):
        perm = list(cells)
        rng.shuffle(perm)
        if out and len(perm) > 1 and perm[0] == out[-1][0]:
            k = rng.randrange(1, len(perm))
            perm[0], perm[k] = perm[k], perm[0]
        out += [(c, rnd) for c in perm]
    return out


def ordered_runs(cells: Sequence[dict[str, Any]], repeats: int, seed: int | None) -> list[dict[str, Any]]:
    """The runs of a sweep from its cells (planned runs of one repeat, in size x variant order): unchanged for one
    repeat without a seed; else interleaved, each named ``<cell>-r<round>`` (rounds from 1) into its own directory
    and log, with ``cell``, ``round`` and ``order`` (0-based submission position) recorded."""
    if repeats == 1 and seed is None:
        return [{**c, "cell": c["name"], "round": 1, "order": i} for i, c in enumerate(cells)]
    by_name = {c["name"]: c for c in cells}
    out = []
    for i, (cell, rnd) in enumerate(interleave(list(by_name), repeats, seed or 0)):
        name = f"{cell}-r{rnd + 1}"
        out.append({**by_name[cell], "name": name, "results_dir": name, "log": f"logs/{name}-%j.out", "cell": cell,
                    "round": rnd + 1, "order": i})
    return out


def cell_counts(runs: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """cell -> {"done", "failed", "pending", "unsubmitted", "of"} from the sweep's planned runs and their status
    rows (same order): failed counts unknown runs (Slurm forgot them and there is no result), pending counts running
    ones, unsubmitted the planned runs never submitted."""
    out: dict[str, dict[str, int]] = {}
    for run, row in zip(runs, rows, strict=True):
        c = out.setdefault(run.get("cell", run["results_dir"]),
                           {"done": 0, "failed": 0, "pending": 0, "unsubmitted": 0, "of": 0})
        c["of"] += 1
        c[{"finished": "done", "failed": "failed", "unknown": "failed", "unsubmitted": "unsubmitted"}.get(
            row["state"], "pending")] += 1
    return out


def format_cell_counts(counts: dict[str, dict[str, int]]) -> list[str]:
    width = max((len(c) for c in counts), default=4)
    return [f"{cell.ljust(width)}  done {c['done']}/{c['of']}, failed {c['failed']}, pending {c['pending']}"
            + (f", never submitted {c['unsubmitted']}" if c.get("unsubmitted") else "") for cell, c in counts.items()]


def print_table(rows: list[dict[str, Any]], root: Path) -> None:
    head = ("backend", "size", "layout", "job", "state", "slurm", "result / detail")
    lines = []
    for r in rows:
        where = (os.path.relpath(r["results"][-1], root) if r["results"] else
                 f"{r['detail']}; log {os.path.relpath(r['log'], root)}" if r["state"] == "failed" else r["detail"])
        name = r["backend"] if r["variant"] == r["backend"] else f"{r['variant']} ({r['backend']})"
        lines.append((name, str(r["size"]), r["layout"], str(r["job_id"] or "-"), r["state"], r["slurm_state"] or "-",
                      where))
    print("\n".join(text_table([head, *lines])))
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    print(f"{len(rows)} run(s): " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())), flush=True)


def add_options(s: argparse.ArgumentParser) -> None:
    """``submit``'s repeat and launch options."""
    s.add_argument("--repeats", type=int, default=1, help="runs per cell (backend x layout), interleaved round robin")
    s.add_argument("--max-repeats", type=int, default=None, metavar="N",
                   help=f"the most rounds `extend` may bring the sweep to (default {DEFAULT_MAX_REPEATS}, at least "
                        "--repeats; recorded)")
    s.add_argument("--order-seed", type=int, default=None, help="seed of the rounds' order (default 0; recorded)")
    s.add_argument("--hint", default=os.environ.get("TWINBENCH_HINT", "nomultithread"),
                   help="srun --hint=... in the scripts (default nomultithread; '' = none): TWINBENCH_HINT")
    s.add_argument("--srun-mpi", choices=SRUN_MPI, default=os.environ.get("TWINBENCH_SRUN_MPI", "pmix"),
                   help="srun --mpi=... of the Horovod launch (default pmix): TWINBENCH_SRUN_MPI")
    s.add_argument("--module-purge", action="store_true",
                   help="module purge before module load in the scripts: TWINBENCH_MODULE_PURGE=1")


def launch_env(a: argparse.Namespace) -> dict[str, str]:
    """The environment the sbatch scripts read for the launch (jobs/slurm/env.sh), exported to every job."""
    launches = layout.slurm_launches()
    out = {launches[b].slurm_variable or "": name for b, name in layout.chosen_launchers(a).items()}
    out.update({"TWINBENCH_SRUN_MPI": a.srun_mpi, "TWINBENCH_HINT": a.hint})
    if a.module_purge:
        out["TWINBENCH_MODULE_PURGE"] = "1"
    return out


def add_status_options(st: argparse.ArgumentParser) -> None:
    """``status``'s convergence option."""
    st.add_argument("--until", metavar="WIDTH", default=None,
                    help="also check whether every cell's 95%% interval of its median is within WIDTH (5%% or 0.05) "
                         f"of it (needs 6 runs per cell); exit {EXIT_NOT_CONVERGED} when every run finished but a "
                         "cell is not yet within it")


def until_width(text: str | None) -> float | None:
    """``--until``'s width as a fraction, None without it; ValueError (one line) on a bad one."""
    from common.report.converge import parse_width

    return None if text is None else parse_width(text)


def until_status(root: Path, width: float, code: int, as_json: bool) -> tuple[int, dict[str, Any]]:
    """The convergence check of the sweep's results so far (printed unless ``as_json``), and the exit status:
    ``code`` (status' own) unless it is 0, then 0 when every cell is within ``width``, else EXIT_NOT_CONVERGED."""
    from common.report.build import load_set
    from common.report.converge import check, converged, format_checks, verdict
    from common.report.summary import summarize

    runs = load_set([root], warn=lambda m: None) if root.is_dir() else []
    checks = check(summarize(runs), width) if runs else []
    done = converged(checks)
    lines = format_checks(checks, width) if checks else [f"no results yet to check against --until {100 * width:g}%"]
    if not as_json:
        print("\n".join(lines), flush=True)
    out = {"width": width, "converged": done, "verdict": verdict(checks, width) if checks else lines[-1],
           "cells": [{"cell": c.cell, "runs": c.repeats, "median": c.median, "width": c.width,
                      "converged": c.converged} for c in checks]}
    return (code if code else 0 if done else EXIT_NOT_CONVERGED), out


def repeats_cap(repeats: int, max_repeats: int | None) -> int:
    """The manifest's ``max_repeats``: ``--max-repeats`` (at least ``--repeats``), else max(12, repeats)."""
    if max_repeats is None:
        return max(DEFAULT_MAX_REPEATS, repeats)
    if max_repeats < repeats:
        raise ValueError(f"--max-repeats ({max_repeats}) is below --repeats ({repeats})")
    return max_repeats


def more_rounds(manifest: dict[str, Any], rounds: int) -> list[dict[str, Any]]:
    """The runs of ``rounds`` more rounds of the manifest's cells, not yet submitted: the rounds that ``submit
    --repeats R+rounds`` (same seed) would have submitted after its first R, each run like its cell's first one.
    ValueError (one line) past the cap, on an incomplete round, or when a cell has no run to copy."""
    if rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {rounds}")
    runs = manifest["runs"]
    names = manifest.get("cells") or [f"{v['label']}-n{size}" for size in manifest["sizes"]
                                      for v in manifest["variants"]]  # a manifest from before "cells"
    done = max((int(r.get("round", 1)) for r in runs), default=0)
    cap = int(manifest.get("max_repeats") or max(DEFAULT_MAX_REPEATS, done))
    if done + rounds > cap:
        raise ValueError(f"--rounds {rounds}: the sweep has {done} round(s) and its cap is {cap} "
                         "(submit --max-repeats)")
    if len(runs) != done * len(names):
        raise ValueError(f"the sweep's {done} round(s) should hold {done * len(names)} runs, the manifest has "
                         f"{len(runs)} (a submission stopped part way?): `python -m common.sweep resume DIR` "
                         "submits the missing ones first")
    first: dict[str, dict[str, Any]] = {}
    for r in runs:
        first.setdefault(r.get("cell", r["results_dir"]), r)
    if set(first) != set(names):
        raise ValueError(f"the manifest's runs ({', '.join(first)}) are not its cells ({', '.join(names)})")
    order = interleave(names, done + rounds, manifest.get("order_seed") or 0)[done * len(names):]
    out = []
    for i, (cell, rnd) in enumerate(order):
        name = f"{cell}-r{rnd + 1}"
        template = {k: v for k, v in first[cell].items() if k not in ("sbatch", "submitted_at")}
        out.append({**template, "name": name, "results_dir": name, "log": f"logs/{name}-%j.out", "job_id": None,
                    "cell": cell, "round": rnd + 1, "order": len(runs) + i})
    return out
