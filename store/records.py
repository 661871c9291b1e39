"""A run's records in the store's format (docs/architecture.md), written whole (scalelab.store.atomic).

    <run>/config.json       the resolved config
    <run>/status.json       {"status": pending|running|done|failed|diverged|stopped_early, ...}
    <run>/metrics.parquet   per step: step, tokens, flops, loss, lr, grad_norm, tokens_per_s
    <run>/evals.parquet     per eval: step, tokens, flops, task, metric, value, stderr
    <run>/router.parquet    MoE runs: per logged step, moe_aux_loss, moe_z_loss, moe_imbalance(_max), moe_dropped_frac

Every file is written whole (a temporary name renamed over the target, or one object on object
storage), so a reader (a sweep scan, polars) never sees a half-written file, whatever happens to
the writer. The training loop (scalelab.train.loop) writes a run's records through this module.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl

from scalelab.store import objects
from scalelab.store.atomic import atomic_write_json, atomic_write_parquet

STATUSES = ("pending", "running", "done", "failed", "diverged", "stopped_early")
TERMINAL = ("done", "diverged", "stopped_early")  # states a run never leaves; anything else is (re)started

METRICS_SCHEMA = {
    "step": pl.Int64,
    "tokens": pl.Int64,
    "flops": pl.Float64,
    "loss": pl.Float64,
    "lr": pl.Float64,
    "grad_norm": pl.Float64,
    "tokens_per_s": pl.Float64,
}
# MoE runs only: router statistics of each logged step (last micro-batch on rank 0), router.parquet
ROUTER_SCHEMA = {
    "step": pl.Int64,
    "moe_aux_loss": pl.Float64,
    "moe_z_loss": pl.Float64,
    "moe_imbalance": pl.Float64,
    "moe_imbalance_max": pl.Float64,
    "moe_dropped_frac": pl.Float64,
}
EVALS_SCHEMA = {
    "step": pl.Int64,
    "tokens": pl.Int64,
    "flops": pl.Float64,
    "task": pl.Utf8,
    "metric": pl.Utf8,
    "value": pl.Float64,
    "stderr": pl.Float64,
}


def write_status(run_dir: str | Path, status: str, **extra: Any) -> None:
    """Update status.json: the previous record's fields, then `status` and `extra`.

    Read-modify-write under the run's status lock (`<run>/.status.lock`, fcntl), so two writers
    (the loop and the step watchdog, rank 0 and a launcher) never lose each other's fields. A
    previous record that cannot be parsed is started afresh (and kept as status.json.corrupt)."""
    if status not in STATUSES:
        raise ValueError(f"status {status!r} not in {STATUSES}")
    with _status_lock(run_dir):
        try:
            prev = read_status(run_dir) or {}
        except ValueError:
            if not objects.is_url(run_dir):
                _keep_aside(Path(run_dir) / "status.json")
            prev = {}
        record = {k: v for k, v in prev.items() if k not in ("status", "error", "reason")}
        record.update(status=status, updated_at=time.time(), **extra)
        atomic_write_json(_join(run_dir, "status.json"), record)


@contextlib.contextmanager
def _status_lock(run_dir: str | Path) -> Iterator[None]:
    if objects.is_url(run_dir):  # one writer per run there (the lease holder's copy is local)
        yield
        return
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    fd = os.open(Path(run_dir) / ".status.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _keep_aside(path: Path) -> Path:
    """An unreadable record renamed <name>.corrupt (kept for inspection, never read again)."""
    target = path.with_name(path.name + ".corrupt")
    os.replace(path, target)
    print(f"records: {path} is unreadable; kept as {target.name}", file=sys.stderr, flush=True)
    return target


def _join(run_dir: str | Path, name: str) -> str | Path:
    return objects.join(run_dir, name) if objects.is_url(run_dir) else Path(run_dir) / name


def read_status(run_dir: str | Path) -> dict[str, Any] | None:
    """status.json as a dict; None when there is none, or it is empty (a write a power loss cut
    before it reached the disk). ValueError for anything else that does not parse."""
    if objects.is_url(run_dir):
        data = objects.read_bytes(objects.join(run_dir, "status.json"))
    else:
        path = Path(run_dir) / "status.json"
        data = path.read_bytes() if path.exists() else None
    if not data:
        return None
    return json.loads(data)


def run_state(run_dir: str | Path) -> str:
    """pending (nothing on disk) | running | done | failed | diverged, from status.json."""
    try:
        status = read_status(run_dir)
    except (OSError, json.JSONDecodeError):
        return "pending"
    return (status or {}).get("status", "pending")


class RecordWriter:
    """Accumulates metric and eval rows and flushes them atomically as Parquet.

    On resume, rows past the checkpoint's step (written before a crash, then redone) are dropped,
    so the records of a resumed run equal those of an uninterrupted one.
    """

    def __init__(self, run_dir: str | Path, resume_step: int | None = None):
        self.run_dir = Path(run_dir)
        self.metrics: list[dict] = []
        self.evals: list[dict] = []
        self.router: list[dict] = []
        self.lost: list[str] = []  # records unreadable at the resume: their rows before it are gone
        if resume_step is not None:
            self.metrics = rows_through(self.run_dir / "metrics.parquet", resume_step, self.lost)
            self.evals = rows_through(self.run_dir / "evals.parquet", resume_step, self.lost)
            self.router = rows_through(self.run_dir / "router.parquet", resume_step, self.lost)

    def log_metrics(self, row: dict) -> None:
        self.metrics.append({k: row.get(k) for k in METRICS_SCHEMA})
        if "moe_imbalance" in row:
            self.router.append({k: row.get(k) for k in ROUTER_SCHEMA})

    def log_eval(self, row: dict) -> None:
        self.evals.append({k: row.get(k) for k in EVALS_SCHEMA})

    def flush(self) -> None:
        atomic_write_parquet(self.run_dir / "metrics.parquet", pl.DataFrame(self.metrics, schema=METRICS_SCHEMA))
        atomic_write_parquet(self.run_dir / "evals.parquet", pl.DataFrame(self.evals, schema=EVALS_SCHEMA))
        if self.router:
            atomic_write_parquet(self.run_dir / "router.parquet", pl.DataFrame(self.router, schema=ROUTER_SCHEMA))


def rows_through(path: Path, max_step: int, lost: list[str] | None = None) -> list[dict]:
    """The rows of a records file with step <= max_step (none if the file does not exist).

    A file that cannot be read (empty or cut by a power loss) is kept aside as <name>.corrupt and
    counts as no rows: the resumed run records from its checkpoint on, and says so (on stderr, and
    its name appended to `lost`, which the loop records in status.json as `records_lost`)."""
    if not path.exists():
        return []
    try:
        df = pl.read_parquet(path)
    except Exception:  # noqa: BLE001 - polars raises several kinds for an empty or cut file
        _keep_aside(path)
        if lost is not None:
            lost.append(path.name)
        return []
    return df.filter(pl.col("step") <= max_step).to_dicts()


def last_step(run_dir: Path) -> int:
    """The last step in a run's metrics.parquet (0 when there is none or it cannot be read)."""
    path = run_dir / "metrics.parquet"
    if not path.exists():
        return 0
    try:
        return int(pl.read_parquet(path, columns=["step"])["step"].max() or 0)
    except Exception:  # noqa: BLE001 - an unreadable file counts as no progress (never a crash)
        return 0
