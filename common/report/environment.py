"""The end of a job's report.md section: the Machine and Environment sections and the list of run files, with
paths relative to the results directory and no home directory."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from common.core.results import RunRecord
from common.report.base import NA
from common.report.machines import format_machines
from common.report.rows import JobSummary, order_backends, row_label
from common.report.versions import versions_by_key


def md_escape(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def distinct(values: Iterable[str], limit: int = 12) -> str:
    """The distinct values as code spans, in first-seen order, at most ``limit`` of them."""
    seen = list(dict.fromkeys(values))
    if not seen:
        return NA
    more = f", … and {len(seen) - limit} more" if len(seen) > limit else ""
    return ", ".join(f"`{v}`" for v in seen[:limit]) + more


def _rank_strings(per_run: Iterable[list[str] | None]) -> list[str]:
    """The per-rank strings (hosts, devices) of every run, in order."""
    return [str(x) for v in per_run if isinstance(v, list) for x in v]


def binding_mix(runs: Sequence[RunRecord]) -> str | None:
    """"native: self; horovod: none" when a job's runs were bound differently (``topology.cpu_bind``: who bound
    each rank), else None; runs that predate the record count as "unknown"."""
    seen: dict[str, set[str]] = {}
    for r in runs:
        how = (r.topology or {}).get("cpu_bind") or ["unknown"]
        seen.setdefault(str(r.backend), set()).update(str(x) for x in how)
    if len({frozenset(v) for v in seen.values()}) <= 1 and all(len(v) == 1 for v in seen.values()):
        return None
    return "; ".join(f"{b}: {', '.join(sorted(v))}" for b, v in sorted(seen.items()))


HOME_PATTERN = re.compile(r"(?:/home|/Users)/[^/\s'\"]+|/root(?=/|\s|$|['\"])")  # home directories on Linux,
# macOS and root's: the report names none, whoever made the runs


def shorten_paths(text: str, results_dir: Path | None = None) -> str:
    """``text`` with the results directory written "." and any home directory "~": the report's paths are relative
    to the results directory and name no home."""
    if results_dir is not None:
        for d in dict.fromkeys((str(results_dir.resolve()), str(results_dir.absolute()))):
            text = re.sub(re.escape(d.rstrip("/")) + r"(?=/|\s|$|['\"=,:])", ".", text)
    home = str(Path.home()).rstrip("/")
    if home not in ("", "/"):
        text = re.sub(re.escape(home) + r"(?=/|\s|$|['\"=,:])", "~", text)
    return HOME_PATTERN.sub("~", text)


def short_command(cmd: Sequence[Any], results_dir: Path | None = None) -> str:
    """A recorded command line as shell words, the interpreter by its name (its path is the environment's: the
    versions line says which Python) and paths shortened (``shorten_paths``)."""
    words = [str(c) for c in cmd]
    if words and "/" in words[0] and Path(words[0]).name.startswith("python"):
        words[0] = Path(words[0]).name
    return shorten_paths(shlex.join(words), results_dir)


def environment_section(s: JobSummary, h: str, results_dir: Path | None = None) -> list[str]:
    """Versions, hosts, devices, backend_info, run period and an example command per backend (paths relative to
    the results directory, no home directory)."""
    runs = s.records
    labels = order_backends({r.identity.plain for r in s.rows})  # row labels without their machine part
    lines = [f"{h}# Environment", ""]
    parts = []
    for k, vals in versions_by_key(runs).items():
        if len(vals) == 1:
            parts.append(f"{k} {next(iter(vals))}")
        else:
            parts.append(f"{k} DIFFERS: " + ", ".join(f"{v} ({', '.join(order_backends(bs))})"
                                                      for v, bs in sorted(vals.items())))
    lines.append(f"- versions: {'; '.join(parts) or NA}")
    lines.append(f"- hosts: {distinct(_rank_strings(r.hosts for r in runs))}")
    lines.append(f"- devices: {distinct(_rank_strings(r.devices for r in runs))}")
    for b in labels:
        infos = [shorten_paths(json.dumps(r.backend_info, sort_keys=True), results_dir) for r in runs
                 if row_label(r) == b and isinstance(r.backend_info, dict)]
        shown = [i if len(i) <= 300 else i[:297] + "..." for i in dict.fromkeys(infos)]
        lines.append(f"- backend_info ({b}): {distinct(shown, limit=4)}")
    starts = sorted(str(r.started_at) for r in runs if r.started_at)
    ends = sorted(str(r.finished_at) for r in runs if r.finished_at)
    if starts or ends:
        lines.append(f"- runs from {starts[0] if starts else '?'} to {ends[-1] if ends else '?'}")
    for b in labels:
        cmd = next((r.command for r in runs if row_label(r) == b and isinstance(r.command, list)), None)
        if cmd:
            lines.append(f"- example command ({b}): `{md_escape(short_command(cmd, results_dir))}`")
    return lines + [""]


def machine_section(s: JobSummary, h: str) -> list[str]:
    """One line per distinct machine set the job's runs ran on (common.report.machines)."""
    several = any(r.machine.label for r in s.rows)
    why = (" Runs on different machines never share a row: when the job ran on several CPU or GPU models every row "
           "names its own (and each has its own 1-replica baseline), and a backend whose runs of one size ran on "
           "different node counts names the node count in its rows (the baseline stays its 1-replica run)."
           if several else "")
    order = order_backends({row_label(r) for r in s.records})
    runs = sorted(s.records, key=lambda r: (order.index(row_label(r)), r.world_size))  # lines list them so
    return [f"{h}# Machine", "", f"CPU model x logical cores; GPU (memory, compute capability, driver) or no GPU; "
            f"nodes; CUDA and cuDNN TensorFlow was built with, MPI, the NCCL Horovod was built with; Slurm job.step "
            f"(partition).{why}", "", *(md_escape(line) for line in format_machines(runs, row_label)), ""]


def run_files(s: JobSummary, results_dir: Path | None) -> list[str]:
    """The collapsed list of run files, relative to the results directory."""
    files = []
    for run in sorted(s.runs, key=lambda r: (r.record.backend, r.record.world_size, str(r.path))):
        r, p = run.record, Path(run.path or "?")
        if results_dir is not None:
            try:
                p = p.relative_to(results_dir)
            except ValueError:
                pass
        reps = f"{r.world_size} replica{'' if r.world_size == 1 else 's'}"
        files.append(f"- `{p}`: {row_label(r)}, {reps}, {float(r.images_per_sec):.1f} img/s")
    return ["<details><summary>Run files</summary>", ""] + files + ["", "</details>", ""]


