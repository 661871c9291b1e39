"""Law fits for analysis: scalelab.fitting's robust fit, started well, with a warm-started bootstrap.

    point = fit_point("chinchilla", {"params": N, "tokens": D, "loss": L})       # a FitResult
    draws = bootstrap_params(point, n_boot=200, seed=0)                           # (n_boot, P) natural

The fit itself is `scalelab.fitting.fit.fit_law` (Huber on log-loss residuals, L-BFGS). Running it
from the law's whole init grid (4500 starts for Chinchilla) costs tens of seconds on a shared CPU,
and an analysis (a comparison, a report) needs a point fit plus a couple of hundred bootstrap refits
per sweep. So the point fit starts from the best few end points of a least-squares pre-fit over a
coarse grid (scipy trust-region on the same log residuals, milliseconds per start), and every
bootstrap refit starts from the point optimum and from a least-squares refit of the resample.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize

from scalelab.errors import UsageError
from scalelab.fitting.fit import fit_law
from scalelab.fitting.fit_runs import one_torch_thread
from scalelab.fitting.laws import get_law
from scalelab.fitting.objective import BatchObjective

_COARSE = {  # per fit-space name: a few starting values for the pre-fit
    "e": [0.0, 1.0],
    "a": [2.0, 6.0],
    "b": [2.0, 6.0],
    "alpha": [0.25, 0.5],
    "beta": [0.25, 0.5],
}


def _coarse_starts(law) -> np.ndarray:
    lo, hi = (np.array(b, dtype=float) for b in zip(*law.fit_bounds))
    axes = []
    for name, a, b in zip(law.fit_names, lo, hi):
        vals = _COARSE.get(name)
        if vals is None:  # e.g. power-law coefficients in compute: spread over the bound range
            vals = list(np.linspace(a + 0.2 * (b - a), a + 0.6 * (b - a), 2))
        axes.append([min(max(v, a + 1e-6), b - 1e-6) for v in vals])
    grid = np.array(list(itertools.product(*axes)), dtype=float)
    if grid.shape[0] > 64:
        grid = grid[np.linspace(0, grid.shape[0] - 1, 64).astype(int)]
    return grid


def _least_squares(law, x, loss, starts: np.ndarray, weights: np.ndarray | None) -> list[np.ndarray]:
    """End points of a squared-loss trust-region fit from each start, best first."""
    obj = BatchObjective(law, x, loss, objective="squared")
    lo, hi = (np.array(b, dtype=float) for b in zip(*law.fit_bounds))
    sw = np.sqrt(weights) if weights is not None else 1.0
    found = []
    for x0 in starts:
        x0 = np.clip(x0, lo + 1e-9, hi - 1e-9)
        try:
            sol = optimize.least_squares(
                lambda th: sw * obj.residuals(th), x0, bounds=(lo, hi), method="trf", max_nfev=200
            )
        except (ValueError, FloatingPointError):
            continue
        if np.isfinite(sol.cost):
            found.append((sol.cost, sol.x))
    found.sort(key=lambda t: t[0])
    return [x for _, x in found]


def _fit_point(law, data: Mapping[str, np.ndarray], *, weights: np.ndarray | None = None, n_starts: int = 2):
    """The robust fit (fit_law) started from the best `n_starts` distinct least-squares pre-fits.

    Distinct: end points closer than 1e-3 in every fit-space coordinate count once (the batched
    L-BFGS runs every start to its own stopping rule, so duplicates only cost time).
    """
    law = get_law(law)
    x = {k: np.array(data[k], dtype=float) for k in law.inputs}  # writable copies (torch wants them)
    loss = np.array(data["loss"], dtype=float)
    if loss.size <= law.n_params:
        raise UsageError(f"{loss.size} points cannot fit the {law.n_params} parameters of {law.name}")
    ends = _least_squares(law, x, loss, _coarse_starts(law), weights)
    distinct: list[np.ndarray] = []
    for e in ends:
        if len(distinct) < n_starts and all(np.max(np.abs(e - o)) > 1e-3 for o in distinct):
            distinct.append(e)
    starts = np.asarray(distinct) if distinct else None
    return fit_law(law, {**x, "loss": loss}, starts=starts, weights=weights, diagnose=True)


def _bootstrap_params(point, *, n_boot: int = 200, seed: int = 0, weights: np.ndarray | None = None) -> np.ndarray:
    """(n_boot, P) natural parameters from refits on runs resampled with replacement.

    Each refit starts from the point optimum and from a least-squares refit of the resample that
    itself starts there (so a resample can move along a flat ridge of the objective instead of
    staying in the point fit's basin). Resamples with no more distinct runs than the law has
    parameters are redrawn.
    """
    law = point.law_object()
    data = point.inputs
    n = int(point.n_points)
    rng = np.random.default_rng(seed)
    base_w = np.ones(n) if weights is None else np.asarray(weights, dtype=float)
    theta = np.asarray(point.theta, dtype=float)
    out = []
    while len(out) < n_boot:
        counts = np.bincount(rng.integers(0, n, n), minlength=n).astype(float)
        if np.count_nonzero(counts) <= law.n_params:
            continue
        keep = counts > 0
        sub = {k: np.array(v)[keep] for k, v in data.items()}
        w = (counts * base_w)[keep]
        ls = _least_squares(law, {k: sub[k] for k in law.inputs}, sub["loss"], theta[None, :], w)
        starts = np.asarray([theta, *ls[:1]])
        res = fit_law(law, sub, starts=starts, weights=w, diagnose=False, n_polish=1)
        out.append([res.params[p] for p in law.param_names])
    return np.asarray(out, dtype=float)


def fit_point(law, data: Mapping[str, np.ndarray], **kwargs):
    """See _fit_point; runs with one torch thread."""
    with one_torch_thread():
        return _fit_point(law, data, **kwargs)


def bootstrap_params(point, **kwargs) -> np.ndarray:
    """See _bootstrap_params; runs with one torch thread."""
    with one_torch_thread():
        return _bootstrap_params(point, **kwargs)


@dataclass(kw_only=True, slots=True)
class StoreFit:
    """A law fitted to a store's runs, with bootstrap draws and a hold-out-the-largest-budget backtest."""

    law: str
    params: dict[str, float]
    draws: np.ndarray  # (n_boot, P) natural parameters, order law.param_names
    n: np.ndarray  # the runs fitted: params, tokens, loss, flops, run ids
    d: np.ndarray
    loss: np.ndarray
    flops: np.ndarray
    run_id: list[str]
    backtest: dict | None  # fitting.backtest.BacktestResult.to_dict(), or None when not possible
    warnings: list[str] = field(default_factory=list)

    def law_object(self):
        return get_law(self.law)

    def predict(self, law_params: dict[str, float] | None = None, **inputs) -> np.ndarray:
        """The law at `inputs` (e.g. params=N, tokens=D), with the fitted or the given parameters."""
        return self.law_object().predict(law_params or self.params, **inputs)

    def draw_dicts(self) -> list[dict[str, float]]:
        names = self.law_object().param_names
        return [dict(zip(names, row)) for row in self.draws]


def store_fit_from_record(record: dict) -> StoreFit:
    """The StoreFit the plots draw, from a store fit's record (scalelab.fitting.scaling_fit.ScalingFit.to_record:
    what `sweep next` saves in fits/round_K.json), so the report shows exactly the round's fit."""
    law = get_law(record["law"])
    pts = record["points"]
    draws = np.array([[d[name] for name in law.param_names] for d in record.get("draws", [])], dtype=float)
    holdout = record.get("backtest", {}).get("holdout")
    return StoreFit(
        law=law.name,
        params=dict(record["params"]),
        draws=draws.reshape(-1, law.n_params),
        n=np.array(pts["params"], dtype=float),
        d=np.array(pts["tokens"], dtype=float),
        loss=np.array(pts["loss"], dtype=float),
        flops=np.array(pts["budgets"], dtype=float),
        run_id=list(record.get("run_ids", [])),
        backtest=holdout if holdout and "runs" in holdout else None,
        warnings=list(record.get("warnings", [])),
    )
