"""Approach 2 without the parabola's grid bias: each IsoFLOP slice fitted with the curve's own shape.

On an IsoFLOP slice N D = C / 6, so a loss of Chinchilla's form is, in x = ln N,

    L_C(x) = c0 + c1 exp(-alpha x) + c2 exp(beta x)      (c0 = E, c1 = A, c2 = B (6 / C)^beta)

an asymmetric curve whenever alpha != beta. Approach 2 fits a parabola in x instead, its
second-order Taylor expansion: the vertex then moves with the grid (how wide the sampled sizes are
and where they sit around the true minimum), and the error grows with the budget when the grids
are laid out the same way in every budget, biasing the N*(C) exponent (Open-Athena's analysis of
Approach 2).

Here every budget keeps its own three coefficients (c0, c1, c2): nothing but the curve's shape is
shared, so the minima are still measured budget by budget, as in Approach 2, and no law's E, A, B
ties them together. The two shape exponents are shared and estimated by variable projection: for
fixed (alpha, beta) every slice is an ordinary least-squares problem, the summed residual is
profiled over an exponent grid and the best grid point is refined. The slice's minimum is where
the two terms' slopes cancel,

    x* = ln(alpha c1 / (beta c2)) / (alpha + beta),

which exists only with c1, c2 > 0 (otherwise the slice is flat: no interior minimum).

Points off an exact IsoFLOP line (a FLOP bin of a table whose budgets scatter: `tokens` given). The
third term is then c2 exp(-beta y), y = ln D, which on an exact slice is the same column up to a
constant factor (the same fit, the same minimum); the minimum is taken along the slice's reference
compute C_ref = 6 N D (its runs' geometric mean), where c2 exp(-beta y) = c2 (C_ref / 6)^-beta N^beta.

Identifiability. A slice with three sizes fits any shape exactly, so the exponents rest on the
residual degrees of freedom sum_b (n_b - 3) - 2; with none left they are not identified and the
estimator refuses (use the parabola). The vertex interval is the delta method on the slice's OLS
covariance with the pooled residual variance, conditional on the exponents (their own uncertainty
is not in it); the N*(C) line's interval then comes from the scatter of the minima, as in Approach 2.

    minima, shape = shape_minima(params=N, loss=L, flops=C, labels=budget_of_each_run)
    shape.alpha, shape.beta, shape.dof
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

from scalelab.errors import UsageError

EXPONENT_GRID = np.geomspace(0.05, 2.0, 28)  # alpha, beta values profiled before the refinement
MIN_SIZES = 3  # a slice needs three distinct sizes for its three coefficients


@dataclass(frozen=True, slots=True)
class SlicePoint:
    """One slice's located minimum (None fields when the slice has no interior minimum)."""

    flops: float
    x_star: float | None
    x_interval: tuple[float, float] | None
    loss_star: float  # the curve's minimum; the best measured loss where there is none
    x_range: tuple[float, float]
    num_runs: int


@dataclass(frozen=True, slots=True)
class ShapeFit:
    """The shared shape: exponents, the residual degrees of freedom left for them, the pooled noise."""

    alpha: float
    beta: float
    dof: int
    sigma: float  # pooled residual sd of loss (loss units)
    rss: float

    @staticmethod
    def interior(value: float) -> bool:
        """Inside the searched exponent range (not stopped at its edge)."""
        return EXPONENT_GRID[0] * 1.01 < value < EXPONENT_GRID[-1] / 1.01


Slice = tuple[np.ndarray, np.ndarray, np.ndarray]  # (x, loss, minus_y): centred ln N, loss, -(centred ln D)


def _design(x: np.ndarray, alpha: float, beta: float, minus_y: np.ndarray) -> np.ndarray:
    # Centre x (and y) per slice before exponentiating: the coefficients rescale, the fit and x* do
    # not, and exp() of ln N ~ 12 at alpha = 2 would otherwise dwarf the constant column. On an exact
    # IsoFLOP slice minus_y is x itself (ln D = ln(C/6) - ln N).
    return np.column_stack([np.ones_like(x), np.exp(-alpha * x), np.exp(beta * minus_y)])


class _Stacked:
    """Every slice's points end to end, so that one (alpha, beta) costs a handful of array operations
    (the profile evaluates it about a thousand times): each slice's 3x3 normal equations summed with
    reduceat, solved at once."""

    def __init__(self, slices: list[Slice]) -> None:
        self.x = np.concatenate([s[0] for s in slices])
        self.y = np.concatenate([s[1] for s in slices])
        self.my = np.concatenate([s[2] for s in slices])
        sizes = np.array([s[0].size for s in slices])
        self.starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        self.index = np.repeat(np.arange(len(slices)), sizes)

    def rss(self, alpha: float, beta: float) -> float:
        design = _design(self.x, alpha, beta, self.my)
        gram = np.add.reduceat(design[:, :, None] * design[:, None, :], self.starts, axis=0)
        rhs = np.add.reduceat(design * self.y[:, None], self.starts, axis=0)
        coef = np.einsum("sij,sj->si", np.linalg.pinv(gram), rhs)
        r = self.y - np.einsum("ni,ni->n", design, coef[self.index])
        return float(r @ r)


def fit_shape(slices: list[Slice]) -> ShapeFit:
    """(alpha, beta) shared by the slices (x centred per slice, loss, minus_y), by variable projection.

    Raises:
        UsageError: no residual degrees of freedom are left for the exponents.
    """
    dof = sum(x.size - 3 for x, _, _ in slices) - 2
    if dof < 1:
        raise UsageError(
            f"isoflop shape: the slices leave {dof} residual degree(s) of freedom for the two shape exponents; "
            "give some budgets 4 or more sizes, or use the parabola (isoflop_shape: parabola)"
        )
    stacked = _Stacked(slices)
    grid = np.array([[stacked.rss(a, b) for b in EXPONENT_GRID] for a in EXPONENT_GRID])
    i, j = np.unravel_index(np.argmin(grid), grid.shape)
    lo, hi = np.log(EXPONENT_GRID[0]), np.log(EXPONENT_GRID[-1])
    res = optimize.minimize(
        lambda v: stacked.rss(float(np.exp(v[0])), float(np.exp(v[1]))),
        x0=np.log([EXPONENT_GRID[i], EXPONENT_GRID[j]]),
        method="Nelder-Mead",
        bounds=[(lo, hi), (lo, hi)],
        # the profiled RSS can be ~1e-12 (runs on a smooth curve): absolute tolerances far below it
        options={"xatol": 1e-8, "fatol": 1e-30, "maxiter": 600},
    )
    best = res.x if res.fun <= grid[i, j] else np.log([EXPONENT_GRID[i], EXPONENT_GRID[j]])
    alpha, beta = (float(v) for v in np.exp(best))
    rss = stacked.rss(alpha, beta)
    return ShapeFit(alpha=alpha, beta=beta, dof=dof, sigma=float(np.sqrt(rss / dof)), rss=rss)


def _slice_minimum(
    x: np.ndarray,
    y: np.ndarray,
    minus_y: np.ndarray,
    centre: float,
    flops: float,
    shift: float,
    shape: ShapeFit,
    level: float,
) -> SlicePoint:
    """The slice's minimum along its reference compute; `shift` is -(centred ln D) at centred x = 0
    there, so that the third term there is c2 exp(beta (shift + x))."""
    a, b = shape.alpha, shape.beta
    design = _design(x, a, b, minus_y)
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    c0, c1, c2 = (float(v) for v in coef)
    c2 *= float(np.exp(b * shift))
    x_range = (float(x.min() + centre), float(x.max() + centre))
    if c1 <= 0 or c2 <= 0:
        return SlicePoint(flops, None, None, float(y.min()), x_range, int(x.size))
    xs = np.log(a * c1 / (b * c2)) / (a + b)
    loss_star = c0 + c1 * np.exp(-a * xs) + c2 * np.exp(b * xs)
    # d x*/d(c0, c1, c2) = (0, 1 / ((a + b) c1), -1 / ((a + b) c2)): the shift scales c2 and so
    # cancels from the relative derivative
    grad = np.array([0.0, 1.0 / ((a + b) * c1), -1.0 / ((a + b) * c2 / float(np.exp(b * shift)))])
    cov = shape.sigma**2 * np.linalg.pinv(design.T @ design)
    half = float(stats.t.ppf(0.5 + level / 2.0, shape.dof)) * float(np.sqrt(max(grad @ cov @ grad, 0.0)))
    return SlicePoint(
        flops,
        float(xs + centre),
        (float(xs + centre - half), float(xs + centre + half)),
        float(loss_star),
        x_range,
        int(x.size),
    )


def shape_minima(
    *,
    params: np.ndarray,
    loss: np.ndarray,
    flops: np.ndarray,
    labels: np.ndarray,
    level: float = 0.95,
    min_sizes: int = MIN_SIZES,
    tokens: np.ndarray | None = None,
) -> tuple[list[SlicePoint], ShapeFit, list[str]]:
    """Every slice's minimum under the shared shape (module docstring), the shape, and warnings.

    Slices with fewer than `min_sizes` distinct sizes (never below MIN_SIZES) are skipped with a warning.
    `tokens`: the runs' D, for slices whose runs do not share one compute (FLOP bins); without it every
    run of a slice is taken to sit on its IsoFLOP line.
    """
    min_sizes = max(min_sizes, MIN_SIZES)
    params, loss, flops = (np.asarray(v, dtype=float) for v in (params, loss, flops))
    slices, meta, warnings = [], [], []
    for lab in np.unique(labels):
        idx = np.flatnonzero(labels == lab)
        if np.unique(params[idx]).size < min_sizes:
            warnings.append(
                f"budget C={np.median(flops[idx]):.3g}: only {np.unique(params[idx]).size} distinct sizes, skipped"
            )
            continue
        x = np.log(params[idx])
        centre = float(x.mean())
        ref = float(np.exp(np.mean(np.log(flops[idx]))))
        if tokens is None:
            minus_y, shift = x - centre, 0.0
        else:
            ln_d = np.log(tokens[idx])
            minus_y = -(ln_d - ln_d.mean())
            shift = -(np.log(ref / 6.0) - centre - ln_d.mean())  # -(centred ln D) at N = exp(centre), C_ref
        slices.append((x - centre, loss[idx], minus_y))
        meta.append((centre, ref, shift))
    if not slices:
        raise UsageError("isoflop shape: no budget has 3 or more distinct sizes")
    shape = fit_shape(slices)
    points = [_slice_minimum(x, y, my, c, f, sh, shape, level) for (x, y, my), (c, f, sh) in zip(slices, meta)]
    return points, shape, warnings
