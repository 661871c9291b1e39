"""Batched, bound-constrained L-BFGS in float64: thousands of independent starts in one loop.

Each row of x (S, P) is its own minimisation problem; all rows advance together so every
objective evaluation is one vectorised call. Per row:

- direction: the L-BFGS two-loop recursion over the last `history` (s, y) pairs, scaled by
  gamma = s'y / y'y; pairs with s'y <= eps y'y are skipped (no curvature information);
- bounds: projected search path x(t) = clip(x + t d, lower, upper); components of d pushing
  out of an active bound are zeroed; a non-descent direction falls back to the projected gradient
  and clears that row's memory;
- step: Armijo backtracking (sufficient decrease c1 = 1e-4) with safeguarded quadratic
  interpolation, first trial t = 1 (t = 1/||d|| when the memory is empty, as L-BFGS-B does);
  only rows still searching are re-evaluated;
- stopping, with scipy L-BFGS-B's defaults so the two agree: max |projected grad| <= gtol
  (1e-5), or (f_k - f_k+1) / max(|f_k|, |f_k+1|, 1) <= ftol (2.2e-9), or max_iter, or the line
  search fails (status 3, the analogue of ABNORMAL_TERMINATION_IN_LNSRCH).

Statuses: 0 gradient converged, 1 relative reduction converged, 2 max_iter, 3 line search failed.

The optimiser's own arithmetic runs on numpy arrays: most of its operations touch a few hundred
numbers, where a torch call costs several times a numpy one. Each is an elementwise IEEE operation
(the same bits in either library), except the row sums and norms, whose order of additions torch and
numpy choose differently for some shapes: those stay torch's (`_rowsum`, `_rownorm`), so a fit gives
the same bits as the fits already recorded in stores, ledgers and docs. `fun` is called with torch
tensors that share the arrays' memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

Fun = Callable[[torch.Tensor, torch.Tensor | None], tuple[torch.Tensor, torch.Tensor]]

STATUS_TEXT = {
    0: "projected gradient below gtol",
    1: "relative reduction of f below ftol",
    2: "max_iter reached",
    3: "line search failed",
}


@dataclass(kw_only=True, slots=True)
class BatchResult:
    """Per-row outcome of lbfgs_batched."""

    x: np.ndarray  # (S, P) final points
    f: np.ndarray  # (S,) final objective values
    grad_norm: np.ndarray  # (S,) max |projected gradient|
    n_iter: np.ndarray  # (S,) iterations taken
    status: np.ndarray  # (S,) codes, see STATUS_TEXT
    n_fun_rows: int  # total rows evaluated (objective+gradient), for benchmarks

    def rows(self, sl: slice) -> BatchResult:
        """The outcome of the rows `sl` (e.g. one problem's starts among many problems')."""
        return BatchResult(
            x=self.x[sl],
            f=self.f[sl],
            grad_norm=self.grad_norm[sl],
            n_iter=self.n_iter[sl],
            status=self.status[sl],
            n_fun_rows=0,
        )

    def copy(self, n_fun_rows: int) -> BatchResult:
        """A copy that shares no array with this one, reporting `n_fun_rows` evaluations."""
        return BatchResult(
            x=self.x.copy(),
            f=self.f.copy(),
            grad_norm=self.grad_norm.copy(),
            n_iter=self.n_iter.copy(),
            status=self.status.copy(),
            n_fun_rows=n_fun_rows,
        )


def _rowsum(a: np.ndarray) -> np.ndarray:
    """Each row's sum in torch's order of additions (see the module docstring)."""
    return torch.from_numpy(a).sum(dim=1).numpy()


def _rownorm(a: np.ndarray) -> np.ndarray:
    return torch.from_numpy(a).norm(dim=1).numpy()


def _project(x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return np.maximum(np.minimum(x, hi), lo)


def projected_gradient(x: np.ndarray, g: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The L-BFGS-B projected gradient: the step x - g clipped to the box, minus x."""
    return _project(x - g, lo, hi) - x


def _evaluate(fun: Fun, x: np.ndarray, idx: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    f, g = fun(torch.from_numpy(x), None if idx is None else torch.from_numpy(idx))
    return f.numpy(), g.numpy()


@dataclass(slots=True)
class _Memory:
    """Every row's last `history` (s, y) pairs, in one ring buffer: all rows advance in lockstep, so
    they share the slot written next (`pos`). rho = 0 marks an empty or skipped slot. Slot-major, so
    that one slot of the active rows is one contiguous block."""

    s: np.ndarray  # (history, S, P)
    y: np.ndarray  # (history, S, P)
    rho: np.ndarray  # (history, S) 1 / s'y
    gamma: np.ndarray  # (S,) s'y / y'y of the newest accepted pair
    n_pairs: np.ndarray  # (S,) pairs kept since the memory was last cleared
    pos: int = 0

    @classmethod
    def empty(cls, n_rows: int, history: int, n_par: int) -> _Memory:
        s = np.zeros((history, n_rows, n_par))
        return cls(
            s=s,
            y=np.zeros_like(s),
            rho=np.zeros((history, n_rows)),
            gamma=np.ones(n_rows),
            n_pairs=np.zeros(n_rows, dtype=np.int64),
        )

    def direction(self, act, xa, ga, lo, hi) -> tuple[np.ndarray, np.ndarray]:
        """The search direction d of the rows `act` and its slope d'g: the two-loop recursion,
        components pushing out of an active bound zeroed, projected steepest descent (and this
        row's memory forgotten) where that is not a descent direction."""
        history = self.s.shape[0]
        sa, ya, ra = (np.take(m, act, axis=1) for m in (self.s, self.y, self.rho))  # contiguous slots
        # Two-loop recursion, newest pair first; rho = 0 marks an empty or skipped slot.
        q = ga.copy()
        order = [(self.pos - 1 - i) % history for i in range(history)]
        alphas = []
        for j in order:
            a_j = ra[j] * _rowsum(sa[j] * q)
            q -= a_j[:, None] * ya[j]
            alphas.append(a_j)
        r = self.gamma[act, None] * q
        for j, a_j in zip(reversed(order), reversed(alphas)):
            b_j = ra[j] * _rowsum(ya[j] * r)
            r += sa[j] * (a_j - b_j)[:, None]
        d = -r
        d[((xa <= lo) & (d < 0)) | ((xa >= hi) & (d > 0))] = 0.0
        dg = _rowsum(d * ga)
        bad = ~(dg < 0)
        if bad.any():
            # Not a descent direction: projected steepest descent, forget this row's memory.
            d[bad] = projected_gradient(xa[bad], ga[bad], lo, hi)
            self.rho[:, act[bad]] = 0.0
            self.n_pairs[act[bad]] = 0
            dg = _rowsum(d * ga)
        return d, dg

    def push(self, act, ok, s, y, eps: float) -> None:
        """Keep each row's pair (s, y) where its step was accepted and has curvature (s'y > eps y'y)."""
        sy, yy = _rowsum(s * y), _rowsum(y * y)
        good = ok & (sy > eps * yy) & (sy > 0)
        self.s[self.pos, act] = np.where(good[:, None], s, 0.0)
        self.y[self.pos, act] = np.where(good[:, None], y, 0.0)
        self.rho[self.pos, act] = np.where(good, 1.0 / np.where(good, sy, 1.0), 0.0)
        self.gamma[act] = np.where(good, sy / np.where(good, yy, 1.0), self.gamma[act])
        self.n_pairs[act] += good
        self.pos = (self.pos + 1) % self.s.shape[0]


def _first_trial(d: np.ndarray, fresh: np.ndarray) -> np.ndarray:
    """The first trial step: t = 1, and t = 1/||d|| (at most 1) for rows with an empty memory."""
    t = np.ones(d.shape[0])
    if fresh.any():
        t[fresh] = np.minimum(1.0 / np.maximum(_rownorm(d[fresh]), 1e-300), 1.0)
    return t


def _line_search(fun: Fun, act, xa, fa, ga, d, dg, t, lo, hi, *, c1: float, max_ls: int):
    """Armijo backtracking along the projected path from trial steps t (updated in place).

    Returns the last trial point of each row, its value and gradient, whether it satisfies the
    sufficient decrease, and how many rows were evaluated."""
    x_new = _project(xa + t[:, None] * d, lo, hi)
    f_new, g_new = _evaluate(fun, x_new, act)
    n_fun = act.size
    ok = f_new <= fa + c1 * _rowsum(ga * (x_new - xa))
    ok &= np.isfinite(f_new)
    for _ls in range(max_ls):
        fail = np.flatnonzero(~ok)
        if fail.size == 0:
            break
        # Safeguarded quadratic interpolation of f along d: t* = -dg t^2 / (2 (f(t) - f - dg t)).
        tf, dgf, faf, xaf = t[fail], dg[fail], fa[fail], xa[fail]
        denom = 2.0 * (f_new[fail] - faf - dgf * tf)
        t_q = np.where(np.isfinite(denom) & (denom > 0), -dgf * tf * tf / denom, 0.5 * tf)
        tf = np.minimum(np.maximum(t_q, 0.1 * tf), 0.5 * tf)
        t[fail] = tf
        xt = _project(xaf + tf[:, None] * d[fail], lo, hi)
        ft, gt = _evaluate(fun, xt, act[fail])
        n_fun += fail.size
        x_new[fail], f_new[fail], g_new[fail] = xt, ft, gt
        ok[fail] = np.isfinite(ft) & (ft <= faf + c1 * _rowsum(ga[fail] * (xt - xaf)))
    return x_new, f_new, g_new, ok, n_fun


def _step_status(ok, fa, f_new, pg, *, ftol: float, gtol: float) -> np.ndarray:
    """Each row's status after a step: -1 still running, else a STATUS_TEXT code."""
    scale = np.maximum(np.maximum(np.abs(fa), np.abs(f_new)), 1.0)
    conv_f = ok & ((fa - f_new) <= ftol * scale)
    new_status = np.full(pg.shape, -1, dtype=np.int64)
    new_status[~ok] = 3
    new_status[conv_f] = 1
    new_status[pg <= gtol] = 0
    return new_status


def lbfgs_batched(
    fun: Fun,
    x0: np.ndarray | torch.Tensor,
    lower: np.ndarray,
    upper: np.ndarray,
    *,
    max_iter: int = 15000,
    history: int = 10,
    gtol: float = 1e-5,
    ftol: float = 2.2e-9,
    max_ls: int = 20,
    c1: float = 1e-4,
) -> BatchResult:
    """Minimise S independent problems from the rows of x0 (S, P) inside [lower, upper].

    Args:
        fun: fun(x (k, P), idx (k,) rows or None for all) -> (f (k,), grad (k, P)), torch float64.
        x0: starting points, clipped into the box first.
        lower, upper: (P,) bounds (use +-inf for none).
        max_iter, history, gtol, ftol, max_ls, c1: see the module docstring.

    Returns:
        BatchResult with per-row points, values, iterations and statuses.
    """
    with np.errstate(all="ignore"):  # inf - inf, 0 / 0 in rejected trial steps: as torch, no warning
        return _minimise(fun, x0, lower, upper, max_iter, history, gtol, ftol, max_ls, c1)


def _minimise(fun, x0, lower, upper, max_iter, history, gtol, ftol, max_ls, c1) -> BatchResult:
    x = np.asarray(x0, dtype=np.float64)
    n_rows, n_par = x.shape
    lo = np.asarray(lower, dtype=np.float64)
    hi = np.asarray(upper, dtype=np.float64)
    x = _project(x, lo, hi)  # a new array: the caller's starts are never written to
    f, g = _evaluate(fun, x, None)
    n_fun = n_rows
    mem = _Memory.empty(n_rows, history, n_par)
    n_iter = np.zeros(n_rows, dtype=np.int64)
    status = np.full(n_rows, -1, dtype=np.int64)
    pg_norm = np.abs(projected_gradient(x, g, lo, hi)).max(axis=1)
    status[pg_norm <= gtol] = 0
    eps = np.finfo(np.float64).eps

    for _ in range(max_iter):
        act = np.flatnonzero(status < 0)
        if act.size == 0:
            break
        xa, fa, ga = x[act], f[act], g[act]
        d, dg = mem.direction(act, xa, ga, lo, hi)
        t = _first_trial(d, mem.n_pairs[act] == 0)
        x_new, f_new, g_new, ok, n_ls = _line_search(fun, act, xa, fa, ga, d, dg, t, lo, hi, c1=c1, max_ls=max_ls)
        n_fun += n_ls
        mem.push(act, ok, x_new - xa, g_new - ga, eps)

        acc = act[ok]
        x[acc], f[acc], g[acc] = x_new[ok], f_new[ok], g_new[ok]
        n_iter[act] += 1

        pg = np.abs(projected_gradient(x[act], g[act], lo, hi)).max(axis=1)
        pg_norm[act] = pg
        status[act] = _step_status(ok, fa, f_new, pg, ftol=ftol, gtol=gtol)

    status[status < 0] = 2
    return BatchResult(x=x, f=f, grad_norm=pg_norm, n_iter=n_iter, status=status, n_fun_rows=n_fun)
