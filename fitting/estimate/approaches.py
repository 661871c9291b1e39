"""Chinchilla Approaches 1 and 2: compute-optimal N*(C) and D*(C) without a parametric loss law.

Approach 1 (envelope): every model size contributes a training curve (loss against FLOPs). At each
FLOP budget on a log grid, the size whose interpolated curve is lowest is the compute-optimal size;
log N*(C) and log D*(C) are then fitted as straight lines in log C.

Approach 2 (IsoFLOP): runs are grouped into FLOP budgets. Within each budget a parabola
loss = p2 (ln N)^2 + p1 ln N + p0 is fitted and its vertex gives N*(C); D*(C) = C / (6 N*(C)).
Budgets whose parabola is flat (no significant upward curvature) or whose vertex lies outside the
sampled sizes are flagged and left out of the power-law fit, because their "minimum" is not measured.

Both take plain arrays (params = total parameters N, tokens = D, loss in nats, flops = C; flops
defaults to 6·N·D) and return typed results whose `PowerLaw` members carry point estimates and
intervals:   N*(C) = coef · C^exponent.

    from scalelab.fitting.estimate.approaches import approach1, approach2
    res = approach2(params=N, tokens=D, loss=L, flops=C)
    res.n_opt.exponent, res.n_opt.exponent_interval, res.flagged_budgets()
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from scalelab.errors import UsageError
from scalelab.fitting.estimate.isoflop_shape import shape_minima

# Relative tolerance when deciding that two runs share a FLOP budget (IsoFLOP designs use exact
# budgets, but recorded FLOPs differ slightly because sizes are rounded to whole layers).
BUDGET_REL_TOL = 0.05


@dataclass(kw_only=True, slots=True)
class PowerLaw:
    """y = coef · C^exponent, fitted as a straight line in (ln C, ln y) by OLS.

    Intervals are t-based OLS confidence intervals at `level`; they only reflect scatter around the
    line, so with 3-4 budgets they are wide, as they should be.
    """

    coef: float
    exponent: float
    coef_interval: tuple[float, float]
    exponent_interval: tuple[float, float]
    level: float
    n_points: int
    cov: np.ndarray | None = None  # 2x2 covariance of (ln coef, exponent); None with 2 budgets
    rss: float = 0.0  # residual sum of squares of the line in ln space

    def sample(self, num: int, seed: int = 0) -> list[tuple[float, float]]:
        """(coef, exponent) draws from the OLS sampling distribution (normal in ln coef, exponent)."""
        if self.cov is None or not np.all(np.isfinite(self.cov)):
            return []
        mean = np.array([np.log(self.coef), self.exponent])
        draws = np.random.default_rng(seed).multivariate_normal(mean, self.cov, size=num)
        return [(float(np.exp(a)), float(b)) for a, b in draws]

    def __call__(self, flops: np.ndarray | float) -> np.ndarray:
        return self.coef * np.asarray(flops, dtype=float) ** self.exponent

    def to_dict(self) -> dict:
        return {
            "coef": self.coef,
            "exponent": self.exponent,
            "coef_interval": list(self.coef_interval),
            "exponent_interval": list(self.exponent_interval),
            "level": self.level,
            "n_points": self.n_points,
        }


@dataclass(kw_only=True, slots=True)
class BudgetMinimum:
    """The compute-optimal point measured at one FLOP budget."""

    flops: float
    n_opt: float
    d_opt: float
    loss_opt: float
    n_opt_interval: tuple[float, float] | None = None  # delta-method interval (Approach 2 only)
    num_runs: int = 0
    flat: bool = False  # no significant upward curvature: the minimum is not located
    boundary: bool = False  # vertex at/beyond the smallest or largest sampled size
    used: bool = True  # entered the power-law fit


@dataclass(kw_only=True, slots=True)
class ApproachResult:
    """Result of Approach 1 or 2: N*(C), D*(C) power laws plus the per-budget minima they came from."""

    approach: int
    n_opt: PowerLaw
    d_opt: PowerLaw
    minima: list[BudgetMinimum]
    warnings: list[str] = field(default_factory=list)

    def flagged_budgets(self) -> list[BudgetMinimum]:
        return [m for m in self.minima if m.flat or m.boundary]

    def tokens_per_param(self, flops: float) -> float:
        return float(self.d_opt(flops) / self.n_opt(flops))

    def to_dict(self) -> dict:
        return {
            "approach": self.approach,
            "n_opt": self.n_opt.to_dict(),
            "d_opt": self.d_opt.to_dict(),
            "minima": [
                {
                    "flops": m.flops,
                    "n_opt": m.n_opt,
                    "d_opt": m.d_opt,
                    "loss_opt": m.loss_opt,
                    "n_opt_interval": list(m.n_opt_interval) if m.n_opt_interval else None,
                    "num_runs": m.num_runs,
                    "flat": m.flat,
                    "boundary": m.boundary,
                    "used": m.used,
                }
                for m in self.minima
            ],
            "warnings": list(self.warnings),
        }


def fit_power_law(flops: np.ndarray, values: np.ndarray, *, level: float = 0.95) -> PowerLaw:
    """Fit values = coef · flops^exponent by OLS in log space.

    Args:
        flops: FLOP budgets C (> 0).
        values: positive quantities (N* or D*) at those budgets.
        level: confidence level of the intervals.
    Returns:
        PowerLaw with t-based intervals (degenerate to the point when only 2 budgets exist).
    Raises:
        UsageError: fewer than 2 budgets or non-positive values.
    """
    x = np.log(np.asarray(flops, dtype=float))
    y = np.log(np.asarray(values, dtype=float))
    if x.size < 2 or np.unique(x).size < 2:
        raise UsageError(f"a power law in compute needs at least 2 distinct FLOP budgets, got {x.size}")
    res = _ols(y, np.column_stack([np.ones_like(x), x]))
    intercept, slope = (float(v) for v in res.params)
    if x.size > 2:
        ci = res.conf_int(1.0 - level)
        icpt_ci, slope_ci = (float(ci[0, 0]), float(ci[0, 1])), (float(ci[1, 0]), float(ci[1, 1]))
    else:  # a line through 2 points has no residual degrees of freedom: no interval exists
        icpt_ci, slope_ci = (float("nan"),) * 2, (float("nan"),) * 2
    return PowerLaw(
        coef=float(np.exp(intercept)),
        exponent=slope,
        coef_interval=(float(np.exp(icpt_ci[0])), float(np.exp(icpt_ci[1]))),
        exponent_interval=slope_ci,
        level=level,
        n_points=int(x.size),
        cov=res.cov_params() if x.size > 2 else None,
        rss=float(res.ssr),
    )


def group_budgets(flops: np.ndarray, *, rel_tol: float = BUDGET_REL_TOL) -> np.ndarray:
    """Label runs with a budget index: sorted FLOPs within `rel_tol` of their neighbour share a label."""
    flops = np.asarray(flops, dtype=float)
    order = np.argsort(flops)
    labels = np.empty(flops.size, dtype=int)
    current, prev = 0, None
    for i in order:
        if prev is not None and np.log(flops[i]) - np.log(prev) > np.log1p(rel_tol):
            current += 1
        labels[i] = current
        prev = flops[i]
    return labels


def _check_arrays(params, tokens, loss, flops) -> tuple[np.ndarray, ...]:
    params = np.asarray(params, dtype=float)
    tokens = np.asarray(tokens, dtype=float)
    loss = np.asarray(loss, dtype=float)
    if not (params.shape == tokens.shape == loss.shape) or params.ndim != 1:
        raise UsageError("params, tokens and loss must be 1-D arrays of equal length")
    flops = 6.0 * params * tokens if flops is None else np.asarray(flops, dtype=float)
    if flops.shape != params.shape:
        raise UsageError("flops must have the same length as params")
    for name, arr in (("params", params), ("tokens", tokens), ("loss", loss), ("flops", flops)):
        if not np.all(np.isfinite(arr)):
            raise UsageError(f"{name} holds NaN or infinite values; drop those runs first")
        if np.any(arr <= 0):
            raise UsageError(f"{name} must be positive")
    return params, tokens, loss, flops


def budget_minimum(
    params: np.ndarray, loss: np.ndarray, flops: np.ndarray, *, curvature_z: float = 2.0, level: float = 0.95
) -> BudgetMinimum | None:
    """The IsoFLOP parabola of one budget: loss = p2 (ln N)^2 + p1 ln N + p0 by OLS, and its vertex.

    Flat when p2 is not significantly positive (p2 / se(p2) < curvature_z, or no residual dof and
    p2 <= 0); boundary when the vertex falls outside [min ln N, max ln N]. The vertex interval is
    the delta method on the parabola's covariance (t quantile). None with fewer than 3 distinct sizes.
    """
    params, loss, flops = (np.asarray(a, dtype=float) for a in (params, loss, flops))
    x = np.log(params)
    if np.unique(x).size < 3:
        return None
    budget = float(np.exp(np.mean(np.log(flops))))
    design = np.column_stack([np.ones_like(x), x, x * x])
    res = _ols(loss, design)
    p0, p1, p2 = (float(v) for v in res.params)
    dof = x.size - 3
    if dof > 0:
        cov = res.cov_params()
        se2 = float(np.sqrt(max(cov[2, 2], 0.0)))
        flat = not (p2 > 0 and (se2 == 0 or p2 / se2 >= curvature_z))
    else:
        cov, flat = None, p2 <= 0
    if p2 > 0:
        x_star = -p1 / (2.0 * p2)
    else:  # no vertex: report the best measured run so the table still shows something
        x_star = float(x[np.argmin(loss)])
    boundary = bool(x_star <= x.min() or x_star >= x.max())
    interval = None
    if cov is not None and p2 > 0:
        # d x*/d(p1, p2) = (-1/(2 p2), p1/(2 p2^2)); p0 does not enter.
        grad = np.array([0.0, -1.0 / (2.0 * p2), p1 / (2.0 * p2**2)])
        se_x = float(np.sqrt(max(grad @ cov @ grad, 0.0)))
        t = float(stats.t.ppf(0.5 + level / 2.0, dof))
        interval = (float(np.exp(x_star - t * se_x)), float(np.exp(x_star + t * se_x)))
    n_opt = float(np.exp(x_star))
    loss_opt = float(p0 + p1 * x_star + p2 * x_star**2) if p2 > 0 else float(loss.min())
    return BudgetMinimum(
        flops=budget,
        n_opt=n_opt,
        d_opt=budget / (6.0 * n_opt),
        loss_opt=loss_opt,
        n_opt_interval=interval,
        num_runs=int(x.size),
        flat=bool(flat),
        boundary=boundary,
        used=not (flat or boundary),
    )


def approach2(
    *,
    params: np.ndarray,
    tokens: np.ndarray,
    loss: np.ndarray,
    flops: np.ndarray | None = None,
    budget_labels: np.ndarray | None = None,
    min_runs_per_budget: int = 3,
    curvature_z: float = 2.0,
    level: float = 0.95,
    shape: str = "parabola",
) -> ApproachResult:
    """Chinchilla Approach 2: IsoFLOP parabolas, then power laws in C.

    Per budget: OLS loss = p2 x^2 + p1 x + p0 with x = ln N; the vertex x* = -p1 / (2 p2).
    A budget is *flat* when p2 is not significantly positive (p2 / se(p2) < curvature_z, or no
    residual dof and p2 <= 0); it is *boundary* when x* falls outside [min ln N, max ln N] of the
    runs in the slice. Flagged budgets are reported but not used in the power-law fit.

    Args:
        params, tokens, loss: per-run arrays (N total parameters, D tokens, final loss).
        flops: per-run FLOPs C; default 6·N·D. Runs are grouped by C within BUDGET_REL_TOL unless
            `budget_labels` gives the grouping explicitly.
        min_runs_per_budget: budgets with fewer distinct sizes are skipped (a parabola needs 3).
        curvature_z: z-threshold on the parabola's curvature for "not flat".
        level: confidence level for all intervals.
        shape: "parabola" (Chinchilla's) or "power": each slice fitted with the IsoFLOP curve's own
            asymmetric shape, the exponents shared (scalelab.fitting.estimate.isoflop_shape: no grid bias).
    Returns:
        ApproachResult with n_opt/d_opt power laws and per-budget minima (intervals on N* from the
        delta method on the parabola's, or the shape fit's, covariance).
    Raises:
        UsageError: bad arrays, or fewer than 2 usable budgets.
    """
    params, tokens, loss, flops = _check_arrays(params, tokens, loss, flops)
    labels = group_budgets(flops) if budget_labels is None else np.asarray(budget_labels)
    if shape == "power":
        return _finish(2, *_shape_minima(params, loss, flops, labels, level, min_runs_per_budget), level)
    if shape != "parabola":
        raise UsageError(f"isoflop shape {shape!r} is not known; use parabola or power")
    minima: list[BudgetMinimum] = []
    warnings: list[str] = []
    for lab in np.unique(labels):
        idx = np.flatnonzero(labels == lab)
        m = budget_minimum(params[idx], loss[idx], flops[idx], curvature_z=curvature_z, level=level)
        if m is None or np.unique(params[idx]).size < min_runs_per_budget:
            n_sizes = np.unique(params[idx]).size
            warnings.append(f"budget C={np.median(flops[idx]):.3g}: only {n_sizes} distinct sizes, skipped")
            continue
        minima.append(m)
        if m.flat:
            warnings.append(f"budget C={m.flops:.3g}: flat IsoFLOP curve (curvature not significant)")
        elif m.boundary:
            warnings.append(
                f"budget C={m.flops:.3g}: minimum at or beyond the sampled sizes (N*≈{m.n_opt:.3g}); "
                "extend the size range"
            )
    return _finish(2, minima, warnings, level)


def _shape_minima(params, loss, flops, labels, level, min_sizes) -> tuple[list[BudgetMinimum], list[str]]:
    """Approach 2's minima from the shared-shape slice fits (scalelab.fitting.estimate.isoflop_shape)."""
    points, fitted, warnings = shape_minima(
        params=params, loss=loss, flops=flops, labels=labels, level=level, min_sizes=min_sizes
    )
    warnings.append(
        f"isoflop shape: alpha {fitted.alpha:.3f}, beta {fitted.beta:.3f} shared by the slices "
        f"({fitted.dof} residual degree(s) of freedom)"
    )
    at_edge = [n for n, v in (("alpha", fitted.alpha), ("beta", fitted.beta)) if not fitted.interior(v)]
    if at_edge:
        warnings.append(
            f"isoflop shape: {' and '.join(at_edge)} at the edge of the searched range: the slices do not "
            "identify the shape, and the minima rest on an arbitrary one"
        )
    minima = []
    for p in points:
        flat = p.x_star is None
        x_star = p.x_range[0] if flat else p.x_star
        boundary = not flat and not (p.x_range[0] < x_star < p.x_range[1])
        n_opt = float(np.exp(x_star))
        minima.append(
            BudgetMinimum(
                flops=p.flops,
                n_opt=n_opt,
                d_opt=p.flops / (6.0 * n_opt),
                loss_opt=p.loss_star,
                n_opt_interval=None if p.x_interval is None else tuple(float(np.exp(v)) for v in p.x_interval),
                num_runs=p.num_runs,
                flat=flat,
                boundary=boundary,
                used=not (flat or boundary),
            )
        )
        if flat:
            warnings.append(f"budget C={p.flops:.3g}: no interior minimum under the fitted shape")
        elif boundary:
            warnings.append(f"budget C={p.flops:.3g}: minimum at or beyond the sampled sizes (N*≈{n_opt:.3g})")
    return minima, warnings


def curves_by_size(params: np.ndarray, flops: np.ndarray) -> list[tuple[float, np.ndarray]]:
    """A table's loss curves: (size, the indices of its points in order of compute) for every size
    with two or more points."""
    out = []
    for size in np.unique(params):
        idx = np.flatnonzero(params == size)
        if idx.size >= 2:
            out.append((float(size), idx[np.argsort(flops[idx])]))
    return out


def approach1(
    *,
    params: np.ndarray,
    tokens: np.ndarray,
    loss: np.ndarray,
    flops: np.ndarray | None = None,
    num_budgets: int = 30,
    level: float = 0.95,
) -> ApproachResult:
    """Chinchilla Approach 1: the lower envelope of loss-vs-FLOP curves across model sizes.

    Points are grouped into curves by model size (equal `params`). Each curve with >= 2 points is
    interpolated linearly in (ln C, ln loss). On `num_budgets` log-spaced budgets covering the FLOP
    range reached by at least two curves, the size with the lowest interpolated loss is N*(C); the
    tokens at that point are D*(C) (interpolated on the same curve). A budget is *boundary* when the
    winner is the smallest or largest size whose curve reaches that budget (the true optimum may lie
    beyond); boundary budgets are kept out of the power-law fit.

    Args:
        params, tokens, loss, flops: per-point arrays (intermediate checkpoints of each run).
        num_budgets: number of grid budgets between the common FLOP range's ends.
        level: confidence level of the power-law intervals.
    Returns:
        ApproachResult with n_opt/d_opt power laws and the per-budget envelope points.
    Raises:
        UsageError: fewer than 2 sizes with curves, or fewer than 2 interior envelope budgets.
    """
    params, tokens, loss, flops = _check_arrays(params, tokens, loss, flops)
    curves = [
        (size, np.log(flops[order]), np.log(loss[order]), np.log(tokens[order]))
        for size, order in curves_by_size(params, flops)
    ]
    if len(curves) < 2:
        raise UsageError("Approach 1 needs training curves: at least 2 model sizes with >= 2 checkpoints each")
    lo = min(c[1][0] for c in curves)
    hi = max(c[1][-1] for c in curves)
    grid = np.linspace(lo, hi, num_budgets)
    minima: list[BudgetMinimum] = []
    for g in grid:
        live = [c for c in curves if c[1][0] <= g <= c[1][-1]]
        if len(live) < 2:
            continue
        losses = np.array([np.interp(g, c[1], c[2]) for c in live])
        best = int(np.argmin(losses))
        size, lf, _, lt = live[best]
        sizes = [c[0] for c in live]
        boundary = size in (min(sizes), max(sizes))
        minima.append(
            BudgetMinimum(
                flops=float(np.exp(g)),
                n_opt=size,
                d_opt=float(np.exp(np.interp(g, lf, lt))),
                loss_opt=float(np.exp(losses[best])),
                num_runs=len(live),
                boundary=bool(boundary),
                used=not boundary,
            )
        )
    warnings = []
    n_boundary = sum(m.boundary for m in minima)
    if n_boundary:
        warnings.append(
            f"{n_boundary} of {len(minima)} envelope budgets are won by the smallest or largest live size "
            "and were left out"
        )
    return _finish(1, minima, warnings, level)


def _finish(approach: int, minima: list[BudgetMinimum], warnings: list[str], level: float) -> ApproachResult:
    used = [m for m in minima if m.used]
    if len(used) < 2:
        raise UsageError(
            f"Approach {approach}: only {len(used)} budget(s) with a located interior minimum "
            f"({len(minima)} measured); add budgets or widen the size range"
        )
    c = np.array([m.flops for m in used])
    if approach == 1 and np.unique([m.n_opt for m in used]).size < 2:
        raise UsageError("Approach 1: the envelope is won by a single size; add sizes between the extremes")
    n_law = fit_power_law(c, np.array([m.n_opt for m in used]), level=level)
    d_law = fit_power_law(c, np.array([m.d_opt for m in used]), level=level)
    if len(used) < 4:
        warnings.append(f"Approach {approach}: exponents rest on only {len(used)} budgets")
    return ApproachResult(approach=approach, n_opt=n_law, d_opt=d_law, minima=minima, warnings=warnings)


@dataclass
class _OLS:
    """Ordinary least squares as statsmodels' OLS computes it (the pseudo-inverse of the design; the
    covariance s^2 (X'X)^-1 with s^2 = RSS / (n - p); t intervals). Here because importing statsmodels
    costs about a second, which every `plan-run` paid through the frontier."""

    params: np.ndarray
    ssr: float
    normalized_cov: np.ndarray
    df_resid: int

    def cov_params(self) -> np.ndarray:
        return self.normalized_cov * (self.ssr / self.df_resid)

    def conf_int(self, alpha: float) -> np.ndarray:
        se = np.sqrt(np.diag(self.cov_params()))
        q = stats.t.ppf(1.0 - alpha / 2.0, self.df_resid)
        return np.column_stack([self.params - q * se, self.params + q * se])


def _ols(y: np.ndarray, design: np.ndarray) -> _OLS:
    pinv = np.linalg.pinv(design)
    params = pinv @ y
    resid = y - design @ params
    dof = design.shape[0] - design.shape[1]
    return _OLS(params=params, ssr=float(resid @ resid), normalized_cov=pinv @ pinv.T, df_resid=dof)
