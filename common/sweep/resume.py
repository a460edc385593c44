"""Finishing a sweep in place: the runs it planned but never submitted (a submission stopped part way: ``sbatch``
refused a job, the login node went away), and the runs that failed or were cancelled, resumed from their checkpoint
when they left one. ``python -m common.sweep resume DIR`` submits both into the same manifest and directories;
``status`` counts the first and names the checkpoints nobody resumes (orphaned). No TensorFlow here.

A sweep's manifest keeps every run it planned (``planned``, written with the first submission; ``extend`` adds its
rounds) beside the runs submitted (``runs``): a planned run is never submitted when no submitted run has its name,
so submitting the missing ones twice is impossible. A manifest from before ``planned`` is read from its ``order``
(every planned cell and round), each missing run made like its cell's first submitted one.

A run's checkpoint is ``RESULTS/<run>/checkpoints/<name>/meta.json`` (common/training/reliability.py writes
``meta.json`` last, so it marks a complete one); the run, started again with the same results directory, resumes
from it. A checkpoint is orphaned when its run has no results JSON and is neither pending nor running.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from common.sweep.layout import SweepError

UNSUBMITTED = "unsubmitted"  # the state of a planned run no job was submitted for


def planned(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """Every run the sweep planned, in submission order (job ids of the submitted ones filled in)."""
    runs = manifest["runs"]
    by_name = {r.get("name", r["results_dir"]): r for r in runs}
    if manifest.get("planned") is not None:
        return [by_name.get(p["name"], p) for p in manifest["planned"]]
    first: dict[str, dict[str, Any]] = {}
    for r in runs:
        first.setdefault(r.get("cell", r["results_dir"]), r)
    out = []
    by_round = {(r.get("cell", r["results_dir"]), int(r.get("round", 1))): r for r in runs}
    for o in manifest.get("order") or []:
        cell, rnd = o["cell"], int(o["round"])
        plain = rnd == 1 and manifest.get("order_seed") is None  # one repeat, no seed: runs named by their cell
        name = cell if plain else f"{cell}-r{rnd}"
        if (cell, rnd) in by_round:
            out.append(by_round[(cell, rnd)])
        elif cell in first:
            template = {k: v for k, v in first[cell].items() if k not in ("sbatch", "submitted_at", "previous_jobs")}
            out.append({**template, "name": name, "results_dir": name, "log": f"logs/{name}-%j.out", "job_id": None,
                        "round": rnd})
        else:
            out.append({"name": name, "cell": cell, "round": rnd, "job_id": None, "results_dir": name,
                        "log": f"logs/{name}-%j.out", "backend": "?", "size": 0, "template": False})
    return out or list(runs)


def never_submitted(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The planned runs no job was submitted for."""
    return [r for r in planned(manifest) if not r.get("job_id")]


def unsubmitted_row(run: dict[str, Any], root: Path) -> dict[str, Any]:
    """A status row for a planned run never submitted."""
    return {"backend": run["backend"], "variant": run.get("variant", run["backend"]), "size": run["size"],
            "layout": run.get("layout") or "-", "job_id": None, "state": UNSUBMITTED, "slurm_state": None,
            "detail": "never submitted", "results": [], "log": str(root / run["log"]), "checkpoint": None}


def checkpoint(rdir: Path) -> dict[str, Any] | None:
    """The newest complete checkpoint in a run's results directory: {"path", "step"}, or None."""
    found = []
    for meta in rdir.glob("checkpoints/*/meta.json"):
        try:
            step = json.loads(meta.read_text()).get("step")
        except (OSError, ValueError, AttributeError):
            continue
        found.append((meta.stat().st_mtime, str(meta.parent), step))
    if not found:
        return None
    _, path, step = max(found)
    return {"path": path, "step": step}


def orphans(rows: list[dict[str, Any]]) -> list[str]:
    """A line per checkpoint no run is resuming: its run failed (or Slurm forgot it) without a results JSON."""
    return [f"orphaned checkpoint: {r['checkpoint']['path']} (step {r['checkpoint']['step']}; job {r['job_id']} "
            f"{r['slurm_state'] or r['state']})" for r in rows
            if r.get("checkpoint") and r["state"] in ("failed", "unknown")]


def to_resume(manifest: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs ``resume`` submits, in plan order: never submitted, then failed or unknown (into the same results
    directory, from its checkpoint when there is one). SweepError when a missing run cannot be made (its cell has
    no submitted run to copy, in a manifest from before ``planned``)."""
    out = []
    for run, row in zip(planned(manifest), rows, strict=True):  # by run: one allocation's runs share a job id
        if run.get("template") is False:
            raise SweepError(f"cell {run['cell']} was never submitted and this manifest (from before `planned`) has "
                             "no run of it to copy: submit it by hand")
        if not run.get("job_id") or row["state"] in ("failed", "unknown"):
            out.append({**run, "log": f"logs/{run['name']}-%j.out"})  # its own log, not the failed job's
    return out
