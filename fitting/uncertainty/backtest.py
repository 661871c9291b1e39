"""Backtests: fit on the smaller-compute runs, predict the held-out ones, score relative error.

Two protocols over a RunTable (its `flops` are the runs' FLOP budgets):

- `holdout_backtest`: hold out the largest-compute runs - by default every run in the largest FLOP
  budget (runs within 5% of each other's FLOPs share a budget; or the group, when `labels` give the
  table's compute groups: scalelab.fitting.uncertainty.compute_groups), or the top `holdout_frac` of runs by
  FLOPs - fit on the rest, predict the held-out losses.
- `leave_one_budget_out`: for each FLOP budget (or group) in turn (smallest first), fit on all other
  budgets and predict it.

Scores, per held-out run i:  rel_i = (pred_i - obs_i) / obs_i.
    MARE = mean |rel_i|,   bias = mean rel_i   (positive bias = the law over-predicts loss).
Every held-out run keeps its fold's training FLOP range, so the folds that extrapolate give the
law's out-of-sample error per decade (scalelab.fitting.uncertainty.predictive.extrapolation_error).

A fold is fitted only with at least `min_train` training runs in at least `min_budgets` budgets
(a law of N and D fitted to one budget is not identified). The fitter is injected:
`fitter(train: RunTable) -> predict(test: RunTable) -> losses`, called once per fold in the order
above, so the same protocol scores any law or approach (`law_fitter` builds it for a law). A fitter
with a `prepare(table, train_masks)` method is shown every fold's training runs first, in the order
it will then be called: `BatchedLawFitter` refits all of them in one batched L-BFGS (a batched
iteration costs about the same for one fold's starts as for twelve folds', so twelve sequential
refits took twelve times as long; scalelab.fitting.uncertainty.bootstrap.refit_replicates).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from scalelab.errors import UsageError
from scalelab.fitting.estimate.approaches import BUDGET_REL_TOL, group_budgets
from scalelab.fitting.estimate.io import RunTable
from scalelab.fitting.forms.laws import Law
from scalelab.fitting.uncertainty.bootstrap import refit_law, refit_replicates

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
    train_range: np.ndarray | None = None  # (n_test, 2): each held-out run's fold's [min, max] training FLOPs
    per_budget: dict[str, dict[str, float]] = field(default_factory=dict)  # LOBO: flops -> mare, bias
    extrapolation_decades: float = 0.0  # log10(max test FLOPs / max train FLOPs), holdout only
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        out = {
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
        if self.train_range is not None:
            out["folds"] = [
                {"flops": float(c), "train_range": [float(lo), float(hi)]}
                for c, (lo, hi) in zip(self.flops, self.train_range)
            ]
            if self.protocol == "holdout" and len(self.train_range):
                out["train_range"] = [float(x) for x in self.train_range[0]]
        return out


def law_fitter(law: Law, starts, **fit_kwargs) -> Fitter:
    """A backtest fitter that refits `law` on each fold's training runs (bootstrap.refit_law).

    `starts`: fit-space start rows, or a function returning them, called once per fold just
    before its fit (the fit entry draws each fold's grid starts from its generator this way).
    fit_kwargs: objective, delta.
    """

    def fitter(train: RunTable) -> Predictor:
        inputs = train.law_inputs()
        data = {**{k: inputs[k] for k in law.inputs}, "loss": train.loss}
        fit = refit_law(law, data, starts() if callable(starts) else starts, train.weight, **fit_kwargs)
        return lambda test: np.asarray(law.predict(fit.params, **{k: test.law_inputs()[k] for k in law.inputs}))

    return fitter


class BatchedLawFitter:
    """A backtest fitter whose folds are refitted together (module docstring): `prepare` refits every
    fold's training runs from `starts()` (called once per fold, in order) in one batch; each call then
    returns the next fold's predictor (a fold refit_replicates cannot fit raises UsageError, as
    fit_law would)."""

    def __init__(self, law: Law, starts, **fit_kwargs) -> None:
        self.law, self.starts, self.fit_kwargs = law, starts, fit_kwargs
        self.queue: list[dict[str, float] | None] = []

    def fit_all(self, table: RunTable, masks: list[np.ndarray]) -> list[dict[str, float] | None]:
        """The law refitted on each mask's runs, in one batch (None where it cannot be)."""
        if not masks:
            return []
        keep = np.stack(masks)
        inputs = {k: v for k, v in table.law_inputs().items() if k in self.law.inputs}
        weights = np.broadcast_to(np.ones(len(table)) if table.weight is None else table.weight, keep.shape)
        starts = np.stack([self.starts() if callable(self.starts) else self.starts for _ in masks])
        losses = np.broadcast_to(table.loss, keep.shape)
        return refit_replicates(self.law, inputs, losses, keep, np.array(weights), starts, **self.fit_kwargs)

    def prepare(self, table: RunTable, masks: list[np.ndarray]) -> None:
        self.queue = self.fit_all(table, masks)

    def __call__(self, train: RunTable) -> Predictor:
        params = self.queue.pop(0)
        if params is None:
            raise UsageError(f"{self.law.name}: the fold's runs cannot be fitted")
        law = self.law
        return lambda test: np.asarray(law.predict(params, **{k: test.law_inputs()[k] for k in law.inputs}))


def relative_errors(predicted: np.ndarray, observed: np.ndarray) -> tuple[np.ndarray, float, float]:
    """(per-run relative error, MARE, signed bias) with rel = (pred - obs) / obs."""
    predicted = np.asarray(predicted, dtype=float)
    observed = np.asarray(observed, dtype=float)
    rel = (predicted - observed) / observed
    return rel, float(np.mean(np.abs(rel))), float(np.mean(rel))


def holdout_mask(flops: np.ndarray, holdout_frac: float | None = None, labels: np.ndarray | None = None) -> np.ndarray:
    """Boolean mask of the held-out (largest-compute) runs.

    holdout_frac None: the whole largest FLOP budget (the group of the run of largest compute, when
    `labels` are given). Otherwise the ceil(frac * n) runs with the largest FLOPs (ties at the cut
    are held out together, so a budget is never split).
    """
    flops = np.asarray(flops, dtype=float)
    if holdout_frac is None and labels is not None:
        labels = np.asarray(labels)
        return labels == labels[int(np.argmax(flops))]
    if holdout_frac is None:
        labels = group_budgets(flops, rel_tol=BUDGET_REL_TOL)
        return labels == labels.max()
    if not 0.0 < holdout_frac < 1.0:
        raise UsageError(f"holdout fraction must be in (0, 1), got {holdout_frac}")
    k = max(1, int(np.ceil(holdout_frac * flops.size)))
    cut = np.sort(flops)[::-1][k - 1]
    return flops >= cut


def _score(protocol: str, test: RunTable, pred, train_range, n_train: int, warnings: list[str]) -> BacktestResult:
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
        train_range=np.asarray(train_range, dtype=float).reshape(-1, 2),
        warnings=warnings,
    )


def _too_few(train: RunTable, min_train: int, min_budgets: int) -> str | None:
    """Why a fold cannot be fitted on `train`, or None."""
    if len(train) < min_train:
        return f"only {len(train)} training runs (need {min_train})"
    budgets = np.unique(group_budgets(train.flops)).size if len(train) else 0
    if budgets < min_budgets:
        return f"the training runs span {budgets} FLOP budget(s) (need {min_budgets})"
    return None


def holdout_backtest(
    table: RunTable,
    fitter: Fitter,
    *,
    holdout_frac: float | None = None,
    min_train: int = 2,
    min_budgets: int = 1,
    labels: np.ndarray | None = None,
) -> BacktestResult:
    """Fit on the runs below the held-out compute and score the predictions of the held-out runs.

    Args:
        table: the runs.
        fitter: train table -> predictor (test table -> predicted losses).
        holdout_frac: None for "the largest budget", else the fraction of runs held out by FLOPs.
        min_train, min_budgets: the training runs and FLOP budgets a fit needs (module docstring).
        labels: per run, its compute group: the largest group is held out (default: FLOP budgets).
    Returns:
        BacktestResult with protocol "holdout".
    Raises:
        UsageError: too few training runs or budgets left.
    """
    mask = holdout_mask(table.flops, holdout_frac, labels)
    train, test = table.subset(~mask), table.subset(mask)
    why = _too_few(train, min_train, min_budgets)
    if why is not None:
        raise UsageError(f"backtest: below the held-out compute, {why}")
    if hasattr(fitter, "prepare"):
        fitter.prepare(table, [~mask])
    predictor = fitter(train)
    lo, hi = float(train.flops.min()), float(train.flops.max())
    result = _score("holdout", test, predictor(test), [[lo, hi]] * len(test), len(train), [])
    result.extrapolation_decades = float(math.log10(float(test.flops.max()) / hi))
    return result


def leave_one_budget_out(
    table: RunTable, fitter: Fitter, *, min_train: int = 2, min_budgets: int = 1, labels: np.ndarray | None = None
) -> BacktestResult:
    """Each FLOP budget in turn (smallest first) is held out; the others fit the law that predicts it.

    Budgets are `labels` when given (the table's compute groups), else the `group` column when the
    table has one, else FLOPs within 5%. Budgets whose complement is too small (min_train runs in
    min_budgets budgets), or whose fit fails, are skipped (listed in warnings). The runs come out
    fold by fold.
    """
    if labels is None:
        labels = table.group if table.group is not None else group_budgets(table.flops)
    parts: list[tuple[RunTable, np.ndarray, list[float]]] = []
    per_budget: dict[str, dict[str, float]] = {}
    warnings: list[str] = []
    smallest_train = len(table)
    folds = []
    for lab in np.unique(labels):
        why = _too_few(table.subset(labels != lab), min_train, min_budgets)
        if why is not None:
            warnings.append(f"budget {lab}: {why}, skipped")
        else:
            folds.append(lab)
    if hasattr(fitter, "prepare"):
        fitter.prepare(table, [labels != lab for lab in folds])
    for lab in folds:
        test_mask = labels == lab
        train, test = table.subset(~test_mask), table.subset(test_mask)
        try:
            pred = np.asarray(fitter(train)(test), dtype=float)
        except UsageError as e:  # e.g. a fit without enough distinct sizes: report, don't abort
            warnings.append(f"budget {lab}: fit failed ({e})")
            continue
        smallest_train = min(smallest_train, len(train))
        parts.append((test, pred, [float(train.flops.min()), float(train.flops.max())]))
        _, mare, bias = relative_errors(pred, test.loss)
        key = str(lab) if table.group is not None else f"{float(np.exp(np.mean(np.log(test.flops)))):.4g}"
        per_budget[key] = {"mare": mare, "bias": bias, "n_test": int(test_mask.sum())}
    if not parts:
        raise UsageError("leave-one-budget-out: no budget could be predicted (too few budgets or runs)")
    test = _concat([t for t, _, _ in parts])
    ranges = [r for t, _, r in parts for _ in range(len(t))]
    result = _score(
        "leave_one_budget_out", test, np.concatenate([p for _, p, _ in parts]), ranges, smallest_train, warnings
    )
    result.per_budget = per_budget
    return result


def _concat(tables: list[RunTable]) -> RunTable:
    """The rows of `tables` one after the other (same columns)."""

    def cat(name):
        cols = [getattr(t, name) for t in tables]
        return None if cols[0] is None else np.concatenate(cols)

    first = tables[0]
    return RunTable(
        params=cat("params"),
        tokens=cat("tokens"),
        loss=cat("loss"),
        flops=cat("flops"),
        flops_source=first.flops_source,
        tokens_source=first.tokens_source,
        run_id=cat("run_id"),
        group=cat("group"),
        unique_tokens=cat("unique_tokens"),
        weight=cat("weight"),
    )
