"""Software versions across runs: the Environment line's data, and the mix that makes a comparison suspect.

A comparison mixes versions when its runs differ in one of ``COMPARED`` (numpy is recorded, not compared). A
key a run's ``versions`` lacks counts as "unknown", but only for backends that record that key at all: a key no
run of a backend records is a package that backend does not use (``common.core.results.versions()`` lists imported
modules only), and a key missing in every run is no difference.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from common.core.results import RunRecord
from common.report.base import fmt_value

COMPARED = ("python", "tensorflow", "tf_keras", "horovod", "horovod_patch")  # keys that must agree
UNKNOWN = "unknown"  # shown for a compared key a run did not record


def versions_by_key(runs: Sequence[RunRecord]) -> dict[str, dict[str, set[str]]]:
    """version key -> value -> backends that ran with it (keys in the order first recorded)."""
    out: dict[str, dict[str, set[str]]] = {}
    for r in runs:
        if isinstance(r.versions, dict):
            for k, v in r.versions.items():
                out.setdefault(str(k), {}).setdefault(fmt_value(v), set()).add(r.backend)
    return out


def _natural(value: str) -> tuple[bool, list[Any]]:
    """Sort key: "unknown" last, numbers in versions compared as numbers (2.9 before 2.18)."""
    parts = re.split(r"(\d+)", value)
    return value == UNKNOWN, [int(p) if i % 2 else p for i, p in enumerate(parts)]


def version_mix(runs: Sequence[RunRecord]) -> list[str]:
    """``"key v1 vs v2"`` for every compared key whose values differ across ``runs`` (empty: no mix)."""
    out = []
    for key in COMPARED:
        users = {r.backend for r in runs if isinstance(r.versions, dict) and key in r.versions}
        values = set()
        for r in runs:
            if r.backend in users:
                vers = r.versions
                values.add(fmt_value(vers[key]) if isinstance(vers, dict) and key in vers else UNKNOWN)
        if len(values) > 1:
            out.append(f"{key} {' vs '.join(sorted(values, key=_natural))}")
    return out


def mix_message(name: str, job_hash: str, mix: Sequence[str]) -> str:
    """The start of the one-line refusal or warning about a mix of versions in one job's comparison."""
    return f"runs of job {name!r} ({job_hash}) mix versions: {'; '.join(mix)}"
