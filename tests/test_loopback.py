"""Servers bind to loopback: a local multi-process job's rendezvous store and gloo sockets.

The listening sockets are read from /proc while the job is up (tests/netcheck.py).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from netcheck import LOOPBACK, listening_sockets, process_tree

from scalelab.parallel.launch import spawn

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _wait_for(predicate, timeout_s: float = 120.0, what: str = "") -> None:
    deadline = time.time() + timeout_s
    while not predicate():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _held_job(flag_dir: str) -> None:
    """Every rank: one collective (the group's sockets are open), report the pid, wait for `go`."""
    t = torch.ones(2)
    dist.all_reduce(t)
    Path(flag_dir, f"rank{dist.get_rank()}.pid").write_text(str(os.getpid()))
    while not Path(flag_dir, "go").exists():
        time.sleep(0.05)
    dist.barrier()


def test_local_job_listens_only_on_loopback(tmp_path):
    before = listening_sockets([os.getpid()])
    errors: list[BaseException] = []

    def run():
        try:
            spawn(_held_job, 2, (str(tmp_path),), backend="gloo")
        except BaseException as e:  # noqa: BLE001 - re-raised in the test thread
            errors.append(e)

    job = threading.Thread(target=run)
    job.start()
    try:
        _wait_for(lambda: all((tmp_path / f"rank{r}.pid").exists() for r in range(2)) or errors, what="the ranks")
        assert not errors, errors
        ranks = [int((tmp_path / f"rank{r}.pid").read_text()) for r in range(2)]
        ours = {pid for r in ranks for pid in process_tree(r)}
        # the launcher's new sockets (the store it serves) and everything the ranks hold
        sockets = (listening_sockets([os.getpid()]) - before) | listening_sockets(ours)
    finally:
        (tmp_path / "go").touch()
        job.join(timeout=120)
    assert not errors, errors
    assert any(pid == os.getpid() for _, _, pid in sockets), "the launcher serves the store"
    assert any(pid in ranks for _, _, pid in sockets), "gloo listens in every rank"
    assert {ip for ip, _, _ in sockets} <= set(LOOPBACK), sockets
