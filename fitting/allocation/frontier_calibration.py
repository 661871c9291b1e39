"""The frontier's forward folds: which form extrapolates, and an interval calibrated at each distance.

    pairs = forward_pairs(flops, loss, sizes, fit_forms, surface_folds)   # rolling origin over the points
    cal = calibrate(pairs, n_points)
    cal.weights          # {"saturating": .., "power": .., "surface": ..}: the point's weights
    cal.tau(1.2)         # the multiplier of the scale s(C) at 1.2 decades beyond the fitted points

Rolling origin over compute: the frontier is fitted on its first k points (k = MIN_TRAIN ... n - 1,
at most MAX_ORIGINS origins spread evenly) and predicts every later point; so does the law of N and
D refitted on the runs up to the fold's last point (its `surface_folds`, at each later point's N*).
Each prediction is a pair: its distance d in decades beyond the fold's last point, each
candidate's log error ln(pred / measured), and the fold's own scale parts there (fit, noise;
scalelab.fitting.allocation.frontier).

The weights. The point is exp(sum_j w_j ln L_j) over the candidates: the saturating form, the pure
power form (scalelab.fitting.allocation.frontier_forms) and the surface (the law of N and D) at the frontier's
N*. The two forms err in opposite directions far out on real runs, by amounts that differ from one
data set to the next, and a surface fitted to runs that pin it (whole loss curves) can beat both,
where on 1-2 decades of small budgets it extrapolates worst of all. Each fold's weights minimise
its squared errors on the simplex (scalelab.fitting.uncertainty.stacking.simplex_least_squares); their median
over the folds (a fold whose few points set a wild form moves it little), renormalised, is shrunk
to the prior PRIOR_WEIGHTS (the two forms' midpoint, the bracket's centre) as if WEIGHT_PRIOR folds
had found it: w = (WEIGHT_PRIOR w0 + n w*) / (WEIGHT_PRIOR + n), n the folds. The forms part of the
scale is the candidates' spread at the weights, sqrt(sum_j w_j (ln L_j - ln L)^2) (half the forms'
gap at the midpoint, none once the folds have decided).

The calibration. A pair's normalised score is r = |e| / s, its error and scale taken at the weights
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
from scalelab.fitting.uncertainty.stacking import simplex_least_squares

MIN_TRAIN = 4  # points a fold fits: the saturating form's three parameters and one degree of freedom
MAX_ORIGINS = 12  # fold origins at most, spread evenly over the points
WEIGHT_PRIOR = 1.0  # folds' worth of belief in the prior weights
PRIOR_WEIGHTS = {"saturating": 0.5, "power": 0.5, "surface": 0.0}  # the forms' midpoint; the surface on evidence
TAU_PRIOR = 2.0  # folds' worth of belief in tau = tau0 (the parts are standard deviations)


@dataclass(frozen=True, slots=True)
class Pair:
    fold: int  # points the fold was fitted on
    decades: float
    errors: dict[str, float]  # candidate -> ln(pred / measured)
    fit: float  # the fold's delta-method sd there
    noise: float

    def at(self, weights: dict[str, float], lead: str | None = None) -> tuple[float, float] | None:
        """(error, scale) of the fold's point at `weights` (module docstring); with `lead`, of that
        candidate's own prediction, its distance from the weighted point counted in the scale (None
        where the pair has no such candidate)."""
        e, spread = combine(self.errors, weights)
        if lead is not None:
            if lead not in self.errors:
                return None
            e, spread = self.errors[lead], abs(self.errors[lead] - e)
        return e, math.sqrt(self.fit**2 + self.noise**2 + spread**2)


def combine(logs: dict[str, float], weights: dict[str, float]) -> tuple[float, float]:
    """(sum_j w_j x_j, sqrt(sum_j w_j (x_j - mean)^2)) over the candidates present in `logs`, the
    weights renormalised over them (equal where they sum to zero)."""
    w = np.array([max(weights.get(k, 0.0), 0.0) for k in logs])
    w = w / w.sum() if w.sum() > 0 else np.full(len(logs), 1.0 / len(logs))
    x = np.array(list(logs.values()))
    mean = float(w @ x)
    return mean, float(np.sqrt(max(float(w @ (x - mean) ** 2), 0.0)))


@dataclass(frozen=True, kw_only=True)
class Calibration:
    weights: dict[str, float]  # the point's weights over the candidates
    weight_folds: int  # folds that set them
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
# the surface refitted per fold: each fold's compute cutoff -> (N, D) -> loss, or None where it cannot be
SurfaceFolds = Callable[[list[float]], list[Callable[[np.ndarray, np.ndarray], np.ndarray] | None]]


def forward_pairs(
    flops, loss, sizes, fit: FoldFit, surface_folds: SurfaceFolds | None = None, *, cutoffs=None,
    min_train: int = MIN_TRAIN,
) -> list[Pair]:  # fmt: skip
    """Every fold's predictions of every later point (module docstring); a fold its forms cannot be
    fitted on is skipped. `sizes`: each point's N*, where the surface is read; `cutoffs`: each
    point's largest run compute (a fold's surface fits the runs up to its last point's; default the
    points' compute)."""
    c, y, n = (np.asarray(a, dtype=float) for a in (flops, loss, sizes))
    cut = c if cutoffs is None else np.asarray(cutoffs, dtype=float)
    order = np.argsort(c)
    c, y, n, cut = c[order], y[order], n[order], cut[order]
    origins = np.arange(min_train, c.size)
    if origins.size > MAX_ORIGINS:
        origins = np.unique(np.round(np.linspace(origins[0], origins[-1], MAX_ORIGINS)).astype(int))
    surfaces = surface_folds([float(cut[:k].max()) for k in origins]) if surface_folds else [None] * origins.size
    pairs = []
    for k, surface in zip(origins, surfaces):
        try:
            predict = fit(c[:k], y[:k])
        except UsageError:
            continue
        logs, fit_sd, noise = predict(c[k:])
        if surface is not None:
            logs = {**logs, "surface": np.log(surface(n[k:], c[k:] / (6.0 * n[k:])))}
        for j, (ck, yk) in enumerate(zip(c[k:], y[k:])):
            errors = {name: float(v[j] - np.log(yk)) for name, v in logs.items() if np.isfinite(v[j])}
            pairs.append(Pair(int(k), float(np.log10(ck / c[k - 1])), errors, float(fit_sd[j]), float(noise)))
    return pairs


def form_weights(pairs: list[Pair], leave_out: int | None = None) -> tuple[dict[str, float], int]:
    """(weights, folds behind them): the shrunk median of the folds' simplex least-squares weights
    (module docstring), fold `leave_out` left out."""
    names = list(PRIOR_WEIGHTS)
    per_fold = []
    for f in sorted({p.fold for p in pairs if p.fold != leave_out}):
        mine = [p for p in pairs if p.fold == f]
        have = [k for k in names if all(k in p.errors for p in mine)]
        if len(have) < 2:
            continue
        w = simplex_least_squares(np.array([[p.errors[k] for k in have] for p in mine]), np.ones(len(mine)))
        per_fold.append([w[have.index(k)] if k in have else np.nan for k in names])
    if not per_fold:
        return dict(PRIOR_WEIGHTS), 0
    table = np.array(per_fold)
    med = np.array([np.median(col[np.isfinite(col)]) if np.isfinite(col).any() else 0.0 for col in table.T])
    med = med / med.sum() if med.sum() > 0 else np.array(list(PRIOR_WEIGHTS.values()))
    n = len(per_fold)
    prior = np.array(list(PRIOR_WEIGHTS.values()))
    w = (WEIGHT_PRIOR * prior + n * med) / (WEIGHT_PRIOR + n)
    return {k: float(v) for k, v in zip(names, w / w.sum())}, n


def calibrate(pairs: list[Pair], n_points: int, level: float = 0.95, lead: str | None = None) -> Calibration:
    """The weights, tau0 for `n_points` frontier points, and tau^2(d)'s isotonic part and the folds'
    reach (module docstring). `lead`: calibrate the predictions of that candidate alone (the surface
    at a run's (N, D) on an envelope of loss curves), its distance from the weighted point in the scale."""
    prior = float(stats.t.ppf(0.5 + level / 2, max(n_points - 2, 1)) / stats.norm.ppf(0.5 + level / 2))
    weights, weight_folds = form_weights(pairs)
    scored = []
    for f in sorted({p.fold for p in pairs}):
        w_f = form_weights(pairs, leave_out=f)[0]
        for p in pairs:
            got = p.at(w_f, lead) if p.fold == f else None
            if got is not None and got[1] > 0 and math.isfinite(got[0] / got[1]):
                scored.append((f, p.decades, (got[0] / got[1]) ** 2))
    if not scored:
        return Calibration(
            weights=weights, weight_folds=weight_folds, distances=[], tau2=[], fold_reach=[], n_pairs=0, prior=prior
        )
    folds = sorted({f for f, _, _ in scored})
    per_fold = {f: sum(g == f for g, _, _ in scored) for f in folds}
    d = np.array([x[1] for x in scored])
    r2 = np.array([x[2] for x in scored])
    w = np.array([1.0 / per_fold[x[0]] for x in scored])
    iso = IsotonicRegression(increasing=True, out_of_bounds="clip").fit(d, r2, sample_weight=w)
    knots = np.unique(d)
    return Calibration(
        weights=weights,
        weight_folds=weight_folds,
        distances=knots.tolist(),
        tau2=[float(v) for v in iso.predict(knots)],
        fold_reach=[max(x[1] for x in scored if x[0] == f) for f in folds],
        n_pairs=len(scored),
        prior=prior,
    )
