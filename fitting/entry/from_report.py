"""Predictions and compute-optimal allocations from a saved fit report (`scalelab predict`, `allocate`).

    from scalelab.fitting.entry.from_report import predict_from_fit, allocate_from_fit
    predict_from_fit(report, params=1e9, tokens=2e10)       # needs the saved samples for intervals
    allocate_from_fit(report, flops=1e23)

The fit is a saved one, read by scalelab.fitting.entry.saved_fit.load_saved_fit (what `scalelab fit --out`
saves, FIT.json, or a sweep's fits/round_K.json; a report or record in memory is read the same way);
its parameter draws (bootstrap or delta-method samples) give the percentile intervals.
A law of N and D saved with its compute frontier answers compute-optimal questions (--flops, the
allocations) from the frontier, the surface's answer beside it (scalelab.fitting.allocation.compute_optimal);
a degenerate surface (its saved `degeneracy` findings) predicts (N, D) at the frontier's level.
"""

from __future__ import annotations

import numpy as np

from scalelab.errors import UsageError
from scalelab.fitting.allocation import allocate as alloc
from scalelab.fitting.allocation.compute_optimal import Surface, anchored_interval, compute_optimal
from scalelab.fitting.allocation.frontier import FrontierFit
from scalelab.fitting.entry.degeneracy import degenerate
from scalelab.fitting.entry.saved_fit import SavedFit, load_saved_fit
from scalelab.fitting.estimate.intervals import percentile_interval
from scalelab.fitting.forms.laws import CURVE_LAWS, get_law
from scalelab.fitting.selection.ensemble import StackedFit
from scalelab.fitting.uncertainty.predictive import PredictionInterval, interval_from_parts


def _pairs(lo, hi) -> list[list[float]]:
    return [[float(a), float(b)] for a, b in zip(np.atleast_1d(lo), np.atleast_1d(hi))]


def frontier_of(fit: SavedFit, level: float | None = None) -> FrontierFit | None:
    """The saved compute frontier of a fit (at `level`), or None."""
    if fit.frontier is None:
        return None
    fr = FrontierFit.from_dict(fit.frontier)
    if level is not None:
        fr.level = level
    return fr


def surface_of(fit: SavedFit, level: float) -> Surface:
    """A saved law of N and D as the frontier reads it (the stacked law's, when it has one): its point,
    its own optimum and its L*(C) interval over the saved samples."""
    holds = not degenerate(fit.degeneracy)
    if fit.stacked:
        sf = StackedFit.from_dict({**fit.stacked, "level": level})
        return Surface(point=lambda n, d: float(sf.predict(n, d)), optimum=sf.optimum, interval=sf.optimum_interval,
                       holds=holds)  # fmt: skip
    law = get_law(fit.law)
    optimum = alloc.optimum_for_law(law)

    def interval(c: float) -> PredictionInterval:
        a = alloc.allocate(optimum, fit.params, c, samples=fit.draws, level=level)
        lo, hi = a.loss_opt_interval if a.loss_opt_interval is not None else (a.loss_opt, a.loss_opt)
        return PredictionInterval(point=a.loss_opt, lo=float(lo), hi=float(hi), level=level, parts={})

    return Surface(
        point=lambda n, d: float(law.predict(fit.params, params=np.asarray(n), tokens=np.asarray(d))),
        optimum=lambda c: optimum(fit.params, c)[:3],
        interval=interval,
        holds=holds,
    )


def predict_from_fit(
    fit: SavedFit | dict,
    *,
    params=None,
    tokens=None,
    flops=None,
    unique_tokens=None,
    level: float | None = None,
) -> dict:
    """Point predictions (with percentile intervals over the saved draws) from a saved fit (or its JSON).

    Approach 3: the loss at (params, tokens) - or, given only flops, the compute-optimal loss and
    allocation at that budget (laws of flops alone predict directly). Approaches 1/2: only
    --flops, giving N*(C) and D*(C).
    Returns:
        dict of lists: inputs, "loss" (Approach 3), "loss_interval" [[lo, hi], ...] (parameter
        uncertainty) and "loss_prediction_interval" (plus run-to-run noise), None without samples.
    """
    fit = load_saved_fit(fit)
    level = fit.level if level is None else level
    if fit.approach != 3:
        if flops is None:
            raise UsageError(f"an Approach {fit.approach} fit predicts allocations only: pass --flops")
        return allocate_from_fit(fit, flops=flops, level=level)
    if fit.law in (*CURVE_LAWS, "average"):
        raise UsageError(
            f"a {fit.law} fit predicts runs from their LR schedules, not from (N, D): use "
            "scalelab.fitting.loss_curves.curves.CurveFit.predict_final on a RunCurve"
        )
    frontier = frontier_of(fit, level)
    if frontier is not None and params is None and tokens is None and flops is not None:
        return allocate_from_fit(fit, flops=flops, level=level)
    if frontier is not None and params is not None and tokens is not None:
        surface = surface_of(fit, level)
        if not surface.holds:
            return _predict_anchored(frontier, surface, params, tokens, level)
    if fit.stacked:
        return _predict_stacked(fit, params=params, tokens=tokens, flops=flops, level=level)
    law = get_law(fit.law)
    given = {"params": params, "tokens": tokens, "flops": flops, "unique_tokens": unique_tokens}
    given = {k: np.atleast_1d(np.asarray(v, dtype=float)) for k, v in given.items() if v is not None}
    for k, v in given.items():
        if not (np.all(np.isfinite(v)) and np.all(v > 0)):
            raise UsageError(f"--{k} must be positive numbers")
    if all(k in given for k in law.inputs):
        try:
            arrays = np.broadcast_arrays(*(given[k] for k in law.inputs))
        except ValueError:
            raise UsageError("--params/--tokens take one value each or equally many values") from None
        x = dict(zip(law.inputs, (np.array(a) for a in arrays)))
        point = law.predict(fit.params, **x)
        out = {k: v.tolist() for k, v in x.items()}
        out["loss"] = np.atleast_1d(point).tolist()
        rows = fit.draws
        out["loss_interval"] = out["loss_prediction_interval"] = None
        if rows:
            # Confidence interval: parameter uncertainty only (the law's mean loss). Prediction
            # interval: each draw also times exp(sigma z), sigma the fit's residual scale (a new run).
            vals = np.array([law.predict(r, **x) for r in rows])
            out["loss_interval"] = _pairs(*percentile_interval(vals, level))
            sigma = fit.residual_scale
            if sigma:
                noise = np.exp(sigma * np.random.default_rng(0).standard_normal(vals.shape))
                out["loss_prediction_interval"] = _pairs(*percentile_interval(vals * noise, level))
        out["level"] = level
        return out
    if "flops" in given and alloc.can_allocate(law):
        return allocate_from_fit(fit, flops=given["flops"], level=level)
    raise UsageError(f"law {law.name} needs {' and '.join('--' + k for k in law.inputs)} (or --flops C)")


def _predict_stacked(fit: SavedFit, *, params, tokens, flops, level: float) -> dict:
    """Law "auto": the stacked law's loss at (N, D), or at the incumbent's compute-optimal (N*, D*)
    given only --flops. loss_interval: the law's own uncertainty (bootstrap and weights);
    loss_prediction_interval: a new run's (plus its noise and the drift out of sample)."""
    sf = StackedFit.from_dict({**fit.stacked, "level": level})
    if params is None and tokens is None and flops is not None:
        alloc_out = allocate_from_fit(fit, flops=flops, level=level)
        n = np.array([a["n_opt"] for a in alloc_out["allocations"]])
        d = np.array([a["d_opt"] for a in alloc_out["allocations"]])
    elif params is not None and tokens is not None:
        try:
            n, d = np.broadcast_arrays(_positive(params, "--params"), _positive(tokens, "--tokens"))
        except ValueError:
            raise UsageError("--params/--tokens take one value each or equally many values") from None
    else:
        raise UsageError("a stacked fit predicts at --params and --tokens (or at --flops C's optimum)")
    out = {"params": n.tolist(), "tokens": d.tolist(), "loss": [], "loss_interval": [], "loss_prediction_interval": []}
    for ni, di in zip(n, d):
        pi = sf.predict_interval(float(ni), float(di))
        own = interval_from_parts(pi.point, {k: pi.parts[k] for k in ("bootstrap", "weights")}, level)
        out["loss"].append(pi.point)
        out["loss_interval"].append([own.lo, own.hi])
        out["loss_prediction_interval"].append([pi.lo, pi.hi])
    out["weights"] = sf.weights
    out["level"] = level
    return out


def _predict_anchored(frontier: FrontierFit, surface: Surface, params, tokens, level: float) -> dict:
    """A degenerate law's (N, D) predictions at the frontier's level (scalelab.fitting.allocation.compute_optimal)."""
    try:
        n, d = np.broadcast_arrays(_positive(params, "--params"), _positive(tokens, "--tokens"))
    except ValueError:
        raise UsageError("--params/--tokens take one value each or equally many values") from None
    pis = [anchored_interval(frontier, surface, float(a), float(b), 6.0 * float(a) * float(b)) for a, b in zip(n, d)]
    return {
        "params": n.tolist(),
        "tokens": d.tolist(),
        "loss": [p.point for p in pis],
        "loss_interval": None,
        "loss_prediction_interval": [[p.lo, p.hi] for p in pis],
        "level": level,
        "note": "the law is degenerate: its losses take the compute frontier's level",
    }


def _frontier_allocations(fit: SavedFit, frontier: FrontierFit, budgets, level: float) -> list[dict]:
    """Allocation rows (allocate's keys) from the frontier, each with the surface's answer beside it."""
    surface = surface_of(fit, level)
    rows = []
    for c in budgets:
        co = compute_optimal(frontier, surface, float(c))
        n_iv = co.n_interval
        rows.append(
            {
                "flops": float(c),
                "n_opt": co.n_opt,
                "n_opt_interval": None if n_iv is None else list(n_iv),
                "d_opt": co.d_opt,
                "d_opt_interval": None if n_iv is None else [float(c) / (6 * n_iv[1]), float(c) / (6 * n_iv[0])],
                "loss_opt": co.loss.point,
                "loss_opt_interval": [co.loss.lo, co.loss.hi],
                "tokens_per_param": co.d_opt / co.n_opt,
                "tokens_per_param_interval": None
                if n_iv is None
                else [float(c) / (6 * n_iv[1] ** 2), float(c) / (6 * n_iv[0] ** 2)],
                "level": level,
                "at_bound": False,
                "source": co.source,
                "forms": co.forms,
                "surface": co.to_dict()["surface"],
                "disagree": co.disagree,
                "line": co.line(),
            }
        )
    return rows


def _optimum_of_fit(fit: SavedFit):
    """(optimum function, point params, samples) for a fit of any approach."""
    samples = fit.draws
    if fit.approach == 3:
        return alloc.optimum_for_law(get_law(fit.law)), fit.params, samples

    def optimum(q, c):  # Approaches 1/2: N* = n_coef C^n_exponent, D* = C / (6 N*)
        n_opt = q["n_coef"] * c ** q["n_exponent"]
        return n_opt, c / (6.0 * n_opt), float("nan")

    p = fit.params
    return optimum, {"n_coef": p["n_coef"], "n_exponent": p["n_exponent"]}, samples


def _budgets_of(fit: SavedFit, frontier: FrontierFit, flops, tokens, level: float) -> list[float]:
    """The FLOP budgets asked for: --flops as given, or for each --tokens D the budget whose
    compute-optimal D* (the frontier's) is D."""
    if tokens is None:
        return [float(c) for c in _positive(flops, "--flops")]
    surface = surface_of(fit, level)

    def optimum(_params, c: float):
        co = compute_optimal(frontier, surface, c)
        return co.n_opt, co.d_opt, co.loss.point

    return [alloc.size_for_data_budget(optimum, {}, float(d))[1] for d in _positive(tokens, "--tokens")]


def _positive(values, flag: str) -> np.ndarray:
    arr = np.atleast_1d(np.asarray(values, dtype=float))
    if not (np.all(np.isfinite(arr)) and np.all(arr > 0)):
        raise UsageError(f"{flag} must be positive numbers")
    return arr


def allocate_from_fit(fit: SavedFit | dict, *, flops=None, tokens=None, level: float | None = None) -> dict:
    """Compute-optimal N*, D*, tokens/param (and L* for Approach 3) with percentile intervals.

    Args:
        fit: a saved fit (scalelab.fitting.entry.saved_fit) or its JSON (ScalingFit.to_report / FIT.json,
            a round's record); intervals need its parameter draws.
        flops: FLOP budget(s) C: the allocation at each.
        tokens: data budget(s) D instead: the size for which D tokens is compute-optimal (solve
            D*(C) = D, then N*(C)) - the loss-optimal model per FLOP that uses exactly that data.
    """
    fit = load_saved_fit(fit)
    level = fit.level if level is None else level
    if (flops is None) == (tokens is None):
        raise UsageError("pass either --flops C or --tokens D")
    frontier = frontier_of(fit, level) if fit.approach == 3 else None
    if frontier is not None:
        budgets = _budgets_of(fit, frontier, flops, tokens, level)
        rows = _frontier_allocations(fit, frontier, budgets, level)
        return {"allocations": rows, "level": level, "law": fit.law, "approach": 3}
    optimum, params, samples = _optimum_of_fit(fit)
    if tokens is not None:
        budgets = []
        for d in _positive(tokens, "--tokens"):
            budgets.append(alloc.size_for_data_budget(optimum, params, float(d))[1])
    else:
        budgets = _positive(flops, "--flops")
    rows = [alloc.allocate(optimum, params, float(c), samples=samples, level=level).to_dict() for c in budgets]
    if fit.approach != 3:
        for r in rows:  # approaches 1/2 do not model the loss
            r.pop("loss_opt", None)
            r.pop("loss_opt_interval", None)
    return {"allocations": rows, "level": level, "law": fit.law, "approach": fit.approach}
