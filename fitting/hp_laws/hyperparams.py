"""Hyperparameter laws: optimal learning rate / batch size against compute as log-log lines.

    log10 h*(C) = intercept + slope · log10 C        (h = learning rate, tokens per batch, ...)

Two steps, both pure:
1. `optimal_per_budget(flops, hparam, loss)` reduces a sweep (several hyperparameter values per
   FLOP budget) to one optimum per budget: the vertex of a parabola of loss in log h when it is
   located inside the swept range, else the best measured value (flagged). The vertex is
   `best_lr(values, loss)`, which also gives a bootstrap interval for one size's best LR (several
   seeds per value allowed): what experiments/lr_transfer.py and the transfer gate (sweeps/recipes/transfer.py) use.
2. `fit_hyperparam_law(flops, h_opt, robust=...)` fits the line with statsmodels OLS, or RLM with
   Huber's T norm when outlying budgets should not drag the slope. Intervals on slope/intercept
   and on predictions come from the model's covariance.

    law = fit_hyperparam_law(C, lr_opt)
    law.slope, law.slope_interval, law.predict(1e21)   # -> (point, lo, hi) in the hparam's unit
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import statsmodels.api as sm
from scipy import stats

from scalelab.errors import UsageError
from scalelab.fitting.estimate.approaches import group_budgets
from scalelab.fitting.estimate.intervals import percentile_interval


@dataclass(kw_only=True, slots=True)
class HyperparamLaw:
    """A fitted log10-log10 line h*(C) = 10^intercept · C^slope with covariance for intervals."""

    intercept: float
    slope: float
    intercept_interval: tuple[float, float]
    slope_interval: tuple[float, float]
    cov: np.ndarray  # 2x2 covariance of (intercept, slope), log10 units
    resid_scale: float  # residual std (OLS) or robust scale (RLM), log10 units
    dof: int
    robust: bool
    level: float
    n_points: int

    def predict(self, flops: float | np.ndarray, *, level: float | None = None, kind: str = "confidence"):
        """Predicted optimum at `flops` with an interval.

        Args:
            flops: FLOP budget(s).
            level: interval level (default: the fit's).
            kind: "confidence" (the mean line) or "prediction" (a new budget's optimum, adds
                the residual scatter).
        Returns:
            (point, lo, hi) arrays (floats for scalar input) in the hyperparameter's own unit.
        """
        level = self.level if level is None else level
        x = np.log10(np.atleast_1d(np.asarray(flops, dtype=float)))
        design = np.column_stack([np.ones_like(x), x])
        mean = design @ np.array([self.intercept, self.slope])
        var = np.einsum("ij,jk,ik->i", design, self.cov, design)
        if kind == "prediction":
            var = var + self.resid_scale**2
        elif kind != "confidence":
            raise UsageError(f"kind must be 'confidence' or 'prediction', got {kind!r}")
        q = _quantile(level, self.dof, self.robust)
        out = tuple(10.0 ** (mean + s * q * np.sqrt(var)) for s in (0.0, -1.0, 1.0))
        if np.ndim(flops) == 0:
            return tuple(float(v[0]) for v in out)
        return out

    def to_dict(self) -> dict:
        return {
            "intercept": self.intercept,
            "slope": self.slope,
            "intercept_interval": list(self.intercept_interval),
            "slope_interval": list(self.slope_interval),
            "robust": self.robust,
            "level": self.level,
            "n_points": self.n_points,
        }


def _quantile(level: float, dof: int, robust: bool) -> float:
    # RLM's covariance is asymptotic, so statsmodels uses normal quantiles for it; OLS uses t.
    if robust or dof <= 0:
        return float(stats.norm.ppf(0.5 + level / 2.0))
    return float(stats.t.ppf(0.5 + level / 2.0, dof))


def fit_hyperparam_law(
    flops: np.ndarray, h_opt: np.ndarray, *, robust: bool = False, level: float = 0.95
) -> HyperparamLaw:
    """Fit log10 h_opt = intercept + slope · log10 flops.

    Args:
        flops: FLOP budgets (> 0).
        h_opt: the optimal hyperparameter at each budget (> 0), e.g. learning rate or tokens/batch.
        robust: RLM with Huber's T (outlier-resistant) instead of OLS.
        level: confidence level of the coefficient intervals.
    Returns:
        HyperparamLaw.
    Raises:
        UsageError: fewer than 3 points, non-positive or non-finite values.
    """
    c = np.asarray(flops, dtype=float)
    h = np.asarray(h_opt, dtype=float)
    if c.shape != h.shape or c.ndim != 1:
        raise UsageError("flops and h_opt must be 1-D arrays of equal length")
    if c.size < 3:
        raise UsageError(f"a hyperparameter law needs at least 3 budgets, got {c.size}")
    if not (np.all(np.isfinite(c)) and np.all(np.isfinite(h)) and np.all(c > 0) and np.all(h > 0)):
        raise UsageError("flops and hyperparameter values must be finite and positive")
    x, y = np.log10(c), np.log10(h)
    design = sm.add_constant(x)
    if robust:
        res = sm.RLM(y, design, M=sm.robust.norms.HuberT()).fit()
        scale = float(res.scale)
    else:
        res = sm.OLS(y, design).fit()
        scale = float(np.sqrt(res.scale))
    ci = np.asarray(res.conf_int(alpha=1.0 - level))
    return HyperparamLaw(
        intercept=float(res.params[0]),
        slope=float(res.params[1]),
        intercept_interval=(float(ci[0, 0]), float(ci[0, 1])),
        slope_interval=(float(ci[1, 0]), float(ci[1, 1])),
        cov=np.asarray(res.cov_params(), dtype=float),
        resid_scale=scale,
        dof=int(c.size - 2),
        robust=robust,
        level=level,
        n_points=int(c.size),
    )


@dataclass(kw_only=True, slots=True)
class LROptimum:
    """The best value of a hyperparameter (a learning rate) at one size, from a sweep over it."""

    lr: float  # the parabola's vertex; the best measured value when not interior
    interval: tuple[float, float]  # bootstrap interval of lr at `level` (a point when not interior)
    grid_lr: float  # the swept value with the lowest mean loss
    loss: float  # fitted loss at lr (the best mean loss when not interior)
    interior: bool  # a minimum was bracketed: vertex strictly inside the fitted window
    level: float


def best_lr(lrs, losses, *, window: int = 2, n_boot: int = 1000, level: float = 0.9, seed: int = 0) -> LROptimum:
    """Sub-grid estimate of the best LR: a parabola of loss in log2 LR around the grid minimum.

    The grid minimum is the swept value with the lowest mean loss over its points (seeds); the
    parabola is fitted by least squares to every point within `window` grid values of it, and its
    vertex is the estimate when it lies strictly inside that window (else the grid minimum, with
    interior=False: the optimum is not bracketed). The interval is a residual bootstrap: the fitted
    parabola plus resampled residuals (inflated by sqrt(n / (n - 3)) for the three fitted
    parameters), refitted, each resample's minimum taken over the window (so a flat or inverted
    resample lands on the window's edge and widens the interval, as a flat loss curve should).

    Args:
        lrs, losses: one entry per run; repeated values = several seeds. Non-finite losses
            (diverged runs) are left out of the fit and never make a value the best.
        window: grid values on each side of the minimum that the parabola is fitted to.
        n_boot, level, seed: bootstrap resamples, two-sided level, RNG seed (0: no interval).
    Returns:
        LROptimum (values in the unit of `lrs`).
    Raises:
        UsageError: non-positive values, or no finite loss.
    """
    x = np.asarray(lrs, dtype=float)
    y = np.asarray(losses, dtype=float)
    if x.shape != y.shape or np.any(x <= 0):
        raise UsageError("lrs and losses must have equal length and the lrs must be positive")
    finite = np.isfinite(y)
    if not finite.any():
        raise UsageError("no finite loss: every run diverged")
    grid = np.unique(x)
    mean = np.array([y[(x == v) & finite].mean() if ((x == v) & finite).any() else np.inf for v in grid])
    best = int(np.argmin(mean))
    point = LROptimum(lr=float(grid[best]), interval=(float(grid[best]),) * 2, grid_lr=float(grid[best]),
                      loss=float(mean[best]), interior=False, level=level)  # fmt: skip
    lo, hi = max(best - window, 0), min(best + window, grid.size - 1)
    sel = finite & (x >= grid[lo]) & (x <= grid[hi])
    u, ys = np.log2(x[sel]), y[sel]
    if best in (0, grid.size - 1) or np.unique(u).size < 3:
        return point
    q2, q1, q0 = np.polyfit(u, ys, 2)
    u_lo, u_hi = np.log2(grid[lo]), np.log2(grid[hi])
    vertex = -q1 / (2 * q2) if q2 > 0 else np.nan
    if not u_lo < vertex < u_hi:
        return point
    interval = (float(2**vertex),) * 2
    if n_boot > 0:
        fitted = np.polyval((q2, q1, q0), u)
        resid = (ys - fitted) * np.sqrt(u.size / max(u.size - 3, 1))
        rng = np.random.default_rng(seed)
        fine = np.linspace(u_lo, u_hi, 401)
        draws = []
        for _ in range(n_boot):
            coef = np.polyfit(u, fitted + rng.choice(resid, size=u.size, replace=True), 2)
            draws.append(fine[np.argmin(np.polyval(coef, fine))])
        interval = tuple(float(2**q) for q in percentile_interval(draws, level))
    return LROptimum(lr=float(2**vertex), interval=interval, grid_lr=float(grid[best]),
                     loss=float(np.polyval((q2, q1, q0), vertex)), interior=True, level=level)  # fmt: skip


def grid_position(lr: float, grid) -> float:
    """Where `lr` sits on an ascending geometric grid, in grid steps (index 0 = grid[0]; fractional
    between grid values, linear in log LR)."""
    logs = np.log(np.asarray(grid, dtype=float))
    return float(np.interp(np.log(lr), logs, np.arange(logs.size)))


@dataclass(kw_only=True, slots=True)
class BudgetOptimum:
    """The best hyperparameter value measured at one budget."""

    flops: float
    h_opt: float
    loss_opt: float
    interior: bool  # vertex located strictly inside the fitted window around the best value


def optimal_per_budget(
    flops: np.ndarray, hparam: np.ndarray, loss: np.ndarray, *, rel_tol: float = 0.05
) -> list[BudgetOptimum]:
    """Reduce a hyperparameter sweep to one optimum per FLOP budget.

    Per budget, `best_lr` of its runs (no bootstrap): the vertex of a parabola of loss in log h
    through the best value and its two neighbours on each side when it lies inside them; otherwise
    the best measured value with interior=False (the optimum may lie outside the sweep, which
    biases the law: check it before trusting the slope).

    Args:
        flops, hparam, loss: per-run arrays.
        rel_tol: FLOPs within this relative distance share a budget.
    Returns:
        One BudgetOptimum per budget, sorted by flops.
    """
    c = np.asarray(flops, dtype=float)
    h = np.asarray(hparam, dtype=float)
    loss = np.asarray(loss, dtype=float)
    if not (c.shape == h.shape == loss.shape):
        raise UsageError("flops, hparam and loss must have equal length")
    if np.any(h <= 0) or not np.all(np.isfinite(loss)):
        raise UsageError("hyperparameter values must be positive and losses finite (drop diverged runs)")
    labels = group_budgets(c, rel_tol=rel_tol)
    out = []
    for lab in np.unique(labels):
        idx = np.flatnonzero(labels == lab)
        opt = best_lr(h[idx], loss[idx], n_boot=0)
        budget = float(np.exp(np.mean(np.log(c[idx]))))
        out.append(BudgetOptimum(flops=budget, h_opt=opt.lr, loss_opt=opt.loss, interior=opt.interior))
    return sorted(out, key=lambda p: p.flops)
