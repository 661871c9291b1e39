"""The frontier's forward folds: which form extrapolates, and an interval calibrated at each distance.

    pairs = forward_pairs(flops, loss, fit_forms)     # rolling origin over the frontier's points
    cal = calibrate(pairs)
    cal.weight           # the power form's share of the point (0.5 without evidence)
    cal.tau(1.2)         # the multiplier of the scale s(C) at 1.2 decades beyond the fitted points

Rolling origin over compute: the frontier is fitted on its first k points (k = MIN_TRAIN ... n - 1,
at most MAX_ORIGINS origins spread evenly) and predicts every later point. Each prediction is a
pair: its distance d in decades beyond the fold's last point, each form's log error
ln(pred / measured), and the fold's own scale parts there (fit, noise; scalelab.fitting.frontier).

The weights. The point is exp((1 - w) ln L_saturating + w ln L_power). The two forms err in opposite
directions far out on real runs, by amounts that differ from one data set to the next. Each fold's
least-squares weight of its errors is w_f = -sum e_s (e_p - e_s) / sum (e_p - e_s)^2, clipped to
[0, 1]; w* is their median (a fold whose few points set a wild form moves it little), shrunk to 1/2
(the midpoint, the bracket's centre) as if WEIGHT_PRIOR folds had found it:
w = (WEIGHT_PRIOR / 2 + n w*) / (WEIGHT_PRIOR + n), n the folds. The forms part
of the scale is the spread of the two forms at that weight, |ln L_s - ln L_p| sqrt(w (1 - w)) (half
the gap at the midpoint, none once the folds have decided).

The calibration. A pair's normalised score is r = |e| / s, its error and scale taken at the weight
the *other* folds give (so that no fold scores weights fitted to itself). The scale carries how the
uncertainty grows with distance; the scores say how far off it is:

    tau^2(d) = (TAU_PRIOR * tau0^2 + n(d) * iso(d)) / (TAU_PRIOR + n(d))

iso is the isotonic (non-decreasing in distance) regression of r^2 on d over every pair, each fold
weighing one in all (the pairs of one fold share its fit), read at the target's distance (clipped to
the distances measured); n(d) is the number of folds that measured at least half that distance. The
prior tau0 is Student's t over the normal quantile for the frontier's residual degrees of freedom
(n - 2: the parts are standard deviations estimated from a few points, x6.5 with three, x1.1 with
twelve); it weighs TAU_PRIOR folds, so a frontier with few folds keeps its parts, and one with many
is set by its measured errors. The interval is point * exp(+-z tau(d) s(C)).

scikit-learn's IsotonicRegression is the monotone fit; the folds are written out here because a
forward fold scores every later point (scikit-learn's TimeSeriesSplit scores only the next block).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats
from sklearn.isotonic import IsotonicRegression

from scalelab.errors import UsageError

MIN_TRAIN = 4  # points a fold fits: the saturating form's three parameters and one degree of freedom
MAX_ORIGINS = 12  # fold origins at most, spread evenly over the points
WEIGHT_PRIOR = 1.0  # folds' worth of belief in the midpoint (w = 1/2)
TAU_PRIOR = 2.0  # folds' worth of belief in tau = tau0 (the parts are standard deviations)


@dataclass(frozen=True, slots=True)
class Pair:
    fold: int  # points the fold was fitted on
    decades: float
    errors: dict[str, float]  # form -> ln(pred / measured)
    fit: float  # the fold's delta-method sd there
    noise: float

    def at(self, w: float) -> tuple[float, float]:
        """(error, scale) of the fold's point at power weight w (module docstring)."""
        if len(self.errors) < 2:
            (e,) = self.errors.values()
            forms = 0.0
        else:
            es, ep = self.errors["saturating"], self.errors["power"]
            e = (1.0 - w) * es + w * ep
            forms = abs(es - ep) * math.sqrt(w * (1.0 - w))
        return e, math.sqrt(self.fit**2 + self.noise**2 + forms**2)


@dataclass(frozen=True, kw_only=True)
class Calibration:
    weight: float = 0.5  # the power form's share of the point
    weight_folds: int = 0  # folds with both forms that set it
    distances: list[float]  # the isotonic fit's knots (decades, ascending)
    tau2: list[float]  # iso(d) at the knots
    fold_reach: list[float]  # per fold, the farthest distance it measured
    n_pairs: int
    prior: float = 1.0  # tau0: the parts' small-sample factor

    @property
    def n_folds(self) -> int:
        return len(self.fold_reach)

    def tau(self, decades: float) -> float:
        """tau(d) of the module docstring."""
        if not self.distances:
            return self.prior
        d = float(np.clip(decades, self.distances[0], self.distances[-1]))
        iso = float(np.interp(d, self.distances, self.tau2))
        n = sum(r >= 0.5 * max(decades, 0.0) for r in self.fold_reach)
        return float(np.sqrt((TAU_PRIOR * self.prior**2 + n * iso) / (TAU_PRIOR + n)))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Calibration:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


# a fold's fit: points' flops and losses -> (flops -> (per form ln L*, fit sd, noise))
FoldFit = Callable[[np.ndarray, np.ndarray], Callable[[np.ndarray], tuple[dict[str, np.ndarray], np.ndarray, float]]]


def forward_pairs(flops, loss, fit: FoldFit, *, min_train: int = MIN_TRAIN) -> list[Pair]:
    """Every fold's predictions of every later point (module docstring); a fold its forms cannot be
    fitted on is skipped."""
    c, y = np.asarray(flops, dtype=float), np.asarray(loss, dtype=float)
    order = np.argsort(c)
    c, y = c[order], y[order]
    origins = np.arange(min_train, c.size)
    if origins.size > MAX_ORIGINS:
        origins = np.unique(np.round(np.linspace(origins[0], origins[-1], MAX_ORIGINS)).astype(int))
    pairs = []
    for k in origins:
        try:
            predict = fit(c[:k], y[:k])
        except UsageError:
            continue
        logs, fit_sd, noise = predict(c[k:])
        for j, (ck, yk) in enumerate(zip(c[k:], y[k:])):
            errors = {name: float(v[j] - np.log(yk)) for name, v in logs.items()}
            pairs.append(Pair(int(k), float(np.log10(ck / c[k - 1])), errors, float(fit_sd[j]), float(noise)))
    return pairs


def form_weight(pairs: list[Pair], leave_out: int | None = None) -> tuple[float, int]:
    """(w, folds behind it): the power form's shrunk weight (module docstring) from the pairs with
    both forms, fold `leave_out` left out."""
    both = [p for p in pairs if len(p.errors) == 2 and p.fold != leave_out]
    per_fold = []
    for f in sorted({p.fold for p in both}):
        es = np.array([p.errors["saturating"] for p in both if p.fold == f])
        delta = np.array([p.errors["power"] for p in both if p.fold == f]) - es
        den = float(np.sum(delta**2))
        if den > 0:
            per_fold.append(float(np.clip(-np.sum(es * delta) / den, 0.0, 1.0)))
    if not per_fold:
        return 0.5, 0
    n = len(per_fold)
    return (WEIGHT_PRIOR * 0.5 + n * float(np.median(per_fold))) / (WEIGHT_PRIOR + n), n


def calibrate(pairs: list[Pair], n_points: int, level: float = 0.95) -> Calibration:
    """The weight, tau0 for `n_points` frontier points, and tau^2(d)'s isotonic part and the folds'
    reach (module docstring)."""
    prior = float(stats.t.ppf(0.5 + level / 2, max(n_points - 2, 1)) / stats.norm.ppf(0.5 + level / 2))
    weight, weight_folds = form_weight(pairs)
    scored = []
    for f in sorted({p.fold for p in pairs}):
        w_f = form_weight(pairs, leave_out=f)[0]
        for p in pairs:
            if p.fold == f:
                e, s = p.at(w_f)
                if s > 0 and math.isfinite(e / s):
                    scored.append((f, p.decades, (e / s) ** 2))
    if not scored:
        return Calibration(
            weight=weight, weight_folds=weight_folds, distances=[], tau2=[], fold_reach=[], n_pairs=0, prior=prior
        )
    folds = sorted({f for f, _, _ in scored})
    per_fold = {f: sum(g == f for g, _, _ in scored) for f in folds}
    d = np.array([x[1] for x in scored])
    r2 = np.array([x[2] for x in scored])
    w = np.array([1.0 / per_fold[x[0]] for x in scored])
    iso = IsotonicRegression(increasing=True, out_of_bounds="clip").fit(d, r2, sample_weight=w)
    knots = np.unique(d)
    return Calibration(
        weight=weight,
        weight_folds=weight_folds,
        distances=knots.tolist(),
        tau2=[float(v) for v in iso.predict(knots)],
        fold_reach=[max(x[1] for x in scored if x[0] == f) for f in folds],
        n_pairs=len(scored),
        prior=prior,
    )
