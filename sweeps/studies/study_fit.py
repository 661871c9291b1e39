"""A study's fit: every arm fitted the loop's way, and each arm against the baseline at the target.

    sf = fit_study("results/studies/study-arch")          # or s3://bucket/studies/study-arch
    sf.arms["gelu"].fit.gates.passed          # each arm: the loop's fit (bootstrap, backtests, gates)
    cmp = sf.comparisons[0]                     # the first non-baseline arm against the baseline
    cmp.gap.point, cmp.gap.lo, cmp.gap.hi       # L_arm - L_baseline at the decisive measurement, 95% interval
    cmp.estimator, cmp.gap.parts                # which estimator the verdict rests on; its interval's parts
    cmp.paired.frontier, cmp.paired.joint_matched, cmp.separate_gap   # the other views
    cmp.multipliers, cmp.intervals, cmp.multiplier_at_target, cmp.slope
    cmp.winner, cmp.decided, cmp.verdict

Each arm's runs (the store's runs labelled `arm: NAME`, done) are fitted through the one fit entry
with the spec's `fit:` options, exactly as `sweep next` fits a sweep (scalelab.sweeps.closed_loop.store_fit:
Huber on log loss, bootstrap over runs, hold-out and leave-one-budget-out backtests, the
identification gates at the study's target). Every arm draws its bootstrap with the same seed from
its runs in design order (budget, size, seed), so where the arms' runs are the same design points,
replicate i of each resamples the same points. The comparison of an arm B with the baseline A is made
at the study's matched decisive measurement (scalelab.sweeps.studies.study_decisive: both arms at the same
sizes around N* and the same seeds at the target; the runs as resolved once a round is proposed):

- the gap L_B - L_A there, by the study's estimator (`study.estimator`, or `estimator=`):
  `paired` (the default): the arms' log loss ratio at matched design points modelled directly, with
  the shared-exponent law as a second view, one bootstrap over design points shared by both
  (scalelab.sweeps.studies.study_paired); `separate`: each arm's own law, their difference with an interval
  of bootstrap, run noise and the arms' paired backtests (scalelab.fitting.comparisons.gap). Both are computed;
  the verdict rests on the one asked for (the paired one needs MIN_PAIRS matched design points, else
  the separate one, with a warning);
- the compute multiplier m(C) = C_A(L*_B(C)) / C at every budget of the design and at the target,
  and its slope d ln m / d ln C, with percentile intervals over the arms' paired replicates;
- a verdict: the predicted winner when the gap's interval excludes 0, else "cannot tell" (naming
  the side it leans to), with what m and its slope say.

Each comparison is a scalelab.fitting.comparisons.comparison.Comparison, the one result and verdict writer that
`scalelab compare` uses too (m(C), its slope and their intervals computed there, once).

`max_budget` fits each arm on the runs of budgets up to it only: the prediction a study would have
made from less compute (scalelab.analysis.decision_accuracy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from scalelab import store
from scalelab.errors import UsageError
from scalelab.fitting.comparisons.comparison import Comparison, compare_laws_at, verdict
from scalelab.fitting.comparisons.gap import GapInterval, gap_interval, paired_extrapolation
from scalelab.fitting.comparisons.paired_gap import Measurement
from scalelab.fitting.entry.fit_options import FitOptions, fit_options
from scalelab.fitting.entry.scaling_fit import ScalingFit
from scalelab.store.paths import SweepLayout
from scalelab.sweeps.closed_loop.propose import readable
from scalelab.sweeps.closed_loop.store_fit import MIN_LOOP_RUNS, fit_store
from scalelab.sweeps.specs.spec import read_spec, spec_budgets, spec_generator
from scalelab.sweeps.studies.study_decisive import decisive_points, planned_runs
from scalelab.sweeps.studies.study_paired import compare_paired
from scalelab.sweeps.studies.study_spec import ARM_LABEL, ESTIMATORS, StudySpec, parse_study

DESIGN_ORDER = ("flops_budget", "size_index", "target_params", "seed", "params", "run_id")


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
class StudyFit:
    sweep_dir: Path
    study: StudySpec
    options: FitOptions
    arms: dict[str, ArmFit]
    comparisons: list[Comparison]  # each arm against the baseline (scalelab.fitting.comparisons.comparison)
    estimator: str = "paired"
    warnings: list[str] = field(default_factory=list)
    setting: PairedSetting | None = None  # how the comparisons were made (to make them again at other runs)

    def comparison(self, arm: str) -> Comparison:
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
                "estimator": self.estimator,
                "decisive": {"sizes": self.study.decisive_sizes, "seeds": self.study.decisive_seeds},
            },
            "arms": arms,
            "comparisons": [c.to_dict() for c in self.comparisons],
            "warnings": self.warnings,
        }


def read_study(sweep_dir: str | Path) -> tuple[dict[str, Any], StudySpec]:
    """(the spec, its study section checked) of a study's sweep directory (local: see `readable`)."""
    sweep_dir = Path(sweep_dir)
    if not store.is_sweep_dir(sweep_dir):
        raise UsageError(f"{sweep_dir} is not a sweep directory (no sweep.yaml)")
    raw = read_spec(SweepLayout(sweep_dir).spec)
    if raw.get("study") is None:
        raise UsageError(f"{sweep_dir} is not a study (its sweep.yaml has no study: section)")
    gen = spec_generator(raw)
    return raw, parse_study(
        raw["study"], raw, gen, spec_budgets(raw, gen), fit_options(raw.get("fit") or {}).target_flops
    )


def arm_runs(runs: pl.DataFrame, arm: str, max_budget: float | None = None) -> pl.DataFrame:
    """The store's runs of one arm (label `arm`), of budgets up to `max_budget` when given, in design
    order (budget, size, seed: two arms' runs at the same design points line up row by row)."""
    if ARM_LABEL not in runs.columns:
        return runs.clear()
    out = runs.filter(pl.col(ARM_LABEL) == arm)
    if max_budget is not None and "flops_budget" in out.columns:
        out = out.filter(pl.col("flops_budget") <= max_budget * (1 + 1e-9))
    return out.sort([c for c in DESIGN_ORDER if c in out.columns], nulls_last=True)


def up_to(runs: pl.DataFrame, max_budget: float | None) -> pl.DataFrame:
    """The runs of budgets up to `max_budget` (all when None)."""
    if max_budget is None or "flops_budget" not in runs.columns:
        return runs
    return runs.filter(pl.col("flops_budget") <= max_budget * (1 + 1e-9))


@dataclass(kw_only=True)
class PairedSetting:
    """What the paired comparison needs beyond the two fits: the runs, the estimator, its bootstrap."""

    runs: pl.DataFrame
    estimator: str = "paired"
    replicates: int = 0
    seed: int = 0
    sizes: int = 1  # distinct sizes of the decisive measurement
    joint: bool = True


def fit_study(
    sweep_dir: str | Path,
    *,
    replicates: int | None = None,
    seed: int = 0,
    runs: pl.DataFrame | None = None,
    max_budget: float | None = None,
    at: dict[str, list[tuple[float, float]]] | None = None,
    estimator: str | None = None,
    paired_replicates: int | None = None,
    joint: bool = True,
) -> StudyFit:
    """Fit every arm of a study and compare each with the baseline (module docstring).

    Args:
        sweep_dir: the study's sweep directory, or an s3:// URL (read through a local copy).
        replicates: bootstrap replicates per arm (default: the spec's fit.bootstrap).
        runs: the store's runs table (default: load it).
        max_budget: fit on the runs of budgets up to this only.
        at: arm -> the decisive measurement's (N, D), aligned pair by pair (default: the planned
            measurement around the baseline's N*(C*), scalelab.sweeps.studies.study_decisive).
        estimator: the verdict's estimator (default: the spec's study.estimator).
        paired_replicates: replicates of the shared design-point bootstrap (default: `replicates`,
            else the spec's fit.bootstrap).
        joint: also fit the paired comparison's joint law (its second view).
    Raises:
        UsageError: not a study, an unknown estimator, or an arm with too few done runs.
    """
    sweep_dir = readable(sweep_dir)
    raw, study = read_study(sweep_dir)
    estimator = estimator or study.estimator
    if estimator not in ESTIMATORS:
        raise UsageError(f"--estimator {estimator!r}: use one of {list(ESTIMATORS)}")
    runs = store.load_runs(sweep_dir) if runs is None else runs
    options = fit_options(raw.get("fit") or {}, bootstrap=replicates, seed=seed, target_flops=study.target_flops)
    arms: dict[str, ArmFit] = {}
    for name in study.names:
        sub = arm_runs(runs, name, max_budget)
        if sub.is_empty():
            raise UsageError(
                f"{sweep_dir}: arm {name!r} has no runs" + (f" up to {max_budget:.3g}" if max_budget else "")
            )
        fit, warnings = fit_store(sweep_dir, options, runs=sub, min_runs=MIN_LOOP_RUNS)
        arms[name] = ArmFit(name=name, fit=fit, warnings=warnings)
    base = arms[study.baseline]
    if at is None:
        planned = planned_runs(decisive_points(base.fit.optimum(study.target_flops)[0], study, raw), study.target_flops)
        at = {name: planned for name in study.names}
    setting = PairedSetting(
        runs=up_to(runs, max_budget),
        estimator=estimator,
        replicates=options.bootstrap if paired_replicates is None else paired_replicates,
        seed=seed,
        sizes=study.decisive_sizes,
        joint=joint,
    )
    comparisons = [compare_arms(base, arms[b], study.target_flops, at=at, setting=setting) for b in study.others]
    return StudyFit(
        sweep_dir=sweep_dir,
        study=study,
        options=options,
        arms=arms,
        comparisons=comparisons,
        estimator=estimator,
        setting=setting,
        warnings=[f"{n}: {w}" for n, a in arms.items() for w in a.warnings]
        + [f"{c.arm}: {n}" for c in comparisons for n in c.notes],
    )


def design_budgets(fit: ScalingFit) -> list[float]:
    """The distinct FLOP budgets a fit's runs were designed for, ascending."""
    out: list[float] = []
    for c in sorted(float(x) for x in fit.budgets):
        if not out or c > out[-1] * 1.05:
            out.append(c)
    return out


def separate_gap(a: ArmFit, b: ArmFit, target: float, at: dict[str, list[tuple[float, float]]]) -> GapInterval:
    """L_B - L_A averaged over the decisive measurement's pairs, each arm by its own law, with the
    interval of scalelab.fitting.comparisons.gap (run noise over the pairs: a mean of `pairs` runs)."""
    fa, fb = a.fit, b.fit
    pairs = len(at[a.name])
    mean_pred = lambda f, pts, p=None: float(np.mean([f.predict(n, d, p) for n, d in pts]))  # noqa: E731
    reps = {arm.name: np.array([mean_pred(arm.fit, at[arm.name], p) for p in arm.fit.draws]) for arm in (a, b)}
    sizes = lambda f: dict(zip(f.run_ids, f.n.tolist()))  # noqa: E731
    mid = len(at[a.name]) // 2
    ext = (fa.predict_interval(*at[a.name][mid], flops=target), fb.predict_interval(*at[b.name][mid], flops=target))
    return gap_interval(
        mean_pred(fa, at[a.name]),
        mean_pred(fb, at[b.name]),
        reps[a.name],
        reps[b.name],
        noise_a=fa.residual_scale / math.sqrt(pairs),
        noise_b=fb.residual_scale / math.sqrt(pairs),
        extrapolation=paired_extrapolation(fa.backtest, fb.backtest, sizes(fa), sizes(fb)),
        decades=max(fa.decades(target), fb.decades(target)),
        level=fa.level,
        fallback_ext=(ext[0].parts["extrapolation"], ext[1].parts["extrapolation"]),
    )


def compare_arms(
    a: ArmFit, b: ArmFit, target: float, *, at: dict[str, list[tuple[float, float]]], setting: PairedSetting
) -> Comparison:
    """Arm B against the baseline A (module docstring): the gap at the decisive measurement by both
    estimators, m(C) with intervals, the verdict."""
    fa, fb = a.fit, b.fit
    budgets = sorted(set(design_budgets(fa)) & set(design_budgets(fb))) or design_budgets(fa)
    points = {arm.name: [(float(n), float(d)) for n, d in at[arm.name]] for arm in (a, b)}
    losses = {arm.name: [arm.fit.predict_interval(n, d, flops=target) for n, d in points[arm.name]] for arm in (a, b)}
    separate = separate_gap(a, b, target, points)
    paired, notes = None, []
    try:
        paired = compare_paired(
            setting.runs,
            a.name,
            b.name,
            fits=(fa, fb),
            target=target,
            points=points,
            measurement=Measurement(sizes=min(setting.sizes, len(points[a.name])), pairs=len(points[a.name])),
            loss=fa.options.loss,
            replicates=setting.replicates,
            seed=setting.seed,
            level=fa.level,
            joint=setting.joint,
        )
        notes += paired.notes
    except UsageError as e:
        notes.append(f"no paired estimate ({e})")
    use_paired = setting.estimator == "paired" and paired is not None
    if setting.estimator == "paired" and paired is None:
        notes.append("the verdict rests on the separate estimator")
    slope_grid = np.geomspace(min(budgets), max(budgets), 5) if len(budgets) > 1 else np.array(budgets)
    cmp = compare_laws_at(
        a.name,
        fa.law_object,
        fa.params,
        fa.draws,
        b.name,
        fb.law_object,
        fb.params,
        fb.draws,
        budgets=budgets,
        target=target,
        slope_grid=slope_grid,
        largest=max(budgets),
        level=fa.level,
        runs=points,
        losses=losses,
        gap=paired.matched if use_paired else separate,
        separate_gap=separate,
        estimator="paired" if use_paired else "separate",
        paired=paired,
        notes=notes,
    )
    cmp.verdict = verdict(cmp)
    return cmp
