"""A first round's bracket: its saturating surface and a pure power law, their geometric mean.

    power = best_loss_power(fit.budgets, fit.loss)   # ln L* = a - gamma ln C through each budget's best loss
    b = bracket((point, lo, hi), power_side)         # Bracket: the point, its 95% interval, the two ends
    bracket_prediction(surface_interval, power_side)  # the same as the loop records it: a PredictionInterval
    fit.bracket_interval(n, d, flops)                # the Bracket from a ScalingFit (fitting.entry.scaling_fit)

On one or two decades of compute a saturating law leans pessimistic far out and a pure power law
optimistic (scalelab.fitting.allocation.frontier_forms), so the bracket predicts with their
geometric mean. On a first round (three budgets, where the frontier has no residual degree of
freedom to calibrate and may not be built at all) the saturating side is the surface's own
prediction at (N, D); the power side is L*(C) = A C^-gamma through each budget's best measured loss,
times the surface's excess at (N, D) over its own optimum at C (the cost of being off N*, which the
surface measures well). The interval: the surface interval's log half-width and half the two
sides' log gap, added in quadrature about the point; the ends are the two sides themselves.

It was the "bracket" column of the registered first-round protocol (docs/first-round.md, step 3b),
scored beside the loop's default on four stores trained after it was registered; its rule held (30x
mean error +1.91% over the four), so the loop predicts with it: every run beyond the fitted budgets of
a fit with no calibrated frontier (ScalingFit.run_interval), scored on fresh stores by that page's
protocol 2.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from scalelab.fitting.allocation.frontier_forms import FrontierForm, fit_power
from scalelab.fitting.estimate.approaches import group_budgets
from scalelab.fitting.uncertainty.predictive import PredictionInterval


@dataclass(frozen=True, slots=True)
class Bracket:
    point: float
    lo: float  # the 95% interval
    hi: float
    low_end: float  # the two sides, the lower first
    high_end: float


def budget_minima(flops, loss) -> tuple[np.ndarray, np.ndarray]:
    """(each budget's FLOPs, its best loss), budgets in increasing order: runs within 5% of each
    other's FLOPs share a budget (a table's 6ND is not exactly its design's budget), at their
    geometric mean."""
    c, y = np.asarray(flops, dtype=float), np.asarray(loss, dtype=float)
    labels = group_budgets(c)
    groups = np.unique(labels)
    budgets = np.array([float(np.exp(np.log(c[labels == g]).mean())) for g in groups])
    return budgets, np.array([float(y[labels == g].min()) for g in groups])


def best_loss_power(flops, loss) -> FrontierForm:
    """The power side: ln L* = a - gamma ln C by least squares through each budget's best loss (2+
    budgets; budget_minima)."""
    return fit_power(*budget_minima(flops, loss))


def bracket(surface: tuple[float, float, float], power_side: float) -> Bracket:
    """The bracket from the surface's (point, lo, hi) at a run and the power side's loss there."""
    point = float(np.sqrt(surface[0] * power_side))
    half = float(np.hypot(np.log(surface[2] / surface[1]) / 2, np.log(surface[0] / power_side) / 2))
    low, high = sorted((surface[0], power_side))
    return Bracket(point, point * float(np.exp(-half)), point * float(np.exp(half)), low, high)


def bracket_prediction(surface: PredictionInterval, power_side: float) -> PredictionInterval:
    """The bracket as a prediction (what the loop records, and plan-run plans from): its point and 95%
    interval, the two sides as `ends`, and as log-space sds in `parts` the surface's interval
    ("surface") and half the sides' gap ("sides"), so that the parts rebuild the interval."""
    b = bracket((surface.point, surface.lo, surface.hi), power_side)
    z = float(stats.norm.ppf(0.5 + surface.level / 2))
    parts = {"surface": float(np.log(surface.hi / surface.lo)) / 2 / z,
             "sides": float(np.log(b.high_end / b.low_end)) / 2 / z}  # fmt: skip
    return PredictionInterval(point=b.point, lo=b.lo, hi=b.hi, level=surface.level, parts=parts,
                              ends=(b.low_end, b.high_end))  # fmt: skip
