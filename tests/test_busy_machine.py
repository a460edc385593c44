"""tests/aids/busy.py (how much CPU other processes took while a timing test ran) on a fake /proc, and the
conftest hook that turns a timing test's failure on a busy machine into a failure saying so. Pure Python."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import tests.conftest as conftest
from tests.aids import busy


def stat_line(pid: int, comm: str, ppid: int, utime: int, stime: int, start: int) -> str:
    # fields 1-22 as the kernel writes them (the ones read: 4 ppid, 14 utime, 15 stime, 22 starttime)
    fields = [str(pid), f"({comm})", "S", str(ppid), *["0"] * 9, str(utime), str(stime), *["0"] * 6, str(start)]
    return " ".join(fields) + " 0 0\n"


def fake_proc(root: Path, procs: dict[int, tuple[str, int, int, int, int | None]]) -> Path:
    """pid -> (comm, ppid, ticks, start, netns inode): a /proc with those processes (ticks all in utime)."""
    if root.exists():
        for p in sorted(root.rglob("*"), reverse=True):
            p.unlink() if p.is_file() or p.is_symlink() else p.rmdir()
    for pid, (comm, ppid, ticks, start, ns) in procs.items():
        d = root / str(pid)
        (d / "ns").mkdir(parents=True)
        (d / "stat").write_text(stat_line(pid, comm, ppid, ticks, 0, start))
        if ns is not None:
            os.symlink(f"net:[{ns}]", d / "ns" / "net")  # a dangling link reads like the kernel's
    (root / "stat").mkdir(exist_ok=True)  # not a process: ignored
    return root


def test_stat_line_with_spaces_and_parentheses_in_the_name() -> None:
    line = stat_line(7, "tf (worker) 1", 5, 120, 30, 999)
    assert busy.parse_stat(line) == (5, 999, 150)
    assert busy.netns_inode("net:[4026531840]") == 4026531840 and busy.netns_inode("mnt:[1]") is None


def test_other_cpu_is_what_neither_the_tree_nor_its_namespaces_took(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    ns_emu, ns_host = 900, 100
    before = {
        100: ("pytest", 1, 1000, 10, ns_host),  # the test
        101: ("mpirun", 100, 50, 20, ns_host),  # its child
        102: ("python", 101, 40, 21, ns_host),  # a rank, reparented to init below: still the test's
        200: ("python", 1, 5000, 5, ns_host),  # another user's job
        300: ("slurmd", 1, 10, 6, ns_emu),  # the emulated cluster's node daemon
        3: ("kworker/0:1", 2, 70, 1, None),  # a kernel thread
    }
    tally = busy.Tally(root=100, namespaces=frozenset({ns_emu}))
    tally.add(busy.sample(fake_proc(proc, before)), first=True)
    assert (tally.own_ticks, tally.other_ticks) == (0, 0)  # the baseline
    after = {
        100: ("pytest", 1, 1010, 10, ns_host),
        102: ("python", 1, 140, 21, ns_host),  # +100, reparented
        200: ("python", 1, 5300, 5, ns_host),  # +300 other
        300: ("slurmd", 1, 15, 6, ns_emu),  # +5
        301: ("python", 300, 200, 50, ns_emu),  # a rank of a job step started in the window: all 200
        400: ("stress", 1, 80, 60, ns_host),  # another process started in the window: all 80
        3: ("kworker/0:1", 2, 170, 1, None),  # +100, not counted
    }
    tally.add(busy.sample(fake_proc(proc, after)))
    assert tally.own_ticks == 10 + 100 + 5 + 200
    assert tally.other_ticks == 300 + 80
    # pid 200 reused by a new process of the test's: a new (pid, start), counted from zero, as the test's
    again = {**after, 200: ("python", 100, 7, 70, ns_host)}
    tally.add(busy.sample(fake_proc(proc, again)))
    assert tally.other_ticks == 380 and tally.own_ticks == 315 + 7
    assert busy.share(380, wall=2.0, cpus=2, hz=100) == pytest.approx(0.95)


def test_a_real_sample_sees_this_process() -> None:
    procs = busy.sample()
    me = procs[os.getpid()]
    assert me.ppid == os.getppid() and me.ticks >= 0


class FakeWatch:
    share = 0.0

    def __init__(self, **_: Any) -> None:
        pass

    def start(self) -> FakeWatch:
        return self

    def stop(self) -> float:
        return self.share


def _drive(monkeypatch: pytest.MonkeyPatch, share: float, error: BaseException | None, timing: bool = True) -> Any:
    """Run the conftest hook around a fake test call that raises ``error`` (or passes) while other processes took
    ``share`` of the machine."""
    monkeypatch.setattr(busy, "Watch", type("W", (FakeWatch,), {"share": share}))
    item = SimpleNamespace(get_closest_marker=lambda name: object() if timing and name == "timing" else None,
                           funcargs={}, user_properties=[])
    gen = conftest.pytest_runtest_call(item)
    next(gen)
    try:
        if error is None:
            gen.send(None)
        else:
            gen.throw(error)
    except StopIteration:
        return item
    raise AssertionError("the hook neither returned nor raised")


def test_a_busy_machine_fails_with_its_figure_first(monkeypatch: pytest.MonkeyPatch) -> None:
    miss = AssertionError("native: predicted 0.146 s, measured 0.173 s")
    with pytest.raises(pytest.fail.Exception) as got:
        _drive(monkeypatch, 0.62, miss)
    text = str(got.value)
    assert text.startswith("the machine was busy: 62% of CPU taken by other processes") and "rerun alone" in text
    assert "predicted 0.146 s, measured 0.173 s" in text  # the test's own message is kept, after
    # a quiet machine: the test's own failure, unchanged
    with pytest.raises(AssertionError, match="predicted 0.146 s"):
        _drive(monkeypatch, 0.05, miss)
    # a busy machine and a pass: a pass (the figure held despite the load), the share recorded
    assert _drive(monkeypatch, 0.9, None).user_properties == [("other_cpu_share", 0.9)]
    # a skip is not a failure: it goes through
    with pytest.raises(pytest.skip.Exception):
        _drive(monkeypatch, 0.9, pytest.skip.Exception("no cluster"))
    # a test not marked timing: no watch at all
    assert _drive(monkeypatch, 0.9, None, timing=False).user_properties == []
