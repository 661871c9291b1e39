"""The paired gap model: two arms' log loss ratio at matched design points, as a line in log C.

    pts = GapPoints(log_budget=x, size=sizes, group=groups, log_ratio=np.log(loss_b / loss_a))
    choice = choose_drift(pts)                      # constant gap, or drifting in log C (the rule below)
    line = fit_gap_line(pts, drift=choice.drift)
    line.predict(13.3)                              # ln(L_B / L_A) at C = 2e13, averaged over sizes

Two arms trained on the same design points (the same budget, size and seed, so the same data order)
share most of what moves a run's loss away from a smooth law: the seed's luck, the data order, a law
form slightly off for both. Their ratio at one design point cancels it, so the gap is modelled
directly, one matched pair i at a time:

    y_i = ln(L_B,i / L_A,i) = g0 + s (x_i - x_ref) + u_size(i) + e_i,

with x = log10 of the point's FLOP budget (x_ref their mean), u the size pattern (the gap at a
design size relative to the mean over sizes, the same at every budget; sum to zero over the sizes,
absent for runs without a design size) and e the point-to-point scatter. `drift=False` is the
constant gap (s = 0). A prediction at a budget is g0 + s (x - x_ref): the gap averaged over the
design's sizes. Fitted by (weighted) least squares: the weights are a bootstrap replicate's counts.

Which of the two (a registered rule, `choose_drift`): leave-one-budget-out, each budget's mean gap
predicted by each model fitted to the other budgets; the drifting line only with three budgets or
more and a lower mean squared miss than the constant gap. How far either is off out of sample is
measured on the model itself by scalelab.fitting.comparisons.gap_backtest; the interval that combines them is
scalelab.fitting.comparisons.paired_gap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from scalelab.errors import UsageError

NO_SIZE = -1  # a run without a design size (a remedy run): no size effect


@dataclass(frozen=True, kw_only=True, slots=True)
class GapPoints:
    """Matched pairs of two arms' runs: one row per pair (the same budget, design size and seed)."""

    log_budget: np.ndarray  # log10 C of the pair's FLOP budget
    size: np.ndarray  # design size index (NO_SIZE: none)
    group: np.ndarray  # design point (budget, size) id: the seeds of one point share it
    log_ratio: np.ndarray  # ln(L_B / L_A)
    pair: np.ndarray | None = None  # each row's index in the caller's table of pairs (default 0..n-1)

    def __post_init__(self) -> None:
        object.__setattr__(self, "log_budget", np.asarray(self.log_budget, dtype=float))
        object.__setattr__(self, "size", np.asarray(self.size, dtype=int))
        object.__setattr__(self, "group", np.asarray(self.group))
        object.__setattr__(self, "log_ratio", np.asarray(self.log_ratio, dtype=float))
        pair = np.arange(self.log_ratio.size) if self.pair is None else np.asarray(self.pair, dtype=int)
        object.__setattr__(self, "pair", pair)

    @property
    def n(self) -> int:
        return int(self.log_ratio.size)

    @property
    def budgets(self) -> np.ndarray:
        """The distinct log10 budgets, ascending."""
        return np.unique(self.log_budget)

    def where(self, mask: np.ndarray) -> GapPoints:
        return GapPoints(
            log_budget=self.log_budget[mask],
            size=self.size[mask],
            group=self.group[mask],
            log_ratio=self.log_ratio[mask],
            pair=self.pair[mask],
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class GapLine:
    """A fitted gap model (module docstring)."""

    drift: bool
    intercept: float  # g0: the gap at x_ref, averaged over sizes
    slope: float  # s: d gap / d log10 C (0 for the constant gap)
    x_ref: float
    size_effects: dict[int, float] = field(default_factory=dict)
    residual_sd: float = math.nan  # sd of e (size pattern removed), degrees of freedom corrected
    scatter_sd: float = math.nan  # sd of a pair's gap around the line (size pattern included)

    def predict(self, log_budget) -> np.ndarray | float:
        """The gap averaged over the design's sizes at log10 budget(s)."""
        out = self.intercept + self.slope * (np.asarray(log_budget, dtype=float) - self.x_ref)
        return float(out) if np.ndim(out) == 0 else out

    def predict_points(self, points: GapPoints) -> np.ndarray:
        """Each pair's gap: the line plus its size's effect (0 for a size not fitted)."""
        u = np.array([self.size_effects.get(int(s), 0.0) for s in points.size])
        return self.predict(points.log_budget) + u

    def refit(self, points: GapPoints, weights: np.ndarray) -> GapLine:
        """The line refitted with the size pattern held (a bootstrap replicate: the pattern is a
        nuisance that a resample missing a size could not estimate)."""
        u = np.array([self.size_effects.get(int(s), 0.0) for s in points.size])
        return _line(points.log_budget, points.log_ratio - u, weights, self.drift, self.size_effects)


def _line(x, y, w, drift: bool, size_effects: dict[int, float]) -> GapLine:
    """Weighted least squares of y on (1, x - x_ref) (no size terms: y has them removed)."""
    keep = w > 0
    if not keep.any():
        raise UsageError("gap model: no pair has a positive weight")
    x, y, w = x[keep], y[keep], w[keep]
    x_ref = float(np.average(x, weights=w))
    slope = 0.0
    if drift:
        sxx = float(np.sum(w * (x - x_ref) ** 2))
        if sxx <= 0:
            raise UsageError("gap model: a drift in log C needs pairs at 2 or more budgets")
        slope = float(np.sum(w * (x - x_ref) * (y - np.average(y, weights=w))) / sxx)
    intercept = float(np.average(y, weights=w))
    return GapLine(drift=drift, intercept=intercept, slope=slope, x_ref=x_ref, size_effects=dict(size_effects))


def fit_gap_line(points: GapPoints, drift: bool, weights: np.ndarray | None = None) -> GapLine:
    """The gap model of module docstring, by (weighted) least squares.

    Raises:
        UsageError: no pair, or a drift asked of pairs at one budget.
    """
    w = np.ones(points.n) if weights is None else np.asarray(weights, dtype=float)
    keep = w > 0
    if not keep.any():
        raise UsageError("gap model: no matched pair to fit")
    x, y, size, w = points.log_budget[keep], points.log_ratio[keep], points.size[keep], w[keep]
    if drift and np.unique(x).size < 2:
        raise UsageError("gap model: a drift in log C needs pairs at 2 or more budgets")
    sizes = [int(s) for s in np.unique(size) if s != NO_SIZE]
    x_ref = float(np.average(x, weights=w))
    cols = [np.ones_like(x)] + ([x - x_ref] if drift else [])
    if len(sizes) >= 2:  # sum-to-zero contrasts: the intercept is the mean over sizes
        first = (size == sizes[0]).astype(float)
        cols += [(size == s).astype(float) - first for s in sizes[1:]]
    design = np.column_stack(cols)
    sw = np.sqrt(w)
    beta = np.linalg.lstsq(design * sw[:, None], y * sw, rcond=None)[0]
    k = 1 + int(drift)
    effects = {}
    if len(sizes) >= 2:
        rest = beta[k:]
        effects = {sizes[0]: float(-np.sum(rest)), **{s: float(b) for s, b in zip(sizes[1:], rest)}}
    line_only = design[:, :k] @ beta[:k]
    total = float(np.sum(w))
    dof = total - design.shape[1]
    resid = y - design @ beta
    return GapLine(
        drift=drift,
        intercept=float(beta[0]),
        slope=float(beta[1]) if drift else 0.0,
        x_ref=x_ref,
        size_effects=effects,
        residual_sd=math.sqrt(float(np.sum(w * resid**2)) / dof) if dof > 0 else math.nan,
        scatter_sd=math.sqrt(float(np.sum(w * (y - line_only) ** 2)) / (total - k)) if total > k else math.nan,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class DriftChoice:
    """The registered rule's choice and what it compared (mean squared leave-one-budget-out misses)."""

    drift: bool
    cv_constant: float
    cv_drift: float  # nan with fewer than 3 budgets

    def to_dict(self) -> dict:
        return {"drift": self.drift, "cv_constant": self.cv_constant, "cv_drift": self.cv_drift}


def _lobo_mse(points: GapPoints, drift: bool) -> float:
    """Mean squared miss of each budget's mean gap, the model fitted to the other budgets."""
    misses = []
    for b in points.budgets:
        test = points.log_budget == b
        line = fit_gap_line(points.where(~test), drift)
        held = points.where(test)
        misses.append(float(np.mean(held.log_ratio) - np.mean(line.predict_points(held))))
    return float(np.mean(np.square(misses)))


def choose_drift(points: GapPoints) -> DriftChoice:
    """Constant gap or a drift in log C (module docstring: the registered rule)."""
    nb = points.budgets.size
    if nb < 2:
        return DriftChoice(drift=False, cv_constant=math.nan, cv_drift=math.nan)
    const = _lobo_mse(points, False)
    drift = _lobo_mse(points, True) if nb >= 3 else math.nan
    return DriftChoice(drift=bool(drift < const), cv_constant=const, cv_drift=drift)
