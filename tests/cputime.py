"""Per-test CPU time of pytest's whole process tree, for comparing tests on a shared machine.

    pytest --cputime [--cputime-out FILE] ...        # the options come from tests/conftest.py

On a machine whose load changes (other people's jobs), a test's wall time says little about the
test; the CPU time its processes used does not depend on the load. At the start and end of every
test phase (setup, call, teardown) the plugin sums user + system time over this process and every
live descendant, each with the time of the children it has reaped (`/proc/<pid>/stat` fields 14-17),
so a Ray worker, a spawned rank or a CLI subprocess that ended and was waited for still counts.
What a process orphaned mid-test did (re-parented away from the tree) is lost, as is a process
started and ended between two readings without being waited for by the tree. Linux only.

Prints the slowest tests by CPU seconds, beside their wall seconds, at the end of the session, and
writes every test's figures (tab-separated: nodeid, phase, cpu_s, wall_s) to --cputime-out if given.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds of the process and its reaped children), None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), sum(int(x) for x in fields[11:15]) / _TICK


def tree_cpu_s(root: int) -> float:
    """CPU seconds of `root` and its live descendants (with what each reaped)."""
    parents: dict[int, tuple[int, float]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (st := _stat(int(entry.name))) is not None:
            parents[int(entry.name)] = st
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in parents.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in parents:
            total += parents[pid][1]
        todo.extend(children.get(pid, ()))
    return total


class CpuTime:
    def __init__(self, out: str | None):
        self.out = out
        self.rows: list[tuple[str, str, float, float]] = []

    def _measure(self, item, phase: str):
        cpu0, wall0 = tree_cpu_s(os.getpid()), time.perf_counter()
        yield
        self.rows.append((item.nodeid, phase, tree_cpu_s(os.getpid()) - cpu0, time.perf_counter() - wall0))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item):
        yield from self._measure(item, "setup")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        yield from self._measure(item, "call")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item):
        yield from self._measure(item, "teardown")

    def pytest_terminal_summary(self, terminalreporter):
        tr = terminalreporter
        total_cpu = sum(r[2] for r in self.rows)
        total_wall = sum(r[3] for r in self.rows)
        tr.write_sep("=", f"CPU time of the process tree: {total_cpu:.0f} s over {total_wall:.0f} s of tests")
        for nodeid, phase, cpu, wall in sorted(self.rows, key=lambda r: -r[2])[:40]:
            tr.write_line(f"{cpu:8.1f} cpu-s {wall:8.1f} s  {phase:<8} {nodeid}")
        if self.out:
            lines = [f"{n}\t{p}\t{c:.2f}\t{w:.2f}" for n, p, c, w in self.rows]
            Path(self.out).write_text("\n".join(["nodeid\tphase\tcpu_s\twall_s", *lines]) + "\n")
