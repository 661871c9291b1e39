"""One call from a run table to the fit report: the object `scalelab fit --json` prints.

    from scalelab.fitting.pipeline import fit_table
    report = fit_table("runs.parquet", law="chinchilla", approach=3, bootstrap=200)
    report["params"], report["intervals"]["alpha"], report["backtest"]["holdout"]["mare"]

Predictions and allocations from a saved report: fitting/from_report.py.

Report keys (the CLI contract): law, approach, params, objective, n_points, intervals {name: [lo, hi]},
derived, backtest, warnings; plus level, inputs (where FLOPs/tokens came from), code_version and
`samples` (bootstrap parameter draws, {name: [...]}) so a saved report can give intervals later.

Approach 3 is the parametric fit (fitting/fit.py) with bootstrap or delta-method intervals.
Approaches 1 and 2 (fitting/approaches.py) report params n_coef, n_exponent, d_coef, d_exponent of
N*(C) = n_coef C^n_exponent and D*(C) = d_coef C^d_exponent; their samples are draws from the OLS
sampling distribution of the N* line.
"""

from __future__ import annotations

import contextlib
import functools
import math
import pathlib
import subprocess

import numpy as np

import scalelab
from scalelab.errors import UsageError
from scalelab.fitting import allocate as alloc
from scalelab.fitting import approaches as appr
from scalelab.fitting.backtest import BacktestResult, holdout_backtest, holdout_mask, leave_one_budget_out
from scalelab.fitting.curves import fit_curves
from scalelab.fitting.io import ColumnMap, RunTable, read_runs
from scalelab.fitting.laws import CURVE_LAWS, get_law
from scalelab.fitting.select import calibration_factor, select_law

LEVEL = 0.95
MAX_LOBO_BUDGETS = 12  # leave-one-budget-out refits once per budget; above this it is skipped
APPROACH_SAMPLES = 2000  # parametric draws saved for Approaches 1/2
BACKTEST_STARTS = 100  # grid starts per backtest refit (plus the full-data optimum)


@contextlib.contextmanager
def one_torch_thread():
    """Run the fits on one torch thread: their tensors are (starts x points), far too small for
    intra-op threads, and on shared machines two threads measured ~20x slower (spin-waiting)."""
    import torch

    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """'scalelab <version>' plus the git commit of the source tree when it is a checkout."""
    root = pathlib.Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return f"scalelab {scalelab.__version__}" + (f" ({sha})" if sha else "")


def _finite(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def _interval(lo, hi) -> list[float | None]:
    return [_finite(lo), _finite(hi)]


# ---------------------------------------------------------------------------------------------
# Approach 3: parametric law
# ---------------------------------------------------------------------------------------------


def _law_data(law, table: RunTable) -> dict[str, np.ndarray]:
    inputs = table.law_inputs()
    missing = [k for k in law.inputs if k not in inputs]
    if missing:
        raise UsageError(f"law {law.name} needs column(s) {missing}; map them with --{missing[0]}-col")
    return {**{k: inputs[k] for k in law.inputs}, "loss": table.loss}


def subsample_starts(law, max_starts: int | None, extra: np.ndarray | None = None) -> np.ndarray | None:
    """Evenly spaced rows of the law's init grid (fit space), at most `max_starts`; plus `extra` rows.

    None when the full grid is wanted. The grid's first axis varies slowest, so even spacing in the
    row index still visits every value of every axis when max_starts >= the grid's axis sizes.
    """
    grid = law.init_grid()
    if max_starts is not None and max_starts < len(grid):
        if max_starts < 1:
            raise UsageError(f"starts must be >= 1, got {max_starts}")
        grid = grid[np.unique(np.round(np.linspace(0, len(grid) - 1, max_starts)).astype(int))]
    elif extra is None:
        return None
    if extra is not None:
        grid = np.vstack([grid, np.atleast_2d(extra)])
    return grid


def _fit_law(law, table: RunTable, *, objective: str, delta: float, starts=None):
    from scalelab.fitting.fit import fit_law

    return fit_law(law, _law_data(law, table), objective=objective, delta=delta, starts=starts, weights=table.weight)


def _law_fitter(law, objective: str, delta: float, starts=None):
    """Backtest fitter: refit on the training runs from `starts` (None: the law's full grid)."""

    def fitter(train: RunTable):
        fit = _fit_law(law, train, objective=objective, delta=delta, starts=starts)
        return lambda test: np.asarray(fit.predict(**{k: test.law_inputs()[k] for k in law.inputs}))

    return fitter


def _derived(law, params: dict[str, float]) -> dict[str, float]:
    """Quantities derived from the parameters (compute-optimal exponents for Chinchilla-based laws)."""
    if {"alpha", "beta", "A", "B"} <= set(params):
        return {
            "n_opt_exponent": alloc.chinchilla_exponents(params)["a"],
            "d_opt_exponent": alloc.chinchilla_exponents(params)["b"],
            "G": alloc.chinchilla_exponents(params)["G"],
        }
    return {}


def _fit_approach3(table, law_name, *, bootstrap, seed, objective, delta, level, holdout_frac, backtest, max_starts):
    law = get_law(law_name)
    if len(table) <= law.n_params:
        raise UsageError(
            f"{len(table)} runs is too few to fit {law.n_params} parameters of {law.name}; need at least "
            f"{law.n_params + 1}"
        )
    fit = _fit_law(law, table, objective=objective, delta=delta, starts=subsample_starts(law, max_starts))
    params = {k: float(v) for k, v in fit.params.items()}
    warnings = list(getattr(fit, "warnings", []))
    derived = _derived(law, params)
    intervals: dict[str, list] = {}
    samples: dict[str, list[float]] = {}
    if bootstrap > 0:
        from scalelab.fitting.bootstrap import bootstrap as run_bootstrap

        boot = run_bootstrap(
            law,
            _law_data(law, table),
            fit,
            n_boot=bootstrap,
            groups=table.group,
            seed=seed,
            derived={k: DERIVED_FNS[k] for k in derived},
        )
        samples = {n: [float(x) for x in boot.samples[n]] for n in law.param_names}
        for name in (*law.param_names, *derived):
            intervals[name] = _interval(*boot.interval(name, level))
        not_conv = int(np.sum(~np.asarray(boot.converged)))
        if not_conv:
            warnings.append(f"bootstrap: {not_conv} of {bootstrap} replicates did not converge")
    else:
        intervals, samples, more = _delta_intervals(law, table, fit, level, seed)
        warnings += more
    report = {
        "law": law.name,
        "approach": 3,
        "params": params,
        "objective": float(fit.objective),
        "n_points": int(fit.n_points),
        "intervals": intervals,
        "derived": derived,
        "backtest": {},
        "warnings": warnings,
        "samples": samples,
        "interval_method": f"bootstrap percentile (B={bootstrap})" if bootstrap > 0 else "delta method",
        # robust sd of the log-loss residuals: the run-to-run noise a prediction interval adds
        "residual_scale": _finite(fit.residual_scale),
    }
    if backtest:
        # Refits start from a thinned grid plus the full-data optimum: the optimum only shortens
        # the search (each refit minimises its own training objective), and keeps backtests cheap.
        bt_starts = subsample_starts(law, min(max_starts or BACKTEST_STARTS, BACKTEST_STARTS), np.asarray(fit.theta))
        fitter = _law_fitter(law, objective, delta, starts=bt_starts)
        report["backtest"] = _run_backtests(table, fitter, holdout_frac, warnings)
    return report


DERIVED_FNS = {
    "n_opt_exponent": lambda p: p["beta"] / (p["alpha"] + p["beta"]),
    "d_opt_exponent": lambda p: p["alpha"] / (p["alpha"] + p["beta"]),
    "G": lambda p: (p["alpha"] * p["A"] / (p["beta"] * p["B"])) ** (1.0 / (p["alpha"] + p["beta"])),
}
DELTA_SAMPLES = 1000  # normal draws from the delta-method covariance, saved for predict/allocate


def _delta_intervals(law, table, fit, level, seed):
    """Delta-method intervals plus parameter draws from N(theta, Cov) in fit space.

    The draws let a saved fit give (approximate, symmetric-in-fit-space) intervals on predictions
    and allocations without a bootstrap.
    """
    from scalelab.fitting.intervals import delta_method_intervals

    derived = DERIVED_FNS if {"alpha", "beta", "A", "B"} <= set(fit.params) else {}
    try:
        dm = delta_method_intervals(law, _law_data(law, table), fit, level=level, derived=derived)
    except (UsageError, np.linalg.LinAlgError) as e:
        return {}, {}, [f"no delta-method intervals: {e}"]
    intervals = {k: _interval(*v) for k, v in dm.intervals.items()}
    cov = np.asarray(dm.cov_fit, dtype=float)
    samples: dict[str, list[float]] = {}
    if np.all(np.isfinite(cov)):
        rng = np.random.default_rng(seed)
        draws = rng.multivariate_normal(np.asarray(fit.theta), cov, size=DELTA_SAMPLES, method="eigh")
        nat = law.to_natural_array(draws)
        samples = {n: nat[:, i].tolist() for i, n in enumerate(law.param_names)}
    return intervals, samples, []


def _run_backtests(table: RunTable, fitter, holdout_frac, warnings: list[str]) -> dict:
    out: dict = {}
    try:
        out["holdout"] = holdout_backtest(table, fitter, holdout_frac=holdout_frac, min_train=3).to_dict()
    except UsageError as e:
        warnings.append(f"holdout backtest skipped: {e}")
    num_budgets = len(np.unique(table.group if table.group is not None else appr.group_budgets(table.flops)))
    if 2 < num_budgets <= MAX_LOBO_BUDGETS:
        try:
            out["leave_one_budget_out"] = leave_one_budget_out(table, fitter, min_train=3).to_dict()
        except UsageError as e:
            warnings.append(f"leave-one-budget-out skipped: {e}")
    elif num_budgets > MAX_LOBO_BUDGETS:
        warnings.append(
            f"leave-one-budget-out skipped: {num_budgets} FLOP budgets (> {MAX_LOBO_BUDGETS} refits); "
            "give a 'group' column to define fewer budgets"
        )
    return out


# ---------------------------------------------------------------------------------------------
# Approaches 1 and 2
# ---------------------------------------------------------------------------------------------


def _run_approach(approach: int, table: RunTable, level: float):
    kw = dict(params=table.params, tokens=table.tokens, loss=table.loss, flops=table.flops, level=level)
    if approach == 1:
        return appr.approach1(**kw)
    return appr.approach2(**kw, budget_labels=None if table.group is None else table.group)


def _fit_approach12(table, approach, *, seed, level, holdout_frac, backtest):
    res = _run_approach(approach, table, level)
    params = {
        "n_coef": res.n_opt.coef,
        "n_exponent": res.n_opt.exponent,
        "d_coef": res.d_opt.coef,
        "d_exponent": res.d_opt.exponent,
    }
    intervals = {
        "n_coef": _interval(*res.n_opt.coef_interval),
        "n_exponent": _interval(*res.n_opt.exponent_interval),
        "d_coef": _interval(*res.d_opt.coef_interval),
        "d_exponent": _interval(*res.d_opt.exponent_interval),
    }
    used = [m for m in res.minima if m.used]
    c_max = max(m.flops for m in used)
    derived = {"tokens_per_param_at_max_budget": res.tokens_per_param(c_max), "max_budget_flops": c_max}
    draws = res.n_opt.sample(APPROACH_SAMPLES, seed=seed)
    samples = {"n_coef": [d[0] for d in draws], "n_exponent": [d[1] for d in draws]} if draws else {}
    warnings = list(res.warnings)
    report = {
        "law": f"approach{approach}",
        "approach": approach,
        "params": params,
        "objective": res.n_opt.rss,
        "n_points": res.n_opt.n_points,
        "intervals": intervals,
        "derived": derived,
        "backtest": {},
        "warnings": warnings,
        "samples": samples,
        "minima": res.to_dict()["minima"],
    }
    if backtest:
        try:
            report["backtest"] = {"holdout": _approach_backtest(approach, table, res, holdout_frac, level)}
        except UsageError as e:
            warnings.append(f"holdout backtest skipped: {e}")
    return report


def _approach_backtest(approach, table, full, holdout_frac, level) -> dict:
    """Predict N* at the largest measured budgets from an approach run on the smaller-compute runs."""
    used = [m for m in full.minima if m.used]
    c = np.array([m.flops for m in used])
    held = holdout_mask(c, holdout_frac)
    if held.all():
        raise UsageError("every located budget would be held out")
    cut = c[held].min() / (1.0 + appr.BUDGET_REL_TOL)
    train = _run_approach(approach, table.subset(table.flops < cut), level)
    obs = np.array([m.n_opt for m, h in zip(used, held) if h])
    pred = train.n_opt(c[held])
    rel = (pred - obs) / obs
    return BacktestResult(
        protocol="holdout_n_opt",
        run_id=[f"C={x:.3g}" for x in c[held]],
        flops=c[held],
        observed=obs,
        predicted=pred,
        rel_error=rel,
        mare=float(np.mean(np.abs(rel))),
        bias=float(np.mean(rel)),
        n_train=sum(m.used for m in train.minima),
        n_test=int(held.sum()),
        extrapolation_decades=float(np.log10(c[held].max() / max(m.flops for m in train.minima if m.used))),
    ).to_dict()


# ---------------------------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------------------------


def _fit_selected(
    table: RunTable, law: str, curves, *, bootstrap, seed, objective, delta, level, holdout_frac, backtest, max_starts
) -> dict:
    """`law` "auto" (fitting/select.py picks by backtest) or a curve law (fitted on `curves`)."""
    if law in CURVE_LAWS and not curves:
        raise UsageError(f"law {law} is fitted on loss curves: pass a sweep directory or a table of logged steps")
    if law == "auto":
        sel = select_law(table, curves, holdout_frac=holdout_frac, refit=False)
    else:
        sel = select_law(table, curves, holdout_frac=holdout_frac, candidates=[law], incumbent=None, refit=False)
    chosen = sel.chosen
    if chosen in ("chinchilla", "kaplan", "data_constrained"):
        report = _fit_approach3(
            table,
            chosen,
            bootstrap=bootstrap,
            seed=seed,
            objective=objective,
            delta=delta,
            level=level,
            holdout_frac=holdout_frac,
            backtest=backtest,
            max_starts=max_starts,
        )
    else:
        sel_full = (
            select_law(
                table, curves, holdout_frac=holdout_frac, candidates=[c.name for c in sel.ranking()], incumbent=None
            )
            if chosen == "average"
            else None
        )
        members = sel_full.fits if sel_full is not None else {}
        if chosen != "average":
            cf = fit_curves(curves, chosen)
            members = {chosen: cf}
            calibration = {chosen: calibration_factor(cf, table, curves)}
        else:
            calibration = sel_full.calibration
        cand = sel.candidates[chosen]
        first = next(iter(members.values()))
        report = {
            "law": chosen,
            "approach": 3,
            "params": dict(first.params) if chosen != "average" else {},
            "members": {
                n: (f.to_dict() if hasattr(f, "points") else {"law": f.law, "params": dict(f.params)})
                for n, f in members.items()
            },
            "calibration": calibration,
            "objective": float(first.result.objective) if hasattr(first, "result") else float("nan"),
            "n_points": int(
                sum(len(f.points["loss"]) if hasattr(f, "points") else f.n_points for f in members.values())
            ),
            "intervals": {},
            "derived": {},
            "backtest": {"holdout": cand.backtest.to_dict()} if cand.backtest is not None else {},
            "warnings": [w for f in members.values() for w in f.warnings],
            "samples": {},
            "interval_method": "none (curve laws: intervals from run-resampling refits in Python)",
        }
    report["selection"] = sel.to_dict()
    return report


def fit_table(
    data,
    law: str = "chinchilla",
    approach: int = 3,
    bootstrap: int = 0,
    holdout_frac: float | None = None,
    seed: int = 0,
    *,
    columns: ColumnMap | None = None,
    objective: str = "huber",
    delta: float = 1e-3,
    level: float = LEVEL,
    backtest: bool = True,
    keep_samples: bool = False,
    max_starts: int | None = None,
    curves=None,
) -> dict:
    """Fit a run table and return the report dict (what `scalelab fit --json` prints).

    Args:
        data: CSV/Parquet path, polars/pandas frame, or dict of arrays (columns per `columns`).
        law: law name for Approach 3 (ignored by Approaches 1/2); "auto" picks the law by the
            held-out-largest backtest (fitting/select.py; the report's "selection" lists every
            candidate's backtest); a curve law ("lr_annealing", "lr_area") needs `curves`.
        curves: RunCurves of the table's runs (matched by run_id): enables the curve laws.
        approach: 1 (envelope), 2 (IsoFLOP parabolas) or 3 (parametric fit).
        bootstrap: number of bootstrap resamples (Approach 3); 0 gives delta-method intervals.
        holdout_frac: backtest hold-out fraction by compute; None holds out the largest budget.
        seed: RNG seed (bootstrap, parametric draws).
        columns: column mapping; objective, delta: the fit's loss (Huber on log loss by default).
        level: interval level. backtest: run the backtests (on by default).
        max_starts: thin the law's init grid to this many starts (None: all, e.g. 4500 for
            Chinchilla; each backtest refit uses at most BACKTEST_STARTS plus the full-data optimum).
        keep_samples: include "samples" (parameter draws for later intervals; `--out` saves them).
    Returns:
        The report dict (JSON-serialisable).
    Raises:
        UsageError / ConfigError: bad input (missing column, NaN, too few points, bad option).
    """
    if approach not in (1, 2, 3):
        raise UsageError(f"approach must be 1, 2 or 3, got {approach}")
    if bootstrap < 0:
        raise UsageError(f"bootstrap must be >= 0, got {bootstrap}")
    if holdout_frac is not None and not 0.0 < holdout_frac < 1.0:
        raise UsageError(f"holdout fraction must be in (0, 1), got {holdout_frac}")
    table = read_runs(data, columns=columns, min_rows=2)
    if approach == 3 and (law == "auto" or law in CURVE_LAWS):
        with one_torch_thread():
            report = _fit_selected(
                table,
                law,
                curves,
                bootstrap=bootstrap,
                seed=seed,
                objective=objective,
                delta=delta,
                level=level,
                holdout_frac=holdout_frac,
                backtest=backtest,
                max_starts=max_starts,
            )
    elif approach == 3:
        with one_torch_thread():
            report = _fit_approach3(
                table,
                law,
                bootstrap=bootstrap,
                seed=seed,
                objective=objective,
                delta=delta,
                level=level,
                holdout_frac=holdout_frac,
                backtest=backtest,
                max_starts=max_starts,
            )
    else:
        report = _fit_approach12(table, approach, seed=seed, level=level, holdout_frac=holdout_frac, backtest=backtest)
    report["level"] = level
    report["inputs"] = {"flops": table.flops_source, "tokens": table.tokens_source, "n_rows": len(table)}
    report["code_version"] = code_version()
    if keep_samples:
        report["run_ids"] = [str(r) for r in table.run_id]
    else:
        report.pop("samples")
    return report
