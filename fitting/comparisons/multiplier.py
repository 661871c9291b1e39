"""The compute-efficiency multiplier of one fitted law over another, with bootstrap intervals.

    m = multiplier(law_a, params_a, law_b, params_b, 1e13)          # a float
    res = paired_multipliers(law_a, draws_a, law_b, draws_b, budgets=[...], target=1e14, slope_grid=[...])
    res.at_target, res.per_budget, res.slopes                         # one value per pair of draws

With L*_X(C) the compute-optimal frontier of side X (the minimum over N of the fitted L(N, C/6N);
the law itself for laws of compute), the multiplier of B over A at budget C is

    m(C) = C_A(L*_B(C)) / C,     C_A(L) = the compute A needs to reach loss L on its frontier,

so m = 1.5 means A needs 1.5x the FLOPs to reach what B reaches with C. Whether it changes with
scale is the slope d ln m / d ln C over a grid of budgets. Intervals pair the i-th draw of A with
the i-th of B (independent resamples of independent runs). A's frontier may never reach B's loss
(B below A's irreducible term): m is then +inf for that draw, which `interval` keeps (upper end
inf). Pure functions of fitted parameters: the comparison of two sweeps
(scalelab.analysis.compare) and a study's arms (scalelab.sweeps.studies.study_fit) both use them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize

from scalelab.errors import UsageError
from scalelab.fitting.allocation import allocate as alloc
from scalelab.fitting.estimate.intervals import percentile_interval
from scalelab.fitting.forms.laws import Law


def frontier_loss(law: Law, params: dict[str, float], flops: float) -> float:
    """L*(C): the law's compute-optimal loss at `flops` (C = 6 N D)."""
    if law.inputs == ("flops",):
        return float(law.predict(params, flops=np.asarray(flops)))
    if law.name == "chinchilla":
        return alloc.chinchilla_optimum(params, flops)[2]
    if not alloc.can_allocate(law):
        raise UsageError(f"law {law.name} has inputs {law.inputs}; comparison needs a law of (N, D) or of C")
    return alloc.numeric_optimum(lambda n, d: law.predict(params, params=n, tokens=d), flops)[2]


def flops_to_reach(law: Law, params: dict[str, float], loss: float, lo: float = 1e3, hi: float = 1e40) -> float:
    """The smallest C with L*(C) <= loss (bisection in ln C); inf if the frontier never gets there."""
    f = lambda x: frontier_loss(law, params, math.exp(x)) - loss  # noqa: E731
    a, b = math.log(lo), math.log(hi)
    if f(b) > 0:
        return math.inf
    if f(a) <= 0:
        return lo
    return math.exp(optimize.brentq(f, a, b, xtol=1e-10))


def multiplier(law_a: Law, params_a: dict[str, float], law_b: Law, params_b: dict[str, float], flops: float) -> float:
    """m(C) = C_A(L*_B(C)) / C (module docstring)."""
    return flops_to_reach(law_a, params_a, frontier_loss(law_b, params_b, flops)) / flops


def log_slope(budgets: np.ndarray, mults: np.ndarray) -> float:
    """d ln m / d ln C by least squares over the finite positive multipliers (nan with fewer than 2)."""
    budgets, mults = np.asarray(budgets, dtype=float), np.asarray(mults, dtype=float)
    ok = np.isfinite(mults) & (mults > 0)
    if ok.sum() < 2:
        return math.nan
    return float(np.polyfit(np.log(budgets[ok]), np.log(mults[ok]), 1)[0])


def interval(values, level: float) -> tuple[float, float]:
    """Percentile interval that keeps +inf (A never reaches B's loss) instead of dropping it."""
    v = np.asarray(values, dtype=float)
    # the quantile drops non-finite values: clip +inf to a huge finite value and map it back
    big = 1e300
    lo, hi = percentile_interval(np.minimum(v, big), level)
    return (math.inf if lo >= big else lo), (math.inf if hi >= big else hi)


@dataclass(kw_only=True, slots=True)
class PairedMultipliers:
    """m of B over A per pair of draws (nan where a draw is degenerate)."""

    per_budget: np.ndarray  # (pairs, budgets)
    at_target: np.ndarray  # (pairs,)
    slopes: np.ndarray  # (pairs,) d ln m / d ln C over the slope grid


def paired_multipliers(
    law_a: Law,
    draws_a: Sequence[dict[str, float]],
    law_b: Law,
    draws_b: Sequence[dict[str, float]],
    *,
    budgets: Sequence[float],
    target: float,
    slope_grid: Sequence[float],
) -> PairedMultipliers:
    """m(C) at `budgets` and `target`, and its slope over `slope_grid`, for draw i of A with draw i of B."""
    k = min(len(draws_a), len(draws_b))
    budgets, slope_grid = np.asarray(budgets, dtype=float), np.asarray(slope_grid, dtype=float)
    per_budget = np.full((k, budgets.size), np.nan)
    at_target = np.full(k, np.nan)
    slopes = np.full(k, np.nan)
    for i in range(k):
        pa, pb = draws_a[i], draws_b[i]
        try:
            per_budget[i] = [multiplier(law_a, pa, law_b, pb, c) for c in budgets]
            at_target[i] = multiplier(law_a, pa, law_b, pb, target)
            slopes[i] = log_slope(slope_grid, np.array([multiplier(law_a, pa, law_b, pb, c) for c in slope_grid]))
        except (UsageError, ValueError):
            continue  # a degenerate draw (e.g. a bound-hitting exponent): left out of the interval
    return PairedMultipliers(per_budget=per_budget, at_target=at_target, slopes=slopes)
