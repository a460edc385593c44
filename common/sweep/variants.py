"""The sweep's variants: ``--variant LABEL=BACKEND[:ARGS]`` names one way of running a backend (its flags), so that
one submission compares several, each at every world size on identical resources. No TensorFlow here.

Without ``--variant`` every chosen backend is one variant, labelled by its name, with no extra flags: the sweep
then runs what it always ran, in the directories it always used (``BACKEND-nSIZE``).
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from common.core import registry

LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a directory and Slurm job name part: no spaces, no slashes
RESERVED = ("logs",)  # the sweep directory's own entries


@dataclass(frozen=True)
class Variant:
    """One backend with its own flags, run at every size; ``label`` names its runs and results directories."""

    label: str
    backend: str
    args: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {"label": self.label, "backend": self.backend, "args": list(self.args)}


def parse_variant(text: str) -> Variant:
    """``LABEL=BACKEND[:ARGS]`` (ARGS split as a shell would); ValueError with a one-line message when malformed."""
    label, sep, rest = text.partition("=")
    label = label.strip()
    if not sep or not label:
        raise ValueError(f"--variant {text!r}: expected LABEL=BACKEND[:ARGS] (e.g. t2=BACKEND:--threads 2)")
    if not LABEL.fullmatch(label) or label in RESERVED:
        raise ValueError(f"--variant {text!r}: label {label!r} must be letters, digits, '.', '_' or '-' (not "
                         f"starting with one of the last three) and not {' or '.join(RESERVED)}")
    name, _, args = rest.partition(":")
    name = name.strip()
    if name not in registry.REGISTRY:
        raise ValueError(f"--variant {text!r}: unknown backend {name!r} (choose from {', '.join(registry.names())})")
    try:
        return Variant(label, name, tuple(shlex.split(args)))
    except ValueError as e:  # unbalanced quotes
        raise ValueError(f"--variant {text!r}: cannot split its flags ({e})") from None


def parse_variants(texts: Sequence[str]) -> list[Variant]:
    """Every --variant, labels unique; ValueError on the first problem."""
    out = [parse_variant(t) for t in texts]
    seen: set[str] = set()
    for v in out:
        if v.label in seen:
            raise ValueError(f"--variant: label {v.label!r} is used twice")
        seen.add(v.label)
    return out


def default_variants(chosen: Sequence[str]) -> list[Variant]:
    """One variant per backend, labelled by its name, with no flags of its own (the sweep without --variant)."""
    return [Variant(b, b) for b in chosen]


def check_flags(v: Variant, common: Sequence[str]) -> None:
    """The backend's own parser must accept ``common + v.args`` (a flag another backend owns, a bad value): else
    ValueError with its one-line message, before anything is submitted. Imports the backend module, not TensorFlow."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            registry.load(v.backend).parser().parse_args([*common, *v.args])
    except SystemExit as e:
        lines = err.getvalue().strip().splitlines() or [f"exit {e.code}"]
        msg = lines[-1].split(": error: ", 1)[-1].removesuffix(" (see --help)")
        raise ValueError(f"--variant {v.label}: {v.backend} refuses its flags: {msg}") from None
