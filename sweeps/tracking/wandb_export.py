"""A sweep's store logged to Weights & Biases after the fact, and `sweep eval` results as eval runs.

    export_sweep("results/iso", mode="offline", images=fit_images)   # `scalelab sweep wandb DIR`
    log_evals(sweep_dir, {run_dir: rows})                             # after `sweep eval`

export_sweep logs every run of the sweep that has no W&B folder yet (a sweep trained with W&B
disabled, or before W&B was wanted) as the run a live sweep would have made: the same W&B id
(the run id), group, tags, job type and summary (sweeps/tracking/wandb_runs.py), its config, and its history
from metrics.parquet and evals.parquet under the loop's names (scalelab.train.loggers.step_metrics);
then every `sweep next` round as its fit run (sweeps/tracking/wandb_fit.py). A run logged while it trained
keeps that record (`force` logs it again: the same id, so W&B appends to it). Live predictions
exist only for runs logged while they trained. Offline runs go where a live sweep puts them:
<run>/wandb/ and <sweep>/wandb/.

An eval run (job_type eval, id `<run_id>-eval-<time>`) holds one `sweep eval`'s new scores of one
run's checkpoints, at the checkpoints' steps, in the run's group with its tags.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from scalelab import store
from scalelab.errors import UsageError
from scalelab.store import objects
from scalelab.store.records import read_status
from scalelab.sweeps.tracking.wandb_fit import Images, log_rounds, logged
from scalelab.sweeps.tracking.wandb_runs import SweepWandb, guarded, reachable_mode, run_context, sweep_wandb
from scalelab.train.loggers import WandbRun, eval_metrics, start_wandb, step_metrics


@dataclass(kw_only=True, slots=True)
class Export:
    """What export_sweep logged."""

    group: str
    mode: str
    runs: list[str] = field(default_factory=list)  # run ids logged
    skipped: list[str] = field(default_factory=list)  # already logged (or not started)
    fits: list[str] = field(default_factory=list)  # W&B ids of the fit runs logged


def _history(run_dir: Path) -> list[tuple[int, dict[str, float]]]:
    """(step, W&B metrics) of a run's records, by step: each metrics row with the evals of its step."""
    by_step: dict[int, dict[str, float]] = {}
    path = run_dir / "metrics.parquet"
    if path.exists():
        for row in pl.read_parquet(path).sort("step").iter_rows(named=True):
            by_step.setdefault(int(row["step"]), {}).update(step_metrics(row))
    path = run_dir / "evals.parquet"
    if path.exists():
        for (step,), rows in pl.read_parquet(path).group_by("step", maintain_order=True):
            by_step.setdefault(int(step), {}).update(eval_metrics(rows.to_dicts()))
    return sorted(by_step.items())


def _log_run(sw: SweepWandb, mode: str, run_dir: Path, ctx: WandbRun, config: dict[str, Any], log) -> bool:
    status = read_status(run_dir) or {}
    run = start_wandb(
        mode=mode,
        project=((config.get("logging") or {}).get("wandb_project")) or sw.project,
        run_id=run_dir.name,
        directory=run_dir,
        name=ctx.name,
        group=ctx.group,
        tags=ctx.tags,
        job_type=ctx.job_type,
        config=dict(config, sweep=ctx.config),
        warn=log,
    )
    if run is None:
        return False
    for step, data in _history(run_dir):
        run.log(data, step=step)
    summary = {k: v for k, v in status.items() if isinstance(v, int | float | str) and k not in ("traceback",)}
    run.summary.update(ctx.summary | summary)
    run.finish(exit_code=0 if status.get("status") in store.TERMINAL else 1)
    return True


def export_sweep(
    sweep_dir: str | Path,
    *,
    mode: str | None = None,
    images: Images | None = None,
    force: bool = False,
    log=print,
) -> Export:
    """Log the sweep's runs and rounds to W&B (module docstring).

    Raises:
        UsageError: not a local sweep directory.
    """
    if objects.is_url(sweep_dir):
        raise UsageError(f"{sweep_dir}: `sweep wandb` reads a local or shared POSIX store; copy it locally first")
    sweep_dir = Path(sweep_dir)
    if not store.is_sweep_dir(sweep_dir):
        raise UsageError(f"{sweep_dir} is not a sweep directory (no sweep.yaml); give a `sweep launch --out` dir")
    sw = sweep_wandb(sweep_dir, mode=mode)
    sw.mode = reachable_mode(sw.mode, log)
    out = Export(group=sw.group, mode=sw.mode)
    if sw.mode == "disabled":
        return out
    entries = store.read_resolved(sweep_dir).get("runs", [])
    for entry in entries:
        run_dir = store.run_path(sweep_dir, entry["run_id"])
        if not (run_dir / "status.json").exists() or (not force and logged(run_dir, entry["run_id"])):
            out.skipped.append(entry["run_id"])
            continue
        ctx = run_context(sw, entry, entries)
        if guarded(f"run {entry['run_id']}", log, _log_run, sw, sw.mode, run_dir, ctx, entry.get("config") or {}, log):
            out.runs.append(entry["run_id"])
    out.fits = log_rounds(sweep_dir, images=images, mode=sw.mode, force=force, log=log)
    return out


def log_evals(sweep_dir: str | Path, new_rows: dict[Path, list[dict[str, Any]]], *, log=print) -> list[str]:
    """One eval run per training run that `sweep eval` scored (module docstring); their W&B ids."""
    if objects.is_url(sweep_dir) or not new_rows:
        return []
    sw = sweep_wandb(sweep_dir)
    mode = reachable_mode(sw.mode, log)
    if mode == "disabled":
        return []
    entries = store.read_resolved(sweep_dir).get("runs", [])
    by_id = {e["run_id"]: e for e in entries}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = []
    for run_dir, rows in new_rows.items():
        ctx = run_context(sw, by_id.get(run_dir.name, {"run_id": run_dir.name}), entries)
        wandb_id = guarded(
            f"the eval run of {run_dir.name}", log, _log_eval_run, sw, mode, run_dir, ctx, rows, stamp, log
        )
        if wandb_id:
            out.append(wandb_id)
    return out


def _log_eval_run(sw: SweepWandb, mode: str, run_dir: Path, ctx: WandbRun, rows, stamp: str, log) -> str | None:
    run = start_wandb(
        mode=mode, project=sw.project, run_id=f"{run_dir.name}-eval-{stamp}", directory=run_dir,
        name=f"{ctx.name} eval", group=sw.group, tags=ctx.tags, job_type="eval",
        config={"sweep": ctx.config, "evaluates": run_dir.name}, resume=None, warn=log,
    )  # fmt: skip
    if run is None:
        return None
    by_step: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_step.setdefault(int(r["step"]), []).append(r)
    for step in sorted(by_step):
        run.log(eval_metrics(by_step[step]), step=step)
    run.summary.update(ctx.summary)
    run.finish()
    return run.id
