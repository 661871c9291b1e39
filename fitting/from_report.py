"""Predictions and compute-optimal allocations from a saved fit report (`scalelab predict`, `allocate`).

    from scalelab.fitting.from_report import predict_from_fit, allocate_from_fit
    predict_from_fit(report, params=1e9, tokens=2e10)       # needs the saved samples for intervals
    allocate_from_fit(report, flops=1e23)

The report is what `scalelab fit --out` saves (scalelab.fitting.scaling_fit.ScalingFit.to_report,
FIT.json); its `samples` (bootstrap or delta-method parameter draws) give the percentile intervals.
"""

from __future__ import annotations

import numpy as np

from scalelab.errors import UsageError
from scalelab.fitting import allocate as alloc
from scalelab.fitting.ensemble import StackedFit
from scalelab.fitting.fit_options import LEVEL
from scalelab.fitting.intervals import percentile_interval
from scalelab.fitting.laws import CURVE_LAWS, get_law
from scalelab.fitting.predictive import interval_from_parts


def sample_rows(samples: dict[str, list[float]]) -> list[dict[str, float]]:
    names = list(samples)
    return [dict(zip(names, vals)) for vals in zip(*(samples[n] for n in names))]


def _samples_of(fit: dict) -> list[dict[str, float]]:
    s = fit.get("samples") or {}
    return sample_rows(s) if s else []


def _pairs(lo, hi) -> list[list[float]]:
    return [[float(a), float(b)] for a, b in zip(np.atleast_1d(lo), np.atleast_1d(hi))]


def predict_from_fit(
    fit: dict,
    *,
    params=None,
    tokens=None,
    flops=None,
    unique_tokens=None,
    level: float | None = None,
) -> dict:
    """Point predictions (with percentile intervals over the saved samples) from a report dict.

    Approach 3: the loss at (params, tokens) - or, given only flops, the compute-optimal loss and
    allocation at that budget (laws of flops alone predict directly). Approaches 1/2: only
    --flops, giving N*(C) and D*(C).
    Returns:
        dict of lists: inputs, "loss" (Approach 3), "loss_interval" [[lo, hi], ...] (parameter
        uncertainty) and "loss_prediction_interval" (plus run-to-run noise), None without samples.
    """
    level = fit.get("level", LEVEL) if level is None else level
    if fit["approach"] != 3:
        if flops is None:
            raise UsageError(f"an Approach {fit['approach']} fit predicts allocations only: pass --flops")
        return allocate_from_fit(fit, flops=flops, level=level)
    if fit["law"] in (*CURVE_LAWS, "average"):
        raise UsageError(
            f"a {fit['law']} fit predicts runs from their LR schedules, not from (N, D): use "
            "scalelab.fitting.curves.CurveFit.predict_final on a RunCurve"
        )
    if fit.get("stacked"):
        return _predict_stacked(fit, params=params, tokens=tokens, flops=flops, level=level)
    law = get_law(fit["law"])
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
        point = law.predict(fit["params"], **x)
        out = {k: v.tolist() for k, v in x.items()}
        out["loss"] = np.atleast_1d(point).tolist()
        rows = _samples_of(fit)
        out["loss_interval"] = out["loss_prediction_interval"] = None
        if rows:
            # Confidence interval: parameter uncertainty only (the law's mean loss). Prediction
            # interval: each draw also times exp(sigma z), sigma the fit's residual scale (a new run).
            vals = np.array([law.predict(r, **x) for r in rows])
            out["loss_interval"] = _pairs(*percentile_interval(vals, level))
            sigma = fit.get("residual_scale")
            if sigma:
                noise = np.exp(sigma * np.random.default_rng(0).standard_normal(vals.shape))
                out["loss_prediction_interval"] = _pairs(*percentile_interval(vals * noise, level))
        out["level"] = level
        return out
    if "flops" in given and set(law.inputs) == {"params", "tokens"}:
        return allocate_from_fit(fit, flops=given["flops"], level=level)
    raise UsageError(f"law {law.name} needs {' and '.join('--' + k for k in law.inputs)} (or --flops C)")


def _predict_stacked(fit: dict, *, params, tokens, flops, level: float) -> dict:
    """Law "auto": the stacked law's loss at (N, D), or at the incumbent's compute-optimal (N*, D*)
    given only --flops. loss_interval: the law's own uncertainty (bootstrap and weights);
    loss_prediction_interval: a new run's (plus its noise and the drift out of sample)."""
    sf = StackedFit.from_dict({**fit["stacked"], "level": level})
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


def _optimum_of_fit(fit: dict):
    """(optimum function, point params, samples) for a report of any approach."""
    samples = _samples_of(fit)
    if fit["approach"] == 3:
        return alloc.optimum_for_law(get_law(fit["law"])), fit["params"], samples

    def optimum(q, c):  # Approaches 1/2: N* = n_coef C^n_exponent, D* = C / (6 N*)
        n_opt = q["n_coef"] * c ** q["n_exponent"]
        return n_opt, c / (6.0 * n_opt), float("nan")

    p = fit["params"]
    return optimum, {"n_coef": p["n_coef"], "n_exponent": p["n_exponent"]}, samples


def _positive(values, flag: str) -> np.ndarray:
    arr = np.atleast_1d(np.asarray(values, dtype=float))
    if not (np.all(np.isfinite(arr)) and np.all(arr > 0)):
        raise UsageError(f"{flag} must be positive numbers")
    return arr


def allocate_from_fit(fit: dict, *, flops=None, tokens=None, level: float | None = None) -> dict:
    """Compute-optimal N*, D*, tokens/param (and L* for Approach 3) with percentile intervals.

    Args:
        fit: a report (ScalingFit.to_report / FIT.json; intervals need its "samples").
        flops: FLOP budget(s) C: the allocation at each.
        tokens: data budget(s) D instead: the size for which D tokens is compute-optimal (solve
            D*(C) = D, then N*(C)) - the loss-optimal model per FLOP that uses exactly that data.
    """
    level = fit.get("level", LEVEL) if level is None else level
    if (flops is None) == (tokens is None):
        raise UsageError("pass either --flops C or --tokens D")
    optimum, params, samples = _optimum_of_fit(fit)
    if tokens is not None:
        budgets = []
        for d in _positive(tokens, "--tokens"):
            budgets.append(alloc.size_for_data_budget(optimum, params, float(d))[1])
    else:
        budgets = _positive(flops, "--flops")
    rows = [alloc.allocate(optimum, params, float(c), samples=samples, level=level).to_dict() for c in budgets]
    if fit["approach"] != 3:
        for r in rows:  # approaches 1/2 do not model the loss
            r.pop("loss_opt", None)
            r.pop("loss_opt_interval", None)
    return {"allocations": rows, "level": level, "law": fit["law"], "approach": fit["approach"]}
