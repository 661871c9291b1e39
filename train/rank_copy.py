"""Each rank's node-local copy of a multi-process run whose store is on object storage.

    with rank_copy(store_cfg) as (run_dir, publish):    # every rank of the group, collectively
        train_run(cfg, run_dir, resume=True, publish=publish)

store_cfg (from the trial that holds the run's lease, scalelab.sweeps.execution.execute):
{"run_url", "lease_url", "holder", "generation", "ttl_s"}. Rank 0 lists the run once and every rank
downloads the complete checkpoints of that listing into a directory of its own node (rank 0 the
records too), so every rank resumes from the same, newest complete checkpoint whatever the group's
size; while the run trains, rank 0 pushes the records every ttl/3 and once at the end. What each
rank uploads, and why a worker of an older lease holder cannot overwrite a newer one's objects:
scalelab.store.rank_copy.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch.distributed as dist

from scalelab.store import objects
from scalelab.store.lease import every, final_push, remove_dead_copies
from scalelab.store.rank_copy import LeaseView, RankMirror


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _rank0_listing(url: str) -> dict[str, dict[str, Any]]:
    """The run's objects as rank 0 lists them, on every rank (one listing: one chosen checkpoint)."""
    box: list[Any] = [objects.list_objects(url) if _rank() == 0 else None]
    if dist.is_available() and dist.is_initialized():
        dist.broadcast_object_list(box, src=0)
    return box[0]


@contextlib.contextmanager
def rank_copy(store_cfg: dict[str, Any]) -> Iterator[tuple[Path, RankMirror]]:
    """This rank's copy of the run, pulled from the store; rank 0's records pushed as it trains."""
    run_id = objects.name(store_cfg["run_url"])
    view = LeaseView(store_cfg["lease_url"], store_cfg["holder"], store_cfg["generation"], store_cfg["ttl_s"])
    view.confirm()  # the trial's lease still: otherwise this rank writes nothing and stops here
    remove_dead_copies(f"scalelab-rank{_rank()}-{run_id}-")  # the group's last attempt ended before this one
    top = Path(tempfile.mkdtemp(prefix=f"scalelab-rank{_rank()}-{run_id}-"))
    mirror = RankMirror(store_cfg["run_url"], top / run_id, lease=view)
    stop, syncer = threading.Event(), None
    try:
        mirror.pull(_rank0_listing(store_cfg["run_url"]), records=_rank() == 0)
        if _rank() == 0:
            period = float(store_cfg["ttl_s"]) / 3
            # records only: the ranks upload the checkpoints themselves
            syncer = threading.Thread(target=every, args=(period, stop, mirror.records), name=f"records-{run_id}")
            syncer.daemon = True
            syncer.start()
        yield mirror.local, mirror
    finally:
        stop.set()
        try:
            if syncer is not None:
                syncer.join()
                if not view.lost.is_set():
                    final_push(mirror, view, checkpoints=False)  # status.json last, as the run ended
                    mirror.push_folders()  # rank 0's offline W&B logs
        finally:
            shutil.rmtree(top, ignore_errors=True)
