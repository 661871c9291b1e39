"""Forward backtests: fit on the smaller groups of runs, predict every larger group, by distance.

A law is used to predict runs *beyond* the compute it was fitted on, so that is what it is scored
on. The runs are split into groups ordered by compute (an IsoFLOP design's budgets, or a family's
models), and every fold trains on the first k groups and predicts each later group (rolling origin,
an expanding window over compute):

    budgets  1  2  3  4  5
    fold 2   T  T  P  P  P        T: fitted on, P: predicted, at log10(C_P / C_T,max) decades
    fold 3   T  T  T  P  P
    fold 4   T  T  T  T  P

Each predicted group yields one `ForwardGroup`: its distance in decades beyond the fold's largest
training compute and, per candidate law, the mean log error log(pred / obs) of its runs. Groups,
not runs, are the unit: the runs of one group share one fit and one distance. Folds whose training
set cannot identify a law (fewer runs than `min_train_runs`, or fewer than two groups) are skipped.

Interpolation (leave-one-budget-out inside the fitted range) is deliberately absent: inside the
range a law that is wrong in how it extrapolates can score best.

    groups = forward_backtest({"chinchilla": fit_chin, "kaplan": fit_kap}, n, d, loss, flops, budgets,
                              min_train_runs=8)
    groups[0].decades, groups[0].errors["chinchilla"]       # e.g. 0.5, +0.012 (1.2% pessimistic)

scikit-learn's TimeSeriesSplit would give the expanding training windows but scores only the next
block; a law's error *as a function of distance* needs every later group from each origin, so the
folds are written out here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass

import numpy as np

from scalelab.errors import UsageError

# fit(train_mask) -> predict(params, tokens) -> loss; one per candidate law
Predict = Callable[[np.ndarray, np.ndarray], np.ndarray]
FitOn = Callable[[np.ndarray], Predict]


@dataclass(frozen=True, kw_only=True, slots=True)
class ForwardGroup:
    """One predicted group of one fold."""

    fold: int  # groups the fold was fitted on
    n_train: int  # runs the fold was fitted on
    train_max_flops: float  # the fold's largest training compute
    flops: float  # the predicted group's compute (its runs' median)
    decades: float  # mean log10(C_run / train_max_flops) over the group's scored runs
    n_test: int  # scored runs of the group
    errors: dict[str, float]  # candidate -> mean log(pred / obs) over the scored runs

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> ForwardGroup:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


def group_order(flops: np.ndarray, groups: np.ndarray) -> list:
    """Group keys sorted by the largest compute among their runs."""
    keys = list(dict.fromkeys(groups.tolist()))
    return sorted(keys, key=lambda g: float(np.max(flops[groups == g])))


def forward_backtest(
    candidates: Mapping[str, FitOn],
    params,
    tokens,
    loss,
    flops,
    groups,
    *,
    scored=None,
    min_train_runs: int,
    min_train_groups: int = 2,
    min_decades: float = 0.05,
) -> list[ForwardGroup]:
    """Every fold's predictions of every later group (module docstring).

    Args:
        candidates: name -> fit function: fit(train_mask) returns predict(params, tokens). A fit that
            raises (too few distinct points) drops that fold for every candidate.
        params, tokens, loss, flops: per run (N, D, observed loss, compute used for distances).
        groups: per run group key (budget label, model name); groups are ordered by compute.
        scored: optional per-run mask of the runs a predicted group is scored on (e.g. a model's last
            30% of checkpoints); default every run.
        min_train_runs: a fold needs at least this many training runs (e.g. twice a law's parameters).
        min_train_groups: ... and at least this many groups.
        min_decades: runs closer than this to the training range are interpolation and are not scored.
    """
    n, d, y, c = (np.asarray(a, dtype=float) for a in (params, tokens, loss, flops))
    groups = np.asarray(groups)
    scored = np.ones(y.size, dtype=bool) if scored is None else np.asarray(scored, dtype=bool)
    order = group_order(c, groups)
    out: list[ForwardGroup] = []
    for k in range(min_train_groups, len(order)):
        train = np.isin(groups, order[:k])
        if train.sum() < min_train_runs:
            continue
        cmax = float(c[train].max())
        try:
            predictors = {name: fit(train) for name, fit in candidates.items()}
        except UsageError:  # a degenerate fold (too few distinct points) is skipped, not fatal
            continue
        for key in order[k:]:
            rows = (groups == key) & scored
            dist = np.log10(c[rows] / cmax) if rows.any() else np.zeros(0)
            keep = dist > min_decades
            if not keep.any():
                continue
            idx = np.flatnonzero(rows)[keep]
            errors = {
                name: float(np.mean(np.log(np.asarray(pred(n[idx], d[idx]), dtype=float) / y[idx])))
                for name, pred in predictors.items()
            }
            if not all(math.isfinite(e) for e in errors.values()):
                continue
            out.append(
                ForwardGroup(
                    fold=k,
                    n_train=int(train.sum()),
                    train_max_flops=cmax,
                    flops=float(np.median(c[idx])),
                    decades=float(np.mean(dist[keep])),
                    n_test=int(idx.size),
                    errors=errors,
                )
            )
    return out
