"""Horovod's documented tuning knobs as flags of ``backends.horovod``: each sets the environment variable Horovod
reads in ``hvd.init()``, and the value in effect is read back the way Horovod parses it. No TensorFlow, no Horovod.

Variable names, defaults and parsing are Horovod 0.28.1's, ``horovod/common/operations.cc`` (BackgroundThreadLoop):
HOROVOD_FUSION_THRESHOLD (line 519: default ``128 * 1024 * 1024`` bytes; line 522: ``strtol``),
HOROVOD_CYCLE_TIME (line 527: default 1 ms; lines 529-533: 0 ms when HOROVOD_ENABLE_XLA_OPS is on; line 539:
``strtof``), HOROVOD_CACHE_CAPACITY (``horovod/common/global_state.h`` line 89: ``cache_capacity = 1024``;
operations.cc lines 546-548: ``strtol`` into a uint32, 0 disables the cache), HOROVOD_HIERARCHICAL_ALLREDUCE
(lines 567-571: off unless ``strtol > 0``, and only when not all ranks share one node; lines 574-577: only with
NCCL or DDL GPU allreduce), HOROVOD_AUTOTUNE and HOROVOD_AUTOTUNE_LOG (lines 628-636: on when ``strtol > 0``; the
log is rank 0's). ``horovodrun`` sets the same variables from its own flags
(``horovod/runner/common/util/config_parser.py`` lines 168-177); a flag given here wins.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from backends import horovod_launch
from common.core.contract import Knob, Launch

MIB = 1024 * 1024
XLA_OPS = "HOROVOD_ENABLE_XLA_OPS"  # changes the cycle time's default (not a knob here)


# -- parsing as Horovod's C++ does -------------------------------------------------------------------------------
_INT = re.compile(r"\s*([+-]?\d+)")
_FLOAT = re.compile(r"\s*([+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|inf(?:inity)?|nan))", re.I)


def c_strtol(text: str) -> int:
    """``std::strtol(text, nullptr, 10)``: the leading integer, 0 when there is none ("abc", "")."""
    m = _INT.match(text)
    return int(m.group(1)) if m else 0


def c_strtof(text: str) -> float:
    """``std::strtof(text, nullptr)``: the leading decimal number, 0.0 when there is none."""
    m = _FLOAT.match(text)
    return float(m.group(1)) if m else 0.0


# -- flags' types ---------------------------------------------------------------------------------------------
def _mebibytes(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not v >= 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a size in MiB >= 0 (0 = no fusion), got {text!r}")
    return v


def _milliseconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = 0.0
    if not 0 < v < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a time in ms > 0, got {text!r}")
    return v


def _capacity(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = -1
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0 (0 = no cache), got {text!r}")
    return v


# -- the table: one row per knob ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    """One Horovod knob: its variable, its flag and how the record and the report say it. The flags
    (``add_arguments``), the variables they set (``KnobFlags.variables``), the variables read back (``VARIABLES``,
    ``snapshot``) and the record's knobs (``knobs``) are all made from ``TABLE``."""

    env: str  # the HOROVOD_* variable Horovod reads in hvd.init
    flag: str  # backends.horovod's flag that sets it
    type: Callable[[str], Any] | None  # the flag's argparse type; None: a switch (given = on)
    default: Any  # Horovod's own value when the variable is unset, as the record says it
    label: Callable[[Any], str] | None  # how a report row names a value; None: a flag only, no knob in the record
    read: Callable[[str], Any]  # the variable's text as Horovod's C++ parses it
    write: Callable[[Any], str]  # a flag's value as the variable's text, as horovodrun writes it
    help: str
    metavar: str | None = None
    name: str | None = None  # the record's key (None when ``label`` is None)
    # (variable, value): Horovod's default becomes value when that variable is on (strtol > 0)
    default_if: tuple[str, Any] | None = None

    @property
    def dest(self) -> str:
        """The flag's argparse destination (and the ``KnobFlags`` key)."""
        return self.flag.lstrip("-").replace("-", "_")

    def default_in(self, environ: Mapping[str, str]) -> Any:
        if self.default_if is not None and c_strtol(environ.get(self.default_if[0]) or "0") > 0:
            return self.default_if[1]
        return self.default


def _on(text: str) -> bool:
    return c_strtol(text) > 0


TABLE: tuple[Row, ...] = (
    Row("HOROVOD_FUSION_THRESHOLD", "--fusion-threshold-mb", _mebibytes, 128 * MIB,  # bytes: operations.cc:519
        lambda v: f"fusion {v / MIB:.4g} MiB" if v else "no fusion", c_strtol, lambda mb: str(int(mb * MIB)),
        "tensor fusion buffer in MiB, HOROVOD_FUSION_THRESHOLD (default: the launcher's value, else Horovod's 128; "
        "0 = no fusion)", "MB", "fusion_threshold_bytes"),
    Row("HOROVOD_CYCLE_TIME", "--cycle-time-ms", _milliseconds, 1.0,  # ms: operations.cc:527 (0 with XLA ops, :533)
        lambda v: f"cycle {v:g} ms", c_strtof, str,  # str: the shortest exact text, strtof reads it back
        "ms between fusion cycles, HOROVOD_CYCLE_TIME (default: the launcher's value, else Horovod's 1)", "MS",
        "cycle_time_ms", default_if=(XLA_OPS, 0.0)),
    Row("HOROVOD_CACHE_CAPACITY", "--cache-capacity", _capacity, 1024,  # tensor names: global_state.h:89
        lambda v: f"cache {v}" if v else "no response cache", lambda t: c_strtol(t) % 2**32, str,  # a uint32
        "response cache entries, HOROVOD_CACHE_CAPACITY (default: the launcher's value, else Horovod's 1024; 0 = no "
        "cache)", "N", "cache_capacity"),
    Row("HOROVOD_HIERARCHICAL_ALLREDUCE", "--hierarchical-allreduce", None, False,
        lambda v: "hierarchical allreduce" if v else "no hierarchical allreduce", _on, lambda _: "1",
        "HOROVOD_HIERARCHICAL_ALLREDUCE=1 (default off; Horovod applies it only across nodes, with NCCL)",
        name="hierarchical_allreduce"),
    Row("HOROVOD_AUTOTUNE", "--autotune", None, False, lambda v: "autotune" if v else "no autotune", _on, lambda _: "1",
        "HOROVOD_AUTOTUNE=1: Horovod tunes fusion and cycle time while training (default off); values set here stay "
        "fixed", name="autotune"),
    Row("HOROVOD_AUTOTUNE_LOG", "--autotune-log", str, None, None, str,
        os.path.abspath,  # rank 0's working directory may differ
        "HOROVOD_AUTOTUNE_LOG: rank 0 writes every autotune trial there (needs --autotune)", "FILE"),
)


VARIABLES = (*(r.env for r in TABLE), XLA_OPS)  # what knobs() reads back
BY_DEST = {r.dest: r for r in TABLE}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The knob flags; absent, Horovod's own value (its default, or what the launcher exported) stays."""
    g = p.add_argument_group("Horovod tuning (each sets its HOROVOD_* variable on every rank before hvd.init)")
    for r in TABLE:
        if r.type is None:
            g.add_argument(r.flag, action="store_true", help=r.help)
        else:
            g.add_argument(r.flag, type=r.type, default=None, metavar=r.metavar, help=r.help)


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with the knob flags taken together (one line), or None."""
    if args.autotune_log is not None and not args.autotune:
        return "--autotune-log needs --autotune (Horovod writes the log only while autotuning)"
    return None


@dataclass(frozen=True)
class KnobFlags:
    """The knob flags given, by ``Row.dest`` (a flag not given, None or a switch off, is absent: the environment's
    value or Horovod's default stays)."""

    given: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> KnobFlags:
        return cls(tuple((r.dest, v) for r in TABLE if (v := getattr(args, r.dest)) is not None and v is not False))

    def variables(self) -> dict[str, str]:
        """The HOROVOD_* variables these flags set, written as horovodrun writes them."""
        return {BY_DEST[dest].env: BY_DEST[dest].write(v) for dest, v in self.given}


def launch_rank(environ: Mapping[str, str]) -> int:
    """This process's rank as its launcher exported it (before hvd.init), 0 when none did."""
    return Launch(horovod_launch.LAUNCHERS).rank(environ) or 0


def apply(flags: KnobFlags, environ: MutableMapping[str, str], prog: str) -> list[str]:
    """Set the flags' variables in ``environ`` (call before hvd.init); returns the launcher's values they replaced
    ("NAME=old -> new"), said once, on the process the launcher calls rank 0."""
    replaced = []
    for name, value in flags.variables().items():
        old = environ.get(name)
        if old is not None and old != value:
            replaced.append(f"{name}={old} -> {value}")
        environ[name] = value
    if replaced and launch_rank(environ) == 0:
        print(f"[{prog}] flags override the launcher's environment: {'; '.join(replaced)}", file=sys.stderr,
              flush=True)
    return replaced


# -- what is in effect -----------------------------------------------------------------------------------------
def knobs(environ: Mapping[str, str]) -> list[Knob]:
    """The knobs as Horovod reads ``environ`` at init: a variable set (by a flag, the user or the launcher) is
    parsed as its C++ parses it, an unset one is Horovod's default."""
    out = []
    for r in TABLE:
        if r.label is None or r.name is None:
            continue
        default = r.default_in(environ)
        value = r.read(text) if (text := environ.get(r.env)) is not None else default
        out.append(Knob(r.name, value, default, r.label(value)))
    return out


def hierarchical_asked(environ: Mapping[str, str]) -> bool:
    """HOROVOD_HIERARCHICAL_ALLREDUCE is on in ``environ`` (Horovod may still not apply it: see the module doc)."""
    row = BY_DEST["hierarchical_allreduce"]
    return bool(row.read(environ.get(row.env) or "0"))


def snapshot(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables ``knobs`` reads, as they are (taken right before hvd.init)."""
    return {k: environ[k] for k in VARIABLES if k in environ}
