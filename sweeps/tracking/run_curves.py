"""Loss curves of stored runs, for the curve laws (scalelab.fitting.loss_curves.curves).

    runs, curves = store_curves("results/iso")              # done runs and one RunCurve each
    curve = run_curve(Path("results/iso/runs/<id>"))         # one run (finished or not)

A RunCurve needs the LR of every step of the run's *whole* schedule and the losses logged so far.
The schedule comes from the run's config.json through scalelab.train.schedule (the same function
the training loop calls, so it matches metrics.parquet's `lr` column step for step, and it gives
the steps a stopped or unfinished run has not taken). The losses are, by `source`:

  "val"    the validation loss of every evaluation (evals.parquet, task "val", metric "loss"),
           with its stderr: the quantity `final_val_loss` and the sweep's fits use;
  "train"  the training loss of every logged step (metrics.parquet);
  "auto"   "val" when the run's config evaluates during training (eval.interval_steps > 0), else
           "train"; store_curves resolves it once for all runs, so one fit never mixes the two.

A cooldown branch's records start at its branch point (its metrics inherit the stable run's
prefix); its schedule is its own WSD schedule, identical to the stable run's up to the branch point.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl

from scalelab import store
from scalelab.errors import UsageError
from scalelab.fitting.loss_curves.curves import RunCurve
from scalelab.train.config import build_run_config
from scalelab.train.run_summary import run_summary_fields
from scalelab.train.schedule import schedule_for

SOURCES = ("auto", "val", "train")


def resolve_source(source: str, configs: list[dict]) -> str:
    """ "val" or "train" for a set of runs: "auto" is "val" only if every run evaluates during training."""
    if source not in SOURCES:
        raise UsageError(f"curve source {source!r} unknown; choose one of {SOURCES}")
    if source != "auto":
        return source
    periodic = [((c.get("eval") or {}).get("interval_steps") or 0) > 0 for c in configs]
    return "val" if configs and all(periodic) else "train"


def planned_lr(config: dict) -> tuple[np.ndarray, int]:
    """(LR of every step 1..num_steps, tokens per step) of a stored run config."""
    cfg = build_run_config(config)
    lr_of = schedule_for(cfg)
    tps = cfg.tokens_per_step
    return np.array([lr_of((s - 1) * tps) for s in range(1, cfg.num_steps + 1)]), tps


def _val_points(run_dir: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    path = run_dir / "evals.parquet"
    if not path.exists():
        return np.empty(0, np.int64), np.empty(0), np.empty(0)
    df = pl.read_parquet(path).filter((pl.col("task") == "val") & (pl.col("metric") == "loss")).sort("step")
    stderr = df["stderr"].fill_null(float("nan")).to_numpy().astype(float)
    return df["step"].to_numpy().astype(np.int64), df["value"].to_numpy().astype(float), stderr


def _train_points(run_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    path = run_dir / "metrics.parquet"
    if not path.exists():
        return np.empty(0, np.int64), np.empty(0)
    df = pl.read_parquet(path, columns=["step", "loss"]).drop_nulls().sort("step").unique("step", keep="last")
    df = df.filter(pl.col("loss").is_finite() & (pl.col("loss") > 0)).sort("step")
    return df["step"].to_numpy().astype(np.int64), df["loss"].to_numpy().astype(float)


def run_curve(
    run_dir: str | Path,
    *,
    source: str = "auto",
    config: dict | None = None,
    final_loss: float | None = None,
    extra_points: tuple[np.ndarray, np.ndarray] | None = None,
) -> RunCurve:
    """The RunCurve of one stored run (module docstring).

    Args:
        run_dir: the run's directory (config.json, metrics.parquet, evals.parquet).
        source: "auto", "val" or "train".
        config: the resolved config (default: run_dir/config.json).
        final_loss: the run's measured final loss, kept on the curve for scoring.
        extra_points: (steps, losses) logged but not yet flushed to disk (a run in progress).
    Raises:
        UsageError: an unknown source, no config, or no logged loss.
    """
    run_dir = Path(run_dir)
    if config is None:
        path = run_dir / "config.json"
        if not path.exists():
            raise UsageError(f"{run_dir}: no config.json, so no LR schedule")
        config = json.loads(path.read_text())
    use_val = resolve_source(source, [config]) == "val"
    lr, tps = planned_lr(config)
    params = float(run_summary_fields(build_run_config(config))["params"])
    if use_val:
        steps, loss, stderr = _val_points(run_dir)
        stderr = stderr if np.all(np.isfinite(stderr)) else None
    else:
        steps, loss = _train_points(run_dir)
        stderr = None
        if extra_points is not None:
            new = extra_points[0] > (steps.max() if steps.size else 0)
            steps = np.concatenate([steps, extra_points[0][new]])
            loss = np.concatenate([loss, extra_points[1][new]])
    keep = (steps >= 1) & (steps <= lr.size)
    if not keep.any():
        raise UsageError(f"{run_dir}: no logged {'validation' if use_val else 'training'} loss")
    return RunCurve(
        run_id=run_dir.name,
        params=params,
        lr=lr,
        steps=steps[keep],
        loss=loss[keep],
        tokens_per_step=float(tps),
        stderr=None if stderr is None else stderr[keep],
        final_loss=final_loss,
    )


def run_dir_of(path: str | Path, row: dict) -> Path:
    """The directory of a load_runs row, for `path` a sweep directory or a store root."""
    path = Path(path)
    if store.is_sweep_dir(path) or (path / store.RESOLVED).exists():
        return store.run_path(path, row["run_id"])
    return store.run_path(path / row["sweep"], row["run_id"])


def store_curves(
    path: str | Path,
    *,
    source: str = "auto",
    statuses: tuple[str, ...] = ("done",),
    loss_col: str = "loss",
) -> tuple[pl.DataFrame, list[RunCurve]]:
    """(runs of `path` with a status in `statuses`, their RunCurves in the same order).

    Each curve's final_loss is the run's `loss_col` (load_runs: final val loss, else final train loss).
    Runs without a readable curve are dropped from both; `source` "auto" is resolved once for all.
    """
    runs = store.load_runs(path)
    if runs.is_empty() or "status" not in runs.columns:
        raise UsageError(f"{path} holds no runs")
    runs = runs.filter(pl.col("status").is_in(list(statuses)))
    dirs, configs = [], []
    for row in runs.iter_rows(named=True):
        d = run_dir_of(path, row)
        try:
            configs.append(json.loads((d / "config.json").read_text()))
        except (OSError, json.JSONDecodeError):
            configs.append(None)
        dirs.append(d)
    chosen = resolve_source(source, [c for c in configs if c is not None])
    keep, curves = [], []
    for i, (row, d, cfg) in enumerate(zip(runs.iter_rows(named=True), dirs, configs)):
        if cfg is None:
            continue
        try:
            curves.append(run_curve(d, source=chosen, config=cfg, final_loss=row.get(loss_col)))
            keep.append(i)
        except UsageError:
            continue
    return runs[keep], curves
