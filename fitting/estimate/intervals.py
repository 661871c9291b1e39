"""Delta-method intervals (the fast alternative to the bootstrap) and shared interval helpers.

For the M-estimator theta_hat = argmin sum_i w_i h(r_i(theta)) with Huber h, the asymptotic
covariance is the sandwich

    Cov(theta_hat) = c * (J' W J)^-1,     c = E[psi(r)^2] / E[psi'(r)]^2,

J = d log L / d theta (n x P) at the optimum. c is evaluated for Gaussian residuals with the robust
scale sigma = 1.4826 * MAD(r): c -> sigma^2 for a squared loss and -> (pi/2) sigma^2 as delta -> 0
(Huber with delta = 1e-3 on ~1% noise behaves like least absolute deviations). Natural parameters
that are fitted as logs (E = exp(e)) get exp(e +- z se): positive, asymmetric intervals. A derived
quantity g(params) gets se^2 = grad' Cov grad with a central-difference gradient in fit space.

Derived quantities used by default (Chinchilla): the compute-optimal exponents
a_opt = beta / (alpha + beta) (N* ~ C^a_opt) and b_opt = alpha / (alpha + beta) (D* ~ C^b_opt), and
tokens_per_param@<C> = D*/N* at each FLOP budget asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from scipy import stats

from scalelab.fitting.forms.laws import Chinchilla, Law, get_law

Derived = Mapping[str, Callable[[Mapping[str, float]], float]]


def default_derived(law: Law, flops_budgets: Sequence[float] = ()) -> dict[str, Callable]:
    """Derived quantities reported by default for a law (see the module docstring)."""
    if not isinstance(law, Chinchilla):
        return {}
    out: dict[str, Callable] = {
        "a_opt": lambda p: p["beta"] / (p["alpha"] + p["beta"]),
        "b_opt": lambda p: p["alpha"] / (p["alpha"] + p["beta"]),
    }
    for c in flops_budgets:
        out[f"tokens_per_param@{c:.3g}"] = lambda p, c=c: float(Chinchilla.tokens_per_param(p, c))
    return out


def robust_scale(r: np.ndarray) -> float:
    """1.4826 * median absolute deviation: the Gaussian-consistent robust standard deviation."""
    r = np.asarray(r, dtype=np.float64)
    return float(1.4826 * np.median(np.abs(r - np.median(r))))


def huber_variance_factor(sigma: float, delta: float | None) -> float:
    """c = E[psi^2] / E[psi']^2 for r ~ N(0, sigma^2); delta None means the squared loss (c = sigma^2)."""
    if delta is None or sigma <= 0:
        return sigma**2
    k = delta / sigma
    inside = 2.0 * stats.norm.cdf(k) - 1.0  # P(|r| <= delta) = E[psi']
    e_psi2 = sigma**2 * (inside - 2.0 * k * stats.norm.pdf(k)) + 2.0 * delta**2 * (1.0 - stats.norm.cdf(k))
    return float(e_psi2 / max(inside, 1e-300) ** 2)


def percentile_interval(samples, level: float = 0.95):
    """Equal-tailed percentile interval: the 0.5 - level/2 and 0.5 + level/2 quantiles of the samples.

    The project's one percentile-interval helper (bootstrap parameters, predictions, allocations,
    comparisons, plots). Non-finite samples (a replicate that failed, a degenerate draw) are left
    out. Fewer than two finite samples is no interval: (nan, nan) - never None and never a
    zero-width (x, x); whoever prints or saves it shows the NaNs as missing ("-", JSON null).

    Args:
        samples: (S,) draws, or (S, K): one interval per column (axis 0 holds the draws).
        level: coverage of the interval, in (0, 1).
    Returns:
        (lo, hi) as floats for 1-D samples, as (K,) arrays for 2-D ones.
    """
    s = np.asarray(samples, dtype=np.float64)
    q = [0.5 - level / 2.0, 0.5 + level / 2.0]
    if s.ndim <= 1:
        s = s.reshape(-1)
        s = s[np.isfinite(s)]
        if s.size < 2:
            return (float("nan"), float("nan"))
        lo, hi = np.quantile(s, q)
        return (float(lo), float(hi))
    s = np.where(np.isfinite(s), s, np.nan)
    lo, hi = np.full(s.shape[1:], np.nan), np.full(s.shape[1:], np.nan)
    enough = np.sum(np.isfinite(s), axis=0) >= 2
    if enough.any():
        lo[enough], hi[enough] = np.nanquantile(s[:, enough], q, axis=0)
    return lo, hi


@dataclass(kw_only=True, slots=True)
class DeltaMethodResult:
    """Delta-method standard errors and intervals (natural parameters and derived quantities)."""

    level: float
    se: dict[str, float]  # natural-unit standard errors (parameters and derived)
    intervals: dict[str, tuple[float, float]]
    cov_fit: np.ndarray  # (P, P) covariance of the fit-space parameters
    information: np.ndarray  # (P, P) J'WJ
    variance_factor: float  # c in Cov = c (J'WJ)^-1
    estimates: dict[str, float] = field(default_factory=dict)

    def interval(self, name: str) -> tuple[float, float]:
        return self.intervals[name]

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "se": self.se,
            "intervals": {k: list(v) for k, v in self.intervals.items()},
            "estimates": self.estimates,
        }


def _jacobian(law: Law, x: Mapping[str, np.ndarray], theta: np.ndarray) -> np.ndarray:
    xt = {k: torch.as_tensor(np.asarray(v, dtype=np.float64)) for k, v in x.items()}
    t = torch.as_tensor(np.asarray(theta, dtype=np.float64))
    # Exact Jacobian with P double-backward passes (no per-point loop, no functorch start-up):
    # g(v) = J' v; then d g_j / d v = J[:, j].
    t = t.reshape(1, -1).requires_grad_(True)
    with torch.enable_grad():
        out = law.log_predict_fit(t, xt)[0]
        v = torch.zeros_like(out, requires_grad=True)
        (g,) = torch.autograd.grad(out, t, grad_outputs=v, create_graph=True)
        cols = [torch.autograd.grad(g[0, j], v, retain_graph=True, allow_unused=True)[0] for j in range(t.shape[1])]
    jac = torch.stack([c if c is not None else torch.zeros_like(out) for c in cols], dim=1).detach()
    return jac.numpy()


def _grad_fd(fn: Callable[[np.ndarray], float], theta: np.ndarray) -> np.ndarray:
    g = np.empty_like(theta)
    for j in range(theta.size):
        h = 1e-6 * (1.0 + abs(theta[j]))
        tp, tm = theta.copy(), theta.copy()
        tp[j] += h
        tm[j] -= h
        g[j] = (fn(tp) - fn(tm)) / (2.0 * h)
    return g


def delta_method(
    law: Law | str,
    x: Mapping[str, np.ndarray],
    loss: np.ndarray,
    theta: np.ndarray,
    *,
    weights: np.ndarray | None = None,
    delta: float | None = 1e-3,
    level: float = 0.95,
    derived: Derived | None = None,
) -> DeltaMethodResult:
    """Delta-method covariance and intervals at a fit-space optimum theta (see module docstring)."""
    law = get_law(law)
    theta = np.asarray(theta, dtype=np.float64)
    jac = _jacobian(law, x, theta)
    w = np.ones(jac.shape[0]) if weights is None else np.asarray(weights, dtype=np.float64)
    info = jac.T @ (jac * w[:, None])
    r = _log_residuals(law, x, loss, theta)
    sigma = robust_scale(r)
    c = huber_variance_factor(sigma, delta)
    cov = c * np.linalg.pinv(info, rcond=1e-15)
    z = float(stats.norm.ppf(0.5 + level / 2.0))
    se_fit = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    nat = law.to_natural(theta)
    se, intervals = {}, {}
    for j, name in enumerate(law.param_names):
        if law.log_fit[j]:
            # se of exp(t) by the delta method; the interval is exp of the fit-space interval.
            se[name] = nat[name] * se_fit[j]
            # min(., 709): exp overflows float64 beyond; an unidentified parameter gets (.., 8e307).
            lo_t, hi_t = (min(theta[j] + s * z * se_fit[j], 709.0) for s in (-1.0, 1.0))
            intervals[name] = (float(np.exp(lo_t)), float(np.exp(hi_t)))
        else:
            se[name] = float(se_fit[j])
            intervals[name] = (float(theta[j] - z * se_fit[j]), float(theta[j] + z * se_fit[j]))
    estimates = dict(nat)
    for name, fn in (derived if derived is not None else default_derived(law)).items():
        g = _grad_fd(lambda t, fn=fn: float(fn(law.to_natural(t))), theta)
        val = float(fn(nat))
        s = float(np.sqrt(max(g @ cov @ g, 0.0)))
        se[name], estimates[name] = s, val
        intervals[name] = (val - z * s, val + z * s)
    return DeltaMethodResult(
        level=level, se=se, intervals=intervals, cov_fit=cov, information=info, variance_factor=c, estimates=estimates
    )


def _log_residuals(law: Law, x: Mapping[str, np.ndarray], loss: np.ndarray, theta: np.ndarray) -> np.ndarray:
    xt = {k: torch.as_tensor(np.asarray(v, dtype=np.float64)) for k, v in x.items()}
    with torch.no_grad():
        lp = law.log_predict_fit(torch.as_tensor(theta).reshape(1, -1), xt)[0].numpy()
    return lp - np.log(np.asarray(loss, dtype=np.float64))


def delta_method_intervals(
    law: Law | str, data: Mapping[str, Any], fit: Any, *, level: float = 0.95, derived: Derived | None = None
) -> DeltaMethodResult:
    """Delta-method intervals for a FitResult (the fast alternative to `bootstrap`).

    Args:
        law: the law (name or object) the fit used; data: the fit's data (law.inputs + "loss");
        fit: the FitResult; level: coverage; derived: extra quantities (defaults per law).

    Returns:
        DeltaMethodResult with .se, .intervals (natural names and derived names), .cov_fit.
    """
    law = get_law(law, **getattr(fit, "law_config", {}))
    x = {k: np.asarray(data[k], dtype=np.float64) for k in law.inputs}
    delta = fit.delta if fit.objective_name == "huber" else None
    return delta_method(
        law,
        x,
        np.asarray(data["loss"], dtype=np.float64),
        np.asarray(fit.theta),
        weights=fit.weights,
        delta=delta,
        level=level,
        derived=derived,
    )
