"""End what a local Ray cluster leaves behind when the driver that started it is killed.

    reaper = start_reaper(exclude=children_before_ray_init)   # in the driver, after ray.init
    ...
    stop_reaper(reaper)                                      # before a normal ray.shutdown()

`ray.init()` without an address starts the cluster's processes as children of the driver. On a
driver SIGKILL the GCS and raylet die with it (Ray fate-shares them), but the raylet's dashboard
and runtime-env agents first try to report the raylet's death to the dead GCS with a 60 s timeout
(ray._private.utils.publish_error_to_driver), so they lingered for one to several minutes. The
reaper is a small watchdog process: while the driver lives it records the driver's descendants
(started after `exclude` was taken, itself excluded) every half second; once the driver is gone it
sends SIGTERM, then SIGKILL two seconds later, to each recorded process still alive with the same
start time (so a reused pid is never hit). Linux only (/proc); elsewhere start_reaper returns None.

Run as `python -m scalelab.sweeps.execution.ray_reaper DRIVER_PID [EXCLUDED_PID ...]` by start_reaper.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

POLL_S = 0.5
GRACE_S = 2.0


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (field 22 of /proc/<pid>/stat), None if gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
    return None if fields[0] == "Z" else fields[19]


def children(pid: int) -> set[int]:
    """The direct children of pid (all its threads')."""
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out.update(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
    return out


def descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        for child in children(todo.pop()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def start_reaper(exclude: set[int]) -> subprocess.Popen | None:
    """Start the watchdog for this (driver) process; None where /proc is not available."""
    if not sys.platform.startswith("linux"):
        return None
    cmd = [sys.executable, "-m", "scalelab.sweeps.execution.ray_reaper", str(os.getpid()), *map(str, sorted(exclude))]
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True)


def stop_reaper(reaper: subprocess.Popen | None) -> None:
    """The driver is shutting Ray down itself: the watchdog is not needed."""
    if reaper is not None and reaper.poll() is None:
        reaper.terminate()
        reaper.wait()


def _kill(recorded: dict[int, str], sig: int) -> None:
    for pid, started in recorded.items():
        if _start_time(pid) == started:
            try:
                os.kill(pid, sig)
            except OSError:
                pass


def watch(driver: int, exclude: set[int]) -> None:
    """Record the driver's descendants until it is gone, then end those still running."""
    driver_started = _start_time(driver)
    me = os.getpid()
    recorded: dict[int, str] = {}
    while driver_started is not None and _start_time(driver) == driver_started:
        for pid in descendants(driver) - exclude - {me}:
            started = _start_time(pid)
            if started is not None:
                recorded.setdefault(pid, started)
        time.sleep(POLL_S)
    _kill(recorded, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and any(_start_time(p) == s for p, s in recorded.items()):
        time.sleep(0.1)
    _kill(recorded, signal.SIGKILL)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop_reaper: leave quietly
    watch(int(sys.argv[1]), {int(p) for p in sys.argv[2:]})
