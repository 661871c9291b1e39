"""Backtests: fit on the smaller-compute runs, predict the held-out ones, score relative error.

Two protocols over a RunTable:

- `holdout_backtest`: hold out the largest-compute runs - by default every run in the largest FLOP
  budget (runs within 5% of each other's FLOPs share a budget), or the top `holdout_frac` of runs
  by FLOPs - fit on the rest, predict the held-out losses.
- `leave_one_budget_out`: for each FLOP budget, fit on all other budgets and predict it.

Scores, per held-out run i:  rel_i = (pred_i - obs_i) / obs_i.
    MARE = mean |rel_i|,   bias = mean rel_i   (positive bias = the law over-predicts loss).

The fitter is injected: `fitter(train: RunTable) -> predict(test: RunTable) -> losses`, so the same
protocol scores any law or approach (fitting/pipeline.py builds it from fit_law).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from scalelab.errors import UsageError
from scalelab.fitting.approaches import BUDGET_REL_TOL, group_budgets
from scalelab.fitting.io import RunTable

Predictor = Callable[[RunTable], np.ndarray]
Fitter = Callable[[RunTable], Predictor]


@dataclass(kw_only=True, slots=True)
class BacktestResult:
    """Per-run errors of one backtest protocol plus the summary numbers."""

    protocol: str  # "holdout" or "leave_one_budget_out"
    run_id: list[str]
    flops: np.ndarray
    observed: np.ndarray
    predicted: np.ndarray
    rel_error: np.ndarray
    mare: float
    bias: float
    n_train: int  # training points of the (last) fit; for LOBO the smallest training set
    n_test: int
    per_budget: dict[str, dict[str, float]] = field(default_factory=dict)  # LOBO: flops -> mare, bias
    extrapolation_decades: float = 0.0  # log10(max test FLOPs / max train FLOPs), holdout only
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "protocol": self.protocol,
            "mare": self.mare,
            "bias": self.bias,
            "n_train": self.n_train,
            "n_test": self.n_test,
            "extrapolation_decades": self.extrapolation_decades,
            "runs": [
                {
                    "run_id": r,
                    "flops": float(c),
                    "observed": float(o),
                    "predicted": float(p),
                    "rel_error": float(e),
                }
                for r, c, o, p, e in zip(self.run_id, self.flops, self.observed, self.predicted, self.rel_error)
            ],
            "per_budget": self.per_budget,
            "warnings": list(self.warnings),
        }


def relative_errors(predicted: np.ndarray, observed: np.ndarray) -> tuple[np.ndarray, float, float]:
    """(per-run relative error, MARE, signed bias) with rel = (pred - obs) / obs."""
    predicted = np.asarray(predicted, dtype=float)
    observed = np.asarray(observed, dtype=float)
    rel = (predicted - observed) / observed
    return rel, float(np.mean(np.abs(rel))), float(np.mean(rel))


def holdout_mask(flops: np.ndarray, holdout_frac: float | None = None) -> np.ndarray:
    """Boolean mask of the held-out (largest-compute) runs.

    holdout_frac None: the whole largest FLOP budget. Otherwise the ceil(frac * n) runs with the
    largest FLOPs (ties at the cut are held out together, so a budget is never split).
    """
    flops = np.asarray(flops, dtype=float)
    if holdout_frac is None:
        labels = group_budgets(flops, rel_tol=BUDGET_REL_TOL)
        return labels == labels.max()
    if not 0.0 < holdout_frac < 1.0:
        raise UsageError(f"holdout fraction must be in (0, 1), got {holdout_frac}")
    k = max(1, int(np.ceil(holdout_frac * flops.size)))
    cut = np.sort(flops)[::-1][k - 1]
    return flops >= cut


def _score(protocol, test: RunTable, pred, n_train, warnings) -> BacktestResult:
    rel, mare, bias = relative_errors(pred, test.loss)
    return BacktestResult(
        protocol=protocol,
        run_id=[str(r) for r in test.run_id],
        flops=test.flops.copy(),
        observed=test.loss.copy(),
        predicted=np.asarray(pred, dtype=float),
        rel_error=rel,
        mare=mare,
        bias=bias,
        n_train=n_train,
        n_test=len(test),
        warnings=warnings,
    )


def holdout_backtest(
    table: RunTable, fitter: Fitter, *, holdout_frac: float | None = None, min_train: int = 2
) -> BacktestResult:
    """Fit on the runs below the held-out compute and score the predictions of the held-out runs.

    Args:
        table: the runs.
        fitter: train table -> predictor (test table -> predicted losses).
        holdout_frac: None for "the largest budget", else the fraction of runs held out by FLOPs.
        min_train: fewer training runs than this is an error.
    Returns:
        BacktestResult with protocol "holdout".
    Raises:
        UsageError: too few training runs left.
    """
    mask = holdout_mask(table.flops, holdout_frac)
    n_train = int((~mask).sum())
    if n_train < min_train:
        raise UsageError(f"backtest: only {n_train} runs remain below the held-out compute (need {min_train})")
    train, test = table.subset(~mask), table.subset(mask)
    predictor = fitter(train)
    result = _score("holdout", test, predictor(test), n_train, [])
    result.extrapolation_decades = float(np.log10(test.flops.max() / train.flops.max()))
    return result


def leave_one_budget_out(table: RunTable, fitter: Fitter, *, min_train: int = 2) -> BacktestResult:
    """Each FLOP budget in turn is held out; the others fit the law that predicts it.

    Budgets are the `group` column when the table has one, else FLOPs within 5%. Budgets whose
    complement has fewer than `min_train` runs are skipped (listed in warnings).
    """
    labels = table.group if table.group is not None else group_budgets(table.flops).astype(str)
    preds = np.full(len(table), np.nan)
    per_budget: dict[str, dict[str, float]] = {}
    warnings: list[str] = []
    smallest_train = len(table)
    for lab in np.unique(labels):
        test_mask = labels == lab
        n_train = int((~test_mask).sum())
        if n_train < min_train:
            warnings.append(f"budget {lab}: only {n_train} other runs, skipped")
            continue
        test = table.subset(test_mask)
        try:
            preds[test_mask] = fitter(table.subset(~test_mask))(test)
        except UsageError as e:  # e.g. a fit without enough distinct sizes: report, don't abort
            warnings.append(f"budget {lab}: fit failed ({e})")
            continue
        smallest_train = min(smallest_train, n_train)
        _, mare, bias = relative_errors(preds[test_mask], test.loss)
        key = f"{float(np.exp(np.mean(np.log(test.flops)))):.4g}" if table.group is None else str(lab)
        per_budget[key] = {"mare": mare, "bias": bias, "n_test": int(test_mask.sum())}
    done = np.isfinite(preds)
    if not done.any():
        raise UsageError("leave-one-budget-out: no budget could be predicted (too few budgets or runs)")
    result = _score("leave_one_budget_out", table.subset(done), preds[done], smallest_train, warnings)
    result.per_budget = per_budget
    return result
