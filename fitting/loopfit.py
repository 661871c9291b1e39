"""The closed loop's fit: one law fit with its bootstrap, backtests, gates and prediction intervals.

    lf = fit_for_loop(params=N, tokens=D, loss=L, budgets=C, law="chinchilla", replicates=64)
    lf.params, lf.intervals["alpha"], lf.gates.passed, lf.gates.failed
    lf.predict_interval(n, d)              # PredictionInterval: point, lo, hi, parts
    lf.optimum(flops)                      # (N*, D*, L*) of the point fit

Pure (arrays in, a LoopFit out): `scalelab sweep next`, the report and the demo all show this one
fit, so they agree on every number.

1. Fit: Huber on log loss, summed (scalelab.fitting.fit.fit_law), from `starts` rows of the law's
   init grid drawn at random with `seed` (the full 4500-start grid finds the same optimum on
   these tables and takes minutes on a laptop).
2. Bootstrap: R multinomial reweightings of the runs, each refitted from the full fit and
   `BOOT_EXTRA_STARTS` grid points of its own (warm starts alone keep every replicate in the full
   fit's basin and understate the uncertainty). Percentile intervals for every parameter and for
   a = beta / (alpha + beta).
3. Backtests: hold out the largest budget; and leave each budget out in turn when there are >= 3.
   Each fold records its training FLOP range, so the folds that extrapolate give the law's
   out-of-sample error per decade (scalelab.fitting.predictive).
4. Gates (scalelab.fitting.gates) at the target budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scalelab.errors import UsageError
from scalelab.fitting import gates as gates_mod
from scalelab.fitting.allocate import optimum_for_law
from scalelab.fitting.approaches import group_budgets
from scalelab.fitting.fit import FitResult, fit_law
from scalelab.fitting.laws import Law, get_law
from scalelab.fitting.predictive import (
    ExtrapolationError,
    PredictionInterval,
    decades_outside,
    extrapolation_error,
    prediction_interval,
)

FIT_STARTS = 200  # starts drawn from the law's init grid for the full fit
BOOT_EXTRA_STARTS = 8  # grid starts added to the warm start in each bootstrap refit
BACKTEST_STARTS = 16  # grid starts added to the warm start in each backtest refit
LEVEL = 0.95
MAX_ADDED = 2  # runs `replicates_with` can add (the compute-optimal run plus one candidate)


def optimum_fn(law: Law):
    """(params, flops) -> (N*, D*, L*) under C = 6 N D for a law of params and tokens."""
    opt = optimum_for_law(law)
    return lambda p, c: opt(p, c)[:3]


def _fit(law: Law, params, tokens, loss, starts, weights=None) -> FitResult:
    data = {"params": np.asarray(params, float), "tokens": np.asarray(tokens, float), "loss": np.asarray(loss, float)}
    return fit_law(law, data, starts=starts, weights=weights, diagnose=False, n_polish=1)


@dataclass(kw_only=True)
class LoopFit:
    law: Law
    fit: FitResult
    params: dict[str, float]
    draws: list[dict[str, float]]  # bootstrap parameter replicates
    intervals: dict[str, list[float]]  # percentile intervals: parameters and "a"
    backtest: dict[str, Any]  # {"holdout": {...}, "leave_one_budget_out": {...}}
    extrapolation: ExtrapolationError
    gates: gates_mod.GateReport
    target_flops: float
    n: np.ndarray
    d: np.ndarray
    loss: np.ndarray
    budgets: np.ndarray
    run_ids: list[str] = field(default_factory=list)
    level: float = LEVEL
    noise_floor: float = 0.0  # log-sd of run-to-run noise measured elsewhere (fit.noise_floor)
    selection: dict[str, Any] | None = None  # fit.law auto: every candidate's backtest and the choice
    boot_plan: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list, repr=False)
    # per replicate: (run weights, refit starts, log-residuals drawn for added points)

    @property
    def residual_scale(self) -> float:
        """The log-sd of a new run's loss around the law: the largest of the robust sd of the fit's
        log residuals scaled by sqrt(n / (n - p)) (a law of p parameters fitted to n runs sits
        closer to them than a new run will), the pooled sd of seed replicates in the table, and the
        stated noise floor (a seed study's figure: runs of one sweep share their data order, so
        their residuals understate the noise of a run that sees other data)."""
        n, p = self.loss.size, self.law.n_params
        fitted = float(self.fit.residual_scale) * math.sqrt(n / max(n - p, 1))
        return max(fitted, replicate_noise(self.n, self.d, self.loss), self.noise_floor)

    def optimum(self, flops: float, params: dict[str, float] | None = None) -> tuple[float, float, float]:
        n, d, loss = optimum_fn(self.law)(params or self.params, flops)[:3]
        return float(n), float(d), float(loss)

    def predict(self, n, d, params: dict[str, float] | None = None) -> np.ndarray:
        return self.law.predict(params or self.params, params=np.asarray(n, float), tokens=np.asarray(d, float))

    def decades(self, flops: float) -> float:
        """How far `flops` lies outside the fitted budgets, in decades."""
        return decades_outside(flops, (float(self.budgets.min()), float(self.budgets.max())))

    def predict_interval(self, n: float, d: float, flops: float | None = None) -> PredictionInterval:
        """Point prediction at (N, D) and its interval: bootstrap + run noise + extrapolation error."""
        reps = np.array([float(self.predict(n, d, p)) for p in self.draws])
        return prediction_interval(
            float(self.predict(n, d)),
            reps,
            residual_scale=self.residual_scale,
            extrapolation=self.extrapolation,
            decades=self.decades(flops if flops is not None else 6.0 * n * d),
            level=self.level,
        )

    def optimum_interval(self, flops: float) -> PredictionInterval:
        """The compute-optimal loss L*(C) with the same three-part interval."""
        point = self.optimum(flops)[2]
        reps = []
        for p in self.draws:
            try:
                reps.append(self.optimum(flops, p)[2])
            except UsageError:
                continue
        return prediction_interval(
            point,
            np.array(reps),
            residual_scale=self.residual_scale,
            extrapolation=self.extrapolation,
            decades=self.decades(flops),
            level=self.level,
        )

    def replicates_with(self, extra: list[tuple[float, float]]) -> list[dict[str, float]]:
        """The bootstrap replicates refitted with extra (N, D) runs added, each at its predicted loss
        times a residual drawn from the fit's own log-residuals (common random numbers: every call
        sees the same resamples and draws, so two candidate sets are compared on equal terms)."""
        preds = [float(self.predict(n, d)) for n, d in extra]
        out = []
        for w, starts, eps in self.boot_plan:
            keep = w > 0
            n = np.append(self.n[keep], [p[0] for p in extra])
            d = np.append(self.d[keep], [p[1] for p in extra])
            y = np.append(self.loss[keep], [pred * math.exp(e) for pred, e in zip(preds, eps)])
            wt = np.append(w[keep], np.ones(len(extra)))
            try:
                out.append(dict(_fit(self.law, n, d, y, starts, wt).params))
            except UsageError:
                continue
        return out

    def to_dict(self) -> dict[str, Any]:
        """The JSON a round's fit file and the ledger keep."""
        return {
            "law": self.law.name,
            "params": dict(self.params),
            "intervals": self.intervals,
            "a": self.params["beta"] / (self.params["alpha"] + self.params["beta"])
            if {"alpha", "beta"} <= set(self.params)
            else None,
            "objective": float(self.fit.objective),
            "n_points": int(self.loss.size),
            "residual_scale": self.residual_scale,
            "noise_floor": self.noise_floor,
            "warnings": list(self.fit.warnings),
            "backtest": self.backtest,
            "extrapolation": self.extrapolation.to_dict(),
            "gates": self.gates.to_dict(),
            "target_flops": self.target_flops,
            "replicates": len(self.draws),
            "draws": [dict(p) for p in self.draws],
            "level": self.level,
            "run_ids": list(self.run_ids),
            "points": {
                "params": self.n.tolist(),
                "tokens": self.d.tolist(),
                "loss": self.loss.tolist(),
                "budgets": self.budgets.tolist(),
            },
            "method": "Huber (delta 1e-3) on log loss, summed; L-BFGS from grid starts; bootstrap reweighting "
            "of runs with warm + grid starts; intervals on predictions add run noise and the backtests' "
            "out-of-sample error per decade of extrapolation",
        }


def replicate_noise(n: np.ndarray, d: np.ndarray, loss: np.ndarray) -> float:
    """Pooled sd of log loss over runs sharing (N, D) (seed replicates); 0 when there are none."""
    groups: dict[tuple[float, float], list[float]] = {}
    for a, b, y in zip(n, d, loss):
        groups.setdefault((float(a), float(b)), []).append(math.log(y))
    sq, dof = 0.0, 0
    for vals in groups.values():
        if len(vals) > 1:
            sq += float(np.sum((np.array(vals) - np.mean(vals)) ** 2))
            dof += len(vals) - 1
    return math.sqrt(sq / dof) if dof else 0.0


def _percentile(values: np.ndarray, level: float) -> list[float]:
    values = values[np.isfinite(values)]
    if values.size < 2:
        return [float("nan"), float("nan")]
    lo, hi = np.quantile(values, [0.5 - level / 2, 0.5 + level / 2])
    return [float(lo), float(hi)]


def _backtests(law: Law, n, d, loss, budgets, starts_fn) -> dict[str, Any]:
    """Hold-out-the-largest and leave-one-budget-out, each fold with its training FLOP range."""
    labels = group_budgets(budgets)
    uniq = np.unique(labels)
    out: dict[str, Any] = {}

    def fold(test_mask) -> dict[str, Any] | None:
        train = ~test_mask
        if train.sum() <= law.n_params or len(np.unique(labels[train])) < 2:
            return None
        f = _fit(law, n[train], d[train], loss[train], starts_fn())
        pred = law.predict(f.params, params=n[test_mask], tokens=d[test_mask])
        rel = (pred - loss[test_mask]) / loss[test_mask]
        return {
            "train_range": [float(budgets[train].min()), float(budgets[train].max())],
            "n_train": int(train.sum()),
            "runs": [
                {"flops": float(c), "observed": float(o), "predicted": float(p), "rel_error": float(r)}
                for c, o, p, r in zip(budgets[test_mask], loss[test_mask], pred, rel)
            ],
        }

    def summary(protocol: str, folds: list[dict[str, Any]]) -> dict[str, Any]:
        runs = [r for f in folds for r in f["runs"]]
        rel = np.array([r["rel_error"] for r in runs])
        return {
            "protocol": protocol,
            "mare": float(np.mean(np.abs(rel))),
            "bias": float(np.mean(rel)),
            "n_test": len(runs),
            "n_train": min(f["n_train"] for f in folds),
            "runs": runs,
            "folds": [{"flops": r["flops"], "train_range": f["train_range"]} for f in folds for r in f["runs"]],
        }

    largest = labels == uniq.max()
    f = fold(largest)
    if f is not None:
        out["holdout"] = dict(summary("holdout", [f]), train_range=f["train_range"])
        out["holdout"]["extrapolation_decades"] = float(math.log10(budgets[largest].max() / f["train_range"][1]))
    else:
        out["holdout"] = {"skipped": "too few runs below the largest budget"}
    if len(uniq) >= 3:
        folds = [g for g in (fold(labels == lab) for lab in uniq) if g is not None]
        if folds:
            out["leave_one_budget_out"] = summary("leave_one_budget_out", folds)
    return out


def fit_for_loop(
    *,
    params,
    tokens,
    loss,
    budgets=None,
    law: str | Law = "chinchilla",
    replicates: int = 64,
    seed: int = 0,
    target_flops: float | None = None,
    starts: int = FIT_STARTS,
    run_ids=None,
    level: float = LEVEL,
    plausible=gates_mod.PLAUSIBLE_EXPONENTS,
    noise_floor: float = 0.0,
) -> LoopFit:
    """Fit, bootstrap, backtest and gate a table of IsoFLOP runs (module docstring).

    Args:
        params, tokens, loss: per run (N total parameters, D tokens, final loss).
        budgets: per run FLOP budget labels (IsoFLOP); default 6 N D.
        replicates: bootstrap replicates (0 = none; intervals then cover noise and extrapolation only).
        target_flops: where the starts gate compares N* and L* (default: 3x the largest budget).
        noise_floor: run-to-run log-sd from a seed study (the spec's fit.noise_floor), a lower
            bound of the noise term of prediction intervals.
    Raises:
        UsageError: fewer runs than the law has parameters + 1, or a law not of (N, D).
    """
    law = get_law(law)
    n, d, y = (np.asarray(a, dtype=float).copy() for a in (params, tokens, loss))
    c = 6.0 * n * d if budgets is None else np.asarray(budgets, dtype=float).copy()
    if y.size <= law.n_params:
        raise UsageError(f"{y.size} runs is too few to fit {law.name} ({law.n_params} parameters)")
    rng = np.random.default_rng(seed)
    grid = law.init_grid()
    grid = grid[rng.choice(len(grid), min(starts, len(grid)), replace=False)]
    fit = _fit(law, n, d, y, grid)
    point = dict(fit.params)
    warm = law.to_fit(point)[None, :]

    def extra_starts(k: int) -> np.ndarray:
        return np.vstack([warm, grid[rng.choice(len(grid), k, replace=False)]])

    log_resid = np.log(y) - np.log(law.predict(point, params=n, tokens=d))
    draws: list[dict[str, float]] = []
    plan = []
    for _ in range(replicates):
        w = np.bincount(rng.integers(0, y.size, y.size), minlength=y.size).astype(float)
        starts_r = extra_starts(BOOT_EXTRA_STARTS)
        plan.append((w, starts_r, rng.choice(log_resid, size=MAX_ADDED)))
        keep = w > 0
        try:
            rep = _fit(law, n[keep], d[keep], y[keep], starts_r, w[keep])
        except UsageError:
            continue  # a degenerate resample (too few distinct points)
        draws.append(dict(rep.params))
    intervals = {}
    for name in law.param_names:
        intervals[name] = _percentile(np.array([p[name] for p in draws]), level)
    if {"alpha", "beta"} <= set(law.param_names):
        intervals["a"] = _percentile(np.array([p["beta"] / (p["alpha"] + p["beta"]) for p in draws]), level)
    backtest = _backtests(law, n, d, y, c, lambda: extra_starts(BACKTEST_STARTS))
    extrap = extrapolation_error(bt for bt in backtest.values() if "runs" in bt)
    target = float(target_flops or 3.0 * c.max())
    report = gates_mod.check_gates(
        law,
        point,
        fit.theta,
        fit.alt_thetas,
        fit.alt_objectives,
        optimum_fn(law),
        n=n,
        loss=y,
        flops=c,
        target_flops=target,
        plausible=plausible,
    )
    return LoopFit(
        law=law,
        fit=fit,
        params=point,
        draws=draws,
        intervals=intervals,
        backtest=backtest,
        extrapolation=extrap,
        gates=report,
        target_flops=target,
        n=n,
        d=d,
        loss=y,
        budgets=c,
        run_ids=[str(r) for r in (run_ids if run_ids is not None else range(y.size))],
        level=level,
        noise_floor=float(noise_floor),
        boot_plan=plan,
    )
