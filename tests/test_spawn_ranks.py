"""`parallel.backend.spawn`: ranks forked from a preloaded forkserver behave as spawned processes do.

They see the caller's environment and working directory as of the call (a forkserver's child would
otherwise have the server's, from whenever it started), and a rank's failure reaches the caller.
"""

import os
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from scalelab.parallel.backend import spawn


def _nothing() -> None:
    pass


def _report(out: str) -> None:
    Path(out, f"rank{dist.get_rank()}.txt").write_text(
        f"{os.environ.get('SCALELAB_TEST_SPAWN_PROBE')}|{os.getcwd()}|{dist.get_world_size()}"
    )


def _fail() -> None:
    if dist.get_rank() == 1:
        raise ValueError("rank 1 failed on purpose")


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
