"""Prediction intervals for a run the law has not seen: parameter, noise and extrapolation error.

A bootstrap over runs resamples the points the law was fitted to, so its interval on a
prediction reflects only how the fit moves with that resampling. A run at 3x or 10x the largest
budget is also off by (a) its own run-to-run noise and (b) the law's error out of sample, which
grows with the distance it extrapolates. The backtests measure (b): fitted without a budget, the
law misses that budget's runs by rel_i at a distance of d_i decades of compute beyond (or below)
the budgets it was fitted on. Assuming the miss grows linearly with the distance (a law with a
slightly wrong exponent drifts linearly in log C), the out-of-sample error per decade is

    k = sqrt(mean_i (rel_i / d_i)^2)          over backtest runs with d_i > 0,

the RMS over every fold that extrapolates (hold-out-the-largest, and the outer folds of
leave-one-budget-out). It includes the held-out runs' own noise, so it errs wide at short range.
The runs of one fold share that fold's fit, so k rests on as many independent estimates as there
are folds (two with three budgets): its term is scaled by t/z, Student's t quantile with that many
degrees of freedom over the normal one (x2.2 with two folds at 95%).
At a target d_t decades from the fitted budgets the three parts add in log space,

    sd = sqrt(s_boot^2 + sigma_noise^2 + (t/z k d_t)^2),     interval = point * exp(+-z sd),

with s_boot the bootstrap replicates' spread (their 95% half-width / z, in log space), sigma_noise
a new run's noise (scalelab.fitting.entry.fit_runs.RunsFit.residual_scale: the fit's residual scale
corrected for its parameters, seed replicates, or a seed study's floor, whichever is largest), and
z the normal quantile of the level. With no
extrapolating backtest (fewer than 3 budgets), k is unknown and the interval says so (k = None).
The ledger (scalelab.store.ledger) scores these intervals against measured runs: that is the
test of the method, not this derivation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

from scalelab.fitting.estimate.intervals import percentile_interval


@dataclass(kw_only=True, slots=True)
class ExtrapolationError:
    per_decade: float | None  # k: RMS relative error per decade of extrapolation; None if unmeasured
    n_runs: int  # backtest runs it rests on
    n_folds: int  # distinct fits behind them: the runs of one fold share its error, so k has ~n_folds dof
    max_decades: float  # the farthest backtest distance measured

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(kw_only=True, slots=True)
class PredictionInterval:
    point: float
    lo: float
    hi: float
    level: float
    parts: dict[str, float]  # log-space sds: bootstrap, noise, extrapolation (and decades)
    ends: tuple[float, float] | None = None  # a bracket's two sides (losses), the lower first

    def to_dict(self) -> dict:
        out = asdict(self)
        if self.ends is None:
            del out["ends"]
        return out


def extrapolation_error(backtests: Iterable[dict]) -> ExtrapolationError:
    """k from backtest dicts whose runs carry `flops` and `rel_error`.

    Each dict carries `train_range` = [min, max] training FLOPs of its fold, or, for
    leave-one-budget-out, `folds` = [{"flops": C, "train_range": [lo, hi]}] per held-out budget.
    Runs inside their training range (interpolation) do not enter; a fold seen by two protocols
    (hold-out-the-largest is leave-one-budget-out's last fold) counts once.
    """
    seen: dict[tuple, float] = {}
    folds: set[tuple] = set()
    dmax = 0.0
    for bt in backtests:
        ranges = {round(math.log10(f["flops"]), 3): f["train_range"] for f in bt.get("folds", [])}
        for r in bt.get("runs", []):
            rng = ranges.get(round(math.log10(r["flops"]), 3), bt.get("train_range"))
            if rng is None:
                continue
            d = decades_outside(r["flops"], rng)
            if d > 0.05:  # within ~12% of the fitted range is interpolation, not extrapolation
                fold = (round(rng[0], -3), round(rng[1], -3))
                seen[(fold, r["flops"], r.get("observed"), r.get("predicted"))] = r["rel_error"] / d
                folds.add(fold)
                dmax = max(dmax, d)
    if not seen:
        return ExtrapolationError(per_decade=None, n_runs=0, n_folds=0, max_decades=0.0)
    ratios = np.array(list(seen.values()))
    return ExtrapolationError(
        per_decade=float(np.sqrt(np.mean(np.square(ratios)))), n_runs=ratios.size, n_folds=len(folds), max_decades=dmax
    )


def decades_outside(flops: float, train_range) -> float:
    """Distance in decades of compute from `flops` to the interval [lo, hi] (0 inside)."""
    lo, hi = train_range
    if flops > hi:
        return math.log10(flops / hi)
    if flops < lo:
        return math.log10(lo / flops)
    return 0.0


def t_over_z(dof: int, level: float) -> float:
    """Student's t quantile with `dof` degrees of freedom over the normal one at `level`.

    A backtest error measured on a few independent fits is itself uncertain: its term in an
    interval is scaled by this factor (x2.2 with two folds, x1.2 with eight, at 95%).
    """
    z = float(stats.norm.ppf(0.5 + level / 2))
    return float(stats.t.ppf(0.5 + level / 2, max(int(dof), 1))) / z


def replicate_sd(replicate_values: np.ndarray, level: float = 0.95) -> float:
    """Log-space sd of bootstrap replicates: their `level` percentile half-width / z (0 if < 2)."""
    z = float(stats.norm.ppf(0.5 + level / 2))
    vals = np.asarray(replicate_values, dtype=float)
    vals = vals[np.isfinite(vals) & (vals > 0)]
    if vals.size < 2:
        return 0.0
    lo_b, hi_b = percentile_interval(np.log(vals), level)
    return float(hi_b - lo_b) / (2 * z)


def replicate_noise(n: np.ndarray, d: np.ndarray, loss: np.ndarray) -> float:
    """Pooled sd of log loss over runs sharing (N, D) (seed replicates); 0 when there are none."""
    groups: dict[tuple[float, float], list[float]] = {}
    for a, b, y in zip(n, d, loss):
        groups.setdefault((float(a), float(b)), []).append(math.log(y))
    sq, dof = 0.0, 0
    for vals in groups.values():
        if len(vals) > 1:
            sq += float(np.sum((np.array(vals) - np.mean(vals)) ** 2))
            dof += len(vals) - 1
    return math.sqrt(sq / dof) if dof else 0.0


def interval_from_parts(point: float, parts: dict[str, float], level: float = 0.95) -> PredictionInterval:
    """point * exp(+-z sd), sd the root sum of squares of the finite log-space sds in `parts`."""
    z = float(stats.norm.ppf(0.5 + level / 2))
    sd = math.sqrt(sum(v**2 for v in parts.values() if math.isfinite(v)))
    return PredictionInterval(
        point=float(point),
        lo=float(point * math.exp(-z * sd)),
        hi=float(point * math.exp(z * sd)),
        level=level,
        parts=dict(parts),
    )


def prediction_interval(
    point: float,
    replicate_values: np.ndarray,
    *,
    residual_scale: float,
    extrapolation: ExtrapolationError,
    decades: float,
    level: float = 0.95,
) -> PredictionInterval:
    """The interval of module docstring for one prediction (point = the fit's prediction)."""
    s_noise = float(residual_scale) if residual_scale and math.isfinite(residual_scale) else 0.0
    k = extrapolation.per_decade
    # k is estimated from a few folds; its quantile is Student's t with that many dof, not z
    s_ext = t_over_z(extrapolation.n_folds, level) * k * max(decades, 0.0) if k is not None else float("nan")
    out = interval_from_parts(
        point, {"bootstrap": replicate_sd(replicate_values, level), "noise": s_noise, "extrapolation": s_ext}, level
    )
    out.parts["decades"] = float(decades)
    return out
