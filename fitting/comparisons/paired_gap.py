"""A study's gap at the target from the paired gap model: the point, and an interval of three parts.

    counts = resample_design(groups, budgets, 64, seed).row_counts(points.group)
    est = paired_gap(points, target_log_budget=13.3, counts=counts, measurement=Measurement(sizes=3, pairs=6))
    est.method                                     # noise_corrected (default) | backtest_t (the first, for comparison)
    est.at_target.point, est.at_target.parts      # ln(L_B / L_A) and its sds
    est.at_target.in_loss(1.26, 0.03)              # as L_B - L_A in loss units (a GapInterval)

The model is scalelab.fitting.comparisons.gap_model's (constant or drifting in log C, by its registered rule),
fitted to the matched pairs of the design. What is measured at the target to score it is a matched
decisive measurement: both arms at `sizes` sizes around N*, each with a few seeds, `pairs` pairs in
all, and its mean gap. The prediction of that mean is off for three reasons, added as independent
sds (ln of a loss ratio; z the normal quantile of the level):

    bootstrap  the line's own uncertainty: the spread of its prediction at the target over the
               shared design-point bootstrap (scalelab.fitting.comparisons.design_bootstrap: both arms' runs at
               a design point drawn together), the size pattern held;
    drift      how far the model misses out of sample because the gap changes with scale, measured on
               the gap model itself over rolling-origin and leave-the-first-budget-out folds, with
               the noise of the budgets' means taken out of each fold's squared miss
               (scalelab.fitting.comparisons.gap_drift: sqrt(k^2 d_t^2p + 0.5 se d_t^2), d_t the target's
               distance from the design's centroid in decades, p = 1 for a constant gap and 2 for a
               drift); unmeasured (nan: no interval, no decision) when the design has one budget;
    scatter    the measurement's own spread: the size pattern over its `sizes` sizes and the pairs'
               pure error over its `pairs` pairs, sqrt(tau^2 / sizes + sigma^2 / pairs), sigma and tau
               from a free mean per budget plus the size pattern (scalelab.fitting.comparisons.gap_drift
               .pure_error), so a gap that drifts is charged in the drift part only.

    interval = point +- z sqrt(bootstrap^2 + drift^2 + scatter^2)

In loss units, at the baseline's predicted loss L_A there: the gap is L_A (e^g - 1), each part is
scaled by L_A e^g, and a fourth part carries the baseline prediction's own error (its log-sd r_A
times |L_A (e^g - 1)|). Between the arms' frontiers the model gives the same ratio (a gap that depends
on C only moves both arms' iso-FLOP curves alike, so their minima sit at the same N): the frontier
gap is L*_A (e^g - 1).

`method="backtest_t"` is the first version, kept to measure the change against (experiments/gap_power.py):
drift = k_gap (scalelab.fitting.comparisons.gap_backtest: RMS of miss / decades beyond each fold's training range,
the noise in every miss) times the distance beyond the largest budget and Student's t over z for the
2-3 folds; scatter from the line's residuals (a drift the constant gap missed counted again there).
On experiments/gap_power.py's simulated studies (docs/studies.md 2.2) it was 1.2x as wide (median) and
decided 56% of the gaps above twice the per-point scatter, against the default's 69%.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from scalelab.errors import UsageError
from scalelab.fitting.comparisons.gap import GapInterval
from scalelab.fitting.comparisons.gap_backtest import GapBacktest, backtest_gap
from scalelab.fitting.comparisons.gap_drift import DriftTerm, PureError, noise_corrected_drift, pure_error
from scalelab.fitting.comparisons.gap_model import DriftChoice, GapLine, GapPoints, choose_drift, fit_gap_line
from scalelab.fitting.estimate.intervals import percentile_interval
from scalelab.fitting.uncertainty.predictive import t_over_z


@dataclass(frozen=True, kw_only=True, slots=True)
class Measurement:
    """The matched decisive measurement a prediction is scored against."""

    sizes: int = 1  # distinct sizes (each arm at each)
    pairs: int = 1  # matched pairs in all (sizes x seeds)


def z_of(level: float) -> float:
    return float(stats.norm.ppf(0.5 + level / 2))


def percentile_sd(values, level: float) -> float:
    """A bootstrap statistic's sd: its percentile interval's half-width over z (0 with < 2 finite)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size < 2:
        return 0.0
    lo, hi = percentile_interval(v, level)
    return float(hi - lo) / (2 * z_of(level))


@dataclass(kw_only=True)
class LogGap:
    """ln(L_B / L_A) with its sd parts (module docstring)."""

    point: float
    parts: dict[str, float]  # sds: bootstrap, drift, scatter (nan: unmeasured)
    level: float

    @property
    def sd(self) -> float:
        return math.sqrt(sum(v * v for v in self.parts.values()))  # nan when a part is unmeasured

    @property
    def lo(self) -> float:
        return self.point - z_of(self.level) * self.sd

    @property
    def hi(self) -> float:
        return self.point + z_of(self.level) * self.sd

    def in_loss(self, baseline_loss: float, baseline_sd: float = 0.0, *, decades: float = 0.0) -> GapInterval:
        """L_B - L_A = L_A (e^g - 1), the parts scaled by L_A e^g, plus the baseline's (module docstring)."""
        scale = baseline_loss * math.exp(self.point)
        point = baseline_loss * math.expm1(self.point)
        parts = {k: scale * v for k, v in self.parts.items()}
        parts["baseline"] = abs(point) * baseline_sd
        sd = math.sqrt(sum(v * v for v in parts.values()))
        z = z_of(self.level)
        return GapInterval(
            point=point,
            lo=point - z * sd,
            hi=point + z * sd,
            level=self.level,
            parts={**parts, "decades": float(decades)},
            estimator="paired",
        )

    def to_dict(self) -> dict:
        return {"point": self.point, "lo": self.lo, "hi": self.hi, "level": self.level, "parts": dict(self.parts)}


METHODS = ("noise_corrected", "backtest_t")


def measurement_scatter(line: GapLine, measurement: Measurement, noise: PureError | None = None) -> float:
    """The measurement's own sd (module docstring, scatter); from the line's residuals without `noise`
    (the first version)."""
    if noise is not None and math.isfinite(noise.sigma):
        return math.sqrt(noise.tau**2 / max(measurement.sizes, 1) + noise.sigma**2 / max(measurement.pairs, 1))
    total, resid = line.scatter_sd, line.residual_sd
    if not math.isfinite(total):
        return math.nan
    if not math.isfinite(resid):
        return total / math.sqrt(max(measurement.sizes, 1))
    pattern = max(total**2 - resid**2, 0.0)
    return math.sqrt(pattern / max(measurement.sizes, 1) + resid**2 / max(measurement.pairs, 1))


def line_noise(line: GapLine) -> PureError:
    """sigma and tau from the line's residuals, for a design with no pure error (one pair per budget and
    size): a drift the line misses is in them, so the interval errs wide."""
    sigma = line.residual_sd if math.isfinite(line.residual_sd) else line.scatter_sd
    tau = math.sqrt(max(line.scatter_sd**2 - sigma**2, 0.0)) if math.isfinite(line.scatter_sd) else 0.0
    return PureError(sigma=sigma, tau=tau, dof=0)


@dataclass(kw_only=True)
class PairedGap:
    """The paired gap model's prediction at the target (module docstring)."""

    choice: DriftChoice
    line: GapLine
    backtest: GapBacktest
    at_target: LogGap
    decades: float  # the target beyond the largest budget
    method: str = "noise_corrected"
    noise: PureError | None = None
    drift_term: DriftTerm | None = None  # the noise-corrected drift (method noise_corrected)
    replicates: np.ndarray = field(default_factory=lambda: np.zeros(0))  # the line's prediction per replicate

    @property
    def model(self) -> str:
        return "drift" if self.line.drift else "constant"

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "intercept": self.line.intercept,
            "slope_per_decade": self.line.slope,
            "size_effects": {str(k): v for k, v in self.line.size_effects.items()},
            "scatter_per_point": self.line.scatter_sd,
            "residual_sd": self.line.residual_sd,
            "choice": self.choice.to_dict(),
            "backtest": self.backtest.to_dict(),
            "at_target": self.at_target.to_dict(),
            "decades": self.decades,
            "method": self.method,
            "noise": None if self.noise is None else self.noise.to_dict(),
            "drift_term": None if self.drift_term is None else self.drift_term.to_dict(),
        }


def drift_sd(backtest: GapBacktest, decades: float, level: float) -> float:
    """t/z k_gap d: the drift part at `decades` beyond the design (nan when k is unmeasured)."""
    if decades <= 0:
        return 0.0
    k = backtest.error.per_decade
    return math.nan if k is None else t_over_z(backtest.error.n_folds, level) * k * decades


def paired_gap(
    points: GapPoints,
    *,
    target_log_budget: float,
    counts: np.ndarray,
    measurement: Measurement,
    level: float = 0.95,
    method: str = "noise_corrected",
) -> PairedGap:
    """The gap model fitted, backtested and bootstrapped, predicted at the target (module docstring).

    Args:
        points: the design's matched pairs.
        target_log_budget: log10 of the target's FLOPs.
        counts: (replicates, pairs) weights of the shared design-point bootstrap.
        measurement: what the prediction will be scored against.
        method: the drift and scatter parts (module docstring): noise_corrected, or backtest_t (the first).
    Raises:
        UsageError: no matched pair, or an unknown method.
    """
    if method not in METHODS:
        raise UsageError(f"paired gap: method {method!r} is not one of {', '.join(METHODS)}")
    choice = choose_drift(points)
    line = fit_gap_line(points, choice.drift)
    reps = np.array([line.refit(points, c).predict(target_log_budget) for c in np.asarray(counts) if c.sum() > 0])
    backtest = backtest_gap(points, lambda train: fit_gap_line(train, choice.drift).predict_points)
    decades = max(target_log_budget - float(points.budgets.max()), 0.0)
    noise, term = None, None
    if method == "noise_corrected":
        noise = pure_error(points)
        if not math.isfinite(noise.sigma):  # one pair per budget and size: the line's residuals, drift and all
            noise = line_noise(line)
        term = noise_corrected_drift(points, drift=choice.drift, noise=noise)
        drift = term.sd_at(target_log_budget - line.x_ref) if decades > 0 else 0.0
    else:
        drift = drift_sd(backtest, decades, level)
    parts = {
        "bootstrap": percentile_sd(reps, level),
        "drift": drift,
        "scatter": measurement_scatter(line, measurement, noise),
    }
    at = LogGap(point=float(line.predict(target_log_budget)), parts=parts, level=level)
    return PairedGap(
        choice=choice,
        line=line,
        backtest=backtest,
        at_target=at,
        decades=decades,
        method=method,
        noise=noise,
        drift_term=term,
        replicates=reps,
    )
