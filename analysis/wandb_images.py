"""The figures of a `sweep next` round for its W&B fit run (scalelab.sweeps.tracking.wandb_fit calls `fit_images`).

    pngs = fit_images(sweep_dir, record, out_dir)   # fits/round_K.json -> {"isoflop", "frontier", "ledger": PNG}

The IsoFLOP curves and the compute frontier of the round's own fit (the runs it used, its bootstrap
draws and backtest), drawn as `scalelab report` draws them, and the sweep's ledger. The sweep side
receives this function from the CLI (it does not import analysis).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from scalelab.analysis import plots
from scalelab.analysis.lawfit import store_fit_from_record
from scalelab.analysis.store_reader import load_store_runs
from scalelab.store.ledger import read_ledger


def fit_images(sweep_dir: str | Path, record: dict[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """{"isoflop", "frontier", "ledger"}: the round's plots (module docstring) as PNGs in out_dir."""
    fit_record = record["fit"]
    fit = store_fit_from_record(fit_record)
    runs = load_store_runs(sweep_dir)
    used = set(fit_record.get("run_ids") or record.get("run_ids") or [])
    if used:
        runs = runs.filter(pl.col("run_id").is_in(list(used)))
    loss_col = record.get("loss_column") if record.get("loss_column") in runs.columns else "loss"
    figures = {
        "isoflop": plots.plot_isoflop(runs, fit, loss_col=loss_col),
        "frontier": plots.plot_frontier(runs, fit),
        "ledger": plots.plot_ledger(read_ledger(sweep_dir)),
    }
    out = {}
    for name, fig in figures.items():
        out[name] = Path(out_dir) / f"{name}.png"
        plots.save(fig, out[name])
    return out
