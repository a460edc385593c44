"""A sweep's plan and its manifest: every run of a submission (variant x size x layout, in interleaved rounds)
with the sbatch resources it gets, the manifest header that records them, and reading a manifest back.
No TensorFlow here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from common import cli
from common.core import registry
from common.core import results as res
from common.sweep import allocation as sa
from common.sweep import layout as sl
from common.sweep import order as so
from common.sweep import variants as sv
from common.sweep.layout import SweepError
from common.workload import argcheck
from common.workload.job import JobError, load_job

PROG = "common.sweep"  # the command, as its messages name it
MANIFEST = "sweep-manifest.json"
MANIFEST_KIND = "sweep"


def sbatch_script(backend: str) -> Path:
    """``backend``'s sbatch script, relative to the repository: its registry line as it is now (read when used, so
    a backend registered after this module was imported has one too)."""
    return Path(registry.entry(backend).slurm_script)


def plan(a: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every run of the sweep (not yet submitted) and the manifest header; SweepError on bad input."""
    sizes = sl.parse_sizes(a.sizes)
    sa.check_options(a)
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
        argcheck.refuse(job, cli.REPO, paths=not a.skip_data_check,  # the ranks start in the repository (--chdir)
                        path_hint=" (or pass --skip-data-check if the data is only visible on compute nodes)")
        from common.workload import data as data_mod

        if not a.skip_data_check and not data_mod.streams(job):  # an input function runs only in the ranks
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
        raise SweepError(f"{results / MANIFEST} exists: {results} already holds a sweep; use a new --results dir (or "
                         f"finish that one: python -m common.sweep resume {results})")
    if results.exists() and not results.is_dir():
        raise SweepError(f"--results {str(results)!r} is not a directory")
    for b in chosen:
        if not (cli.REPO / sbatch_script(b)).is_file():
            raise SweepError(f"{cli.REPO / sbatch_script(b)} is missing")
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
        "launchers": sl.chosen_launchers(a),  # each backend's Slurm launcher, where its script has a choice
        "serial": a.serial,
        "one_allocation": a.one_allocation,  # every run a job step of one job (per --rounds-per-job rounds)
        "rounds_per_job": a.rounds_per_job,  # None: every round in one job
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

