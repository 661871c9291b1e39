"""`parallel.backend.spawn`: ranks forked from a preloaded forkserver behave as spawned processes do.

They see the caller's environment and working directory as of the call (a forkserver's child would
otherwise have the server's, from whenever it started), a rank's failure reaches the caller, and a
group that hangs is ended by spawn's watchdog, its error quoting the ranks' stacks.
"""

import os
import time
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from scalelab.errors import UsageError
from scalelab.parallel.backend import SpawnHung, spawn, spawn_timeout


def _nothing() -> None:
    pass


def _report(out: str) -> None:
    Path(out, f"rank{dist.get_rank()}.txt").write_text(
        f"{os.environ.get('SCALELAB_TEST_SPAWN_PROBE')}|{os.getcwd()}|{dist.get_world_size()}"
    )


def _fail() -> None:
    if dist.get_rank() == 1:
        raise ValueError("rank 1 failed on purpose")


def _barrier_rank0_never_joins() -> None:
    if dist.get_rank() == 0:
        time.sleep(3600)
    dist.barrier()  # rank 1 waits here for a partner that never comes: gloo's own timeout is 600 s


def test_ranks_see_the_callers_environment_and_directory_of_the_call(tmp_path, monkeypatch):
    spawn(_nothing, 2, backend="gloo")  # the forkserver is running before the change below
    monkeypatch.setenv("SCALELAB_TEST_SPAWN_PROBE", "set-after-the-server-started")
    monkeypatch.chdir(tmp_path)
    spawn(_report, 2, (str(tmp_path),), backend="gloo")
    for rank in range(2):
        probe, cwd, world = (tmp_path / f"rank{rank}.txt").read_text().split("|")
        assert probe == "set-after-the-server-started" and Path(cwd) == tmp_path and world == "2"


def test_a_failing_rank_raises_in_the_caller_with_its_traceback():
    with pytest.raises(mp.ProcessRaisedException, match="rank 1 failed on purpose"):
        spawn(_fail, 2, backend="gloo")


def test_a_hung_group_is_ended_by_the_watchdog_with_the_ranks_stacks():
    t0 = time.monotonic()
    hung = r"hung process group: the 2-process group running _barrier_rank0_never_joins"
    with pytest.raises(SpawnHung, match=hung) as e:
        spawn(_barrier_rank0_never_joins, 2, backend="gloo", timeout_s=4)
    assert time.monotonic() - t0 < 60
    rank0, rank1 = str(e.value).split("\nrank 0:\n")[1].split("\nrank 1:\n")
    assert "in _barrier_rank0_never_joins" in rank0 and "in barrier" not in rank0, rank0  # asleep
    assert "in barrier" in rank1 and "in _barrier_rank0_never_joins" in rank1, rank1  # waiting for rank 0


def test_the_watchdogs_limit_comes_from_the_caller_or_the_environment(monkeypatch):
    monkeypatch.setenv("SCALELAB_SPAWN_TIMEOUT_S", "90")
    assert spawn_timeout(5.0) == 5.0 and spawn_timeout(None) == 90.0
    monkeypatch.setenv("SCALELAB_SPAWN_TIMEOUT_S", "")
    assert spawn_timeout(None) is None
    for bad in ("soon", "0", "-3", "nan"):
        monkeypatch.setenv("SCALELAB_SPAWN_TIMEOUT_S", bad)
        with pytest.raises(UsageError, match=f"SCALELAB_SPAWN_TIMEOUT_S='{bad}' is not a positive number"):
            spawn_timeout(None)
