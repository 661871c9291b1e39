"""One process trains a run of a store root at a time: the run lock.

    with run_lock(sweep_dir, run_id) as run_dir:     # the directory to train into
        remove_stale_temp_files(run_dir)
        train_run(cfg, run_dir, resume=True)

A local or shared POSIX store: the root's one directory of the run (scalelab.store.claims.claim_run)
under an exclusive fcntl lock on `<run>/.lock`, which the OS drops when its holder dies. Object
storage: a lease and a node-local copy synced to the store (scalelab.store.lease) of the root's one
copy of the run (claims.claim_object_run). A run claimed by a sibling sweep waits as long as its
holder lives.

A multi-process run on object storage trains on several nodes, each rank in a copy of its own
(scalelab.store.rank_copy): its trial takes only the lease (`run_lease`) and hands it to the ranks.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from scalelab.store import objects
from scalelab.store.claims import claim_object_run, claim_run
from scalelab.store.lease import Lease, LeaseLost, held_lease, remote_run

LOCK_WAIT_S = 180.0  # how long a trainer waits for a previous process of the same run to go away


@contextlib.contextmanager
def run_lock(sweep_dir: str | Path, run_id: str, wait_s: float = LOCK_WAIT_S) -> Iterator[Path]:
    """Be the one process training run_id in its store root; yields the directory to train into."""
    if objects.is_url(sweep_dir):
        run_url = claim_object_run(sweep_dir, run_id)
        linked = run_url != objects.join(sweep_dir, "runs", run_id)  # another sweep's: wait as long as it trains
        with remote_run(sweep_dir, run_id, wait_s=None if linked else wait_s, run_url=run_url) as run_dir:
            yield run_dir
        return
    run_dir = claim_run(sweep_dir, run_id)
    with fcntl_lock(run_dir, wait_s=None if run_dir.is_symlink() else wait_s):
        yield run_dir


@contextlib.contextmanager
def run_lease(sweep_url: str, run_id: str, wait_s: float = LOCK_WAIT_S) -> Iterator[tuple[str, Lease]]:
    """Hold run_id's lease on object storage without a local copy: yields (the run's URL, the lease).

    Raises:
        LeaseLost: (on exit) the lease was taken over or lapsed during the block.
    """
    run_url = claim_object_run(sweep_url, run_id)
    linked = run_url != objects.join(sweep_url, "runs", run_id)  # another sweep's: wait as long as it trains
    with held_lease(sweep_url, run_id, wait_s=None if linked else wait_s) as lease:
        yield run_url, lease
    if lease.lost.is_set():
        raise LeaseLost(f"{lease.url}: taken over or lapsed while this trial trained")


@contextlib.contextmanager
def fcntl_lock(run_dir: Path, wait_s: float | None = LOCK_WAIT_S) -> Iterator[None]:
    """Hold an exclusive fcntl lock on <run>/.lock; the OS drops it when the holder dies.

    wait_s=None waits as long as the holder lives: a sibling sweep training this run.
    On NFS this needs NFSv4 (or lockd for v3); on Lustre the `flock` mount option."""
    fd = os.open(run_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    deadline = None if wait_s is None else time.monotonic() + wait_s
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline is not None and time.monotonic() > deadline:
                    raise RuntimeError(f"{run_dir} is locked by another process for {wait_s:.0f} s") from None
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)


def remove_stale_temp_files(run_dir: Path) -> None:
    """Temp files of a writer that died mid-write (records, a half-saved checkpoint). Holding the
    run's lock means no live process writes here, so whatever temp file exists is garbage."""
    for tmp in run_dir.glob(".*.tmp"):
        tmp.unlink(missing_ok=True)
    for tmp in (run_dir / "checkpoints").glob("*.tmp"):
        shutil.rmtree(tmp, ignore_errors=True)
