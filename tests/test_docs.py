"""The documentation stays true to the repository: the generated job-key reference is current, the README stays a
front door, every relative link (and its #anchor) resolves, and every ``python -m MODULE`` the README names exists.
Fast: no TensorFlow."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
MAX_README_LINES = 260
SCRIPT = REPO / "scripts" / "job_reference.py"

FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)
PYTHON_M = re.compile(r"python3?\s+-m\s+([A-Za-z_][\w.]*)")


def _without_fences(text: str) -> str:
    return FENCE.sub("", text)


def _prose(text: str) -> str:
    """Markdown without fenced blocks, indented code blocks (after a blank line, not list continuations) and code
    spans: what a renderer turns into links."""
    text = _without_fences(text)
    text = re.sub(r"(\n\n)((?: {4}|\t)[^\n]*\n?)+", r"\1", text)
    return CODE_SPAN.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup removed, lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links keep their text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file; repeated headings get -1, -2... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for m in HEADING.finditer(_without_fences(path.read_text())):
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(page: Path) -> list[str]:
    bad = []
    for m in LINK.finditer(_prose(page.read_text())):
        target = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:...
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        where = f"{page.relative_to(REPO)}: ({target})"
        if not dest.exists():
            bad.append(f"{where}: {path_part} does not exist")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{where}: no heading #{anchor} in {dest.relative_to(REPO)}")
    return bad


def test_job_reference_is_current():
    r = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_job_reference_check_fails_on_a_stale_block(tmp_path):
    stale = tmp_path / "jobs.md"
    stale.write_text((REPO / "docs" / "jobs.md").read_text().replace("| `seed` |", "| `seeds` |"))
    r = subprocess.run([sys.executable, str(SCRIPT), "--check", "--doc", str(stale)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "--write" in r.stderr, r.stderr


def test_job_reference_imports_no_tensorflow():
    code = f"import runpy, sys\nrunpy.run_path({str(SCRIPT)!r})['generate']()\nprint('tensorflow' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr[-500:]


def test_readme_is_a_front_door():
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines (at most {MAX_README_LINES}): move detail to docs/"


# A figure the README states: a duration (m:ss, or a number of minutes, seconds, ms, hours) or a count of tests.
FIGURE = re.compile(r"\b\d+:\d{2}\b|\b\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)? (?:minutes|min|seconds|s|ms|hours)\b"
                    r"|\b\d+ tests\b")
EXACT_FIGURE = re.compile(r"\b\d+:\d{2}\b|\b\d+ tests\b")  # these must be written in the entry as in the README
DATED_LINK = re.compile(r"\(docs/findings\.md#(\d{4}-\d{2}-\d{2}-[\w-]+)\)")


def findings_entries(text: str) -> dict[str, str]:
    """anchor -> text of every dated entry (``## YYYY-MM-DD: ...``) of docs/findings.md."""
    entries = {}
    parts = re.split(r"^## ", _without_fences(text), flags=re.M)
    for part in parts[1:]:
        heading, _, body = part.partition("\n")
        if re.match(r"\d{4}-\d{2}-\d{2}:", heading):
            entries[slug(heading.strip())] = heading + "\n" + body
    return entries


def unsourced_figures(readme: str, findings: str) -> list[str]:
    """Each paragraph of the README that states a figure links the dated findings entry that measured it, and the
    entry holds its exact figures (times as m:ss, test counts) as the README writes them."""
    entries = findings_entries(findings)
    bad = []
    for para in re.split(r"\n\s*\n", _without_fences(readme)):
        figures = [m.group(0) for m in FIGURE.finditer(para)]
        if not figures:
            continue
        anchors = DATED_LINK.findall(para)
        where = " ".join(para.split())[:70]
        if not anchors:
            bad.append(f"{figures} without a link to a dated findings entry: {where}")
            continue
        missing = [a for a in anchors if a not in entries]
        bad += [f"no dated entry #{a} in docs/findings.md: {where}" for a in missing]
        measured = "\n".join(entries.get(a, "") for a in anchors)
        bad += [f"{f!r} is not in the linked entry {anchors}: {where}" for f in
                (m.group(0) for m in EXACT_FIGURE.finditer(para)) if f not in measured]
    return bad


def test_readme_figures_point_to_the_findings_that_measured_them():
    assert unsourced_figures(README.read_text(), (REPO / "docs" / "findings.md").read_text()) == []


def test_an_unsourced_or_stale_figure_is_found():
    readme, findings = README.read_text(), (REPO / "docs" / "findings.md").read_text()
    suite = re.search(r"tests on two workers in (\d+):(\d{2})", readme)  # the suite's figure, sourced today
    assert suite, "README states the suite's time"
    was, changed = suite.group(0), suite.group(0).replace(f"{suite[1]}:", f"{int(suite[1]) + 1}:")
    stale = unsourced_figures(readme.replace(was, changed), findings)
    assert len(stale) == 1 and f"'{int(suite[1]) + 1}:{suite[2]}' is not in the linked entry" in stale[0], stale
    unlinked = unsourced_figures(readme + "\n\nThe demo takes 3 minutes.\n", findings)
    assert len(unlinked) == 1 and "['3 minutes'] without a link" in unlinked[0], unlinked


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page):
    assert broken_links(page) == []


def test_slugs_follow_github():
    assert slug("Step-time breakdown (diagnostic runs)") == "step-time-breakdown-diagnostic-runs"
    assert slug("TensorFlow 2.21.0 vs 2.18.1 (this machine)") == "tensorflow-2210-vs-2181-this-machine"
    assert slug("Which collective runs, and how to tune it") == "which-collective-runs-and-how-to-tune-it"
    assert slug("Slurm: the `sbatch` scripts") == "slurm-the-sbatch-scripts"


def test_readme_modules_exist():
    modules = sorted(set(PYTHON_M.findall(README.read_text())))
    assert "backends.native" in modules and "common.report" in modules, modules  # the pattern still finds them
    had_tf = "tensorflow" in sys.modules
    missing = []
    for name in modules:
        spec = importlib.util.find_spec(name)
        origin = Path(spec.origin).resolve() if spec and spec.origin else None
        if origin is None or REPO not in origin.parents:
            missing.append(name)
    assert missing == [], f"README.md names python -m {', '.join(missing)}: not modules of this repository"
    assert had_tf or "tensorflow" not in sys.modules, "finding the README's modules imported TensorFlow"
