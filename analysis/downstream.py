"""Two-step downstream prediction (the OLMo ladder): compute -> task loss -> task accuracy.

    pred = predict_task(runs, evals, task="olmes/arc_easy/rc_0shot", params=1e9, tokens=2e10)
    pred.bpb, pred.bpb_interval, pred.acc, pred.acc_interval

Step 1 fits the task's bits-per-byte of the correct answer (each run's mean over its last `last_n`
checkpoints) against (N, D) with a law from scalelab.fitting (Chinchilla by default), optionally
weighted by the noise analysis' inverse variances, through the one fit entry
(scalelab.fitting.entry.fit_runs: the law's whole start grid, its bootstrap, no backtests). Step 2 fits
the loss-to-accuracy sigmoid (scalelab.fitting.task_accuracy.loss_to_accuracy) on the (bpb, accuracy) pairs of
every checkpoint of every run, since intermediate checkpoints cover the range the sigmoid needs.
Intervals: bootstrap draws of the step-1 law give bpb draws at (N, D); each is pushed through a
sigmoid drawn from the step-2 fit's parameter covariance, so the accuracy interval carries both
steps' uncertainty.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from scalelab.analysis.noise import fit_weights
from scalelab.errors import UsageError
from scalelab.fitting.entry.fit_options import FitOptions
from scalelab.fitting.entry.fit_runs import fit_runs
from scalelab.fitting.estimate.intervals import percentile_interval
from scalelab.fitting.estimate.io import read_runs
from scalelab.fitting.forms.laws import get_law
from scalelab.fitting.task_accuracy.loss_to_accuracy import fit_sigmoid, sigmoid


@dataclass(kw_only=True, slots=True)
class TaskPrediction:
    task: str
    params: float
    tokens: float
    bpb: float
    bpb_interval: tuple[float, float]
    acc: float
    acc_interval: tuple[float, float]
    level: float
    law: str
    law_params: dict[str, float]
    sigmoid: dict[str, float]
    sigmoid_rmse: float
    n_runs: int
    n_pairs: int
    acc_metric: str
    weighted: bool

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


def _task_rows(evals: pl.DataFrame, task: str, metric: str) -> pl.DataFrame:
    rows = evals.filter((pl.col("task") == task) & (pl.col("metric") == metric))
    if rows.is_empty():
        have = sorted(set(evals["task"]))
        raise UsageError(f"no '{metric}' rows for task '{task}'; tasks in this store: {', '.join(have)}")
    return rows


def predict_task(
    runs: pl.DataFrame,
    evals: pl.DataFrame,
    *,
    task: str,
    params: float,
    tokens: float,
    law: str = "chinchilla",
    acc_metric: str = "acc",
    last_n: int = 3,
    n_boot: int = 200,
    level: float = 0.95,
    weighted: bool = True,
    seed: int = 0,
) -> TaskPrediction:
    """Predict the task's bpb and accuracy of a run with `params` parameters trained on `tokens`."""
    if params <= 0 or tokens <= 0:
        raise UsageError("--params and --tokens must be > 0")
    _task_rows(evals, task, "bpb")
    _task_rows(evals, task, acc_metric)
    values, w = fit_weights(runs, evals, task, "bpb", last_n=last_n)
    ok = np.isfinite(values)
    if ok.sum() <= 5:
        raise UsageError(f"task '{task}': {int(ok.sum())} runs have bpb; step 1 needs at least 6")
    n = np.array(runs["params"].cast(pl.Float64).to_numpy())[ok]
    d = np.array(runs["tokens"].cast(pl.Float64).to_numpy())[ok]
    weights = w[ok] if weighted and np.all(w[ok] > 0) else None
    columns = {"params": n, "tokens": d, "loss": values[ok]}
    table = read_runs(columns if weights is None else {**columns, "weight": weights})
    lawobj = get_law(law)  # one named law (not "auto"/"select"): its draws give the bpb interval
    fit = fit_runs(table, FitOptions(law=lawobj.name, bootstrap=n_boot, seed=seed, level=level, backtest=False))
    bpb = float(lawobj.predict(fit.params, params=np.asarray(params), tokens=np.asarray(tokens)))
    bpb_draws = np.array([float(lawobj.predict(p, params=params, tokens=tokens)) for p in fit.draws])

    # step 2: (bpb, acc) of every checkpoint
    pairs = (
        _task_rows(evals, task, "bpb")
        .select("run_id", "step", pl.col("value").alias("bpb"))
        .join(
            _task_rows(evals, task, acc_metric).select("run_id", "step", pl.col("value").alias("acc")),
            on=["run_id", "step"],
        )
    )
    sig = fit_sigmoid(pairs["bpb"].to_numpy(), pairs["acc"].to_numpy(), seed=seed)
    acc = float(np.clip(sig.predict(bpb), 0.0, 1.0))  # accuracy is a fraction, whatever the sigmoid's ceiling
    rng = np.random.default_rng(seed + 17)
    if bpb_draws.size:
        cov = np.asarray(sig.cov, dtype=float)
        mean = np.array([sig.a, sig.k, sig.L0, sig.b])
        if np.all(np.isfinite(cov)):
            sig_draws = rng.multivariate_normal(mean, cov, size=bpb_draws.size, check_valid="ignore")
        else:
            sig_draws = np.tile(mean, (bpb_draws.size, 1))

        acc_draws = np.clip([sigmoid(x, *p) for x, p in zip(bpb_draws, sig_draws)], 0.0, 1.0)
        bpb_iv = percentile_interval(bpb_draws, level)
        acc_iv = percentile_interval(acc_draws, level)
    else:
        bpb_iv = acc_iv = (math.nan, math.nan)
    return TaskPrediction(
        task=task,
        params=float(params),
        tokens=float(tokens),
        bpb=bpb,
        bpb_interval=bpb_iv,
        acc=acc,
        acc_interval=acc_iv,
        level=level,
        law=lawobj.name,
        law_params=dict(fit.params),
        sigmoid=sig.params,
        sigmoid_rmse=sig.rmse,
        n_runs=int(ok.sum()),
        n_pairs=pairs.height,
        acc_metric=acc_metric,
        weighted=weights is not None,
    )


def format_prediction(p: TaskPrediction) -> str:
    pct = f"{100 * p.level:.0f}%"
    law = ", ".join(f"{k}={v:.4g}" for k, v in p.law_params.items())
    sig = ", ".join(f"{k}={v:.4g}" for k, v in p.sigmoid.items())
    return "\n".join(
        [
            f"task {p.task} at N={p.params:.3g} params, D={p.tokens:.3g} tokens (C=6ND={6 * p.params * p.tokens:.3g})",
            f"  step 1  bpb  = {p.bpb:.4f}  {pct} [{p.bpb_interval[0]:.4f}, {p.bpb_interval[1]:.4f}]   "
            f"({p.law} on {p.n_runs} runs{', noise-weighted' if p.weighted else ''}: {law})",
            f"  step 2  {p.acc_metric:<4} = {p.acc:.4f}  {pct} [{p.acc_interval[0]:.4f}, {p.acc_interval[1]:.4f}]   "
            f"(sigmoid on {p.n_pairs} checkpoint pairs, rmse {p.sigmoid_rmse:.4f}: {sig})",
        ]
    )
