"""Per-test CPU time of pytest's whole process tree, for comparing tests on a shared machine.

    pytest --cputime [--cputime-out FILE] ...        # the options come from tests/conftest.py

On a machine whose load changes (other people's jobs), a test's wall time says little about the
test; the CPU time its processes used does not depend much on the load. When pytest runs in a
cpuacct cgroup of its own (cgroup v1; as root, e.g.
`mkdir /sys/fs/cgroup/cpuacct/t && echo $$ > /sys/fs/cgroup/cpuacct/t/cgroup.procs && pytest ...`),
the figures are the cgroup's: every process pytest started, ended ones included, exactly.
Otherwise they are read from /proc: at the start and end of every
test phase (setup, call, teardown) the plugin sums user + system time over this process and every
live descendant, each with the time of the children it has reaped (`/proc/<pid>/stat` fields 14-17),
so a Ray worker, a spawned rank or a CLI subprocess that ended and was waited for still counts, and
a descendant seen at one reading and killed unreaped before the next keeps its last reading (TreeCpu).
What a process did after its last reading and before dying unreaped is lost, as is a process
started and ended between two readings without being waited for by the tree. Linux only.

Prints the slowest tests by CPU seconds, beside their wall seconds, at the end of the session, and
writes every test's figures (tab-separated: nodeid, phase, cpu_s, wall_s) to --cputime-out if given;
`python tests/cputime.py BEFORE.tsv AFTER.tsv` sets two such files side by side.
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


class TreeCpu:
    """CPU seconds used so far by a process and its descendants (with what each reaped).

    A descendant seen at one reading and gone at the next either was reaped by a parent still in
    the tree (its time is in that parent's reaped-children time now) or was not (killed with its
    parent, re-parented away): its last reading is kept, so the total never goes back.
    """

    def __init__(self, root: int):
        self.root = root
        self.seen: dict[int, tuple[int, float]] = {}  # pid -> (parent pid, CPU s) at the last reading
        self.gone_s = 0.0

    def read(self) -> float:
        procs: dict[int, tuple[int, float]] = {}
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and (st := _stat(int(entry.name))) is not None:
                procs[int(entry.name)] = st
        children: dict[int, list[int]] = {}
        for pid, (ppid, _) in procs.items():
            children.setdefault(ppid, []).append(pid)
        tree: dict[int, tuple[int, float]] = {}
        todo = [self.root]
        while todo:
            pid = todo.pop()
            if pid in procs:
                tree[pid] = procs[pid]
                todo.extend(children.get(pid, ()))
        for pid, (ppid, cpu) in self.seen.items():
            if pid not in tree and ppid not in tree:
                self.gone_s += cpu
        self.seen = tree
        return self.gone_s + sum(cpu for _, cpu in tree.values())


def cgroup_usage_file() -> Path | None:
    """cpuacct.usage of this process's cgroup (v1 cpuacct), when it is in one of its own (not the root)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "cpuacct" in controllers.split(",") and path != "/":
            usage = Path("/sys/fs/cgroup", controllers, path.lstrip("/"), "cpuacct.usage")
            return usage if usage.exists() else None
    return None


class CgroupCpu:
    """CPU seconds used so far by every process of a cgroup, ended ones included (exact)."""

    def __init__(self, usage: Path):
        self.usage = usage

    def read(self) -> float:
        return int(self.usage.read_text()) / 1e9


class CpuTime:
    def __init__(self, out: str | None):
        self.out = out
        usage = cgroup_usage_file()
        self.tree = CgroupCpu(usage) if usage else TreeCpu(os.getpid())
        self.source = f"cgroup {usage.parent.name}" if usage else "the process tree"
        self.rows: list[tuple[str, str, float, float]] = []

    def _measure(self, item, phase: str):
        cpu0, wall0 = self.tree.read(), time.perf_counter()
        yield
        self.rows.append((item.nodeid, phase, self.tree.read() - cpu0, time.perf_counter() - wall0))

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
        tr.write_sep("=", f"CPU time ({self.source}): {total_cpu:.0f} s over {total_wall:.0f} s of tests")
        for nodeid, phase, cpu, wall in sorted(self.rows, key=lambda r: -r[2])[:40]:
            tr.write_line(f"{cpu:8.1f} cpu-s {wall:8.1f} s  {phase:<8} {nodeid}")
        if self.out:
            lines = [f"{n}\t{p}\t{c:.2f}\t{w:.2f}" for n, p, c, w in self.rows]
            Path(self.out).write_text("\n".join(["nodeid\tphase\tcpu_s\twall_s", *lines]) + "\n")


def compare(before: Path, after: Path, top: int = 40) -> str:
    """Per-test CPU seconds of two --cputime-out files side by side (phases summed), biggest change first."""

    def load(path: Path) -> dict[str, tuple[float, float]]:
        out: dict[str, tuple[float, float]] = {}
        for line in path.read_text().splitlines()[1:]:
            nodeid, _, cpu, wall = line.split("\t")
            c, w = out.get(nodeid, (0.0, 0.0))
            out[nodeid] = (c + float(cpu), w + float(wall))
        return out

    a, b = load(before), load(after)
    lines = [f"{'before':>8} {'after':>8} {'change':>8}  CPU s (wall s before / after)  test"]
    rows = []
    for nodeid in sorted(set(a) | set(b)):
        ca, wa = a.get(nodeid, (0.0, 0.0))
        cb, wb = b.get(nodeid, (0.0, 0.0))
        rows.append((cb - ca, ca, cb, wa, wb, nodeid + ("" if nodeid in b else "  (gone)")))
    for d, ca, cb, wa, wb, nodeid in sorted(rows)[:top]:
        lines.append(f"{ca:8.1f} {cb:8.1f} {d:+8.1f}  ({wa:6.1f} / {wb:6.1f})  {nodeid}")
    total_a, total_b = sum(c for c, _ in a.values()), sum(c for c, _ in b.values())
    wall_a, wall_b = sum(w for _, w in a.values()), sum(w for _, w in b.values())
    lines.append(f"{total_a:8.1f} {total_b:8.1f} {total_b - total_a:+8.1f}  ({wall_a:6.1f} / {wall_b:6.1f})  all tests")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 3:
        sys.exit("usage: python tests/cputime.py BEFORE.tsv AFTER.tsv")
    print(compare(Path(sys.argv[1]), Path(sys.argv[2])))
