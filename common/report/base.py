"""What every report module shares: the error types, the warning printer, the n/a marker, value quoting, and the
inline markup of the report's text (Markdown's: `code`, **bold**, table cells escaped) with its plain-text reading."""

from __future__ import annotations

import json
import math
import re
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


def md_escape(text: str) -> str:
    """Text safe inside a Markdown table cell (and so in any of the report's inline text)."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def md_unescape(text: str) -> str:
    """``md_escape`` undone (its newlines stay spaces)."""
    return re.sub(r"\\([\\|])", r"\1", text)


def plain(text: str) -> str:
    """Inline markup read as plain text: code spans and bold without their marks, escapes undone."""
    return md_unescape(text.replace("**", "").replace("`", ""))


def fmt_num(x: float | None, fmt: str, scale: float = 1.0, suffix: str = "") -> str:
    """``x * scale`` formatted, plus ``suffix``; n/a for None."""
    if x is None:
        return NA
    if math.isnan(x):
        return "nan"
    return f"{x * scale:{fmt}}{suffix}"


IMAGES, SAMPLES = "images/s", "samples/s"  # throughput's unit, named for what a step consumes


def in_unit(text: str, unit: str) -> str:
    """The report's text (written for images) in ``unit``: "samples/s" for jobs whose samples are not images."""
    return text if unit == IMAGES else text.replace(IMAGES, unit).replace("per image", "per sample")
