"""What every report module shares: the error types, the warning printer, the n/a marker and value quoting."""

from __future__ import annotations

import json
import sys
from typing import Any

NA = "n/a"  # shown for every value that cannot be computed
NO_INTERVAL = "n=1, no interval"  # shown instead of an interval for a single repeat
MISSING = object()  # marks a field absent from one of two dicts


class ReportError(Exception):
    """Bad input or a refused comparison; the message is one line meant for the user (CLI exit status 2)."""

    prefix = ""  # printed between "report: " and the message on stderr


class MixedVersionsError(ReportError):
    """Runs that would share one comparison were made with different software versions."""

    prefix = "error: "


def warn(msg: str) -> None:
    """The default warning sink: one line on stderr."""
    print(f"report: warning: {msg}", file=sys.stderr)


def fmt_value(v: Any) -> str:
    """A job field or version value as shown to the user (strings bare, the rest as JSON)."""
    if v is MISSING:
        return "(absent)"
    return v if isinstance(v, str) else json.dumps(v)
