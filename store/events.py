"""A sweep's event log: one record per trial start / end / failure / retry, append-only.

    <sweep>/events.jsonl          one JSON line per event (a single O_APPEND write each)
    <sweep>/events/<time>-<id>.json   on object storage, where there is no append: one object each

`sweep status` and bench/sweep_overhead.py read them back with read_events.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

from scalelab.store import objects
from scalelab.store.paths import SweepLayout


def append_event(sweep_dir: str | Path, event: str, run_id: str, **fields: Any) -> None:
    """One JSON line in events.jsonl; a single O_APPEND write, so concurrent trials never interleave."""
    line = json.dumps(dict(event=event, run_id=run_id, time=time.time(), pid=os.getpid(), **fields))
    if objects.is_url(sweep_dir):  # no append on object storage: one object per event
        event_name = f"{time.time():.6f}-{uuid.uuid4().hex[:8]}.json"  # sorts by time
        objects.write_bytes(objects.join(sweep_dir, "events", event_name), line.encode())
        return
    fd = os.open(SweepLayout(Path(sweep_dir)).events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def read_events(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """The events of a sweep, oldest first (events.jsonl, or one object each from object storage)."""
    if objects.is_url(sweep_dir):
        sweep_dir = objects.local_view(sweep_dir)
    path = Path(SweepLayout(Path(sweep_dir)).events)
    lines = path.read_text().splitlines() if path.exists() else []
    one_each = Path(sweep_dir) / "events"
    lines += [p.read_text() for p in sorted(one_each.glob("*.json"))] if one_each.is_dir() else []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a killed writer
    return out
