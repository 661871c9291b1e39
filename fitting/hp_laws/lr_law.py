"""Where an optimizer setting's optimum lies over model size and run length, and what a setting away
from it costs in loss: the best learning rate as a law of (N, D), AdamW's best weight-decay timescale.

    cells = cell_optima(params, tokens, lr, loss)          # per (N, D) cell: a parabola in ln lr
    law = fit_optimum_law(cells, terms=("params", "tokens"))   # ln lr* = a + b ln N + c ln D
    law.predict(n, d)                                       # (lr*, lo, hi)
    law.cost(n, d, lr)                                      # relative loss cost of lr: (point, lo, hi)
    fit_optimum_law(wd_cells, terms=())                     # a constant optimum (a timescale fraction)

Per cell (one (N, D), several values x of the setting, seeds allowed): a parabola of ln loss in
u = ln x, fitted to every run within `window` grid values of the grid minimum,
ln L(u) = q0 + q1 u + q2 u^2. Its vertex u* = -q1 / (2 q2) is the cell's optimum when it lies
strictly inside that window (else the cell is "not bracketed" and stays out of the law), and q2 is
the cell's curvature in *relative* units: a setting at u costs exp(q2 (u - u*)^2) - 1 of the loss,
about q2 (u - u*)^2. Each cell's uncertainty is a residual bootstrap of its parabola (the fitted
curve plus resampled residuals, inflated by sqrt(n / (n - 3))), vectorised over the draws.

The law is ordinary least squares of the bracketed cells' u* on [1, ln(N / N0), ln(D / D0)] (the
`terms` asked for; N0, D0 the cells' geometric means, so the intercept is the optimum at the centre
of the design), and the curvature's law the same for ln q2 (a constant when the cells are too few to
fit its slopes). Intervals come from replicates that resample the cells with replacement *and*
replace each drawn cell's optimum and curvature by one of its own bootstrap draws: the first carries
the cells' scatter about the law (lack of fit), the second each cell's measurement noise.
tests/test_lr_law.py measures recovery and coverage on synthetic cells from a known optimum.

Pure: arrays in, dataclasses out; the sweep side (scalelab.sweeps.recipes.recipe_audit) turns them into a
recipe and a gate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from scalelab.errors import UsageError
from scalelab.fitting.estimate.intervals import percentile_interval

TERMS = ("params", "tokens")  # the regressors a law may use, as ln of the cell's N and D


@dataclass(kw_only=True, slots=True)
class CellOptimum:
    """The optimum of a setting at one (N, D) cell, from a parabola of ln loss in ln x."""

    params: float
    tokens: float
    x_opt: float  # the vertex (the best measured value when not bracketed)
    interval: tuple[float, float]  # bootstrap interval of x_opt at `level` (nan when not bracketed, or
    # when the parabola passes through its three points exactly: no residual to resample)
    curvature: float  # q2: relative loss per (ln x)^2 (nan when not bracketed)
    loss_opt: float  # the fitted loss at the vertex (the best mean loss when not bracketed)
    bracketed: bool
    grid: list[float]  # the values swept
    mean_loss: list[float]  # mean loss per value (inf where every run diverged)
    resid_sd: float  # the parabola's residual sd in ln loss: the cell's run-to-run noise
    draws_u: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)  # bootstrap ln x*
    draws_q2: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)

    def cost(self, x: float) -> float:
        """Relative loss cost of the setting x in this cell (its own parabola)."""
        return math.expm1(self.curvature * (math.log(x) - math.log(self.x_opt)) ** 2)


def cell_optima(
    params,
    tokens,
    values,
    loss,
    *,
    window: int = 2,
    n_boot: int = 400,
    level: float = 0.9,
    seed: int = 0,
) -> list[CellOptimum]:
    """One CellOptimum per distinct (params, tokens) (module docstring), sorted by (N, D).

    Args:
        params, tokens, values, loss: one entry per run; `values` the setting (lr, a timescale) > 0.
            Non-finite losses (diverged runs) are left out and never make a value the best.
        window: grid values on each side of the grid minimum the parabola is fitted to.
        n_boot, level, seed: the residual bootstrap of each cell.
    Raises:
        UsageError: arrays of different lengths, a value <= 0.
    """
    n, d, x, y = (np.asarray(a, dtype=float) for a in (params, tokens, values, loss))
    if not (n.shape == d.shape == x.shape == y.shape) or n.ndim != 1:
        raise UsageError("params, tokens, values and loss must be 1-D arrays of equal length")
    if np.any(x <= 0):
        raise UsageError("the values of the setting must be positive")
    rng = np.random.default_rng(seed)
    out = []
    for nn, dd in sorted({(float(a), float(b)) for a, b in zip(n, d)}):
        sel = (n == nn) & (d == dd)
        out.append(_one_cell(nn, dd, x[sel], y[sel], window, n_boot, level, rng))
    return out


def _one_cell(n, d, x, y, window, n_boot, level, rng) -> CellOptimum:
    finite = np.isfinite(y) & (y > 0)
    grid = np.unique(x)
    mean = np.array([y[(x == v) & finite].mean() if ((x == v) & finite).any() else np.inf for v in grid])
    best = int(np.argmin(mean))
    flat = CellOptimum(params=n, tokens=d, x_opt=float(grid[best]), interval=(math.nan, math.nan),
                       curvature=math.nan, loss_opt=float(mean[best]), bracketed=False, grid=grid.tolist(),
                       mean_loss=mean.tolist(), resid_sd=math.nan)  # fmt: skip
    lo, hi = max(best - window, 0), min(best + window, grid.size - 1)
    sel = finite & (x >= grid[lo]) & (x <= grid[hi])
    u, ly = np.log(x[sel]), np.log(y[sel])
    if not np.isfinite(mean[best]) or best in (0, grid.size - 1) or np.unique(u).size < 3:
        return flat
    design = np.column_stack([np.ones_like(u), u, u * u])
    coef, *_ = np.linalg.lstsq(design, ly, rcond=None)
    q0, q1, q2 = coef
    u_lo, u_hi = math.log(grid[lo]), math.log(grid[hi])
    vertex = -q1 / (2 * q2) if q2 > 0 else math.nan
    if not u_lo < vertex < u_hi:
        return flat
    fitted = design @ coef
    dof = max(u.size - 3, 1)
    resid = (ly - fitted) * math.sqrt(u.size / dof)
    draws_u = np.full(n_boot, vertex)
    draws_q2 = np.full(n_boot, q2)
    if u.size == 3:  # a parabola through three points: no residual, so no interval from this cell
        draws_u, draws_q2 = np.zeros(0), np.zeros(0)
    elif n_boot > 0 and np.any(resid != 0):
        ys = fitted[None, :] + rng.choice(resid, size=(n_boot, u.size), replace=True)
        c = np.linalg.lstsq(design, ys.T, rcond=None)[0]  # (3, n_boot)
        with np.errstate(divide="ignore", invalid="ignore"):
            v = np.where(c[2] > 0, -c[1] / (2 * c[2]), np.nan)
        # a flat or inverted resample puts its optimum at the window's edge, widening the interval
        edge = np.where(c[1] + 2 * c[2] * u_lo > 0, u_lo, u_hi)
        draws_u = np.where(np.isfinite(v), np.clip(v, u_lo, u_hi), edge)
        draws_q2 = np.maximum(c[2], 1e-12)
    lo_u, hi_u = percentile_interval(draws_u, level) if draws_u.size else (math.nan, math.nan)
    return CellOptimum(
        params=n,
        tokens=d,
        x_opt=math.exp(vertex),
        interval=(math.exp(lo_u), math.exp(hi_u)),
        curvature=float(q2),
        loss_opt=math.exp(q0 + q1 * vertex + q2 * vertex**2),
        bracketed=True,
        grid=grid.tolist(),
        mean_loss=mean.tolist(),
        resid_sd=float(np.sqrt(np.sum((ly - fitted) ** 2) / dof)) if u.size > 3 else math.nan,
        draws_u=draws_u,
        draws_q2=draws_q2,
    )


@dataclass(kw_only=True, slots=True)
class OptimumLaw:
    """ln x*(N, D) = coef . [1, ln(N/N0), ln(D/D0)] (the terms fitted) and the curvature's law."""

    terms: tuple[str, ...]  # of TERMS, in order
    ref_params: float  # N0
    ref_tokens: float  # D0
    coef: np.ndarray  # intercept, then one slope per term
    curv_coef: np.ndarray  # ln q2's law, same terms (slopes 0 when too few cells)
    draws: np.ndarray  # (B, 1 + len(terms)) replicates of coef
    curv_draws: np.ndarray  # (B, 1 + len(terms))
    n_cells: int
    left_out: list[tuple[float, float]]  # (N, D) of cells not bracketed
    level: float
    resid_sd: float  # the bracketed cells' scatter about the law, in ln x

    def _design(self, n, d) -> np.ndarray:
        n, d = np.broadcast_arrays(np.asarray(n, dtype=float), np.asarray(d, dtype=float))
        cols = [np.ones(n.shape)]
        for t in self.terms:
            cols.append(np.log(n / self.ref_params) if t == "params" else np.log(d / self.ref_tokens))
        return np.stack(cols, axis=-1)

    def predict(self, n: float = 1.0, d: float = 1.0) -> tuple[float, float, float]:
        """x* at (N, D) with its percentile interval over the replicates."""
        row = self._design(n, d)
        point = float(np.exp(row @ self.coef))
        lo, hi = percentile_interval(np.exp(self.draws @ row), self.level)
        return point, float(lo), float(hi)

    def curvature(self, n: float = 1.0, d: float = 1.0) -> float:
        return float(np.exp(self._design(n, d) @ self.curv_coef))

    def cost(self, n: float, d: float, x: float) -> tuple[float, float, float]:
        """Relative loss cost of the setting x at (N, D): exp(q2 (ln x - ln x*)^2) - 1, with its
        interval over the replicates (each with its own optimum and curvature)."""
        row = self._design(n, d)
        gap = math.log(x) - row @ self.coef
        point = math.expm1(min(math.exp(row @ self.curv_coef) * gap**2, 700.0))
        exponent = np.exp(self.curv_draws @ row) * (math.log(x) - self.draws @ row) ** 2
        reps = np.expm1(np.minimum(exponent, 700.0))  # a replicate past e^700 is as lost as an infinite one
        lo, hi = percentile_interval(reps, self.level)
        return float(point), float(lo), float(hi)

    def slope_interval(self, term: str) -> tuple[float, float]:
        j = 1 + self.terms.index(term)
        lo, hi = percentile_interval(self.draws[:, j], self.level)
        return float(lo), float(hi)

    def to_dict(self) -> dict:
        return {
            "terms": list(self.terms),
            "ref_params": self.ref_params,
            "ref_tokens": self.ref_tokens,
            "coef": self.coef.tolist(),
            "curv_coef": self.curv_coef.tolist(),
            "draws": self.draws.tolist(),
            "curv_draws": self.curv_draws.tolist(),
            "n_cells": self.n_cells,
            "left_out": [list(c) for c in self.left_out],
            "level": self.level,
            "resid_sd": self.resid_sd,
        }

    @classmethod
    def from_dict(cls, data: dict) -> OptimumLaw:
        """The law as `to_dict` saved it (plain JSON numbers; nothing is executed)."""
        try:
            terms = tuple(str(t) for t in data["terms"])
            if any(t not in TERMS for t in terms):
                raise ValueError(f"unknown term in {terms}")
            return cls(
                terms=terms,
                ref_params=float(data["ref_params"]),
                ref_tokens=float(data["ref_tokens"]),
                coef=np.asarray(data["coef"], dtype=float),
                curv_coef=np.asarray(data["curv_coef"], dtype=float),
                draws=np.asarray(data["draws"], dtype=float).reshape(-1, 1 + len(terms)),
                curv_draws=np.asarray(data["curv_draws"], dtype=float).reshape(-1, 1 + len(terms)),
                n_cells=int(data["n_cells"]),
                left_out=[(float(a), float(b)) for a, b in data["left_out"]],
                level=float(data["level"]),
                resid_sd=float(data["resid_sd"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise UsageError(f"not a saved optimum law ({e})") from None


def fit_optimum_law(
    cells: list[CellOptimum], *, terms: tuple[str, ...] = TERMS, n_boot: int = 400, level: float = 0.9, seed: int = 0
) -> OptimumLaw:
    """The law of the bracketed cells' optima over `terms` (module docstring).

    Raises:
        UsageError: an unknown term, or fewer bracketed cells than the law has coefficients + 1.
    """
    if any(t not in TERMS for t in terms):
        raise UsageError(f"terms must be among {TERMS}, got {terms}")
    good = [c for c in cells if c.bracketed]
    k = 1 + len(terms)
    if len(good) < k + 1:
        raise UsageError(
            f"{len(good)} bracketed cell(s) for a law with {k} coefficient(s): widen the grid around the "
            "optimum or add cells"
        )
    ref_n = float(np.exp(np.mean(np.log([c.params for c in good]))))
    ref_d = float(np.exp(np.mean(np.log([c.tokens for c in good]))))
    law = OptimumLaw(terms=terms, ref_params=ref_n, ref_tokens=ref_d, coef=np.zeros(k), curv_coef=np.zeros(k),
                     draws=np.zeros((0, k)), curv_draws=np.zeros((0, k)), n_cells=len(good),
                     left_out=[(c.params, c.tokens) for c in cells if not c.bracketed], level=level,
                     resid_sd=math.nan)  # fmt: skip
    design = law._design([c.params for c in good], [c.tokens for c in good])
    if np.linalg.matrix_rank(design) < k:
        raise UsageError(f"the bracketed cells do not vary in every term of {terms}: add cells that do")
    u = np.array([math.log(c.x_opt) for c in good])
    lq = np.log([c.curvature for c in good])
    curv_full = len(good) >= k + 2  # the curvature's slopes need a spare cell; else a constant
    law.coef = np.linalg.lstsq(design, u, rcond=None)[0]
    law.curv_coef = _curv_fit(design, lq, curv_full)
    law.resid_sd = float(np.sqrt(np.sum((u - design @ law.coef) ** 2) / max(len(good) - k, 1)))
    rng = np.random.default_rng(seed)
    draws, curv_draws = [], []
    for _ in range(n_boot):
        idx = rng.integers(0, len(good), size=len(good))
        if np.linalg.matrix_rank(design[idx]) < k:
            continue  # a resample that cannot separate the terms says nothing about them
        pick = rng.integers(0, max(good[0].draws_u.size, 1), size=len(good))
        ub = np.array([_draw(good[i].draws_u, j, u[i]) for i, j in zip(idx, pick)])
        qb = np.log([_draw(good[i].draws_q2, j, good[i].curvature) for i, j in zip(idx, pick)])
        draws.append(np.linalg.lstsq(design[idx], ub, rcond=None)[0])
        curv_draws.append(_curv_fit(design[idx], qb, curv_full))
    law.draws = np.array(draws).reshape(-1, k)
    law.curv_draws = np.array(curv_draws).reshape(-1, k)
    return law


def _draw(draws: np.ndarray, j: int, point: float) -> float:
    return float(draws[j]) if draws.size > j else point


def _curv_fit(design: np.ndarray, lq: np.ndarray, full: bool) -> np.ndarray:
    if full and np.linalg.matrix_rank(design) == design.shape[1]:
        return np.linalg.lstsq(design, lq, rcond=None)[0]
    out = np.zeros(design.shape[1])
    out[0] = float(np.median(lq))
    return out
