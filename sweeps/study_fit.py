"""A study's fit: every arm fitted the loop's way, and each arm against the baseline at the target.

    sf = fit_study("results/studies/study-arch")
    sf.arms["gelu"].fit.gates.passed          # each arm: the loop's fit (bootstrap, backtests, gates)
    cmp = sf.comparisons[0]                     # the first non-baseline arm against the baseline
    cmp.multipliers, cmp.intervals              # m(C) of the arm over the baseline at every budget
    cmp.multiplier_at_target, cmp.target_interval, cmp.slope, cmp.slope_interval
    cmp.gap.point, cmp.gap.lo, cmp.gap.hi       # L_arm - L_baseline at the target, 95% interval
    cmp.winner, cmp.decided, cmp.verdict

Each arm's runs (the store's runs labelled `arm: NAME`, done) are fitted through the one fit entry
with the spec's `fit:` options, exactly as `sweep next` fits a sweep (scalelab.sweeps.store_fit:
Huber on log loss, bootstrap over runs, hold-out and leave-one-budget-out backtests, the
identification gates at the study's target), arm i with bootstrap seed `seed + i` (independent
resamples of independent runs). The comparison of an arm B with the baseline A:

- the compute multiplier m(C) = C_A(L*_B(C)) / C at every budget of the design and at the target,
  and its slope d ln m / d ln C over the design's range, with percentile intervals over paired
  bootstrap replicates (scalelab.fitting.multiplier; the same arithmetic as `scalelab compare`);
- the predicted gap L_B - L_A between the two runs that decide the study: each arm's
  compute-optimal run at the target (or the runs given), each predicted by its arm's fit with the
  loop's three-part interval, their difference with an interval of bootstrap, run noise and the
  gap's own out-of-sample error measured by the arms' paired backtests (scalelab.fitting.gap);
- a verdict: the predicted winner when the gap's interval excludes 0, else "cannot tell" (naming
  the side it leans to), with what m and its slope say.

`max_budget` fits each arm on the runs of budgets up to it only: the law-based prediction a study
would have made from less compute (scalelab.analysis.decision_accuracy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from scalelab import store
from scalelab.config_tree import from_dict
from scalelab.errors import UsageError
from scalelab.fitting.fit_options import FitOptions
from scalelab.fitting.gap import GapInterval, gap_interval, paired_extrapolation
from scalelab.fitting.multiplier import interval, log_slope, multiplier, paired_multipliers
from scalelab.fitting.predictive import PredictionInterval
from scalelab.fitting.scaling_fit import ScalingFit
from scalelab.sweeps.spec import FitSpec, read_spec
from scalelab.sweeps.store_fit import MIN_LOOP_RUNS, fit_options, fit_store
from scalelab.sweeps.study_spec import StudySpec, parse_study

GENERATORS = ("grid", "isoflop", "ladder", "random", "points")


@dataclass(kw_only=True)
class ArmFit:
    name: str
    fit: ScalingFit
    warnings: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.fit.gates is not None and self.fit.gates.passed

    @property
    def n_runs(self) -> int:
        return int(self.fit.loss.size)


@dataclass(kw_only=True)
class ArmComparison:
    """Arm `arm` (B) against the baseline (A)."""

    baseline: str
    arm: str
    level: float
    budgets: list[float]
    multipliers: list[float]  # m(C) of B over A at each budget
    intervals: list[tuple[float, float]]
    target_flops: float
    multiplier_at_target: float
    target_interval: tuple[float, float]
    slope: float  # d ln m / d ln C over the design's budgets
    slope_interval: tuple[float, float]
    runs: dict[str, tuple[float, float]]  # arm -> (N, D) of its run at the target
    losses: dict[str, PredictionInterval]  # arm -> that run's predicted loss
    gap: GapInterval  # L_B - L_A
    verdict: str = ""

    @property
    def winner(self) -> str:
        """The arm predicted to reach the lower loss at the target (decided or not)."""
        return self.arm if self.gap.point < 0 else self.baseline

    @property
    def decided(self) -> bool:
        return self.gap.decided

    def to_dict(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline,
            "arm": self.arm,
            "level": self.level,
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
            "runs": {a: {"params": n, "tokens": d} for a, (n, d) in self.runs.items()},
            "losses": {a: p.to_dict() for a, p in self.losses.items()},
            "gap": self.gap.to_dict(),
            "winner": self.winner,
            "decided": self.decided,
            "verdict": self.verdict,
        }


@dataclass(kw_only=True)
class StudyFit:
    sweep_dir: Path
    study: StudySpec
    options: FitOptions
    arms: dict[str, ArmFit]
    comparisons: list[ArmComparison]
    warnings: list[str] = field(default_factory=list)

    def comparison(self, arm: str) -> ArmComparison:
        for c in self.comparisons:
            if c.arm == arm:
                return c
        raise UsageError(f"arm {arm!r} is not compared (arms: {self.study.others})")

    def to_dict(self) -> dict[str, Any]:
        arms = {}
        for name, a in self.arms.items():
            rec = a.fit.to_record()
            arms[name] = {
                "law": rec["law"],
                "params": rec["params"],
                "intervals": rec["intervals"],
                "n_runs": a.n_runs,
                "gates": rec["gates"],
                "backtest": {
                    k: {kk: v.get(kk) for kk in ("mare", "bias", "n_test")} for k, v in rec["backtest"].items()
                },
                "extrapolation": rec["extrapolation"],
                "residual_scale": rec["residual_scale"],
                "warnings": a.warnings,
            }
        return {
            "study": {
                "arms": self.study.arms,
                "baseline": self.study.baseline,
                "target_flops": self.study.target_flops,
            },
            "arms": arms,
            "comparisons": [c.to_dict() for c in self.comparisons],
            "warnings": self.warnings,
        }


def read_study(sweep_dir: str | Path) -> tuple[dict[str, Any], StudySpec]:
    """(the spec, its study section checked) of a study's sweep directory."""
    sweep_dir = Path(sweep_dir)
    if not store.is_sweep_dir(sweep_dir):
        raise UsageError(f"{sweep_dir} is not a sweep directory (no sweep.yaml)")
    raw = read_spec(sweep_dir / "sweep.yaml")
    if raw.get("study") is None:
        raise UsageError(f"{sweep_dir} is not a study (its sweep.yaml has no study: section)")
    gen = next(g for g in GENERATORS if g in raw)
    budgets = [float(b) for b in (raw.get("isoflop") or {}).get("budgets", [])] if gen == "isoflop" else []
    return raw, parse_study(raw["study"], raw, gen, budgets)


def arm_runs(runs: pl.DataFrame, arm: str, max_budget: float | None = None) -> pl.DataFrame:
    """The store's runs of one arm (label `arm`), of budgets up to `max_budget` when given."""
    if "arm" not in runs.columns:
        return runs.clear()
    out = runs.filter(pl.col("arm") == arm)
    if max_budget is not None and "flops_budget" in out.columns:
        out = out.filter(pl.col("flops_budget") <= max_budget * (1 + 1e-9))
    return out


def fit_study(
    sweep_dir: str | Path,
    *,
    replicates: int | None = None,
    seed: int = 0,
    runs: pl.DataFrame | None = None,
    max_budget: float | None = None,
    at: dict[str, tuple[float, float]] | None = None,
) -> StudyFit:
    """Fit every arm of a study and compare each with the baseline (module docstring).

    Args:
        replicates: bootstrap replicates per arm (default: the spec's fit.bootstrap).
        runs: the store's runs table (default: load it).
        max_budget: fit on the runs of budgets up to this only.
        at: arm -> (N, D) of the runs whose gap is predicted (default: each arm's N*(C*), D*(C*)).
    Raises:
        UsageError: not a study, or an arm with too few done runs for the loop's fit.
    """
    sweep_dir = Path(sweep_dir)
    raw, study = read_study(sweep_dir)
    fit_spec = from_dict(FitSpec, raw.get("fit") or {}, prefix="fit")
    runs = store.load_runs(sweep_dir) if runs is None else runs
    arms: dict[str, ArmFit] = {}
    options = None
    for i, name in enumerate(study.names):
        options = fit_options(fit_spec, bootstrap=replicates, seed=seed + i, target_flops=study.target_flops)
        sub = arm_runs(runs, name, max_budget)
        if sub.is_empty():
            raise UsageError(
                f"{sweep_dir}: arm {name!r} has no runs" + (f" up to {max_budget:.3g}" if max_budget else "")
            )
        fit, warnings = fit_store(sweep_dir, options, runs=sub, min_runs=MIN_LOOP_RUNS)
        arms[name] = ArmFit(name=name, fit=fit, warnings=warnings)
    base = arms[study.baseline]
    comparisons = [compare_arms(base, arms[b], study.target_flops, at=at) for b in study.others]
    return StudyFit(
        sweep_dir=sweep_dir,
        study=study,
        options=options,
        arms=arms,
        comparisons=comparisons,
        warnings=[f"{n}: {w}" for n, a in arms.items() for w in a.warnings],
    )


def design_budgets(fit: ScalingFit) -> list[float]:
    """The distinct FLOP budgets a fit's runs were designed for, ascending."""
    out: list[float] = []
    for c in sorted(float(x) for x in fit.budgets):
        if not out or c > out[-1] * 1.05:
            out.append(c)
    return out


def compare_arms(
    a: ArmFit, b: ArmFit, target: float, *, at: dict[str, tuple[float, float]] | None = None
) -> ArmComparison:
    """Arm B against the baseline A (module docstring): m(C) with intervals, the gap at the target."""
    fa, fb = a.fit, b.fit
    level = fa.level
    budgets = sorted(set(design_budgets(fa)) & set(design_budgets(fb))) or design_budgets(fa)
    slope_grid = np.geomspace(min(budgets), max(budgets), 5) if len(budgets) > 1 else np.array(budgets)
    law_a, law_b = fa.law_object, fb.law_object
    m_point = [multiplier(law_a, fa.params, law_b, fb.params, c) for c in budgets]
    m_target = multiplier(law_a, fa.params, law_b, fb.params, target)
    slope = log_slope(slope_grid, np.array([multiplier(law_a, fa.params, law_b, fb.params, c) for c in slope_grid]))
    paired = paired_multipliers(law_a, fa.draws, law_b, fb.draws, budgets=budgets, target=target, slope_grid=slope_grid)
    k = paired.at_target.size
    nan2 = (math.nan, math.nan)
    intervals = [interval(paired.per_budget[:, j], level) for j in range(len(budgets))] if k else [nan2] * len(budgets)

    runs = {}
    for arm in (a, b):
        n, d = (at or {}).get(arm.name) or arm.fit.optimum(target)[:2]
        runs[arm.name] = (float(n), float(d))
    losses = {arm.name: arm.fit.predict_interval(*runs[arm.name], flops=target) for arm in (a, b)}
    reps = {arm.name: np.array([float(arm.fit.predict(*runs[arm.name], p)) for p in arm.fit.draws]) for arm in (a, b)}
    sizes = lambda f: dict(zip(f.run_ids, f.n.tolist()))  # noqa: E731
    gap = gap_interval(
        losses[a.name].point,
        losses[b.name].point,
        reps[a.name],
        reps[b.name],
        noise_a=fa.residual_scale,
        noise_b=fb.residual_scale,
        extrapolation=paired_extrapolation(fa.backtest, fb.backtest, sizes(fa), sizes(fb)),
        decades=max(fa.decades(target), fb.decades(target)),
        level=level,
        fallback_ext=(losses[a.name].parts["extrapolation"], losses[b.name].parts["extrapolation"]),
    )
    cmp = ArmComparison(
        baseline=a.name,
        arm=b.name,
        level=level,
        budgets=budgets,
        multipliers=m_point,
        intervals=intervals,
        target_flops=float(target),
        multiplier_at_target=float(m_target),
        target_interval=interval(paired.at_target, level) if k else nan2,
        slope=slope,
        slope_interval=interval(paired.slopes, level) if k else nan2,
        runs=runs,
        losses=losses,
        gap=gap,
    )
    cmp.verdict = verdict(cmp, largest=max(budgets))
    return cmp


def _iv(iv) -> str:
    return f"[{iv[0]:.3g}, {iv[1]:.3g}]"


def verdict(cmp: ArmComparison, *, largest: float) -> str:
    """The study's answer for one arm, in words (module docstring)."""
    pct = f"{100 * cmp.level:.0f}%"
    a, b, g = cmp.baseline, cmp.arm, cmp.gap
    where = f"at C = {cmp.target_flops:.3g} FLOPs ({cmp.target_flops / largest:.3g}x the largest budget)"
    rel = abs(g.point) / cmp.losses[a].point
    loser = a if cmp.winner == b else b
    if g.decided:
        head = (
            f"{cmp.winner} wins {where}: predicted loss {abs(g.point):.4f} below {loser}'s ({rel:.2%}); "
            f"{pct} interval of L_{b} - L_{a} [{g.lo:+.4f}, {g.hi:+.4f}] excludes 0."
        )
    else:
        head = (
            f"The data cannot tell {a} and {b} apart {where}: predicted L_{b} - L_{a} = {g.point:+.4f}, {pct} "
            f"interval [{g.lo:+.4f}, {g.hi:+.4f}] contains 0 (leaning {cmp.winner})."
        )
    m, iv = cmp.multiplier_at_target, cmp.target_interval
    mult = f" Multiplier of {b} over {a} at the target: {m:.3g} {pct} {_iv(iv)}"
    if not math.isnan(iv[0]) and (iv[0] > 1 or iv[1] < 1):
        mult += " (excludes 1"
        mult += "; the frontiers differ, but two runs at the target may not show it)." if not g.decided else ")."
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


def format_study(sf: StudyFit) -> str:
    """Per arm: its fit and gates; per comparison: m(C), the gap at the target, the verdict."""
    pct = f"{100 * sf.options.level:.0f}%"
    lines = [f"study {sf.sweep_dir.name}: baseline {sf.study.baseline}, target {sf.study.target_flops:.3g} FLOPs"]
    lines.append(f"  {'arm':12} {'runs':>4} {'gates':24} parameters ({pct} interval)")
    for name, a in sf.arms.items():
        f = a.fit
        gates = "pass" if a.passed else "FAIL: " + ",".join(f.gates.failed if f.gates else ["none"])
        params = ", ".join(f"{k}={v:.4g} {_iv(f.intervals[k])}" for k, v in f.params.items() if k in f.intervals)
        lines.append(f"  {name:12} {a.n_runs:>4} {gates:24} {params}")
    for c in sf.comparisons:
        lines.append(f"{c.arm} over {c.baseline}: multiplier m(C) = C_{c.baseline}(L*_{c.arm}(C)) / C")
        lines.append(f"  {'budget (FLOPs)':>16} {'m':>8} {pct + ' interval':>22}")
        for budget, m, iv in zip(c.budgets, c.multipliers, c.intervals):
            if budget != c.target_flops:  # once the target's runs are in, its row is the one below
                lines.append(f"  {budget:>16.3g} {m:>8.3f} {_iv(iv):>22}")
        lines.append(f"  {c.target_flops:>16.3g} {c.multiplier_at_target:>8.3f} {_iv(c.target_interval):>22}  (target)")
        lines.append(f"  slope d ln m / d ln C: {c.slope:.4f} {_iv(c.slope_interval)}")
        for arm, (n, d) in c.runs.items():
            p = c.losses[arm]
            lines.append(
                f"  {arm:12} at the target: N={n:,.0f}, D={d:,.0f}: predicted loss {p.point:.4f} "
                f"[{p.lo:.4f}, {p.hi:.4f}]"
            )
        g = c.gap
        lines.append(
            f"  gap L_{c.arm} - L_{c.baseline}: {g.point:+.4f} [{g.lo:+.4f}, {g.hi:+.4f}] (sds: bootstrap "
            f"{g.parts['bootstrap']:.4f}, noise {g.parts['noise']:.4f}, extrapolation {g.parts['extrapolation']:.4f} "
            f"at {g.parts['decades']:.2f} decades)"
        )
        lines.append("  " + c.verdict)
    lines += [f"warning: {w}" for w in sf.warnings]
    return "\n".join(lines)
