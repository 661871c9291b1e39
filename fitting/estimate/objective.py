"""Robust objectives on log-loss residuals, evaluated for a batch of parameter vectors at once.

For one parameter vector theta and n runs with observed loss y_i:

    r_i = log_predict(theta, x_i) - log y_i                       (residual in log space)
    huber_delta(r) = r^2 / 2            if |r| <= delta
                   = delta (|r| - delta/2) otherwise              (delta = 1e-3 by default)
    objective = sum_i w_i huber(r_i)        reduction="sum"  (the default)
              = sum_i w_i huber(r_i) / sum_i w_i   reduction="mean" (the trap: see below)

Why the sum: with delta = 1e-3 each term is ~1e-3 |r|, so the *mean* is ~n times smaller and its
decrease per L-BFGS step falls under scipy's default ftol (2.2e-9 absolute when f < 1) within a
couple of iterations; the optimiser reports convergence at a poor point. Summing keeps the scale.

`BatchObjective` evaluates f and its gradient for S parameter vectors (S, P) in one torch call, each
row with its own optional weights (S, n) and losses (S, n) - which is how bootstrap replicates
(integer counts; runs added at drawn losses) run together. A run at weight 0 adds exactly nothing,
even where the law's prediction for it is not finite.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from scalelab.errors import UsageError
from scalelab.fitting.forms.laws import Law

OBJECTIVES = ("huber", "squared")
REDUCTIONS = ("sum", "mean")


def huber(r: torch.Tensor, delta: float) -> torch.Tensor:
    """Elementwise Huber loss with threshold delta (quadratic inside, linear outside)."""
    a = r.abs()
    return torch.where(a <= delta, 0.5 * r * r, delta * (a - 0.5 * delta))


def elementwise_loss(r: torch.Tensor, objective: str, delta: float) -> torch.Tensor:
    if objective == "huber":
        return huber(r, delta)
    if objective == "squared":
        return 0.5 * r * r
    raise UsageError(f"objective={objective!r} is not known; choose one of {OBJECTIVES}")


def _rows(t: torch.Tensor, idx: torch.Tensor | None) -> torch.Tensor:
    """A shared (n,) tensor as it is; the rows `idx` of a per-row (S, n) one (all rows for None)."""
    return t if t.ndim == 1 or idx is None else t[idx]


def _weighted(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """h * w, exactly 0 where w is 0 (0 * inf would be NaN)."""
    return torch.where(w > 0, h * w, 0.0)


class BatchObjective:
    """f(theta) and grad f for a batch of parameter vectors; see the module docstring for the formula.

    Args:
        law: the law form (its log_predict_fit is the model in log space).
        x: inputs as numpy arrays (n,), keys law.inputs.
        loss: observed losses (n,), > 0, or (S, n) per-row losses.
        weights: None, (n,) shared weights, or (S, n) per-row weights (bootstrap counts).
        objective: "huber" or "squared"; delta: Huber threshold; reduction: "sum" or "mean".
    """

    def __init__(
        self,
        law: Law,
        x: Mapping[str, np.ndarray],
        loss: np.ndarray,
        *,
        weights: np.ndarray | None = None,
        objective: str = "huber",
        delta: float = 1e-3,
        reduction: str = "sum",
    ):
        if reduction not in REDUCTIONS:
            raise UsageError(f"reduction={reduction!r} is not known; choose one of {REDUCTIONS}")
        if objective not in OBJECTIVES:
            raise UsageError(f"objective={objective!r} is not known; choose one of {OBJECTIVES}")
        self.law = law
        self.x = {k: torch.as_tensor(np.asarray(x[k], dtype=np.float64)) for k in law.inputs}
        self.log_y = torch.log(torch.as_tensor(np.asarray(loss, dtype=np.float64)))
        self.weights = None if weights is None else torch.as_tensor(np.asarray(weights, dtype=np.float64))
        self.objective, self.delta, self.reduction = objective, float(delta), reduction
        self.n_evals = 0  # rows evaluated, for benchmarks

    def _weights_for(self, idx: torch.Tensor | None) -> torch.Tensor | None:
        return None if self.weights is None else _rows(self.weights, idx)

    def value(self, theta: torch.Tensor, idx: torch.Tensor | None = None) -> torch.Tensor:
        """Objective per row of theta (S, P) -> (S,). idx selects rows of per-row weights."""
        r = self.law.log_predict_fit(theta, self.x) - _rows(self.log_y, idx)
        h = elementwise_loss(r, self.objective, self.delta)
        w = self._weights_for(idx)
        if w is None:
            f = h.sum(dim=1)
            return f / h.shape[1] if self.reduction == "mean" else f
        f = _weighted(h, w).sum(dim=1)
        return f / w.sum(dim=-1) if self.reduction == "mean" else f

    def __call__(self, theta: torch.Tensor, idx: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(f (S,), grad (S, P)) at theta (S, P); rows are independent.

        grad = sum_i w_i psi(r_i) d log L_i / d theta, psi = dh/dr (clip(r, -delta, delta) for Huber),
        through the law's vector-Jacobian product (analytic for Chinchilla, autograd otherwise).
        """
        self.n_evals += theta.shape[0]
        log_pred, vjp = self.law.log_predict_vjp(theta.detach(), self.x)
        r = log_pred - _rows(self.log_y, idx)  # not in place: autograd may have saved log_pred
        if self.objective == "huber":
            # psi = clip(r, -delta, delta) = dh/dr and h = psi (r - psi/2): both branches of the
            # Huber loss in three in-place ops.
            psi = r.clamp(-self.delta, self.delta)
            h = r.sub_(psi, alpha=0.5).mul_(psi)
        else:
            psi = r.clone()
            h = r.mul_(r).mul_(0.5)
        w = self._weights_for(idx)
        if w is not None:
            h, psi = _weighted(h, w), _weighted(psi, w)
        f = h.sum(dim=1)
        if self.reduction == "mean":
            denom = w.sum(dim=-1) if w is not None else torch.tensor(float(h.shape[1]), dtype=h.dtype)
            denom = denom.reshape(-1, 1) if denom.ndim else denom
            f = f / denom.reshape(-1)
            psi = psi / denom
        return f, vjp(psi)

    def numpy_fun(self, row: int | None = None):
        """A scipy-style fun(theta (P,)) -> (f, grad (P,)) for a single parameter vector."""
        idx = None if row is None else torch.tensor([row])

        def fun(th: np.ndarray) -> tuple[float, np.ndarray]:
            f, g = self(torch.from_numpy(np.asarray(th, dtype=np.float64)).reshape(1, -1), idx)
            return float(f[0]), g[0].numpy().copy()

        return fun

    def residuals(self, theta: np.ndarray) -> np.ndarray:
        """Log-space residuals r_i at one fit-space parameter vector (P,)."""
        with torch.no_grad():
            t = torch.from_numpy(np.asarray(theta, dtype=np.float64)).reshape(1, -1)
            return (self.law.log_predict_fit(t, self.x) - self.log_y)[0].numpy()
