"""The runs table: one row per run of a sweep (or of every sweep under a store root), as polars.

    from scalelab import store
    df = store.load_runs("results/isoflop")        # a sweep dir, a whole store root, or s3://...
    df.filter(pl.col("status") == "done").select("params", "tokens", "flops", "loss")

Everything the fitting side needs comes from this frame, so fits also run on any CSV/Parquet with
the same columns (`export_table`). An object-storage store is read from a local copy of its
records (scalelab.store.objects.local_view).
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import polars as pl

from scalelab.errors import UsageError
from scalelab.store import objects
from scalelab.store.atomic import atomic_write_bytes, atomic_write_parquet
from scalelab.store.paths import RESOLVED, is_sweep_dir, runs_dir
from scalelab.store.records import last_step, read_status
from scalelab.store.sweep_dir import read_resolved

_HYPER = {  # column -> path in the resolved config
    "lr": ("optim", "lr"),
    "weight_decay": ("optim", "weight_decay"),
    "beta2": ("optim", "beta2"),
    "schedule": ("schedule", "name"),
    "global_batch_tokens": ("train", "global_batch_tokens"),
    "seq_len": ("data", "seq_len"),
    "seed": ("train", "seed"),
    "data_seed": ("train", "data_seed"),  # None: the data order follows seed
    "num_layers": ("model", "num_layers"),
    "d_model": ("model", "d_model"),
    "parametrization": ("model", "parametrization"),
    "num_heads": ("model", "num_heads"),
    "num_kv_heads": ("model", "num_kv_heads"),
    "d_ff": ("model", "d_ff"),
    "vocab_size": ("model", "vocab_size"),
    "tokenizer": ("data", "tokenizer"),
    "init_from": ("train", "init_from"),
}
_LABELS = (
    "generator",
    "spec",
    "flops_budget",
    "tokens_per_param",
    "size_index",
    "target_params",
    "cooldown",
    "branch_of",
    "branch_step",
    "round",
    "proposal",
    "sample",
    "mixture",
    "epochs",
    "unique_tokens",
    "arm",
)


def _get(tree: dict, path: tuple[str, ...]) -> Any:
    for p in path:
        if not isinstance(tree, dict):
            return None
        tree = tree.get(p)
    return tree


def _final_evals(run_dir: Path) -> dict[str, float]:
    path = run_dir / "evals.parquet"
    if not path.exists():
        return {}
    try:
        df = pl.read_parquet(path)
    except Exception:  # noqa: BLE001
        return {}
    if df.is_empty():
        return {}
    last = df.filter(pl.col("step") == df["step"].max())
    return {f"eval/{r['task']}/{r['metric']}": r["value"] for r in last.iter_rows(named=True)}


def _row(run_dir: Path, sweep: str, entry: dict[str, Any]) -> dict[str, Any]:
    status = {}
    try:
        status = read_status(run_dir) or {}
    except (OSError, json.JSONDecodeError):
        pass
    config = entry.get("config")
    if config is None and (run_dir / "config.json").exists():
        config = json.loads((run_dir / "config.json").read_text())
    config = config or {}
    labels = entry.get("labels") or {}
    num_steps = status.get("num_steps")
    if num_steps is None and config:
        tps = config["train"]["global_batch_tokens"] // config["data"]["seq_len"] * config["data"]["seq_len"]
        num_steps = config["train"]["num_tokens"] // tps
    step = last_step(run_dir)
    final_val = status.get("final_val_loss")
    row = dict(
        run_id=run_dir.name,
        sweep=sweep,
        status=status.get("status", "pending"),
        step=step,
        num_steps=num_steps,
        progress=(step / num_steps) if num_steps else None,
        attempts=status.get("attempts", 0),
        params=status.get("params", entry.get("params")),
        params_nonembed=status.get("params_nonembed", entry.get("params_nonembed")),
        tokens=status.get("num_tokens", entry.get("num_tokens")),
        flops=status.get("flops_6n", entry.get("flops_6n")),
        flops_exact=status.get("flops_exact", entry.get("flops_exact")),
        cost_flops=entry.get("cost_flops", status.get("flops_6n")),
        final_train_loss=status.get("final_train_loss"),
        best_train_loss=status.get("best_train_loss"),
        final_val_loss=final_val,
        best_val_loss=status.get("best_val_loss"),
        final_val_bpb=status.get("final_val_bpb"),
        loss=final_val if final_val is not None else status.get("final_train_loss"),
        predicted_loss=status.get("predicted_loss"),  # stopped_early runs (sweeps/tracking/early_stop.py)
        stopped_fraction=status.get("stopped_fraction"),
        error=status.get("error") or status.get("reason"),
        updated_at=status.get("updated_at"),
        tags=json.dumps(dict(config.get("tags") or {}, **{k: str(v) for k, v in labels.items()}), sort_keys=True),
    )
    for col in _LABELS:
        row[col] = labels.get(col) if col != "spec" else entry.get("spec")
    for col, path in _HYPER.items():
        row[col] = _get(config, path)
    row.update(_final_evals(run_dir))
    return row


def _sweep_rows(sweep_dir: Path) -> list[dict[str, Any]]:
    resolved = read_resolved(sweep_dir)
    entries = {r["run_id"]: r for r in resolved.get("runs", [])}
    rdir = runs_dir(sweep_dir)
    on_disk = sorted(p.name for p in rdir.iterdir() if not p.name.startswith(".")) if rdir.is_dir() else []
    ids = list(entries) + [i for i in on_disk if i not in entries]
    rows, seen = [], set()
    for i in ids:
        # One physical run can sit under two ids (linked after the code added config fields): once.
        real = os.path.realpath(rdir / i) if (rdir / i).exists() else str(rdir / i)
        if real in seen:
            continue
        seen.add(real)
        rows.append(_row(rdir / i, sweep_dir.name, entries.get(i, {})))
    return rows


def load_runs(path: str | Path) -> pl.DataFrame:
    """One row per run of a sweep directory, or of every sweep under a store root.

    Columns: run_id, sweep, status, step/num_steps/progress, attempts, params, params_nonembed,
    tokens, flops (6ND), flops_exact, cost_flops, final/best train and val losses, final_val_bpb,
    loss (final val loss, else final train loss), error, tags (JSON), design labels (generator,
    flops_budget, tokens_per_param, cooldown, branch_of, ...), hyperparameters (lr, batch, shape,
    seed, ...) and the last value of every eval as `eval/<task>/<metric>`. In a store root a run
    linked into several sweeps appears once. `path` may be an object-storage URL.
    """
    path = objects.local_view(path) if objects.is_url(path) else Path(path)
    if is_sweep_dir(path) or (path / RESOLVED).exists():
        rows = _sweep_rows(path)
    elif path.is_dir():
        rows, seen = [], set()
        for sweep in sorted(p for p in path.iterdir() if is_sweep_dir(p)):
            for row in _sweep_rows(sweep):
                if row["run_id"] not in seen:
                    seen.add(row["run_id"])
                    rows.append(row)
        if not rows and not any(is_sweep_dir(p) for p in path.iterdir()):
            raise UsageError(f"{path} is neither a sweep directory nor a store root holding sweeps")
    else:
        raise UsageError(f"{path} does not exist")
    if not rows:
        return pl.DataFrame({"run_id": [], "status": []}, schema={"run_id": pl.Utf8, "status": pl.Utf8})
    return pl.DataFrame(rows, infer_schema_length=None)


def export_table(path: str | Path, out: str | Path, *, done_only: bool = True) -> int:
    """Write load_runs(path) as CSV (or Parquet by suffix) for the fitter; returns the row count."""
    df = load_runs(path)
    if done_only and "status" in df.columns:
        df = df.filter(pl.col("status") == "done")
    out = Path(out)
    if out.suffix == ".parquet":
        atomic_write_parquet(out, df)
    else:
        buf = io.StringIO()
        df.select([c for c in df.columns if df[c].dtype != pl.Null]).write_csv(buf)
        atomic_write_bytes(out, buf.getvalue().encode())
    return df.height
