"""Plain-text tables for the terminal (``common.check``, the sweep's status, the planner, ``--until``): one way to
align columns. Imports nothing of the project."""

from __future__ import annotations

from collections.abc import Sequence


def text_table(rows: Sequence[Sequence[str]], *, right: bool = False, rule: bool = False,
               indent: str = "") -> list[str]:
    """``rows`` (the header first) as lines, columns two spaces apart and padded to their widest cell (right-aligned
    with ``right``), trailing spaces stripped; ``rule`` puts a line of dashes under the header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]

    def line(cells: Sequence[str]) -> str:
        return (indent + "  ".join(c.rjust(w) if right else c.ljust(w) for c, w in zip(cells, widths))).rstrip()

    out = [line(r) for r in rows]
    if rule:
        out.insert(1, indent + "  ".join("-" * w for w in widths))
    return out
