"""Run records in the sweep-store format (ARCHITECTURE.md), written atomically.

    <run>/config.json       the resolved config
    <run>/status.json       {"status": pending|running|done|failed|diverged|stopped_early, ...}
    <run>/metrics.parquet   per step: step, tokens, flops, loss, lr, grad_norm, tokens_per_s
    <run>/evals.parquet     per eval: step, tokens, flops, task, metric, value, stderr
    <run>/router.parquet    MoE runs: per logged step, moe_aux_loss, moe_z_loss, moe_imbalance(_max), moe_dropped_frac

Every file is written to a temporary name in the same directory and renamed over the target, so a
reader (a sweep scan, polars) never sees a half-written file, whatever happens to the writer. On
object storage (an `s3://` path, scalelab.train.storage) there is no rename: each file is one
object put whole, which gives readers the same guarantee.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import polars as pl

from scalelab.models.accounting import flops_per_token, num_params, num_params_nonembedding
from scalelab.train import storage

STATUSES = ("pending", "running", "done", "failed", "diverged", "stopped_early")

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


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    if storage.is_url(path):
        storage.write_bytes(path, data)
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def atomic_write_parquet(path: str | Path, df: pl.DataFrame) -> None:
    if storage.is_url(path):
        buf = io.BytesIO()
        df.write_parquet(buf)
        storage.write_bytes(path, buf.getvalue())
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        df.write_parquet(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_status(run_dir: str | Path, status: str, **extra: Any) -> None:
    if status not in STATUSES:
        raise ValueError(f"status {status!r} not in {STATUSES}")
    prev = read_status(run_dir) or {}
    record = {k: v for k, v in prev.items() if k not in ("status", "error", "reason")}
    record.update(status=status, updated_at=time.time(), **extra)
    atomic_write_json(_join(run_dir, "status.json"), record)


def _join(run_dir: str | Path, name: str) -> str | Path:
    return storage.join(run_dir, name) if storage.is_url(run_dir) else Path(run_dir) / name


def read_status(run_dir: str | Path) -> dict[str, Any] | None:
    if storage.is_url(run_dir):
        data = storage.read_bytes(storage.join(run_dir, "status.json"))
        return None if data is None else json.loads(data)
    path = Path(run_dir) / "status.json"
    if not path.exists():
        return None
    return json.loads(path.read_text())


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
        if resume_step is not None:
            self.metrics = rows_through(self.run_dir / "metrics.parquet", resume_step)
            self.evals = rows_through(self.run_dir / "evals.parquet", resume_step)
            self.router = rows_through(self.run_dir / "router.parquet", resume_step)

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


def rows_through(path: Path, max_step: int) -> list[dict]:
    """The rows of a records file with step <= max_step (none if the file does not exist)."""
    if not path.exists():
        return []
    return pl.read_parquet(path).filter(pl.col("step") <= max_step).to_dicts()


def run_summary_fields(cfg) -> dict[str, Any]:
    """Static facts about a run config (sizes, FLOPs) that the store keeps beside its losses."""
    fpt = flops_per_token(cfg.model, cfg.data.seq_len)
    return dict(
        params=num_params(cfg.model),
        params_nonembed=num_params_nonembedding(cfg.model),
        flops_per_token_6n=fpt.six_n,
        # exact: every matmul (output layer included) plus causal attention (half the T x T scores)
        flops_per_token_exact=fpt.exact_causal,
        num_steps=cfg.num_steps,
        tokens_per_step=cfg.tokens_per_step,
        num_tokens=cfg.num_steps * cfg.tokens_per_step,
    )
