"""The fit entry's branches that are not one parametric law (scalelab.fitting.entry.fit_runs.fit_runs).

- Chinchilla Approaches 1 and 2 (scalelab.fitting.estimate.approaches): params n_coef, n_exponent, d_coef,
  d_exponent of N*(C) = n_coef C^n_exponent and D*(C) = d_coef C^d_exponent, with OLS intervals;
  their samples are draws from the OLS sampling distribution of the N* line. The backtest predicts
  N* at the largest located budgets from the approach run on the smaller-compute runs.
- A curve law, or the average of the candidates, chosen by law "auto" (scalelab.fitting.selection.select):
  fitted on the runs' loss curves (scalelab.fitting.loss_curves.curves), its backtest the selection's.
"""

from __future__ import annotations

import numpy as np

from scalelab.errors import UsageError
from scalelab.fitting.entry.fit_options import FitOptions
from scalelab.fitting.entry.scaling_fit import ScalingFit
from scalelab.fitting.estimate import approaches as appr
from scalelab.fitting.estimate.io import RunTable
from scalelab.fitting.loss_curves.curves import RunCurve, fit_curves
from scalelab.fitting.selection.select import Selection, calibration_factor, select_law
from scalelab.fitting.uncertainty.backtest import BacktestResult, holdout_mask

APPROACH_SAMPLES = 2000  # parametric draws of the N* line saved for Approaches 1/2


def _run_approach(approach: int, table: RunTable, level: float, shape: str = "parabola"):
    kw = dict(params=table.params, tokens=table.tokens, loss=table.loss, flops=table.flops, level=level)
    if approach == 1:
        return appr.approach1(**kw)
    return appr.approach2(**kw, budget_labels=None if table.group is None else table.group, shape=shape)


def fit_approach(table: RunTable, options: FitOptions) -> ScalingFit:
    """Approach 1 or 2 of `table` (module docstring)."""
    approach = options.approach
    res = _run_approach(approach, table, options.level, options.isoflop_shape)
    params = {
        "n_coef": res.n_opt.coef,
        "n_exponent": res.n_opt.exponent,
        "d_coef": res.d_opt.coef,
        "d_exponent": res.d_opt.exponent,
    }
    intervals = {
        "n_coef": list(res.n_opt.coef_interval),
        "n_exponent": list(res.n_opt.exponent_interval),
        "d_coef": list(res.d_opt.coef_interval),
        "d_exponent": list(res.d_opt.exponent_interval),
    }
    c_max = max(m.flops for m in res.minima if m.used)
    draws = res.n_opt.sample(APPROACH_SAMPLES, seed=options.seed)
    out = ScalingFit(
        options=options,
        table=table,
        law=f"approach{approach}",
        approach=approach,
        params=params,
        intervals={k: [float(v[0]), float(v[1])] for k, v in intervals.items()},
        objective=res.n_opt.rss,
        n_points=res.n_opt.n_points,
        derived={"tokens_per_param_at_max_budget": res.tokens_per_param(c_max), "max_budget_flops": c_max},
        warnings=list(res.warnings),
        samples={"n_coef": [d[0] for d in draws], "n_exponent": [d[1] for d in draws]} if draws else {},
        interval_method="OLS on the located minima",
        extra={"minima": res.to_dict()["minima"]},
    )
    if options.backtest:
        try:
            out.backtest = {"holdout": _approach_backtest(approach, table, res, options)}
        except UsageError as e:
            out.warnings.append(f"holdout backtest skipped: {e}")
    return out


def _approach_backtest(approach: int, table: RunTable, full, options: FitOptions) -> dict:
    """Predict N* at the largest measured budgets from an approach run on the smaller-compute runs."""
    used = [m for m in full.minima if m.used]
    c = np.array([m.flops for m in used])
    held = holdout_mask(c, options.holdout_frac)
    if held.all():
        raise UsageError("every located budget would be held out")
    cut = c[held].min() / (1.0 + appr.BUDGET_REL_TOL)
    train = _run_approach(approach, table.subset(table.flops < cut), options.level, options.isoflop_shape)
    obs = np.array([m.n_opt for m, h in zip(used, held) if h])
    pred = train.n_opt(c[held])
    rel = (pred - obs) / obs
    train_c = [m.flops for m in train.minima if m.used]
    return BacktestResult(
        protocol="holdout_n_opt",
        run_id=[f"C={x:.3g}" for x in c[held]],
        flops=c[held],
        observed=obs,
        predicted=pred,
        rel_error=rel,
        mare=float(np.mean(np.abs(rel))),
        bias=float(np.mean(rel)),
        n_train=len(train_c),
        n_test=int(held.sum()),
        train_range=np.array([[min(train_c), max(train_c)]] * int(held.sum())),
        extrapolation_decades=float(np.log10(c[held].max() / max(train_c))),
    ).to_dict()


def fit_curve_choice(table: RunTable, curves: list[RunCurve], sel: Selection, options: FitOptions) -> ScalingFit:
    """The curve law `sel` chose, or the average of its candidates, fitted on every run's curve."""
    chosen = sel.chosen
    if chosen == "average":
        full = select_law(
            table, curves, holdout_frac=options.holdout_frac, candidates=[c.name for c in sel.ranking()], incumbent=None
        )
        members, calibration = full.fits, full.calibration
    else:
        cf = fit_curves(curves, chosen)
        members, calibration = {chosen: cf}, {chosen: calibration_factor(cf, table, curves)}
    cand = sel.candidates[chosen]
    first = next(iter(members.values()))
    return ScalingFit(
        options=options,
        table=table,
        law=chosen,
        approach=3,
        params=dict(first.params) if chosen != "average" else {},
        intervals={},
        objective=float(first.result.objective) if hasattr(first, "result") else float("nan"),
        n_points=int(sum(len(f.points["loss"]) if hasattr(f, "points") else f.n_points for f in members.values())),
        backtest={"holdout": cand.backtest.to_dict()} if cand.backtest is not None else {},
        warnings=[w for f in members.values() for w in f.warnings],
        interval_method="none (curve laws: intervals from run-resampling refits in Python)",
        selection=sel.to_dict(),
        extra={
            "members": {
                n: (f.to_dict() if hasattr(f, "points") else {"law": f.law, "params": dict(f.params)})
                for n, f in members.items()
            },
            "calibration": calibration,
        },
    )
