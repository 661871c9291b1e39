"""Nonparametric bootstrap of a law fit: resample the runs, refit, take percentile intervals.

Two ways to refit the replicates, over the same resampling of runs (integer counts w_i per run, so
replicate b minimises sum_i w_bi h(r_i(theta))):

`refit_bootstrap` (what `fit_runs`, and so `scalelab fit`, `sweep next` and the report, use): each
replicate fitted as `refit_law` fits it, from the full fit's optimum plus `BOOT_EXTRA_STARTS`
init-grid points of its own (warm starts alone keep every replicate in the full fit's basin and
understate the uncertainty); `refit_replicates` runs every replicate's batched stage as rows of one
L-BFGS, then polishes each replicate on its own runs (10x faster than a fit per replicate:
bench/refit_replicates_speed.py).
Each replicate keeps its plan (counts, starts, residuals drawn for runs added later), so
`refit_with_runs` can refit every replicate with candidate runs added, all candidates seeing the
same resamples (common random numbers: a design comparison on equal terms).

    boot = refit_bootstrap(law, data, fit, replicates=64, rng=np.random.default_rng(0), start_pool=grid)
    boot.draws                              # [{"E": ..., "alpha": ...}, ...]
    percentile_interval([d["alpha"] for d in boot.draws])

`bootstrap` (thousands of replicates, grouped resampling): every replicate as a row of one
batched L-BFGS (fitting/estimate/batched_lbfgs.py) from the warm start plus `n_extra_starts` more (the full fit's
next-best distinct end points, else init-grid points). Because the warm start is close, the
stopping rules must be tight (gtol 1e-9, ftol 1e-14); see `bootstrap`.

    boot = bootstrap("chinchilla", data, fit, n_boot=1000)
    boot.interval("alpha")                 # 95% percentile interval
    boot.interval("a_opt")                 # compute-optimal exponent beta / (alpha + beta)
    boot.prediction_interval(0.95, params=7e10, tokens=1.4e12)   # (median, lo, hi) for L

Percentile intervals: scalelab.fitting.estimate.intervals.percentile_interval.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scalelab.errors import UsageError
from scalelab.fitting.estimate import batch_memo, diagnostics
from scalelab.fitting.estimate.fit import BATCH_MAX_ITER, POLISH_MAX_ITER, FitResult, fit_law, fit_threads, polish
from scalelab.fitting.estimate.intervals import default_derived, percentile_interval
from scalelab.fitting.estimate.objective import BatchObjective
from scalelab.fitting.forms.laws import Law, get_law


@dataclass(kw_only=True)
class BootstrapResult:
    """Replicate estimates (natural parameters and derived quantities) and their intervals."""

    law: str
    law_config: dict[str, Any]
    param_names: tuple[str, ...]
    estimates: dict[str, float]  # full-data fit, parameters and derived quantities
    samples: dict[str, np.ndarray]  # name -> (n_boot,) replicate values
    theta_samples: np.ndarray  # (n_boot, P) fit-space replicate optima
    converged: np.ndarray  # (n_boot,) bool: the replicate's best start met a stopping tolerance
    n_boot: int
    grouped: bool
    seed: int
    residual_scale: float  # robust sd of the full-data log residuals (noise for prediction intervals)
    seconds: float = 0.0
    derived_names: tuple[str, ...] = field(default_factory=tuple)

    def interval(self, name: str, level: float = 0.95) -> tuple[float, float]:
        """Percentile interval of a parameter or derived quantity."""
        if name not in self.samples:
            raise UsageError(f"bootstrap has no quantity {name!r}; known: {sorted(self.samples)}")
        return percentile_interval(self.samples[name], level)

    def intervals(self, level: float = 0.95) -> dict[str, tuple[float, float]]:
        return {k: self.interval(k, level) for k in self.samples}

    def param_samples(self) -> list[dict[str, float]]:
        """Replicates as natural-parameter dicts (e.g. for allocation intervals)."""
        return [{p: float(self.samples[p][b]) for p in self.param_names} for b in range(self.n_boot)]

    def prediction_interval(
        self, level: float = 0.95, *, include_noise: bool = True, seed: int = 0, **inputs: Any
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(median, lo, hi) of the predicted loss at the inputs.

        With include_noise (a prediction interval for a new run) each replicate's prediction is
        multiplied by exp(sigma z), sigma the fit's robust log-residual scale; without it, the
        interval covers the law's mean loss only (a confidence interval).
        """
        law = get_law(self.law, **self.law_config)
        preds = np.stack([law.predict(th, **inputs) for th in law.to_natural_array(self.theta_samples)])
        if include_noise:
            rng = np.random.default_rng(seed)
            preds = preds * np.exp(self.residual_scale * rng.standard_normal(preds.shape))
        lo, hi = percentile_interval(preds, level)
        return np.nanmedian(preds, axis=0), lo, hi

    def to_dict(self, level: float = 0.95) -> dict[str, Any]:
        """JSON-safe summary: estimates and percentile intervals (not the samples)."""
        return {
            "n_boot": self.n_boot,
            "grouped": self.grouped,
            "seed": self.seed,
            "level": level,
            "estimates": dict(self.estimates),
            "intervals": {k: list(v) for k, v in self.intervals(level).items()},
            "converged_fraction": float(np.mean(self.converged)),
        }


def resample_counts(
    n: int, n_boot: int, rng: np.random.Generator, groups: np.ndarray | None = None, keep: Sequence[Any] = ()
) -> np.ndarray:
    """(n_boot, n) integer counts: rows drawn with replacement, or whole groups when groups is given.

    Groups listed in `keep` enter every replicate once (a conditional bootstrap: e.g. the run whose
    own prefix a prediction is conditioned on); the other groups are resampled among themselves.
    """
    if groups is None:
        idx = rng.integers(0, n, size=(n_boot, n))
        counts = np.zeros((n_boot, n))
        np.add.at(counts, (np.repeat(np.arange(n_boot), n), idx.reshape(-1)), 1.0)
        return counts
    labels, inverse = np.unique(np.asarray(groups), return_inverse=True)
    fixed = np.isin(labels, np.asarray(list(keep), dtype=labels.dtype)) if len(keep) else np.zeros(labels.size, bool)
    free = np.flatnonzero(~fixed)
    g = free.size
    if g < 1 or labels.size < 2:
        raise UsageError("grouped bootstrap needs at least 2 distinct groups, one of them resampled")
    draws = free[rng.integers(0, g, size=(n_boot, g))]
    gcounts = np.zeros((n_boot, labels.size))
    np.add.at(gcounts, (np.repeat(np.arange(n_boot), g), draws.reshape(-1)), 1.0)
    gcounts[:, fixed] = 1.0
    return gcounts[:, inverse]


def _group_labels(data: Mapping[str, Any], groups, n: int):
    """`groups` as given, or the data column it names; UsageError unless one label per run."""
    if isinstance(groups, str):
        if groups not in data:
            raise UsageError(f"groups={groups!r} is not a data column; columns: {list(data.keys())}")
        groups = np.asarray(data[groups])
    if groups is not None and np.asarray(groups).shape != (n,):
        raise UsageError(f"groups must have one label per run ({n}), got shape {np.asarray(groups).shape}")
    return groups


def _replicate_starts(law: Law, fit: FitResult, n_boot: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """(n_boot, k, P) fit-space starts: the full fit's optimum, its other distinct end points (other
    basins), then init-grid points drawn from `rng`."""
    extra = [np.asarray(t) for t in fit.alt_thetas[1:]]
    grid = law.init_grid()
    starts = np.empty((n_boot, k, law.n_params))
    starts[:, 0] = np.asarray(fit.theta)
    for j in range(1, k):
        if j - 1 < len(extra):
            starts[:, j] = extra[j - 1]
        else:
            starts[:, j] = grid[rng.integers(0, grid.shape[0], size=n_boot)]
    return starts


def _replicate_rows(law: Law, x, losses, weights, starts, lo, hi, *, objective, delta, reduction="sum", **tol):
    """Every replicate's every start as a row of one batched L-BFGS: row b*k + j is replicate b's
    start j, weighted by weights[b] (R, n) and fitted to losses[b] where losses is (R, n) (shared
    where it is (n,)). `tol`: lbfgs_batched's max_iter, gtol, ftol."""
    k = starts.shape[1]
    obj = BatchObjective(
        law,
        x,
        losses if losses.ndim == 1 else np.repeat(losses, k, axis=0),
        weights=np.repeat(weights, k, axis=0),
        objective=objective,
        delta=delta,
        reduction=reduction,
    )
    return batch_memo.solve(obj, starts.reshape(-1, law.n_params), lo, hi, **tol)


def _fit_replicates(law: Law, x, loss, fit: FitResult, counts, starts, *, max_iter, gtol, ftol):
    """Every replicate's every start as a row of one batched L-BFGS (weights: the replicate's
    counts); each replicate's best end point (fit space) and whether it converged."""
    n_boot, k = starts.shape[:2]
    lo, hi = (np.array(b, dtype=np.float64) for b in zip(*law.fit_bounds))
    with fit_threads():
        res = _replicate_rows(
            law,
            x,
            loss,
            counts,
            starts,
            lo,
            hi,
            objective=fit.objective_name,
            delta=fit.delta,
            reduction=fit.reduction,
            max_iter=max_iter,
            gtol=gtol,
            ftol=ftol,
        )
    f = np.where(np.isfinite(res.f), res.f, np.inf).reshape(n_boot, k)
    best = np.argmin(f, axis=1)
    pick = np.arange(n_boot) * k + best
    converged = np.isin(res.status[pick], (0, 1)) | ((res.status[pick] == 3) & (res.grad_norm[pick] <= 1e-3))
    return res.x[pick], converged


def bootstrap(
    law: Law | str,
    data: Mapping[str, Any],
    fit: FitResult,
    n_boot: int = 1000,
    groups: Sequence[Any] | np.ndarray | str | None = None,
    seed: int = 0,
    derived: Mapping[str, Callable[[Mapping[str, float]], float]] | None = None,
    *,
    keep_groups: Sequence[Any] = (),
    n_extra_starts: int = 2,
    flops_budgets: Sequence[float] = (),
    max_iter: int = 2000,
    gtol: float = 1e-9,
    ftol: float = 1e-14,
) -> BootstrapResult:
    """Bootstrap a fit: resample runs (or groups), refit every replicate in one batched L-BFGS.

    Args:
        law: the law the fit used (name or object; the fit's law_config is applied to a name).
        data: the fit's data (law.inputs + "loss").
        fit: the full-data FitResult (warm start; its objective settings are reused).
        n_boot: number of replicates.
        groups: None (resample runs), an array of labels (n,), or the name of an input column
            (e.g. "params" to resample whole model sizes).
        seed: random seed of the resampling.
        keep_groups: groups present once in every replicate (see resample_counts).
        derived: extra quantities fn(natural params) -> float; defaults per law (Chinchilla:
            a_opt, b_opt and tokens_per_param at `flops_budgets`).
        n_extra_starts: starts added to the warm start per replicate: the full fit's next-best
            distinct end points (FitResult.alt_thetas), then random init-grid points.
        max_iter, gtol, ftol: stopping rules of the batched optimiser. Deliberately much tighter
            than scipy's defaults: a warm-started replicate begins next to its optimum, and with
            ftol = 2.2e-9 it stops almost at once, so the replicates barely move and the intervals
            come out ~10x too narrow (measured: sd(alpha) 0.001 vs 0.013 on 240 runs, 1% noise).

    Returns:
        BootstrapResult.

    Raises:
        UsageError: bad data (as fit_law), groups of the wrong length or fewer than 2 groups.
    """
    t0 = time.perf_counter()
    law = get_law(law, **fit.law_config) if isinstance(law, str) else law
    x, loss, w_fit = diagnostics.validate_data(law, data, fit.weights)
    groups = _group_labels(data, groups, loss.size)
    rng = np.random.default_rng(seed)
    counts = resample_counts(loss.size, n_boot, rng, None if groups is None else np.asarray(groups), keep=keep_groups)
    if w_fit is not None:
        counts = counts * w_fit[None, :]
    starts = _replicate_starts(law, fit, n_boot, 1 + n_extra_starts, rng)
    theta_s, converged = _fit_replicates(law, x, loss, fit, counts, starts, max_iter=max_iter, gtol=gtol, ftol=ftol)
    nat = law.to_natural_array(theta_s)
    samples = {p: nat[:, j] for j, p in enumerate(law.param_names)}
    dfun = dict(default_derived(law, flops_budgets)) if derived is None else dict(derived)
    estimates = dict(fit.params)
    for name, fn in dfun.items():
        samples[name] = np.array([fn(dict(zip(law.param_names, row))) for row in nat], dtype=np.float64)
        estimates[name] = float(fn(fit.params))
    return BootstrapResult(
        law=law.name,
        law_config=law.config(),
        param_names=law.param_names,
        estimates=estimates,
        samples=samples,
        theta_samples=theta_s,
        converged=converged,
        n_boot=n_boot,
        grouped=groups is not None,
        seed=seed,
        residual_scale=fit.residual_scale,
        seconds=time.perf_counter() - t0,
        derived_names=tuple(dfun),
    )


BOOT_EXTRA_STARTS = 8  # grid starts added to the warm start in each replicate of refit_bootstrap
MAX_ADDED = 2  # runs refit_with_runs can add (a residual is drawn for each in advance)


@dataclass(kw_only=True, slots=True)
class Replicate:
    """One resample of refit_bootstrap, kept so that it can be refitted with runs added."""

    counts: np.ndarray  # (n,) times each run was drawn
    starts: np.ndarray  # (K, P) fit-space starts: the full fit's optimum, then grid points
    added_residuals: np.ndarray  # (MAX_ADDED,) log residuals for runs added later (refit_with_runs)


@dataclass(kw_only=True, slots=True)
class RefitBootstrap:
    draws: list[dict[str, float]]  # natural parameters of every replicate that could be fitted
    plan: list[Replicate]  # every replicate drawn, fitted or not
    n_failed: int  # degenerate resamples (too few distinct runs) left out of `draws`


REFIT_TOLERANCES = {"gtol": 1e-9, "ftol": 1e-14}  # see refit_law


def refit_law(law: Law, data: Mapping[str, np.ndarray], starts: np.ndarray, weights=None, **fit_kwargs) -> FitResult:
    """The refit of a bootstrap replicate or a backtest fold: fit_law from `starts`, one polish, no
    diagnostics (the point fit already reported them), run to tight tolerances. A summed Huber loss
    on log residuals is ~1e-5 near its optimum and so is its gradient: with L-BFGS-B's default
    gtol (1e-5) a refit started at the full fit's optimum stops there, so replicates would not
    spread and a backtest fold would score the full fit, not its own."""
    return fit_law(
        law, data, starts=starts, weights=weights, diagnose=False, n_polish=1, **{**REFIT_TOLERANCES, **fit_kwargs}
    )


def refit_replicates(
    law: Law,
    inputs: Mapping[str, np.ndarray],
    losses: np.ndarray,
    keep: np.ndarray,
    weights: np.ndarray,
    starts: np.ndarray,
    *,
    objective: str = "huber",
    delta: float = 1e-3,
) -> list[dict[str, float] | None]:
    """Replicate r refitted as `refit_law` would fit its runs, every replicate's batched stage in one
    L-BFGS (a batched iteration costs about the same for 9 rows as for 500, so this is where a
    bootstrap's time went).

    Replicate r fits the runs where keep[r] (losses[r], weights weights[r]) from starts[r] (K, P).
    Stage 1 runs every replicate's every start as a row of one batched L-BFGS (rows are independent
    problems), a replicate's other runs at weight 0; stage 2 polishes each replicate's best end
    point with scipy on its own runs, as fit_law does. Runs at weight 0 change only the rounding of
    the sums, but where a resample's optimum is a flat valley or has several basins that is enough
    to end elsewhere: in bench/refit_replicates_speed.py the median replicate reaches refit_law's
    objective to within 1e-9, and a few in forty end in another basin, as often lower as higher.

    Returns each replicate's natural parameters; None where fit_law would refuse the replicate's
    runs (a degenerate resample: too few distinct runs) or no start has a finite objective.
    """
    n_rep, k = starts.shape[:2]
    subsets = {}  # replicate -> its runs, as fit_law validates them
    for r in range(n_rep):
        sub = {**{name: v[keep[r]] for name, v in inputs.items()}, "loss": losses[r][keep[r]]}
        with contextlib.suppress(UsageError):
            subsets[r] = diagnostics.validate_data(law, sub, weights[r][keep[r]])
    valid = list(subsets)
    out: list[dict[str, float] | None] = [None] * n_rep
    if not valid:
        return out
    lo, hi = (np.array(b, dtype=np.float64) for b in zip(*law.fit_bounds))
    tol = REFIT_TOLERANCES
    with fit_threads():
        batch = _replicate_rows(
            law,
            inputs,
            losses[valid],
            np.where(keep, weights, 0.0)[valid],
            starts[valid],
            lo,
            hi,
            objective=objective,
            delta=delta,
            max_iter=BATCH_MAX_ITER,
            **tol,
        )
        for i, r in enumerate(valid):
            x, y, w = subsets[r]
            fun = BatchObjective(law, x, y, weights=w, objective=objective, delta=delta).numpy_fun()
            res = batch.rows(slice(i * k, (i + 1) * k))
            xs, fs = polish(fun, res, lo, hi, n_polish=1, max_iter=POLISH_MAX_ITER, **tol)[:2]
            if np.isfinite(fs).any():
                out[r] = dict(law.to_natural(xs[int(np.nanargmin(np.where(np.isfinite(fs), fs, np.nan)))]))
    return out


def refit_bootstrap(
    law: Law,
    data: Mapping[str, np.ndarray],
    fit: FitResult,
    *,
    replicates: int,
    rng: np.random.Generator,
    start_pool: np.ndarray,
    weights: np.ndarray | None = None,
    **fit_kwargs: Any,
) -> RefitBootstrap:
    """Resample the runs `replicates` times and refit each resample (module docstring).

    Per replicate, in this order from `rng`: the counts (n draws with replacement), BOOT_EXTRA_STARTS
    rows of `start_pool` (beside the full fit's optimum), and MAX_ADDED of the fit's log residuals
    (for refit_with_runs). The replicate's weights are its counts times `weights`.

    Args:
        law, data: the law and its data (law.inputs + "loss"), as fitted by `fit`.
        fit: the full-data fit (its parameters are every replicate's first start).
        rng: the generator the caller's other draws (starts, backtests) share.
        start_pool: fit-space rows the extra starts are drawn from (the point fit's starts).
        fit_kwargs: objective, delta of the point fit.
    """
    y = np.asarray(data["loss"], dtype=float)
    inputs = {k: np.asarray(data[k], dtype=float) for k in law.inputs}
    warm = law.to_fit(fit.params)[None, :]
    log_resid = np.log(y) - np.log(law.predict(fit.params, **inputs))
    k = min(BOOT_EXTRA_STARTS, len(start_pool))
    plan = []
    for _ in range(replicates):
        counts = np.bincount(rng.integers(0, y.size, y.size), minlength=y.size).astype(float)
        starts = np.vstack([warm, start_pool[rng.choice(len(start_pool), k, replace=False)]])
        plan.append(Replicate(counts=counts, starts=starts, added_residuals=rng.choice(log_resid, size=MAX_ADDED)))
    counts = np.stack([rep.counts for rep in plan])
    fitted = refit_replicates(
        law,
        inputs,
        np.broadcast_to(y, counts.shape),
        counts > 0,
        counts if weights is None else counts * weights,
        np.stack([rep.starts for rep in plan]),
        **fit_kwargs,
    )
    draws = [p for p in fitted if p is not None]  # None: a degenerate resample (too few distinct points)
    return RefitBootstrap(draws=draws, plan=plan, n_failed=len(fitted) - len(draws))


def refit_with_runs(
    law: Law,
    data: Mapping[str, np.ndarray],
    plan: Sequence[Replicate],
    added: Mapping[str, Sequence[float]],
    predicted: Sequence[float],
    *,
    weights: np.ndarray | None = None,
    **fit_kwargs: Any,
) -> list[dict[str, float]]:
    """Every replicate of `plan` refitted with runs added (inputs `added`, at most MAX_ADDED runs),
    each at its `predicted` loss times exp of the residual the replicate drew for it in advance.
    Replicates that cannot be fitted are left out."""
    if not plan:
        return []
    y = np.asarray(data["loss"], dtype=float)
    inputs = {k: np.append(np.asarray(data[k], dtype=float), added[k]) for k in law.inputs}
    m = len(predicted)
    losses = np.stack([np.append(y, [p * math.exp(e) for p, e in zip(predicted, rep.added_residuals)]) for rep in plan])
    counts = np.stack([rep.counts for rep in plan])
    w = counts if weights is None else counts * weights
    fitted = refit_replicates(
        law,
        inputs,
        losses,
        np.hstack([counts > 0, np.ones((len(plan), m), bool)]),
        np.hstack([w, np.ones((len(plan), m))]),
        np.stack([rep.starts for rep in plan]),
        **fit_kwargs,
    )
    return [p for p in fitted if p is not None]
