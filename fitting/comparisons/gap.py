"""The predicted loss gap between two arms' runs at a target, with an interval of three parts.

    k = paired_extrapolation(backtests_a, backtests_b, sizes_a, sizes_b)   # the gap's error per decade
    gap = gap_interval(loss_a, loss_b, reps_a, reps_b, noise_a=..., noise_b=..., extrapolation=k,
                       decades=0.7, level=0.95)
    gap.point, gap.lo, gap.hi, gap.parts                  # L_B - L_A (negative: B is better)

Two runs are predicted, one per arm, each by its arm's fit (scalelab.fitting.entry.scaling_fit.ScalingFit:
the loop's fit). Their difference is off for three reasons, which add as independent sds (in loss
units, z the normal quantile of the level):

    bootstrap      the spread of L_B,i - L_A,i over paired bootstrap replicates i (the arms were
                   fitted to independent runs, so draw i of one pairs with draw i of the other);
    noise          each measured run's own noise: sqrt((L_A s_A)^2 + (L_B s_B)^2), s the arms'
                   residual log-sds (run-to-run noise, scalelab.fitting.entry.scaling_fit.residual_scale);
    extrapolation  the law's error out of sample, for the *gap*: the backtests of the two arms hold
                   out the same budgets, so their misses on the same design point (budget and rank
                   of the size within it) are paired, and the gap's miss per decade is measured,
                       k_gap = sqrt(mean_i (((p_B - o_B) - (p_A - o_A)) / o_mean / d_i)^2),
                   over paired held-out runs d_i > 0 decades beyond their fold's training range
                   (a miss both arms share, a law form slightly off for both, cancels in the gap);
                   scaled like a single prediction's by Student's t over z for the folds it rests
                   on (scalelab.fitting.uncertainty.predictive), times the target's distance and the mean loss.
                   Without paired backtests the two arms' own errors add as if independent.

    interval = point +- z sqrt(boot^2 + noise^2 + ext^2)

The measured gap of the two runs, once they finish, is scored against it (scalelab.sweeps.study_ledger).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

from scalelab.fitting.estimate.intervals import percentile_interval
from scalelab.fitting.uncertainty.predictive import ExtrapolationError, decades_outside, t_over_z


@dataclass(kw_only=True, slots=True)
class GapInterval:
    point: float  # L_B - L_A
    lo: float
    hi: float
    level: float
    parts: dict[str, float]  # sds in loss units (this estimator's: bootstrap, noise, extrapolation); decades
    estimator: str = "separate"  # separate (this module) | paired | joint (scalelab.fitting.comparisons.paired_gap)

    @property
    def decided(self) -> bool:
        """The interval excludes 0: the data tell the arms apart at the target."""
        return self.lo > 0 or self.hi < 0

    def to_dict(self) -> dict:
        return dict(asdict(self), decided=self.decided)


def _paired_runs(bt: dict, sizes: dict[str, float]) -> dict[tuple[float, int], dict]:
    """Held-out runs of one protocol keyed by (budget, rank of the run's size within its budget)."""
    ranges = {round(math.log10(f["flops"]), 3): f["train_range"] for f in bt.get("folds", [])}
    by_budget: dict[float, list[dict]] = {}
    for r in bt.get("runs", []):
        rng = ranges.get(round(math.log10(r["flops"]), 3), bt.get("train_range"))
        if rng is not None and r["run_id"] in sizes:
            by_budget.setdefault(round(math.log10(r["flops"]), 3), []).append(dict(r, train_range=rng))
    out = {}
    for budget, runs in by_budget.items():
        for rank, r in enumerate(sorted(runs, key=lambda r: (sizes[r["run_id"]], r["run_id"]))):
            out[(budget, rank)] = r
    return out


def paired_extrapolation(
    backtests_a: dict[str, dict], backtests_b: dict[str, dict], sizes_a: dict[str, float], sizes_b: dict[str, float]
) -> ExtrapolationError:
    """k_gap (module docstring) from two arms' backtests ({protocol: BacktestResult.to_dict()}).

    Runs pair by protocol, budget and the rank of their size (`sizes_*`: run id -> N) within the
    budget: the same design point in both arms. A fold seen by two protocols counts once.
    per_decade is None when no pair extrapolates.
    """
    seen: dict[tuple, float] = {}
    folds: set[tuple] = set()
    dmax = 0.0
    for protocol, bt_a in backtests_a.items():
        bt_b = backtests_b.get(protocol) or {}
        runs_a, runs_b = _paired_runs(bt_a, sizes_a), _paired_runs(bt_b, sizes_b)
        for key in sorted(set(runs_a) & set(runs_b)):
            a, b = runs_a[key], runs_b[key]
            d = decades_outside(a["flops"], a["train_range"])
            if d <= 0.05:  # interpolation, as in scalelab.fitting.uncertainty.predictive.extrapolation_error
                continue
            miss = (b["predicted"] - b["observed"]) - (a["predicted"] - a["observed"])
            rel = miss / (0.5 * (a["observed"] + b["observed"]))
            fold = (round(a["train_range"][0], -3), round(a["train_range"][1], -3))
            seen[(fold, key)] = rel / d
            folds.add(fold)
            dmax = max(dmax, d)
    if not seen:
        return ExtrapolationError(per_decade=None, n_runs=0, n_folds=0, max_decades=0.0)
    ratios = np.array(list(seen.values()))
    return ExtrapolationError(
        per_decade=float(np.sqrt(np.mean(np.square(ratios)))), n_runs=ratios.size, n_folds=len(folds), max_decades=dmax
    )


def gap_interval(
    loss_a: float,
    loss_b: float,
    replicates_a: np.ndarray,
    replicates_b: np.ndarray,
    *,
    noise_a: float,
    noise_b: float,
    extrapolation: ExtrapolationError,
    decades: float,
    level: float = 0.95,
    fallback_ext: tuple[float, float] | None = None,
) -> GapInterval:
    """L_B - L_A with its interval (module docstring).

    Args:
        loss_a, loss_b: the arms' point predictions for their runs.
        replicates_a, replicates_b: the same predictions under paired bootstrap replicates (the
            i-th of each is one pair; nan where a replicate failed).
        noise_a, noise_b: the arms' run-to-run log-sds.
        extrapolation: paired_extrapolation's k_gap.
        decades: how far the target lies beyond the budgets the arms were fitted on.
        fallback_ext: (log-sd of A's extrapolation term, B's), used when k_gap is unmeasured.
    """
    z = float(stats.norm.ppf(0.5 + level / 2))
    ra, rb = np.asarray(replicates_a, dtype=float), np.asarray(replicates_b, dtype=float)
    k = min(ra.size, rb.size)
    diffs = rb[:k] - ra[:k]
    diffs = diffs[np.isfinite(diffs)]
    boot = 0.0
    if diffs.size >= 2:
        lo, hi = percentile_interval(diffs, level)
        boot = float(hi - lo) / (2 * z)
    noise = math.hypot(loss_a * noise_a, loss_b * noise_b)
    if extrapolation.per_decade is not None:
        scale = t_over_z(extrapolation.n_folds, level) * extrapolation.per_decade * max(decades, 0.0)
        ext = scale * 0.5 * (loss_a + loss_b)
    elif fallback_ext is not None and all(math.isfinite(x) for x in fallback_ext):
        ext = math.hypot(loss_a * fallback_ext[0], loss_b * fallback_ext[1])
    else:
        ext = math.nan
    sd = math.sqrt(sum(v * v for v in (boot, noise, ext) if math.isfinite(v)))
    point = float(loss_b - loss_a)
    return GapInterval(
        point=point,
        lo=point - z * sd,
        hi=point + z * sd,
        level=level,
        parts={"bootstrap": boot, "noise": noise, "extrapolation": ext, "decades": float(decades)},
    )
