"""A study's paired comparison of one arm with the baseline: the gap model and the joint law, one bootstrap.

    pc = compare_paired(runs, "swiglu", "gelu", fits=(fit_a, fit_b), target=2e13,
                        points={"swiglu": [(n, d), ...], "gelu": [(n, d), ...]}, measurement=Measurement(3, 6),
                        loss="final_val_loss", replicates=64)
    pc.matched        # L_B - L_A at the decisive measurement's points (the verdict's gap), a GapInterval
    pc.frontier       # L*_B - L*_A between the arms' frontiers at the target
    pc.joint_matched, pc.joint_frontier              # the same from the shared-exponent law

Two views of the same design points (scalelab.sweeps.studies.study_pairs), resampled by one bootstrap over
design points shared by both arms and both views (scalelab.fitting.comparisons.design_bootstrap):

1. the paired gap model (scalelab.fitting.comparisons.paired_gap): the log ratio of the arms' losses at matched
   points, constant or drifting in log C, with its three-part interval (bootstrap, a drift term
   backtested on the gap model, the measurement's scatter), in loss units at the baseline's predicted
   loss (its own error a fourth part). This is the study's default verdict.
2. the joint law (scalelab.fitting.comparisons.shared_exponents): per-arm E, A, B with shared exponents, fitted
   to both arms' runs; its gap at the same points and between the frontiers, with the bootstrap's
   spread, the same measurement scatter and a drift term backtested on the joint law's own gap (each
   fold a refit on its budgets; k_gap times Student's t, scalelab.fitting.comparisons.gap_backtest: the first
   version's method, the noise not taken out, since a refitted law is not linear in the pairs). A
   second opinion: a law's form constrains how the gap may move with scale, which the gap model does
   not assume.

The baseline's own loop fit (`fits[0]`) gives the predicted loss the log ratio is converted at, and
the frontier's L*_A.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from scalelab.errors import UsageError
from scalelab.fitting.comparisons.design_bootstrap import resample_design
from scalelab.fitting.comparisons.gap import GapInterval
from scalelab.fitting.comparisons.gap_backtest import backtest_gap
from scalelab.fitting.comparisons.gap_model import GapPoints
from scalelab.fitting.comparisons.paired_gap import (
    Measurement,
    PairedGap,
    drift_sd,
    measurement_scatter,
    paired_gap,
    percentile_sd,
    z_of,
)
from scalelab.fitting.comparisons.shared_exponents import SharedFit, fit_shared_exponents, refit_from
from scalelab.fitting.entry.scaling_fit import ScalingFit
from scalelab.fitting.uncertainty.predictive import PredictionInterval
from scalelab.sweeps.studies.study_pairs import JointRows, MatchedPairs, joint_rows, match_arms

MIN_PAIRS = 3  # matched pairs the gap model needs


@dataclass(kw_only=True)
class PairedComparison:
    """Arm B against the baseline A by the paired estimators (module docstring)."""

    estimate: PairedGap
    matched: GapInterval
    frontier: GapInterval
    n_pairs: int
    measurement: Measurement
    replicates: int
    joint_matched: GapInterval | None = None
    joint_frontier: GapInterval | None = None
    joint_params: dict[str, dict[str, float]] | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "gap_model": self.estimate.to_dict(),
            "matched": self.matched.to_dict(),
            "frontier": self.frontier.to_dict(),
            "n_pairs": self.n_pairs,
            "measurement": {"sizes": self.measurement.sizes, "pairs": self.measurement.pairs},
            "replicates": self.replicates,
            "joint": None
            if self.joint_matched is None
            else {
                "params": self.joint_params,
                "matched": self.joint_matched.to_dict(),
                "frontier": self.joint_frontier.to_dict(),
            },
            "notes": self.notes,
        }


def _baseline_sd(p: PredictionInterval, pairs: int) -> float:
    """The baseline prediction's log-sd the gap is converted with: its fit's bootstrap and extrapolation,
    and the measurement's run noise over its pairs."""
    parts = [
        p.parts.get("bootstrap", 0.0),
        p.parts.get("extrapolation", 0.0),
        p.parts.get("noise", 0.0) / math.sqrt(pairs),
    ]
    return math.sqrt(sum(v * v for v in parts if math.isfinite(v)))


def compare_paired(
    runs,
    baseline: str,
    arm: str,
    *,
    fits: tuple[ScalingFit, ScalingFit],
    target: float,
    points: dict[str, list[tuple[float, float]]],
    measurement: Measurement,
    loss: str,
    replicates: int,
    seed: int = 0,
    level: float = 0.95,
    joint: bool = True,
) -> PairedComparison:
    """Both views of module docstring.

    Args:
        runs: the study's runs table (scalelab.store.load_runs), already cut to the budgets wanted.
        fits: the baseline's and the arm's loop fits.
        points: arm -> the decisive measurement's (N, D), aligned pair by pair.
        joint: also fit the joint law (the second view).
    Raises:
        UsageError: fewer than MIN_PAIRS matched pairs.
    """
    pairs = match_arms(runs, baseline, arm, loss=loss)
    if pairs.count < MIN_PAIRS:
        raise UsageError(
            f"{arm} vs {baseline}: {pairs.count} matched design point(s); the paired gap needs {MIN_PAIRS}"
        )
    rows = joint_rows(runs, baseline, arm, pairs, loss=loss)
    resample = resample_design(rows.group, rows.budget, replicates, seed)
    gap_points = pairs.points()
    est = paired_gap(
        gap_points,
        target_log_budget=math.log10(target),
        counts=resample.row_counts(gap_points.group),
        measurement=measurement,
        level=level,
    )
    fit_a = fits[0]
    at_a = [fit_a.predict_interval(n, d, flops=target) for n, d in points[baseline]]
    loss_a = float(np.mean([p.point for p in at_a]))
    matched = est.at_target.in_loss(loss_a, _baseline_sd(at_a[len(at_a) // 2], measurement.pairs), decades=est.decades)
    star = fit_a.optimum_interval(target)
    frontier = est.at_target.in_loss(star.point, _baseline_sd(star, measurement.pairs), decades=est.decades)
    out = PairedComparison(
        estimate=est,
        matched=matched,
        frontier=frontier,
        n_pairs=pairs.count,
        measurement=measurement,
        replicates=replicates,
    )
    if joint and fit_a.law == "chinchilla" and fits[1].law == "chinchilla":
        view = JointInputs(
            rows=rows, pairs=pairs, fits=fits, target=target, points=(points[baseline], points[arm]), level=level
        )
        _joint_view(out, view, resample, loss_a)
    elif joint:
        out.notes.append("joint law not fitted: it starts from each arm's chinchilla fit")
    return out


@dataclass(kw_only=True)
class JointInputs:
    """What the joint view fits and where it predicts."""

    rows: JointRows  # both arms' runs
    pairs: MatchedPairs  # the design's matched pairs (its backtest's held-out points)
    fits: tuple[ScalingFit, ScalingFit]  # the arms' own fits: its starts
    target: float
    points: tuple[list[tuple[float, float]], list[tuple[float, float]]]  # the decisive measurement's (N, D)
    level: float


def _joint_view(out: PairedComparison, inp: JointInputs, resample, loss_a: float) -> None:
    """The joint law's matched and frontier gaps (module docstring, view 2) into `out`."""
    rows = inp.rows
    try:
        joint = fit_shared_exponents(
            rows.n, rows.d, rows.arm, rows.loss, starts_from=(inp.fits[0].params, inp.fits[1].params)
        )
    except UsageError as e:
        out.notes.append(f"joint law not fitted: {e}")
        return
    (na, da), (nb, db) = (np.array(p, dtype=float).T for p in inp.points)

    def gaps(params=None) -> tuple[float, float]:
        matched = float(np.mean(joint.predict("b", nb, db, params) - joint.predict("a", na, da, params)))
        try:
            front = joint.frontier_loss("b", inp.target, params) - joint.frontier_loss("a", inp.target, params)
        except UsageError:
            front = math.nan
        return matched, front

    draws = [p for p in joint.replicates(resample.row_counts(rows.group)) if p is not None]
    reps = np.array([gaps(p) for p in draws]).reshape(-1, 2)
    backtest = backtest_gap(inp.pairs.points(), lambda train: _joint_predictor(joint, inp, train))
    scale = loss_a * math.exp(out.estimate.at_target.point)  # log-ratio sds to loss units
    shared = {
        "drift": scale * drift_sd(backtest, out.estimate.decades, inp.level),
        "scatter": scale * measurement_scatter(out.estimate.line, out.measurement, out.estimate.noise),
    }
    z = z_of(inp.level)
    views = []
    for point, col in zip(gaps(), (0, 1)):
        parts = {"bootstrap": percentile_sd(reps[:, col], inp.level), **shared}
        sd = math.sqrt(sum(v * v for v in parts.values()))
        parts["decades"] = out.estimate.decades
        views.append(
            GapInterval(
                point=point, lo=point - z * sd, hi=point + z * sd, level=inp.level, parts=parts, estimator="joint"
            )
        )
    out.joint_matched, out.joint_frontier = views
    out.joint_params = joint.params


def _joint_predictor(joint: SharedFit, inp: JointInputs, train: GapPoints):
    """A backtest fold of the joint law: refitted on the runs of `train`'s budgets (two or more: its
    eight parameters need them), predicting each held-out pair's ln(L_B / L_A)."""
    budgets = np.unique(np.round(train.log_budget, 6))
    if budgets.size < 2:
        return None
    rows, pairs = inp.rows, inp.pairs
    keep = np.isin(np.round(np.log10(rows.budget), 6), budgets)
    fold = refit_from(joint, rows.n[keep], rows.d[keep], rows.arm[keep], rows.loss[keep])

    def predict(held: GapPoints) -> np.ndarray:
        i = held.pair
        return np.log(fold.predict("b", pairs.n[1][i], pairs.d[1][i]) / fold.predict("a", pairs.n[0][i], pairs.d[0][i]))

    return predict
