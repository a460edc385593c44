"""How busy the machine was with OTHER processes while a timing test ran (tests/conftest.py applies it to every test
marked ``timing``): a timing test that misses its figure on a machine others were loading should say so, not read
as a wrong model.

A background thread samples every process's CPU (``/proc/<pid>/stat``: utime + stime, in clock ticks) every
``INTERVAL`` seconds. A process is the test's own when it descends from the test's process (by ``ppid`` at any
sample; once the test's, always, so a rank reparented to init stays the test's) or runs in one of the test's
network namespaces (the emulated cluster's nodes: their daemons, job steps and ranks do not descend from pytest).
Every other process's CPU between samples is *other* CPU; kernel threads (children of kthreadd, pid 2) are left
out: their work (loopback softirqs, writeback) is mostly what the test itself causes. The share is other CPU over
the machine's capacity in the window (wall seconds x logical CPUs).

Undercounts, never overcounts: a process that starts and ends between two samples, and the last interval of one
that ends, are not seen; so a share above the line is at least that busy. No psutil (not installed here): /proc.
A sample costs about 3.5 ms of CPU with 100 processes (the test's own: under 1% of a 2-core machine at 4 a second).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

BUSY_SHARE = 0.25  # other processes' CPU above this share of the machine: the test's timing is not its own
# (on 2 cores: half a core on average, enough to take a 2-rank test's core half the time)
INTERVAL = 0.25  # s between samples: short enough to see a 1-s process, cheap (one small read per process)
KTHREADD = 2  # the kernel threads' parent


@dataclass(frozen=True)
class Proc:
    """One process in one sample: its parent, its CPU so far (ticks) and its network namespace (inode or None)."""

    ppid: int
    start: int  # start time in ticks since boot: (pid, start) names a process across pid reuse
    ticks: int  # utime + stime
    netns: int | None


def parse_stat(text: str) -> tuple[int, int, int]:
    """(ppid, start time, utime + stime) from a /proc/<pid>/stat line; the command name (field 2, in parentheses)
    may hold spaces and parentheses, so the fields are counted after its last ')'."""
    rest = text[text.rindex(")") + 2:].split()
    # rest[0] is field 3 (state): ppid field 4, utime 14, stime 15, starttime 22
    return int(rest[1]), int(rest[19]), int(rest[11]) + int(rest[12])


def netns_inode(link: str) -> int | None:
    """"net:[4026531840]" -> 4026531840; None for anything else."""
    if link.startswith("net:[") and link.endswith("]"):
        return int(link[5:-1])
    return None


def sample(proc: Path = Path("/proc")) -> dict[int, Proc]:
    """Every process readable under ``proc`` (a process that ends while being read is left out)."""
    out = {}
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid, start, ticks = parse_stat((d / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue
        try:
            ns = netns_inode(os.readlink(d / "ns" / "net"))
        except OSError:
            ns = None
        out[int(d.name)] = Proc(ppid, start, ticks, ns)
    return out


@dataclass
class Tally:
    """The running account of one window: which processes are the test's, each one's last CPU, the other CPU."""

    root: int  # the test's process
    namespaces: frozenset[int] = frozenset()  # network namespaces whose processes are the test's
    own: set[tuple[int, int]] = field(default_factory=set)
    last: dict[tuple[int, int], int] = field(default_factory=dict)
    other_ticks: int = 0
    own_ticks: int = 0

    def add(self, procs: dict[int, Proc], first: bool = False) -> None:
        """Account one sample. In the first, each process's CPU so far is the baseline; a process first seen
        later counts all of its CPU (it started inside the window, or was too short-lived before)."""
        mine = {pid for pid, p in procs.items() if p.netns is not None and p.netns in self.namespaces}
        mine |= {pid for pid, p in procs.items() if (pid, p.start) in self.own}
        mine.add(self.root)
        children: dict[int, list[int]] = {}
        for pid, p in procs.items():
            children.setdefault(p.ppid, []).append(pid)
        todo = list(mine)
        while todo:  # every descendant of a process of the test's
            for c in children.get(todo.pop(), []):
                if c not in mine:
                    mine.add(c)
                    todo.append(c)
        for pid, p in procs.items():
            key = (pid, p.start)
            if pid == KTHREADD or p.ppid == KTHREADD or pid == 0:
                continue
            if pid in mine:
                self.own.add(key)
            delta = p.ticks - self.last.get(key, 0 if not first else p.ticks)
            self.last[key] = p.ticks
            if key in self.own:
                self.own_ticks += max(delta, 0)
            else:
                self.other_ticks += max(delta, 0)


def share(other_ticks: int, wall: float, cpus: int, hz: int) -> float:
    """Other CPU as a share of the machine's capacity over ``wall`` seconds."""
    return other_ticks / hz / (wall * cpus) if wall > 0 and cpus > 0 else 0.0


class Watch:
    """Samples in a thread from ``start()`` to ``stop()``; ``stop()`` returns the other processes' share."""

    def __init__(self, root: int | None = None, namespaces: frozenset[int] = frozenset(),
                 proc: Path = Path("/proc"), interval: float = INTERVAL) -> None:
        self.tally = Tally(root if root is not None else os.getpid(), namespaces)
        self.proc, self.interval = proc, interval
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._t0 = 0.0
        self.wall = 0.0

    def start(self) -> Watch:
        self.tally.add(sample(self.proc), first=True)
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._done.wait(self.interval):
            self.tally.add(sample(self.proc))

    def stop(self) -> float:
        self._done.set()
        self._thread.join()
        self.tally.add(sample(self.proc))
        self.wall = time.monotonic() - self._t0
        return share(self.tally.other_ticks, self.wall, os.cpu_count() or 1, os.sysconf("SC_CLK_TCK"))


def busy_message(other: float, line: float = BUSY_SHARE) -> str:
    """The failure's first line when the machine was busy."""
    return (f"the machine was busy: {100 * other:.0f}% of CPU taken by other processes while this timing test ran "
            f"(above {100 * line:.0f}%); rerun alone (`make test` runs the timing tests after the others: nothing "
            "else should run beside them)")
