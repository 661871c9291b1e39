"""The fit of a sweep store: its runs table and its spec's `fit:` options, through the one fit entry.

    options = fit_options(store_fit_spec("results/iso"))      # the spec's fit: section, as FitOptions
                                                              # (scalelab.fitting.entry.fit_options)
    fit, warnings = fit_store("results/iso", options)         # a ScalingFit (scalelab.fitting.entry.fit_runs)

`scalelab fit DIR`, `sweep next DIR` and `scalelab report DIR` all fit a store this way: the same
runs (the store's runs table, scalelab.store.load_runs, filtered by `fit_frame`) with the
same options (scalelab.fitting.entry.fit_options.fit_options, from the spec's `fit:` section unless a
command-line option says otherwise), so they agree on every parameter and interval.

The runs a fit uses: done runs with a value in the options' loss column, at their FLOP budget (the
IsoFLOP label, else their FLOPs by the options' convention, 6ND or exact). With `stopped: include`
the runs stopped early enter too, at their predicted loss and weight (scalelab.sweeps.tracking.early_stop).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import polars as pl

from scalelab import store
from scalelab.errors import UsageError
from scalelab.fitting.entry.fit_options import FitOptions
from scalelab.fitting.entry.fit_options import fit_options as fit_options  # the one builder, beside the store's section
from scalelab.fitting.entry.fit_runs import fit_runs
from scalelab.fitting.entry.scaling_fit import ScalingFit
from scalelab.fitting.estimate.io import RunTable, read_runs
from scalelab.fitting.loss_curves.curves import RunCurve
from scalelab.sweeps.specs.spec import read_spec
from scalelab.sweeps.tracking.early_stop import STATUS as STOPPED
from scalelab.sweeps.tracking.early_stop import stopped_run_weight
from scalelab.sweeps.tracking.run_curves import run_dir_of

MIN_LOOP_RUNS = 6  # runs the closed loop (and the report's gates) need before it fits


def store_fit_spec(path: str | Path) -> dict[str, Any]:
    """The `fit:` section of a sweep directory's spec ({} for a store root or a bare store): what
    fit_options builds a store's options from (`fit_options(store_fit_spec(path), law=...)`)."""
    if not store.is_sweep_dir(path):
        return {}
    return read_spec(store.SweepLayout(path).spec).get("fit") or {}


def fit_frame(runs: pl.DataFrame, options: FitOptions, *, store_path: str | Path | None = None) -> pl.DataFrame:
    """The runs a fit uses (module docstring), one row each, in the runs table's order.

    Columns: run_id, params, tokens, flops (the FLOP budget), loss (options.loss, or a stopped run's
    prediction), weight (1 for a run that finished), status. Stopped runs need `store_path` (their
    predictions are in their status.json).
    """
    flops_col = "flops" if options.flops == "6n" else "flops_exact"
    params_col = "params" if options.params == "total" else "params_nonembed"
    if options.loss not in runs.columns:
        return _frame([])
    rows = []
    for row in runs.iter_rows(named=True):
        loss, weight = row.get(options.loss), 1.0
        if row["status"] == STOPPED and options.stopped == "include":
            if store_path is None:
                raise UsageError("runs stopped early enter a fit only from a store (their predictions)")
            loss, weight = stopped_run_weight(store.read_status(run_dir_of(store_path, row)) or {})
        elif row["status"] != "done":
            continue
        if loss is None or row.get(params_col) is None:
            continue
        budget = number_or_none(row.get("flops_budget"))
        rows.append(
            {
                "run_id": str(row["run_id"]),
                "params": float(row[params_col]),
                "tokens": float(row["tokens"]),
                "flops": budget if budget is not None else number_or_none(row.get(flops_col)),
                "loss": float(loss),
                "weight": float(weight),
                "status": row["status"],
            }
        )
    return _frame(rows)


def number_or_none(x) -> float | None:
    """x as a finite float; None when it is missing, not a number, or not finite."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _frame(rows: list[dict]) -> pl.DataFrame:
    schema = {"run_id": pl.Utf8, "params": pl.Float64, "tokens": pl.Float64, "flops": pl.Float64}
    schema |= {"loss": pl.Float64, "weight": pl.Float64, "status": pl.Utf8}
    return pl.DataFrame(rows, schema=schema)


def completeness(runs: pl.DataFrame) -> list[str]:
    """Warnings when runs of the design are not done: the fit then uses part of the grid."""
    warnings = []
    not_done = runs.filter(pl.col("status") != "done")
    if not_done.height:
        warnings.append(
            f"partial grid: the fit uses {runs.height - not_done.height} of {runs.height} planned runs "
            f"({not_done.height} not done: {', '.join(sorted(set(not_done['status'].to_list())))})"
        )
        if "flops_budget" in runs.columns:
            for budget in sorted({b for b in not_done["flops_budget"].to_list() if b is not None}):
                sub = runs.filter(pl.col("flops_budget") == budget)
                ok = sub.filter(pl.col("status") == "done").height
                warnings.append(f"budget {budget:.3g}: {ok} of {sub.height} runs done")
    return warnings


def runs_table(
    runs: pl.DataFrame, options: FitOptions, *, store_path: str | Path | None = None, min_runs: int = 1
) -> RunTable:
    """fit_frame as the fitter's RunTable (a weight column only when a run is weighted below 1).

    Raises:
        UsageError: fewer than `min_runs` runs (naming the loss column).
    """
    frame = fit_frame(runs, options, store_path=store_path)
    if frame.height < min_runs:
        where = f"{store_path}: " if store_path is not None else ""
        raise UsageError(
            f"{where}{frame.height} done run(s) with {options.loss}; a {options.law} fit needs at least {min_runs}"
        )
    if (frame["weight"] == 1.0).all():
        frame = frame.drop("weight")
    return read_runs(frame.drop("status"))


def fit_store(
    path: str | Path,
    options: FitOptions,
    *,
    runs: pl.DataFrame | None = None,
    curves: list[RunCurve] | None = None,
    min_runs: int = 1,
) -> tuple[ScalingFit, list[str]]:
    """(the fit of the store's runs, warnings about the runs: a partial grid).

    `runs`: a part of the store's runs table (e.g. one tag's runs); default all of it.
    """
    runs = store.load_runs(path) if runs is None else runs
    if runs.is_empty():
        raise UsageError(f"{path} holds no runs")
    table = runs_table(runs, options, store_path=path, min_runs=min_runs)
    return fit_runs(table, options, curves=curves), completeness(runs)
