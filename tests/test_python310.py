"""twinbench runs on Python 3.10 as well as 3.11+ (pyproject.toml: requires-python >= 3.10). No 3.10 interpreter is
installable on the development machine (Debian 12 ships 3.11 only), so vermin, which reads the source and knows in
which Python version each module, member, keyword and syntax form appeared, checks it instead."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from common.core import buildinfo
from tests.conftest import BIN, REPO

CHECKED = ("backends", "common", "bench", "scripts", "jobs")


def _vermin() -> str:
    exe = BIN / "vermin"
    if not exe.exists():
        pytest.fail("vermin is not installed (requirements.txt; make setup)")
    return str(exe)


def _run(*paths: str | Path) -> subprocess.CompletedProcess[str]:
    # --no-tips: no advice lines; -t=3.10-: the target is 3.10 and later; --violations: print only what breaks
    # the target and exit 1 then (vermin --help); --eval-annotations off: `from __future__ import annotations`
    # keeps annotations unevaluated, so `X | None` in them is fine on 3.10
    return subprocess.run([_vermin(), "--no-tips", "-t=3.10-", "--violations", *map(str, paths)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def test_the_code_needs_nothing_newer_than_python_310():
    proc = _run(*CHECKED)
    assert proc.returncode == 0, f"vermin found 3.11+ features:\n{proc.stdout}\n{proc.stderr}"
    assert re.search(r"^Minimum required versions: 3\.(\d+)$", proc.stdout, re.M), proc.stdout
    assert int(re.search(r"^Minimum required versions: 3\.(\d+)$", proc.stdout, re.M).group(1)) <= 10


def test_vermin_catches_a_311_feature(tmp_path):
    """The check is not vacuous: tomllib, typing.Self and datetime.UTC, which the code used before, fail it."""
    bad = tmp_path / "bad.py"
    bad.write_text("import tomllib\nimport datetime\nfrom typing import Self\nnow = datetime.UTC\n")
    proc = _run(bad)
    assert proc.returncode != 0
    for feature in ("tomllib", "typing.Self", "datetime.UTC"):
        assert feature in proc.stdout, (feature, proc.stdout)


def test_the_project_states_python_310():
    assert re.search(r'^requires-python = ">=3\.10"$', (REPO / "pyproject.toml").read_text(), re.M)
    assert re.search(r'^target-version = "py310"$', (REPO / "pyproject.toml").read_text(), re.M)
    for req in buildinfo.requirements_files():
        text = req.read_text()
        assert re.search(r'^tomli==[0-9.]+ ; python_version < "3\.11"$', text, re.M), req.name


def test_tomli_only_below_311():
    req = REPO / "requirements.txt"
    assert "tomli" not in buildinfo.read_pins(req)  # this interpreter is 3.11+: tomllib
    assert "tomli" in buildinfo.read_pins(req, every_python=True)
    assert buildinfo.marker_holds('python_version < "3.11"', (3, 10))
    assert not buildinfo.marker_holds('python_version < "3.11"', (3, 11))
    assert buildinfo.marker_holds('python_version >= "3.11"', (3, 12)) and buildinfo.marker_holds("", (3, 10))


def test_job_loader_falls_back_to_tomli():
    src = (REPO / "common" / "workload" / "job.py").read_text()
    assert "import tomli as tomllib" in src and "sys.version_info >= (3, 11)" in src
