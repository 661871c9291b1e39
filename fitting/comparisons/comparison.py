"""Is B better than A: the one comparison of two fitted laws, its result and its verdict in words.

    cmp = compare_laws_at(a_name, law_a, params_a, draws_a, b_name, law_b, params_b, draws_b,
                          budgets=[...], target=1e21, slope_grid=[...], largest=3e19, level=0.95)
    cmp.multiplier_at_target, cmp.target_interval, cmp.slope, cmp.slope_interval
    cmp.verdict = verdict(cmp)

`scalelab compare` (scalelab.analysis.compare: two sweeps, or one store split by a tag) and a
study (scalelab.sweeps.studies.study_fit: each arm against the baseline) both build a Comparison here:

- the compute multiplier of B over A, m(C) = C_A(L*_B(C)) / C (scalelab.fitting.comparisons.multiplier), at
  each budget and at the target, and its slope d ln m / d ln C, each with a percentile interval
  over the sides' paired bootstrap draws (draw i of A with draw i of B);
- for a study, the gap L_B - L_A at the decisive measurement (`gap`, by the estimator the verdict
  rests on: the paired gap model, scalelab.fitting.comparisons.paired_gap, or each arm's own law,
  scalelab.fitting.comparisons.gap), with the other views beside it;
- one verdict writer: the gap decides when there is one (a study), else the multiplier's interval
  (`scalelab compare`); then what the multiplier and its slope say.

PARTS and ESTIMATOR_TEXT name the gap estimators and their intervals' parts for every printer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scalelab.fitting.comparisons.gap import GapInterval
from scalelab.fitting.comparisons.multiplier import interval, log_slope, multiplier, paired_multipliers
from scalelab.fitting.forms.laws import Law

# what each part of a gap's interval is, per estimator (sds in loss units)
PARTS = {
    "paired": {
        "bootstrap": "the gap model's spread over the design-point bootstrap shared by both arms",
        "drift": "the gap model's out-of-sample drift per decade (its own backtests, the budget means' noise taken "
        "out) times the target's distance from the design's centroid",
        "scatter": "the decisive measurement's own spread (the size pattern over its sizes, pure error over its pairs)",
        "baseline": "the baseline's predicted loss the log ratio is converted at",
    },
    "joint": {
        "bootstrap": "the shared-exponent law's spread over the same design-point bootstrap",
        "drift": "that law's gap backtested the same way, times the decades to the target",
        "scatter": "the decisive measurement's own spread",
    },
    "separate": {
        "bootstrap": "the spread of the arms' own laws over their bootstrap replicates, paired by index",
        "noise": "the measured runs' noise over the measurement's pairs",
        "extrapolation": "the arms' laws' paired backtests per decade times the decades to the target",
    },
}
ESTIMATOR_TEXT = {
    "paired": "paired gap model",
    "joint": "shared-exponent law",
    "separate": "each arm's own law",
}
NAN2 = (math.nan, math.nan)


@dataclass(kw_only=True, slots=True)
class SideFit:
    """One side of `scalelab compare`: its law, parameters and bootstrap draws."""

    name: str
    law: str
    params: dict[str, float]
    draws: np.ndarray  # (n_boot, P) natural params
    n_runs: int
    flops_range: tuple[float, float]
    warnings: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class Comparison:
    """B (`arm`) against A (`baseline`): the multiplier, and for a study the decisive gap."""

    baseline: str
    arm: str
    level: float
    budgets: list[float]
    multipliers: list[float]  # m(C) of B over A at each budget
    intervals: list[tuple[float, float]]
    target_flops: float
    multiplier_at_target: float
    target_interval: tuple[float, float]
    slope: float  # d ln m / d ln C over the slope grid
    slope_interval: tuple[float, float]
    largest: float  # the largest budget the data reach (the verdict says how far the target is beyond it)
    draws_at_target: np.ndarray  # m at the target per pair of draws (plots)
    sides: tuple[SideFit, SideFit] | None = None  # `scalelab compare`: the two sides' fits
    # a study: the decisive measurement, each arm's predicted losses there, the gap by the verdict's
    # estimator and by each arm's own law, and the paired views (scalelab.sweeps.studies.study_paired)
    runs: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    losses: dict[str, list[Any]] = field(default_factory=dict)  # arm -> PredictionInterval per run
    gap: GapInterval | None = None
    separate_gap: GapInterval | None = None
    estimator: str = "paired"
    paired: Any = None  # scalelab.sweeps.studies.study_paired.PairedComparison
    verdict: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def a(self) -> SideFit | None:
        return None if self.sides is None else self.sides[0]

    @property
    def b(self) -> SideFit | None:
        return None if self.sides is None else self.sides[1]

    @property
    def winner(self) -> str:
        """The side predicted to reach the lower loss at the target (decided or not)."""
        if self.gap is not None:
            return self.arm if self.gap.point < 0 else self.baseline
        return self.arm if self.multiplier_at_target > 1 else self.baseline

    @property
    def decided(self) -> bool:
        if self.gap is not None:
            return self.gap.decided
        lo, hi = self.target_interval
        return not math.isnan(lo) and (lo > 1 or hi < 1)

    def mean_loss(self, arm: str) -> float:
        return float(np.mean([p.point for p in self.losses[arm]]))

    def to_dict(self) -> dict[str, Any]:
        scale = {
            "budgets": [
                {"flops": c, "multiplier": m, "interval": list(iv)}
                for c, m, iv in zip(self.budgets, self.multipliers, self.intervals)
            ],
            "target": {
                "flops": self.target_flops,
                "multiplier": self.multiplier_at_target,
                "interval": list(self.target_interval),
            },
            "slope": {"value": self.slope, "interval": list(self.slope_interval)},
        }
        if self.gap is None:  # `scalelab compare --json`
            sides = {k: _side_dict(s) for k, s in zip("ab", self.sides or ())}
            return {**sides, "level": self.level, **scale, "verdict": self.verdict}
        return {
            "baseline": self.baseline,
            "arm": self.arm,
            "level": self.level,
            "estimator": self.estimator,
            **scale,
            "runs": {a: [{"params": n, "tokens": d} for n, d in pts] for a, pts in self.runs.items()},
            "losses": {a: [p.to_dict() for p in ps] for a, ps in self.losses.items()},
            "gap": self.gap.to_dict(),
            "gap_parts": PARTS[self.estimator],  # what each part of the verdict's interval is
            "separate_gap": None if self.separate_gap is None else self.separate_gap.to_dict(),
            "paired": None if self.paired is None else self.paired.to_dict(),
            "winner": self.winner,
            "decided": self.decided,
            "verdict": self.verdict,
            "notes": self.notes,
        }


def _side_dict(s: SideFit) -> dict[str, Any]:
    return {
        "name": s.name,
        "law": s.law,
        "params": s.params,
        "n_runs": s.n_runs,
        "flops_range": list(s.flops_range),
        "warnings": s.warnings,
    }


def compare_laws_at(
    baseline: str,
    law_a: Law,
    params_a: dict[str, float],
    draws_a: Sequence[dict[str, float]],
    arm: str,
    law_b: Law,
    params_b: dict[str, float],
    draws_b: Sequence[dict[str, float]],
    *,
    budgets: Sequence[float],
    target: float,
    slope_grid: Sequence[float],
    largest: float,
    level: float,
    **evidence: Any,
) -> Comparison:
    """The Comparison of B's law with A's (module docstring): m at `budgets` and `target`, its slope
    over `slope_grid`, intervals over the paired draws (none without draws). `evidence`: the
    Comparison's other fields (a study's gap and runs, compare's sides). The verdict is left to
    `verdict`, which reads the whole result."""
    m = lambda c: multiplier(law_a, params_a, law_b, params_b, c)  # noqa: E731
    paired = paired_multipliers(law_a, draws_a, law_b, draws_b, budgets=budgets, target=target, slope_grid=slope_grid)
    k = paired.at_target.size
    return Comparison(
        baseline=baseline,
        arm=arm,
        level=level,
        budgets=[float(c) for c in budgets],
        multipliers=[float(m(c)) for c in budgets],
        intervals=[interval(paired.per_budget[:, j], level) for j in range(len(budgets))]
        if k
        else [NAN2] * len(budgets),
        target_flops=float(target),
        multiplier_at_target=float(m(target)),
        target_interval=interval(paired.at_target, level) if k else NAN2,
        slope=log_slope(np.asarray(slope_grid), np.array([m(c) for c in slope_grid])),
        slope_interval=interval(paired.slopes, level) if k else NAN2,
        largest=float(largest),
        draws_at_target=paired.at_target,
        **evidence,
    )


def target_interval(
    law_a: Law,
    draws_a: Sequence[dict[str, float]],
    law_b: Law,
    draws_b: Sequence[dict[str, float]],
    target: float,
    level: float,
) -> tuple[float, float]:
    """m(target)'s interval over the paired draws alone, as compare_laws_at computes it (a study's
    design scoring: how much a candidate run would narrow it)."""
    paired = paired_multipliers(law_a, draws_a, law_b, draws_b, budgets=[], target=target, slope_grid=[])
    return interval(paired.at_target, level)


def _iv(iv) -> str:
    return f"[{iv[0]:.3g}, {iv[1]:.3g}]"


def verdict(cmp: Comparison) -> str:
    """The comparison's answer in words: the gap's when there is one (a study's decisive
    measurement), else the multiplier's (`scalelab compare`); then what m and its slope say."""
    return _gap_verdict(cmp) if cmp.gap is not None else _multiplier_verdict(cmp)


def _gap_verdict(cmp: Comparison) -> str:
    pct = f"{100 * cmp.level:.0f}%"
    a, b, g = cmp.baseline, cmp.arm, cmp.gap
    where = f"at C = {cmp.target_flops:.3g} FLOPs ({cmp.target_flops / cmp.largest:.3g}x the largest budget)"
    rel = abs(g.point) / cmp.mean_loss(a)
    loser = a if cmp.winner == b else b
    by = f"by the {ESTIMATOR_TEXT[cmp.estimator]}"
    if cmp.paired is not None and cmp.estimator == "paired":
        by += f" ({cmp.paired.estimate.model} gap in log C, {cmp.paired.n_pairs} matched pairs)"
    if g.decided:
        head = (
            f"{cmp.winner} wins {where}: predicted loss {abs(g.point):.4f} below {loser}'s ({rel:.2%}) {by}; "
            f"{pct} interval of L_{b} - L_{a} [{g.lo:+.4f}, {g.hi:+.4f}] excludes 0."
        )
    else:
        head = (
            f"The data cannot tell {a} and {b} apart {where}: predicted L_{b} - L_{a} = {g.point:+.4f} {by}, "
            f"{pct} interval [{g.lo:+.4f}, {g.hi:+.4f}] contains 0 (leaning {cmp.winner})."
        )
    m, iv = cmp.multiplier_at_target, cmp.target_interval
    mult = f" Multiplier of {b} over {a} at the target: {m:.3g} {pct} {_iv(iv)}"
    if not math.isnan(iv[0]) and (iv[0] > 1 or iv[1] < 1):
        mult += " (excludes 1"
        mult += "; the frontiers differ, but the runs at the target may not show it)." if not g.decided else ")."
    else:
        mult += " (contains 1)."
    s, s_iv = cmp.slope, cmp.slope_interval
    if math.isnan(s_iv[0]):
        trend = ""
    elif s_iv[0] > 0 or s_iv[1] < 0:
        trend = f" It changes with scale: d ln m / d ln C = {s:.3f} {_iv(s_iv)} excludes 0."
    else:
        trend = f" No evidence that it changes with scale: slope {s:.3f} {_iv(s_iv)} contains 0."
    return head + mult + trend


def _multiplier_verdict(cmp: Comparison) -> str:
    pct = f"{100 * cmp.level:.0f}%"
    a, b, m, iv = cmp.baseline, cmp.arm, cmp.multiplier_at_target, cmp.target_interval
    extrap = cmp.target_flops / cmp.largest
    where = f"at C = {cmp.target_flops:.3g} FLOPs ({extrap:.3g}x the largest shared budget)"
    if math.isnan(iv[0]):
        head = f"{b} vs {a} {where}: multiplier {m:.3g} (no bootstrap, no interval: cannot decide)"
    elif iv[0] > 1:
        head = (
            f"The data support '{b} is better' {where}: {a} needs {m:.3g}x the compute to reach {b}'s loss "
            f"({pct} interval {_iv(iv)}, above 1)."
        )
    elif iv[1] < 1:
        head = (
            f"The data support '{a} is better' {where}: {a} needs only {m:.3g}x {b}'s compute "
            f"({pct} interval {_iv(iv)}, below 1)."
        )
    else:
        head = (
            f"The data do NOT support '{b} is better' {where}: multiplier {m:.3g}, {pct} interval {_iv(iv)} contains 1."
        )
    s, s_iv = cmp.slope, cmp.slope_interval
    if math.isnan(s_iv[0]):
        trend = ""
    elif s_iv[0] > 0 or s_iv[1] < 0:
        trend = (
            f" The multiplier changes with scale: d ln m / d ln C = {s:.3f} ({pct} interval "
            f"{_iv(s_iv)} excludes 0), so the advantage {'grows' if s > 0 else 'shrinks'} with compute."
        )
    else:
        trend = (
            f" No evidence that the multiplier changes with scale: slope {s:.3f}, {pct} interval "
            f"{_iv(s_iv)} contains 0."
        )
    caveat = " Intervals cover fit uncertainty only (bootstrap over runs), not a change of law beyond the data."
    return head + trend + (caveat if extrap > 1.5 else "")
