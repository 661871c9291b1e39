"""Approach 3: fit a parametric law by robust multi-start L-BFGS; the FitResult it returns.

    fit = fit_law("chinchilla", {"params": N, "tokens": D, "loss": L})
    fit.params            # {"E": ..., "A": ..., "B": ..., "alpha": ..., "beta": ...}
    fit.predict(params=7e10, tokens=1.4e12)
    fit.warnings          # bound hits, stalls, flat directions, disagreeing starts
    FitResult.from_dict(json.loads(text))   # reload a saved fit for predict / allocation

Default objective (Hoffmann et al. 2022, Besiroglu et al. 2024): Huber loss with delta = 1e-3 on
log-loss residuals, SUMMED over runs, minimised by L-BFGS from every point of the law's init grid
(Chinchilla: Hoffmann's 4500 starts), keeping the best. Two stages:

1. all starts at once in the batched L-BFGS (fitting/estimate/batched_lbfgs.py), scipy L-BFGS-B's stopping
   rules, up to `batch_max_iter` iterations (starts still running there are carried to stage 2
   only if they are among the best); a problem solved earlier in the process is not solved again
   (fitting/estimate/batch_memo.py);
2. the best `n_polish` distinct end points are finished with scipy's L-BFGS-B (same objective and
   tolerances), which also confirms the batched optimum against the reference optimiser.

method="scipy" instead runs the plain reference: one scipy L-BFGS-B call per start, in a loop.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import threadpoolctl
import torch
from scipy import optimize

from scalelab.errors import UsageError
from scalelab.fitting.estimate import batch_memo, diagnostics
from scalelab.fitting.estimate.batched_lbfgs import STATUS_TEXT
from scalelab.fitting.estimate.intervals import delta_method, robust_scale
from scalelab.fitting.estimate.objective import BatchObjective
from scalelab.fitting.forms.laws import Law, get_law

MAX_THREADS = int(os.environ.get("SCALELAB_FIT_THREADS", "1"))
# One torch thread by default: on shared 2-core machines two OpenMP threads spin against other
# processes and a fit got 10-20x slower (measured: 41 s vs 2 s CPU for the 4500-start fit).
# The same holds for OpenBLAS, which scipy's L-BFGS-B (C since scipy 1.15) calls on 5x10 matrices:
# its default of one thread per core spins in every polish step (bench/fit_process_time.py).
BATCH_MAX_ITER = 200  # iterations of the batched stage (every start)
POLISH_MAX_ITER = 15000  # iterations of the scipy polish of the best end points


@contextlib.contextmanager
def fit_threads() -> Iterator[None]:
    """Run a fit's tensor and BLAS work on MAX_THREADS threads, then restore the caller's settings."""
    prev = torch.get_num_threads()
    torch.set_num_threads(MAX_THREADS)
    try:
        with threadpoolctl.threadpool_limits(limits=MAX_THREADS, user_api="blas"):
            yield
    finally:
        torch.set_num_threads(prev)


@dataclass(kw_only=True)
class FitResult:
    """A fitted law: natural parameters, the objective reached, the points used, diagnostics."""

    law: str
    params: dict[str, float]
    objective: float
    n_points: int
    inputs: dict[str, np.ndarray]  # the law's inputs and "loss" actually fitted
    warnings: list[str] = field(default_factory=list)
    n_iter: int = 0
    converged: bool = True
    theta: list[float] = field(default_factory=list)  # fit-space optimum (e.g. e = ln E)
    law_config: dict[str, Any] = field(default_factory=dict)  # get_law(law, **law_config) rebuilds it
    objective_name: str = "huber"
    delta: float = 1e-3
    reduction: str = "sum"
    weights: np.ndarray | None = None
    n_starts: int = 0
    method: str = "batched"
    residual_scale: float = float("nan")  # robust sd of log residuals (1.4826 MAD)
    status: str = ""
    seconds: float = 0.0
    alt_thetas: list[list[float]] = field(default_factory=list)  # best distinct end points (fit space)
    alt_objectives: list[float] = field(default_factory=list)  # their objective values

    def law_object(self) -> Law:
        return get_law(self.law, **self.law_config)

    def predict(self, **inputs: Any) -> np.ndarray:
        """Predicted loss at the given inputs (keyword names = the law's inputs)."""
        return self.law_object().predict(self.params, **inputs)

    def residuals(self) -> np.ndarray:
        """Log-space residuals log L_pred - log L_obs at the fitted points."""
        x = {k: self.inputs[k] for k in self.law_object().inputs}
        return np.log(self.predict(**x)) - np.log(self.inputs["loss"])

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (arrays as lists); FitResult.from_dict inverts it."""
        return {
            "law": self.law,
            "law_config": self.law_config,
            "params": dict(self.params),
            "theta": [float(t) for t in self.theta],
            "objective": float(self.objective),
            "objective_name": self.objective_name,
            "delta": self.delta,
            "reduction": self.reduction,
            "n_points": self.n_points,
            "inputs": {k: np.asarray(v).tolist() for k, v in self.inputs.items()},
            "weights": None if self.weights is None else np.asarray(self.weights).tolist(),
            "warnings": list(self.warnings),
            "n_iter": int(self.n_iter),
            "converged": bool(self.converged),
            "n_starts": int(self.n_starts),
            "method": self.method,
            "residual_scale": float(self.residual_scale),
            "status": self.status,
            "seconds": float(self.seconds),
            "alt_thetas": [[float(t) for t in th] for th in self.alt_thetas],
            "alt_objectives": [float(v) for v in self.alt_objectives],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FitResult:
        known = set(cls.__dataclass_fields__)
        kw = {k: v for k, v in d.items() if k in known}
        kw["inputs"] = {k: np.asarray(v, dtype=np.float64) for k, v in d["inputs"].items()}
        if d.get("weights") is not None:
            kw["weights"] = np.asarray(d["weights"], dtype=np.float64)
        kw["params"] = {k: float(v) for k, v in d["params"].items()}
        return cls(**kw)


def subsample_starts(law: Law, max_starts: int | None, extra: np.ndarray | None = None) -> np.ndarray | None:
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


def _starts_array(law: Law, starts: Any) -> np.ndarray:
    if starts is None:
        return law.init_grid()
    if isinstance(starts, Mapping):
        starts = [starts]
    if isinstance(starts, Sequence) and len(starts) and isinstance(starts[0], Mapping):
        return np.stack([law.to_fit(s) for s in starts])
    arr = np.atleast_2d(np.asarray(starts, dtype=np.float64))
    if arr.shape[1] != law.n_params:
        raise UsageError(f"starts must have {law.n_params} columns {law.fit_names} (fit space), got {arr.shape}")
    return arr


def _distinct_best(x: np.ndarray, f: np.ndarray, k: int) -> list[int]:
    """Indices of the k lowest-objective rows whose end points differ (rounded to 1e-4)."""
    picked, seen = [], set()
    if k <= 0:
        return picked
    for i in np.argsort(np.where(np.isfinite(f), f, np.inf)):
        if not np.isfinite(f[i]):
            break
        key = tuple(np.round(x[i], 4))
        if key in seen:
            continue
        seen.add(key)
        picked.append(int(i))
        if len(picked) == k:
            break
    return picked


def _scipy_minimize(fun, x0: np.ndarray, bounds, max_iter: int, gtol: float, ftol: float):
    return optimize.minimize(
        fun,
        x0,
        jac=True,
        method="L-BFGS-B",
        bounds=bounds,
        options={"maxiter": max_iter, "gtol": gtol, "ftol": ftol, "maxcor": 10},
    )


def _scipy_status(r, max_iter: int) -> int:
    """A scipy L-BFGS-B result's STATUS_TEXT code."""
    return 0 if r.success else (2 if r.nit >= max_iter else 3)


def _scipy_grad_norm(r, lo: np.ndarray, hi: np.ndarray) -> float:
    """Max |projected gradient| at a scipy L-BFGS-B result."""
    return float(np.abs(np.clip(r.x - r.jac, lo, hi) - r.x).max())


def _batched_then_polish(obj, fun, x0, lo, hi, *, batch_max_iter, n_polish, max_iter, gtol, ftol):
    """Stage 1, every start in the batched L-BFGS; stage 2, the best distinct end points finished by
    scipy (kept where scipy does not end higher). Returns (points, values, iterations, codes, |pg|)."""
    res = batch_memo.solve(obj, x0, lo, hi, max_iter=batch_max_iter, gtol=gtol, ftol=ftol)
    return polish(fun, res, lo, hi, n_polish=n_polish, max_iter=max_iter, gtol=gtol, ftol=ftol)


def polish(fun, res, lo, hi, *, n_polish, max_iter, gtol, ftol):
    """Stage 2 of a fit: the `n_polish` best distinct end points of a batched stage's result `res`
    (its rows: one problem's starts) finished by scipy L-BFGS-B on `fun`, each kept where scipy does
    not end higher. Returns (points, values, iterations, codes, |pg|)."""
    bounds = list(zip(lo, hi))
    xs, fs, its = res.x.copy(), res.f.copy(), res.n_iter.copy()
    codes, gnorm = res.status.copy(), res.grad_norm.copy()
    for i in _distinct_best(xs, fs, n_polish):
        r = _scipy_minimize(fun, xs[i], bounds, max_iter, gtol, ftol)
        if np.isfinite(r.fun) and r.fun <= fs[i]:
            xs[i], fs[i] = r.x, r.fun
            its[i] += r.nit
            codes[i] = _scipy_status(r, max_iter)
            gnorm[i] = _scipy_grad_norm(r, lo, hi)
    return xs, fs, its, codes, gnorm


def _scipy_per_start(fun, x0, lo, hi, *, max_iter, gtol, ftol):
    """The reference: one scipy L-BFGS-B call per start. Returns what _batched_then_polish does."""
    bounds = list(zip(lo, hi))
    n = x0.shape[0]
    xs, fs = np.empty_like(x0), np.full(n, np.inf)
    its, codes, gnorm = np.zeros(n, int), np.zeros(n, int), np.zeros(n)
    for i in range(n):
        r = _scipy_minimize(fun, np.clip(x0[i], lo, hi), bounds, max_iter, gtol, ftol)
        xs[i], fs[i], its[i] = r.x, r.fun, r.nit
        codes[i] = _scipy_status(r, max_iter)
        gnorm[i] = _scipy_grad_norm(r, lo, hi)
    return xs, fs, its, codes, gnorm


def _fit_warnings(law, x, loss, w, theta, status, n_iter, grad_norm, xs, fs, objective, delta, diagnose) -> list[str]:
    """The fit's warnings: no residual degrees of freedom, bound hits, a stall, disagreeing starts,
    flat directions (delta-method information at the optimum, when `diagnose`)."""
    warns: list[str] = []
    if loss.size == law.n_params:
        warns.append(f"as many points as parameters ({loss.size}): no residual degrees of freedom")
    warns += diagnostics.bound_warnings(law, theta)
    warns += diagnostics.stall_warning(status, n_iter, grad_norm, STATUS_TEXT[status])
    warns += diagnostics.disagreement_warning(law, law.to_natural_array(xs), fs)
    if diagnose:
        dm = delta_method(law, x, loss, theta, weights=w, delta=delta if objective == "huber" else None, derived={})
        warns += diagnostics.flatness_warnings(law, theta, dm.information, dm.se)
    return warns


def fit_law(
    law: Law | str,
    data: Mapping[str, Any],
    *,
    objective: str = "huber",
    delta: float = 1e-3,
    reduction: str = "sum",
    starts: Any = None,
    weights: Any = None,
    max_iter: int = POLISH_MAX_ITER,
    batch_max_iter: int = BATCH_MAX_ITER,
    n_polish: int = 3,
    method: str = "batched",
    gtol: float = 1e-5,
    ftol: float = 2.2e-9,
    diagnose: bool = True,
) -> FitResult:
    """Fit `law` to data by multi-start L-BFGS on the (Huber) objective in log-loss space.

    Over 80 lines for its Args: the body is the stages of the module docstring in order, each a
    named function (_batched_then_polish or _scipy_per_start, then _fit_warnings).

    Args:
        law: law object or registry name ("chinchilla", "kaplan", "power_law", ...).
        data: mapping with the law's inputs and "loss" (arrays of equal length, all > 0).
        objective: "huber" (default) or "squared"; delta: Huber threshold on log residuals.
        reduction: "sum" (default) or "mean" (kept to demonstrate the trap; see objective.py).
        starts: None (the law's full init grid), an (K, P) fit-space array, or natural-param dicts.
        weights: optional per-run weights (n,).
        max_iter: iteration cap of the scipy polish / reference; batch_max_iter: of the batched stage.
        n_polish: distinct best end points finished with scipy L-BFGS-B (0 = none).
        method: "batched" (default) or "scipy" (plain per-start loop, the reference).
        gtol, ftol: stopping tolerances, scipy L-BFGS-B's defaults.
        diagnose: compute the flat-direction diagnostics (a Jacobian at the optimum; cheap).

    Returns:
        FitResult (natural parameters, objective, warnings, ...).

    Raises:
        UsageError: missing columns, too few points, non-positive/NaN values, duplicate rows,
            unknown objective/reduction/method, malformed starts.
    """
    t0 = time.perf_counter()
    law = get_law(law)
    x, loss, w = diagnostics.validate_data(law, data, weights)
    if method not in ("batched", "scipy"):
        raise UsageError(f"method={method!r} is not known; choose 'batched' or 'scipy'")
    x0 = _starts_array(law, starts)
    obj = BatchObjective(law, x, loss, weights=w, objective=objective, delta=delta, reduction=reduction)
    lo, hi = (np.array(b, dtype=np.float64) for b in zip(*law.fit_bounds))
    fun = obj.numpy_fun()
    tol = dict(max_iter=max_iter, gtol=gtol, ftol=ftol)
    with fit_threads():
        if method == "batched":
            ends = _batched_then_polish(obj, fun, x0, lo, hi, batch_max_iter=batch_max_iter, n_polish=n_polish, **tol)
        else:
            ends = _scipy_per_start(fun, x0, lo, hi, **tol)
    xs, fs, its, codes, gnorm = ends
    if not np.isfinite(fs).any():
        raise UsageError(f"{law.name} fit: the objective is not finite at any start; check the data scale")
    best = int(np.nanargmin(np.where(np.isfinite(fs), fs, np.nan)))
    theta = xs[best]
    status = int(codes[best])
    warns = _fit_warnings(
        law, x, loss, w, theta, status, int(its[best]), float(gnorm[best]), xs, fs, objective, delta, diagnose
    )
    resid = obj.residuals(theta)
    alt = _distinct_best(xs, fs, 5)
    return FitResult(
        law=law.name,
        law_config=law.config(),
        params=law.to_natural(theta),
        objective=float(fs[best]),
        n_points=int(loss.size),
        inputs={**x, "loss": loss},
        warnings=warns,
        n_iter=int(its[best]),
        converged=status in (0, 1) or (status == 3 and gnorm[best] <= 1e-3),
        theta=[float(t) for t in theta],
        objective_name=objective,
        delta=float(delta),
        reduction=reduction,
        weights=w,
        n_starts=int(x0.shape[0]),
        method=method,
        residual_scale=robust_scale(resid),
        status=STATUS_TEXT[status],
        seconds=time.perf_counter() - t0,
        alt_thetas=[[float(t) for t in xs[i]] for i in alt],
        alt_objectives=[float(fs[i]) for i in alt],
    )
