"""Loss-curve fits: one law fitted on every logged checkpoint of every run, and what it predicts.

    curves = [RunCurve(run_id="r1", params=5e4, lr=lr_per_step, tokens_per_step=1024,
                       steps=logged_steps, loss=logged_losses), ...]
    cf = fit_curves(curves, law="lr_annealing")
    cf.predict(curve)                       # loss at every step of the run's whole schedule
    cf.predict_final(curve)                 # at its last step: a prefix predicts its end, a
                                            # stable run's fit predicts a cooldown branch, ...
    cf.final_interval(curve, n_boot=64)     # percentile interval, resampling whole runs

A RunCurve carries the LR of *every* step of its schedule (planned where the run is unfinished or
is a branch never trained) and the losses logged so far; the areas S1 and S2 of fitting/loss_curves/lr_areas.py
turn it into the inputs of the curve laws ("lr_annealing", "lr_area"). The same machinery fits the
(N, D) laws on checkpoints ("chinchilla" on every checkpoint: inputs params and tokens).

Points. Each run contributes its logged losses after its warmup and after `drop_first` of its
schedule (Choshen et al. 2025: the first ~10% of training mislead a fit), in at most
`max_points_per_run` groups of consecutive logged steps: a group's loss is the geometric mean and
its inputs the mean areas, so thousands of noisy per-step losses become a few dozen precise points.

Weights (the noise analysis as a random-intercept model). A point's log loss has variance
sigma_i^2 (the evaluation noise: the stderr of an eval, else the run's step-to-step scatter
1.4826 MAD(diff log L) / sqrt 2, divided by the group size) and every point of a run shares that
run's offset, of variance sigma_run^2 (seed-to-seed noise). The weight 1 / (sigma_i^2 + n_r sigma_run^2)
(n_r points in the run) is the GLS weight of that model: points count by their precision, and no
run counts for more than its own seed noise allows, however many checkpoints it logged.

Fit. Every law here is linear in its coefficients once its exponents (and the annealing momentum)
are fixed, so a grid over the exponents with a non-negative least-squares solve for the
coefficients (variable projection) finds the basins; the best few grid points then start
fitting.estimate.fit.fit_law (Huber on log loss, the weights above). The momentum `decay` of S2 is
profiled over DECAYS (the objective picks it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
from scipy import optimize

from scalelab.errors import UsageError
from scalelab.fitting.estimate.fit import FitResult, fit_law
from scalelab.fitting.estimate.intervals import percentile_interval, robust_scale
from scalelab.fitting.forms.laws import Law, get_law
from scalelab.fitting.loss_curves.lr_areas import lr_areas, warmup_end
from scalelab.fitting.uncertainty.bootstrap import bootstrap

DECAYS = (0.9, 0.97, 0.99, 0.995, 0.999)  # momentum lambdas profiled for the annealing area
CURVE_INPUTS = ("params", "tokens", "flops", "s1", "s2")
SIGMA_RUN = 0.005  # default seed-to-seed sd of log loss between runs (0.5%)
EXPONENT_GRID = np.geomspace(0.02, 2.0, 24)  # alpha, beta values of the variable-projection grid
GAMMA_GRID = np.linspace(-0.6, 0.9, 11)  # size exponents of the data term (lr_annealing_sized)
TOP_STARTS = 6  # grid points that start the L-BFGS fit (per decay tried)


@dataclass(kw_only=True)
class RunCurve:
    """One run's schedule and logged losses.

    Attributes:
        run_id: the run's name.
        params: its parameter count N.
        lr: (T,) the LR of every optimizer step 1..T of the whole schedule.
        steps: (n,) the steps (1-based, <= T) whose loss was logged.
        loss: (n,) the logged losses (> 0).
        tokens_per_step: tokens of each step: a constant or (T,) values.
        stderr: (n,) standard errors of the losses (e.g. an eval's), or None to estimate them.
        final_loss: the run's measured final loss where it differs from the last logged point
            (e.g. the final validation loss of a run whose curve is its training loss).
    """

    run_id: str
    params: float
    lr: np.ndarray
    steps: np.ndarray
    loss: np.ndarray
    tokens_per_step: float | np.ndarray = 1.0
    stderr: np.ndarray | None = None
    final_loss: float | None = None
    _areas: dict[tuple[float, str], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.lr = np.asarray(self.lr, dtype=np.float64).reshape(-1)
        self.steps = np.asarray(self.steps, dtype=np.int64).reshape(-1)
        self.loss = np.asarray(self.loss, dtype=np.float64).reshape(-1)
        where = f"run {self.run_id}"
        if self.steps.shape != self.loss.shape:
            raise UsageError(f"{where}: {self.steps.size} steps but {self.loss.size} losses")
        if self.steps.size and (self.steps.min() < 1 or self.steps.max() > self.lr.size):
            raise UsageError(f"{where}: logged steps must lie in 1..{self.lr.size} (the schedule's length)")
        if not (np.all(np.isfinite(self.loss)) and np.all(self.loss > 0)):
            raise UsageError(f"{where}: losses must be finite and > 0")
        if not (math.isfinite(self.params) and self.params > 0):
            raise UsageError(f"{where}: params must be > 0, got {self.params}")
        if self.stderr is not None:
            self.stderr = np.asarray(self.stderr, dtype=np.float64).reshape(-1)
            if self.stderr.shape != self.loss.shape:
                raise UsageError(f"{where}: stderr needs one value per logged loss")
        order = np.argsort(self.steps, kind="stable")
        self.steps, self.loss = self.steps[order], self.loss[order]
        if self.stderr is not None:
            self.stderr = self.stderr[order]

    @property
    def num_steps(self) -> int:
        return int(self.lr.size)

    def tokens(self, steps: np.ndarray) -> np.ndarray:
        """Tokens seen after each of `steps`."""
        tps = np.broadcast_to(np.asarray(self.tokens_per_step, dtype=np.float64), self.lr.shape)
        return np.cumsum(tps)[np.asarray(steps, dtype=np.int64) - 1]

    def tail_steps(self, fraction: float) -> np.ndarray:
        """The logged steps in the last `fraction` of the run's logged tokens (what a tail backtest scores)."""
        d = self.tokens(self.steps)
        return self.steps[d >= (1.0 - fraction) * d.max()]

    def areas(self, decay: float, units: str = "peak_tokens") -> tuple[np.ndarray, np.ndarray]:
        """(S1, S2) after every step of the schedule, cached per (decay, units).

        units "peak_tokens": tokens at the run's peak LR (fitting/loss_curves/lr_areas.py); "lr_steps": Tissue
        et al.'s own units, the raw LR summed over steps, so the LR's level and the batch size enter.
        """
        key = (decay, units)
        if key not in self._areas:
            if units == "peak_tokens":
                self._areas[key] = lr_areas(self.lr, tokens_per_step=self.tokens_per_step, decay=decay)
            elif units == "lr_steps":
                self._areas[key] = lr_areas(self.lr, tokens_per_step=1.0, decay=decay, lr_ref=1.0)
            else:
                raise UsageError(f"area units {units!r} unknown; use peak_tokens or lr_steps")
        return self._areas[key]

    def inputs(self, steps: np.ndarray, decay: float, units: str = "peak_tokens") -> dict[str, np.ndarray]:
        """Law inputs at `steps`: params, tokens, flops (6 N D), s1, s2."""
        steps = np.asarray(steps, dtype=np.int64)
        s1, s2 = self.areas(decay, units)
        d = self.tokens(steps)
        return {
            "params": np.full(steps.shape, float(self.params)),
            "tokens": d,
            "flops": 6.0 * self.params * d,
            "s1": s1[steps - 1],
            "s2": np.maximum(s2[steps - 1], 0.0),
        }

    def prefix(self, fraction: float | None = None, *, max_step: int | None = None) -> RunCurve:
        """The same run seen only up to `fraction` of its steps (or `max_step`): the schedule stays whole."""
        cut = max_step if max_step is not None else int(math.floor(fraction * self.num_steps))
        keep = self.steps <= cut
        return RunCurve(
            run_id=self.run_id,
            params=self.params,
            lr=self.lr,
            steps=self.steps[keep],
            loss=self.loss[keep],
            tokens_per_step=self.tokens_per_step,
            stderr=None if self.stderr is None else self.stderr[keep],
        )

    @property
    def last_loss(self) -> float:
        """The measured final loss (final_loss, else the mean of the last 5% of logged losses)."""
        if self.final_loss is not None:
            return float(self.final_loss)
        tail = self.loss[-max(1, self.loss.size // 20) :]
        return float(np.exp(np.mean(np.log(tail))))


def _step_noise(curve: RunCurve) -> float:
    """sd of one logged log loss: the robust scatter of successive differences / sqrt(2)."""
    if curve.loss.size < 4:
        return float("nan")
    return robust_scale(np.diff(np.log(curve.loss))) / math.sqrt(2.0)


def curve_points(
    curves: Sequence[RunCurve],
    *,
    decay: float,
    units: str = "peak_tokens",
    drop_first: float = 0.1,
    max_points_per_run: int = 48,
    sigma_run: float = SIGMA_RUN,
) -> dict[str, np.ndarray]:
    """The fitted points of a set of runs (module docstring): law inputs, loss, weight, run, step.

    Returns:
        dict of equal-length arrays: params, tokens, flops, s1, s2, loss, sigma (sd of log loss),
        weight (mean 1), run (index into curves), step (mean step of the group).
    Raises:
        UsageError: no run has a point past its warmup and its first `drop_first`.
    """
    cols: dict[str, list[np.ndarray]] = {k: [] for k in (*CURVE_INPUTS, "loss", "sigma", "run", "step", "n_r")}
    fallback = np.nanmedian([_step_noise(c) for c in curves] or [np.nan])
    for r, c in enumerate(curves):
        first = max(warmup_end(c.lr) + 1, int(math.ceil(drop_first * c.num_steps)))
        keep = c.steps > first
        if not keep.any():
            continue
        steps, logl = c.steps[keep], np.log(c.loss[keep])
        groups = np.array_split(np.arange(steps.size), min(max_points_per_run, steps.size))
        s1, s2 = c.areas(decay, units)
        if c.stderr is not None:
            var_i = (c.stderr[keep] / c.loss[keep]) ** 2
        else:
            sd = _step_noise(c)
            sd = sd if math.isfinite(sd) and sd > 0 else (fallback if math.isfinite(fallback) else 0.01)
            var_i = np.full(steps.size, sd**2)
        n = len(groups)
        for g in groups:
            st = steps[g]
            cols["params"].append(np.array([c.params]))
            d = c.tokens(st).mean()
            cols["tokens"].append(np.array([d]))
            cols["flops"].append(np.array([6.0 * c.params * d]))
            cols["s1"].append(np.array([s1[st - 1].mean()]))
            cols["s2"].append(np.array([max(s2[st - 1].mean(), 0.0)]))
            cols["loss"].append(np.array([math.exp(logl[g].mean())]))
            cols["sigma"].append(np.array([math.sqrt(var_i[g].sum()) / g.size]))
            cols["run"].append(np.array([r]))
            cols["step"].append(np.array([st.mean()]))
            cols["n_r"].append(np.array([n]))
    if not cols["loss"]:
        raise UsageError(f"no run has a logged loss past its warmup and its first {drop_first:.0%} of steps")
    out = {k: np.concatenate(v) for k, v in cols.items()}
    # Runs that share a prefix (a WSD branch and its stable run, a constant and a WSD run of one
    # size and seed) log the same losses at the same areas: one measurement, kept once.
    _, first = np.unique(np.stack([out[k] for k in (*CURVE_INPUTS, "loss")], axis=1), axis=0, return_index=True)
    out = {k: v[np.sort(first)] for k, v in out.items()}
    w = 1.0 / (out["sigma"] ** 2 + out.pop("n_r") * sigma_run**2)
    out["weight"] = w / w.mean()
    out["run"] = out["run"].astype(np.int64)
    return out


# ---------------------------------------------------------------------------------------------
# Variable projection: exponents on a grid, coefficients by non-negative least squares
# ---------------------------------------------------------------------------------------------


def _design(law: Law, x: dict[str, np.ndarray], alpha: float, beta: float, gamma: float = 0.0) -> np.ndarray | None:
    """Columns multiplying the law's linear coefficients (in param order E, A, B[, C]), or None."""
    n_term = x["params"] ** -alpha
    if law.name == "chinchilla":
        return np.stack([np.ones_like(n_term), n_term, x["tokens"] ** -beta], axis=1)
    if law.name == "lr_area":
        return np.stack([np.ones_like(n_term), n_term, x["s1"] ** -beta], axis=1)
    if law.name == "lr_annealing":
        return np.stack([np.ones_like(n_term), n_term, x["s1"] ** -beta, -x["s2"]], axis=1)
    if law.name == "lr_annealing_sized":
        data = x["params"] ** gamma * x["s1"] ** -beta
        return np.stack([np.ones_like(n_term), n_term, data, -x["s2"]], axis=1)
    return None


def varpro_starts(law: Law, x: dict[str, np.ndarray], loss: np.ndarray, weights: np.ndarray, k: int = TOP_STARTS):
    """(starts (k, P) in fit space, best relative SSE) from the exponent grid; (None, inf) if the
    law has no linear structure known here."""
    if _design(law, x, 0.5, 0.5) is None:
        return None, math.inf
    scale = np.sqrt(weights) / loss
    b = loss * scale
    gammas = GAMMA_GRID if "gamma" in law.param_names else (0.0,)
    found = []
    for alpha in EXPONENT_GRID:
        for beta in EXPONENT_GRID:
            for gamma in gammas:
                a_mat = _design(law, x, alpha, beta, gamma) * scale[:, None]
                coef, rnorm = optimize.nnls(a_mat, b, maxiter=50 * a_mat.shape[1])
                found.append((rnorm**2, alpha, beta, gamma, coef))
    found.sort(key=lambda t: t[0])
    lo, hi = (np.array(v) for v in zip(*law.fit_bounds))
    starts = []
    for _sse, alpha, beta, gamma, coef in found[:k]:
        logs = np.log(np.maximum(coef, 1e-9))  # a zero coefficient starts near its floor
        theta = np.concatenate([logs, [alpha, beta], [gamma] if len(gammas) > 1 else []])
        starts.append(np.clip(theta, lo, hi))
    return np.array(starts), found[0][0]


# ---------------------------------------------------------------------------------------------
# The fit and its predictions
# ---------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class CurveFit:
    """A law fitted on loss curves; predicts any run's loss at any step of its schedule."""

    law: str
    decay: float  # momentum of S2 the fit chose (irrelevant to laws without s2)
    result: FitResult
    drop_first: float
    run_ids: list[str]
    points: dict[str, np.ndarray]  # the fitted points (curve_points), with their weights
    decays_tried: dict[float, float] = field(default_factory=dict)  # decay -> objective
    _boot: tuple | None = field(default=None, repr=False)  # ((n_boot, seed, kept run), thetas)

    @property
    def params(self) -> dict[str, float]:
        return self.result.params

    @property
    def warnings(self) -> list[str]:
        return self.result.warnings

    def law_object(self) -> Law:
        return self.result.law_object()

    def predict(self, curve: RunCurve, steps: np.ndarray | None = None, *, params: dict | None = None) -> np.ndarray:
        """Predicted loss of `curve` at `steps` (default: every step of its schedule)."""
        law = self.law_object()
        steps = np.arange(1, curve.num_steps + 1) if steps is None else np.asarray(steps, dtype=np.int64)
        x = curve.inputs(steps, self.decay, getattr(law, "units", "peak_tokens"))
        return law.predict(self.params if params is None else params, **{k: x[k] for k in law.inputs})

    def predict_final(self, curve: RunCurve) -> float:
        return float(self.predict(curve, np.array([curve.num_steps]))[0])

    def bootstrap_thetas(self, n_boot: int = 64, seed: int = 0, keep: str | None = None) -> np.ndarray:
        """(n_boot, P) natural parameters refitted on resamples of whole runs (cached).

        keep: a run_id present once in every replicate (the run a prediction is conditioned on).
        """
        if self._boot is None or self._boot[0] != (n_boot, seed, keep):
            data = {k: self.points[k] for k in (*self.law_object().inputs, "loss")}
            if np.unique(self.points["run"]).size < 2:
                raise UsageError("an interval from resampled runs needs at least 2 runs in the fit")
            kept = [self.run_ids.index(keep)] if keep in self.run_ids else []
            boot = bootstrap(
                self.law_object(),
                data,
                self.result,
                n_boot=n_boot,
                groups=self.points["run"],
                seed=seed,
                derived={},
                keep_groups=kept,
            )
            self._boot = ((n_boot, seed, keep), np.stack([boot.samples[p] for p in self.law_object().param_names], 1))
        return self._boot[1]

    def final_draws(self, curve: RunCurve, *, n_boot: int = 64, seed: int = 0) -> np.ndarray:
        """The predicted final loss of `curve` under each run-resampling bootstrap refit.

        When `curve` is one of the fitted runs (e.g. a prefix), it stays in every replicate: the
        draws are conditional on the run's own points, and the other runs are resampled.
        """
        names = self.law_object().param_names
        return np.array(
            [
                self.predict(curve, np.array([curve.num_steps]), params=dict(zip(names, row)))[0]
                for row in self.bootstrap_thetas(n_boot, seed, keep=curve.run_id)
            ]
        )

    def final_interval(self, curve: RunCurve, *, level: float = 0.95, n_boot: int = 64, seed: int = 0):
        """Percentile interval of the predicted final loss over run-resampling bootstrap refits (final_draws)."""
        return percentile_interval(self.final_draws(curve, n_boot=n_boot, seed=seed), level)

    def to_dict(self) -> dict[str, Any]:
        return {
            "law": self.law,
            "decay": self.decay,
            "params": dict(self.params),
            "objective": self.result.objective,
            "n_points": self.result.n_points,
            "n_runs": len(self.run_ids),
            "drop_first": self.drop_first,
            "decays_tried": {str(k): v for k, v in self.decays_tried.items()},
            "warnings": list(self.warnings),
        }


def _decay_trials(curves, base, decays, *, units, drop_first, max_points_per_run, sigma_run) -> list[tuple]:
    """(SSE, decay, law, points, starts) per momentum decay (one when the law has no annealing area),
    best SSE first: the variable-projection pre-fit that ranks the decays before the full fits."""
    uses_decay = "s2" in base.inputs
    kw = {"units": units} if "s1" in base.inputs else {}
    trials = []
    for decay in decays if uses_decay else decays[-1:]:
        the_law = get_law(base.name, **kw, **({"decay": decay} if uses_decay else {}))
        pts = curve_points(
            curves,
            decay=decay,
            units=units,
            drop_first=drop_first,
            max_points_per_run=max_points_per_run,
            sigma_run=sigma_run,
        )
        x = {k: pts[k] for k in the_law.inputs}
        starts, sse = varpro_starts(
            the_law, {**x, "params": pts["params"], "tokens": pts["tokens"]}, pts["loss"], pts["weight"]
        )
        trials.append((sse, decay, the_law, pts, starts))
    trials.sort(key=lambda t: t[0])
    return trials


def fit_curves(
    curves: Sequence[RunCurve],
    law: str = "lr_annealing",
    *,
    decays: Sequence[float] = DECAYS,
    drop_first: float = 0.1,
    max_points_per_run: int = 48,
    sigma_run: float = SIGMA_RUN,
    delta: float = 1e-3,
    n_decays_refined: int = 2,
    units: str = "peak_tokens",
) -> CurveFit:
    """Fit `law` on every logged point of every run (module docstring).

    Args:
        curves: the runs (at least one; several sizes to identify the N terms).
        law: "lr_annealing", "lr_area", or an (N, D) law on checkpoints ("chinchilla", "kaplan").
        decays: momentum values profiled for the annealing area (laws with s2 only).
        drop_first: fraction of each run's schedule whose points are not fitted.
        max_points_per_run: groups per run (see curve_points).
        sigma_run: seed-to-seed sd of log loss (random-intercept weights).
        delta: Huber threshold on log-loss residuals.
        n_decays_refined: how many of the best decays (by the grid's SSE) get the full fit.
        units: the area convention of the curve laws ("peak_tokens" or "lr_steps", RunCurve.areas).
    Returns:
        CurveFit.
    Raises:
        UsageError: an unknown law or one whose inputs a curve cannot give; no usable points.
    """
    if not curves:
        raise UsageError("fit_curves: no runs given")
    base = get_law(law)
    missing = [k for k in base.inputs if k not in CURVE_INPUTS]
    if missing:
        raise UsageError(f"law {base.name} needs inputs {missing} that loss curves do not give")
    trials = _decay_trials(
        curves,
        base,
        decays,
        units=units,
        drop_first=drop_first,
        max_points_per_run=max_points_per_run,
        sigma_run=sigma_run,
    )
    best: CurveFit | None = None
    tried: dict[float, float] = {}
    for _, decay, the_law, pts, starts in trials[: max(1, n_decays_refined)]:
        if starts is None:  # no linear structure known: a thinned init grid
            grid = the_law.init_grid()
            starts = grid[np.unique(np.linspace(0, len(grid) - 1, min(len(grid), 200)).astype(int))]
        data = {**{k: pts[k] for k in the_law.inputs}, "loss": pts["loss"]}
        # Tight tolerances: a curve fit's objective is small (hundreds of ~1e-6 Huber terms), and
        # scipy's default ftol stops it at twice its optimum (measured on a simulated ladder).
        res = fit_law(
            the_law, data, starts=starts, weights=pts["weight"], delta=delta, n_polish=2, gtol=1e-10, ftol=1e-15
        )
        tried[decay] = float(res.objective)
        if best is None or res.objective < best.result.objective:
            best = CurveFit(
                law=the_law.name,
                decay=decay,
                result=res,
                drop_first=drop_first,
                run_ids=[c.run_id for c in curves],
                points=pts,
            )
    assert best is not None
    best.decays_tried = tried
    if np.unique(best.points["params"]).size == 1:
        best.result.warnings.append(
            "one model size: the size terms are not identified (predictions hold at this size only)"
        )
    return best


CURVE_TABLE_COLUMNS = ("run_id", "step", "lr", "params", "loss")


def is_curve_table(frame) -> bool:
    """Whether a table holds loss curves (a row per logged step with its LR), not one row per run."""
    return all(c in frame.columns for c in CURVE_TABLE_COLUMNS)


def curves_from_table(frame) -> tuple[Any, list[RunCurve]]:
    """(one row per run at its last step, RunCurves) from a table of logged steps.

    The table (e.g. a metrics export of another framework) has a row per logged step with columns
    run_id, step, lr, params, loss and optionally tokens (tokens seen after the step; default:
    step x the run's tokens per step, 1 when unknown). The LR of steps that were not logged is
    interpolated between logged ones, so the table should log the whole schedule of every run
    (its last row is the run's last step). The per-run frame has run_id, params, tokens, loss (the
    loss at the last step) for fitting.estimate.io.read_runs.

    Raises:
        UsageError: a missing column, a run without rows.
    """
    missing = [c for c in CURVE_TABLE_COLUMNS if c not in frame.columns]
    if missing:
        raise UsageError(f"a curve table needs columns {list(CURVE_TABLE_COLUMNS)}; missing {missing}")
    curves, rows = [], []
    for (run_id,), g in frame.sort("step").group_by(["run_id"], maintain_order=True):
        steps = np.asarray(g["step"].cast(pl.Int64).to_numpy(), dtype=np.int64)
        lr_logged = np.asarray(g["lr"].cast(pl.Float64).to_numpy(), dtype=float)
        total = int(steps.max())
        lr = np.interp(np.arange(1, total + 1), steps, lr_logged)
        tps = 1.0
        if "tokens" in g.columns:
            tps = float(g["tokens"].cast(pl.Float64).to_numpy()[-1]) / total
        loss = np.asarray(g["loss"].cast(pl.Float64).to_numpy(), dtype=float)
        params = float(g["params"].cast(pl.Float64).to_numpy()[-1])
        curves.append(RunCurve(run_id=str(run_id), params=params, lr=lr, steps=steps, loss=loss, tokens_per_step=tps))
        rows.append({"run_id": str(run_id), "params": params, "tokens": tps * total, "loss": float(loss[-1])})
    if not rows:
        raise UsageError("the curve table has no rows")
    return pl.DataFrame(rows), curves
