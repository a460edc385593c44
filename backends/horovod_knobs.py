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
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

from common.core.contract import Knob

MIB = 1024 * 1024
FUSION = "HOROVOD_FUSION_THRESHOLD"
CYCLE = "HOROVOD_CYCLE_TIME"
CACHE = "HOROVOD_CACHE_CAPACITY"
HIERARCHICAL = "HOROVOD_HIERARCHICAL_ALLREDUCE"
AUTOTUNE = "HOROVOD_AUTOTUNE"
AUTOTUNE_LOG = "HOROVOD_AUTOTUNE_LOG"
XLA_OPS = "HOROVOD_ENABLE_XLA_OPS"  # changes the cycle time's default (not a knob here)
VARIABLES = (FUSION, CYCLE, CACHE, HIERARCHICAL, AUTOTUNE, AUTOTUNE_LOG, XLA_OPS)  # what knobs() reads back
FUSION_DEFAULT = 128 * MIB  # bytes: operations.cc:519
CYCLE_DEFAULT = 1.0  # ms: operations.cc:527 (0 with HOROVOD_ENABLE_XLA_OPS, operations.cc:533)
CACHE_DEFAULT = 1024  # tensor names: global_state.h:89
# Where a launcher puts this process's rank before hvd.init (gloo_run, Open MPI, PMIx, MPICH/PMI, srun)
RANK_VARIABLES = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")


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


# -- flags ---------------------------------------------------------------------------------------------------------
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The knob flags; absent, Horovod's own value (its default, or what the launcher exported) stays."""
    g = p.add_argument_group("Horovod tuning (each sets its HOROVOD_* variable on every rank before hvd.init)")
    g.add_argument("--fusion-threshold-mb", type=_mebibytes, default=None, metavar="MB",
                   help="tensor fusion buffer in MiB, HOROVOD_FUSION_THRESHOLD (default: the launcher's value, else "
                        "Horovod's 128; 0 = no fusion)")
    g.add_argument("--cycle-time-ms", type=_milliseconds, default=None, metavar="MS",
                   help="ms between fusion cycles, HOROVOD_CYCLE_TIME (default: the launcher's value, else "
                        "Horovod's 1)")
    g.add_argument("--cache-capacity", type=_capacity, default=None, metavar="N",
                   help="response cache entries, HOROVOD_CACHE_CAPACITY (default: the launcher's value, else Horovod's "
                        "1024; 0 = no cache)")
    g.add_argument("--hierarchical-allreduce", action="store_true",
                   help="HOROVOD_HIERARCHICAL_ALLREDUCE=1 (default off; Horovod applies it only across nodes, with "
                        "NCCL)")
    g.add_argument("--autotune", action="store_true",
                   help="HOROVOD_AUTOTUNE=1: Horovod tunes fusion and cycle time while training (default off); "
                        "values set here stay fixed")
    g.add_argument("--autotune-log", default=None, metavar="FILE",
                   help="HOROVOD_AUTOTUNE_LOG: rank 0 writes every autotune trial there (needs --autotune)")


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with the knob flags taken together (one line), or None."""
    if args.autotune_log is not None and not args.autotune:
        return "--autotune-log needs --autotune (Horovod writes the log only while autotuning)"
    return None


@dataclass(frozen=True)
class KnobFlags:
    """The knob flags as given (None / False: not given, the environment's value or Horovod's default stays)."""

    fusion_threshold_mb: float | None = None
    cycle_time_ms: float | None = None
    cache_capacity: int | None = None
    hierarchical_allreduce: bool = False
    autotune: bool = False
    autotune_log: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> KnobFlags:
        return cls(args.fusion_threshold_mb, args.cycle_time_ms, args.cache_capacity, args.hierarchical_allreduce,
                   args.autotune, args.autotune_log)

    def variables(self) -> dict[str, str]:
        """The HOROVOD_* variables these flags set, written as horovodrun writes them."""
        out: dict[str, str] = {}
        if self.fusion_threshold_mb is not None:
            out[FUSION] = str(int(self.fusion_threshold_mb * MIB))
        if self.cycle_time_ms is not None:
            out[CYCLE] = str(self.cycle_time_ms)  # shortest exact text: strtof reads it back
        if self.cache_capacity is not None:
            out[CACHE] = str(self.cache_capacity)
        if self.hierarchical_allreduce:
            out[HIERARCHICAL] = "1"
        if self.autotune:
            out[AUTOTUNE] = "1"
        if self.autotune_log is not None:
            out[AUTOTUNE_LOG] = os.path.abspath(self.autotune_log)  # rank 0's working directory may differ
        return out


def launch_rank(environ: Mapping[str, str]) -> int:
    """This process's rank as its launcher exported it (before hvd.init), 0 when none did."""
    for name in RANK_VARIABLES:
        v = environ.get(name, "")
        if v.strip().isdigit():
            return int(v)
    return 0


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
    get = environ.get
    cycle_default = 0.0 if c_strtol(get(XLA_OPS) or "0") > 0 else CYCLE_DEFAULT
    fusion = c_strtol(v) if (v := get(FUSION)) is not None else FUSION_DEFAULT
    cycle = c_strtof(v) if (v := get(CYCLE)) is not None else cycle_default
    cache = c_strtol(v) % 2**32 if (v := get(CACHE)) is not None else CACHE_DEFAULT  # a uint32 in Horovod
    hierarchical = hierarchical_asked(environ)
    autotune = c_strtol(get(AUTOTUNE) or "0") > 0
    return [
        Knob("fusion_threshold_bytes", fusion, FUSION_DEFAULT,
             f"fusion {fusion / MIB:.4g} MiB" if fusion else "no fusion"),
        Knob("cycle_time_ms", cycle, cycle_default, f"cycle {cycle:g} ms"),
        Knob("cache_capacity", cache, CACHE_DEFAULT, f"cache {cache}" if cache else "no response cache"),
        Knob("hierarchical_allreduce", hierarchical, False,
             "hierarchical allreduce" if hierarchical else "no hierarchical allreduce"),
        Knob("autotune", autotune, False, "autotune" if autotune else "no autotune"),
    ]


def hierarchical_asked(environ: Mapping[str, str]) -> bool:
    """HOROVOD_HIERARCHICAL_ALLREDUCE is on in ``environ`` (Horovod may still not apply it: see the module doc)."""
    return c_strtol(environ.get(HIERARCHICAL) or "0") > 0


def snapshot(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables ``knobs`` reads, as they are (taken right before hvd.init)."""
    return {k: environ[k] for k in VARIABLES if k in environ}
