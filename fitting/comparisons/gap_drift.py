"""The paired gap's drift part, corrected for the noise of the budgets' means: what the gap model misses
out of sample because the gap changes with scale, not because a budget's mean is noisy.

    noise = pure_error(points)                                  # sigma, tau: the pairs' noise, size pattern
    term = noise_corrected_drift(points, drift=False, noise=noise)
    term.sd_at(1.5)                                             # the drift part 1.5 decades from the design

Why not scalelab.fitting.comparisons.gap_backtest's k_gap times Student's t: a fold's miss (a held-out budget's
mean gap minus the fold's prediction of it) is the systematic change of the gap with scale PLUS the
sampling noise of the held-out mean and of the fold's fit. That noise is then counted a second time
by the interval's bootstrap and scatter parts, and with three budgets a t on the 2-3 folds k rests on
multiplies it by 1.6-6. Here the noise's share is not estimated from the folds but known from the
model, so it is taken out (method of moments, as DerSimonian and Laird take the within-study
variance out of a meta-analysis's between-study variance):

    fold f: miss m_f, expected squared miss from noise alone v_f = sigma^2 (1 / n_held + sum_j a_j^2),
            a_j the weight of training pair j in the fold's mean prediction (the gap model is linear
            in the pairs' log ratios, so a is exact: the fold refitted on unit vectors), and
            d_f = |held-out budget - the fold's training centroid| in decades;
    p     = 1 for a constant gap (what it leaves out, a slope, misses in proportion to d), 2 for a
            drifting line (what it leaves out, curvature, misses in proportion to d^2);
    k^2   = max(0, sum_f (m_f^2 - v_f)) / sum_f d_f^2p          drift variance per decade^2p, floored at 0
    se    = sqrt(sum_f (2 v_f^2 + 4 max(m_f^2 - v_f, 0) v_f)) / sum_f d_f^2   its sampling sd, per decade^2
    drift part at the target = sqrt(k^2 d_t^2p + SE_WEIGHT se d_t^2),  d_t = target - the design's centroid.

The distance is from the centroid, where a fitted gap line is anchored, not from the edge of the
training range: a constant gap fitted to budgets whose truth drifts by s per decade misses by s times
that distance, exactly, in every fold and at the target; a line fitted to a gap curving by c per
decade^2 misses by about c d^2 (2.0 c predicted against 2.08 c at the demo's target). With only a
few folds k^2 is uncertain; the interval adds SE_WEIGHT = 0.5 standard errors of it, scaled as a slope
(with d_t, not d_t^p: what a few noisy folds cannot resolve is first of all a slope), in the role
Student's t plays for an estimated variance, without t's blow-up on 1-2 degrees of freedom: the noise
share is known, so the folds only carry the drift. A constant gap with no sign of
drift then pays only that share of a standard error (about the sd of a slope the design cannot rule
out); a gap that drifts pays its drift. The weight is a calibration on simulated studies
(experiments/gap_power.py, its first 10 trials per truth and noise level); the coverage docs/studies.md
reports is measured on other draws.

What it covers less well than the first version: curvature, which a drifting line's two folds
measure poorly (tests/test_gap_drift.py: 80% against 92% on a gap curving 0.01 per decade^2); and
what no backtest over three budgets sees, a gap that curves with its turning point at the design's
centre (a constant fitted there misses nothing in its folds), neither covers.

sigma is the pure error of the pairs: their scatter around a budget-by-size additive fit (a free mean
per budget, the size pattern shared), so no change of the gap with scale can leak into it; the scatter
part of the interval uses the same sigma (scalelab.fitting.comparisons.paired_gap), so nothing is counted twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from scalelab.errors import UsageError
from scalelab.fitting.comparisons.gap_backtest import INTERPOLATION_DECADES, folds
from scalelab.fitting.comparisons.gap_model import NO_SIZE, GapPoints, fit_gap_line


@dataclass(frozen=True, kw_only=True, slots=True)
class PureError:
    """The pairs' noise with the gap's change over budgets removed (module docstring)."""

    sigma: float  # sd of one pair around its budget's mean and its size's effect (nan: no dof)
    tau: float  # sd of the size pattern (the size effects' spread, its noise share removed)
    dof: int

    def to_dict(self) -> dict:
        return {"sigma": self.sigma, "tau": self.tau, "dof": self.dof}


def pure_error(points: GapPoints) -> PureError:
    """sigma and tau from y = mean per budget + size effect + e (module docstring)."""
    budgets = np.unique(points.log_budget)
    sizes = [int(s) for s in np.unique(points.size) if s != NO_SIZE]
    cols = [(points.log_budget == b).astype(float) for b in budgets]
    if len(sizes) >= 2:  # sum-to-zero contrasts, as the gap model's
        first = (points.size == sizes[0]).astype(float)
        cols += [(points.size == s).astype(float) - first for s in sizes[1:]]
    design = np.column_stack(cols)
    beta, *_ = np.linalg.lstsq(design, points.log_ratio, rcond=None)
    rank = int(np.linalg.matrix_rank(design))
    dof = points.n - rank
    if dof <= 0:
        return PureError(sigma=math.nan, tau=math.nan, dof=0)
    sigma2 = float(np.sum((points.log_ratio - design @ beta) ** 2)) / dof
    tau = 0.0
    if len(sizes) >= 2:
        rest = beta[budgets.size :]
        effects = np.array([-np.sum(rest), *rest])
        per_size = points.n / len(sizes)  # pairs behind each size effect
        tau = math.sqrt(max(float(np.var(effects, ddof=1)) - sigma2 / per_size, 0.0))
    return PureError(sigma=math.sqrt(sigma2), tau=tau, dof=dof)


SE_WEIGHT = 0.5  # standard errors of k^2 added to it: a calibration (module docstring)


@dataclass(kw_only=True)
class DriftTerm:
    """k^2 and its standard error, and the folds behind them (module docstring)."""

    k2: float  # noise-corrected drift variance per decade^2 (nan: no fold reaches out)
    se: float  # its sampling sd
    power: int = 1  # the miss grows as distance^power: 1 for a constant gap, 2 for a drifting line
    misses: list[dict] = field(default_factory=list)  # per fold: train, held_out, decades, miss, noise_var

    @property
    def per_decade(self) -> float:
        """The drift part at one decade from the design's centroid."""
        return self.sd_at(1.0)

    def sd_at(self, decades: float) -> float:
        if decades <= 0 or not math.isfinite(self.k2):
            return 0.0 if decades <= 0 else math.nan
        return math.sqrt(self.k2 * decades ** (2 * self.power) + SE_WEIGHT * self.se * decades**2)

    def to_dict(self) -> dict:
        return {"k2": self.k2, "se": self.se, "power": self.power, "per_decade": self.per_decade, "misses": self.misses}


def _mean_prediction_weights(train: GapPoints, held: GapPoints, drift: bool) -> np.ndarray:
    """a: the fold's mean prediction over `held` is a @ train.log_ratio (the fit is linear in y)."""
    out = np.empty(train.n)
    for j in range(train.n):
        unit = GapPoints(log_budget=train.log_budget, size=train.size, group=train.group, log_ratio=np.eye(train.n)[j])
        out[j] = float(np.mean(fit_gap_line(unit, drift).predict_points(held)))
    return out


def noise_corrected_drift(points: GapPoints, *, drift: bool, noise: PureError) -> DriftTerm:
    """The gap model's drift term over scalelab.fitting.comparisons.gap_backtest's folds (module docstring)."""
    rows = []
    for train_b, test_b in folds(points.budgets):
        train = points.where(np.isin(points.log_budget, train_b))
        try:
            line = fit_gap_line(train, drift)
        except UsageError:  # a drift fold on one budget
            continue
        lo, hi = float(train_b.min()), float(train_b.max())
        for b in test_b:
            if max(float(b) - hi, lo - float(b), 0.0) <= INTERPOLATION_DECADES:
                continue
            held = points.where(points.log_budget == b)
            miss = float(np.mean(held.log_ratio) - np.mean(line.predict_points(held)))
            a = _mean_prediction_weights(train, held, drift)
            v = noise.sigma**2 * (1.0 / held.n + float(np.sum(a * a)))
            d = abs(float(b) - line.x_ref)
            rows.append({"train": [lo, hi], "held_out": float(b), "decades": d, "miss": miss, "noise_var": v})
    if not rows or not math.isfinite(noise.sigma):
        return DriftTerm(k2=math.nan, se=math.nan, power=2 if drift else 1, misses=rows)
    m2 = np.array([r["miss"] ** 2 for r in rows])
    v = np.array([r["noise_var"] for r in rows])
    power = 2 if drift else 1
    d = np.array([r["decades"] for r in rows])
    den = float(np.sum(d ** (2 * power)))
    excess = np.maximum(m2 - v, 0.0)
    k2 = max(float(np.sum(m2 - v)), 0.0) / den
    se = math.sqrt(float(np.sum(2 * v * v + 4 * excess * v))) / float(np.sum(d * d))
    return DriftTerm(k2=k2, se=se, power=power, misses=rows)
