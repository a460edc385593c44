"""docs/architecture.md and the contract's docstring count what the contract has: the table of ``Backend``'s member
groups has as many rows as the text says and names every public member, and "Adding a backend" names the abstract
members, as many as it says. Fast: no TensorFlow."""

from __future__ import annotations

import re

from common.core import contract
from common.core.contract import Backend
from tests.conftest import REPO

ARCH = REPO / "docs" / "architecture.md"
WORDS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen".split()
NUMBER = {w: i for i, w in enumerate(WORDS)}
SHORTCUTS = {"info", "rank", "num_workers", "num_replicas", "is_chief", "name"}  # RankInfo's, derived


def member_table(text: str) -> tuple[int, list[str]]:
    """The number the text says, and the rows of the table that follows it."""
    m = re.search(r"declared member of `common\.core\.contract\.Backend`, in (\w+) groups:\n\n(.*?)\n\n", text, re.S)
    assert m, "the member table's sentence is gone from docs/architecture.md"
    rows = [ln for ln in m.group(2).splitlines() if ln.startswith("| `")]
    return NUMBER[m.group(1).lower()], rows


def test_the_member_groups_are_as_many_as_the_text_says_and_name_every_member():
    said, rows = member_table(ARCH.read_text())
    assert said == len(rows), f"architecture.md says {WORDS[said]} groups; its table has {len(rows)}"
    m = re.search(r"``Backend`` is the per-rank half, (\w+) groups", contract.__doc__ or "")
    assert m and NUMBER[m.group(1)] == len(rows), "common/core/contract.py's docstring counts other groups"
    named = {n for row in rows for n in re.findall(r"`(\w+)", row.split("|")[1])}
    public = {n for n in dir(Backend) if not n.startswith("_")} - SHORTCUTS
    assert public <= named, f"members missing from the table: {sorted(public - named)}"


def test_the_abstract_members_are_as_many_as_the_text_says():
    text = ARCH.read_text()
    m = re.search(r"implementing the (\w+) abstract\s+members \((.*?)\)\.", text, re.S)
    assert m, "Adding a backend no longer names the abstract members"
    names = set(re.findall(r"`(\w+)`", m.group(2))) - {"RankInfo"}
    assert NUMBER[m.group(1)] == len(Backend.__abstractmethods__) and names == Backend.__abstractmethods__
    d = re.search(r"(\w+) are abstract", contract.__doc__ or "")
    assert d and NUMBER[d.group(1).lower()] == len(Backend.__abstractmethods__)


def test_a_wrong_count_is_found():
    text = ARCH.read_text().replace(", in eleven groups:", ", in thirteen groups:")
    said, rows = member_table(text)
    assert said == 13 != len(rows)
