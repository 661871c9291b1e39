"""How far a gap model misses out of sample, per decade of compute: backtests over the design's budgets.

    bt = backtest_gap(points, lambda train: fit_gap_line(train, drift=False).predict_points)
    bt.error.per_decade, bt.error.n_folds           # k_gap, and the independent fits it rests on
    bt.misses                                       # each held-out budget: its distance and miss

The folds hold out budgets, never single runs (the runs of one budget share its luck):

    rolling origin        fit on the k smallest budgets, predict every larger one (k = 1 .. B-1);
    leave the first out   fit on every budget but the smallest, predict the smallest (B >= 3).

A fold's predictor may refuse (return None: a drift needs two budgets, a joint law needs more runs
than parameters); it is then skipped. For every held-out budget at d > 0.05 decades beyond its
fold's training range, the miss is the budget's mean observed gap minus the mean predicted one, and

    k_gap = sqrt(mean((miss / d)^2))       per decade, in the gap's own units (ln of a loss ratio),

as scalelab.fitting.uncertainty.predictive measures a single law's error, so a model that misses more the farther
it reaches is charged for it at the target. The runs of one fold share its fit, so k rests on as
many independent estimates as there are folds (scalelab.fitting.uncertainty.predictive.t_over_z scales it).
The held-out budget's own scatter is in its miss, so k errs wide at short range: the paired gap model's
default drift part takes it out over the same folds (scalelab.fitting.comparisons.gap_drift); the joint law's
view and the first version of the paired one use k as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from scalelab.errors import UsageError
from scalelab.fitting.comparisons.gap_model import GapPoints
from scalelab.fitting.uncertainty.predictive import ExtrapolationError

INTERPOLATION_DECADES = 0.05  # within this of the training range a held-out budget is interpolated

Predictor = Callable[[GapPoints], np.ndarray]  # held-out pairs -> their predicted gaps


@dataclass(kw_only=True)
class GapBacktest:
    error: ExtrapolationError
    misses: list[dict] = field(default_factory=list)  # train budgets, held-out budget, decades, miss

    def to_dict(self) -> dict:
        return {"error": self.error.to_dict(), "misses": self.misses}


def folds(budgets: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train, held out) log10 budgets of every fold (module docstring)."""
    b = np.sort(np.asarray(budgets, dtype=float))
    out = [(b[:k], b[k:]) for k in range(1, b.size)]
    if b.size >= 3:
        out.append((b[1:], b[:1]))
    return out


def backtest_gap(points: GapPoints, fit: Callable[[GapPoints], Predictor | None]) -> GapBacktest:
    """k_gap of the model that `fit` fits (module docstring); per_decade None when no fold reaches out."""
    ratios, misses, used = [], [], set()
    dmax = 0.0
    for train_b, test_b in folds(points.budgets):
        train = points.where(np.isin(points.log_budget, train_b))
        try:
            predict = fit(train)
        except UsageError:
            predict = None
        if predict is None:
            continue
        lo, hi = float(train_b.min()), float(train_b.max())
        for b in test_b:
            d = max(float(b) - hi, lo - float(b), 0.0)
            if d <= INTERPOLATION_DECADES:
                continue
            held = points.where(points.log_budget == b)
            miss = float(np.mean(held.log_ratio) - np.mean(predict(held)))
            ratios.append(miss / d)
            used.add((lo, hi))
            dmax = max(dmax, d)
            misses.append({"train": [lo, hi], "held_out": float(b), "decades": d, "miss": miss})
    if not ratios:
        return GapBacktest(error=ExtrapolationError(per_decade=None, n_runs=0, n_folds=0, max_decades=0.0))
    k = float(np.sqrt(np.mean(np.square(ratios))))
    return GapBacktest(
        error=ExtrapolationError(per_decade=k, n_runs=len(ratios), n_folds=len(used), max_decades=dmax), misses=misses
    )
