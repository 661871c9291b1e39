"""Compute-optimal allocation: N*(C), D*(C), tokens per parameter, and the size for a data budget.

Under C = 6 N D, minimising L(N, D) along the FLOP budget gives N*(C) and D*(C) = C / (6 N*).
For the Chinchilla form L = E + A/N^alpha + B/D^beta this has a closed form

    N*(C) = G (C/6)^a,   D*(C) = G^-1 (C/6)^b,   G = (alpha A / (beta B))^(1/(alpha+beta)),
    a = beta / (alpha + beta),   b = alpha / (alpha + beta)

(Hoffmann et al. 2022, eq. 4). Any other law with inputs (N, D) is optimised numerically in ln N.
Intervals come from evaluating the same optimum on each bootstrap parameter sample (percentiles).

"Size for a data budget": given D tokens you can afford to train on, the size for which D is the
compute-optimal token count (invert D*(C) = D) - the loss-optimal model per FLOP that uses exactly
that data. For laws with a unique-token input (data-constrained), bind the unique tokens inside
`loss_fn` and use `compute_optimal` at the FLOP budget instead.

Which laws can allocate has one answer here: `can_allocate(law)` (a law of N and D alone), used by
the fit entry (its gates and frontier) and `optimum_for_law`. The subset the closed loop fits and
plan-run plans from is scalelab.fitting.entry.fit_options.LOOP_LAWS, each of which can allocate.

    alloc = chinchilla_allocation(params, flops=1e23, samples=boot_samples)
    alloc.n_opt, alloc.n_opt_interval, alloc.tokens_per_param
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize

from scalelab.errors import UsageError
from scalelab.fitting.estimate.intervals import percentile_interval
from scalelab.fitting.forms.laws import CURVE_LAWS, Law, get_law


def can_allocate(law: str | Law) -> bool:
    """A law of N and D alone, so with a compute-optimal allocation N*(C) (curve laws and the
    selection's "average" have none)."""
    name = law if isinstance(law, str) else law.name
    if name in CURVE_LAWS or name == "average":
        return False
    return set(get_law(law).inputs) == {"params", "tokens"}


LossFn = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (N, D) -> loss


@dataclass(kw_only=True, slots=True)
class Allocation:
    """The compute-optimal point at one FLOP budget, with percentile intervals when samples exist."""

    flops: float
    n_opt: float
    d_opt: float
    loss_opt: float
    tokens_per_param: float
    # percentile_interval of the samples' optima: None without samples, (nan, nan) with fewer than 2
    n_opt_interval: tuple[float, float] | None = None
    d_opt_interval: tuple[float, float] | None = None
    loss_opt_interval: tuple[float, float] | None = None
    tokens_per_param_interval: tuple[float, float] | None = None
    level: float = 0.95
    at_bound: bool = False  # the numeric optimum hit the search bounds: no interior optimum

    def to_dict(self) -> dict:
        out = {}
        for key in ("flops", "n_opt", "d_opt", "loss_opt", "tokens_per_param"):
            out[key] = getattr(self, key)
            iv = getattr(self, f"{key}_interval", None)
            if key != "flops":
                out[f"{key}_interval"] = list(iv) if iv is not None else None
        out["level"] = self.level
        out["at_bound"] = self.at_bound
        return out


def chinchilla_optimum(params: dict[str, float], flops: float) -> tuple[float, float, float]:
    """Closed-form (N*, D*, L*) at `flops` for params with keys E, A, B, alpha, beta."""
    e, a_coef, b_coef = params["E"], params["A"], params["B"]
    alpha, beta = params["alpha"], params["beta"]
    if alpha <= 0 or beta <= 0 or a_coef <= 0 or b_coef <= 0:
        raise UsageError("closed-form allocation needs A, B, alpha, beta > 0")
    g = (alpha * a_coef / (beta * b_coef)) ** (1.0 / (alpha + beta))
    n_opt = g * (flops / 6.0) ** (beta / (alpha + beta))
    d_opt = flops / (6.0 * n_opt)
    loss = e + a_coef / n_opt**alpha + b_coef / d_opt**beta
    return float(n_opt), float(d_opt), float(loss)


def numeric_optimum(
    loss_fn: LossFn, flops: float, *, n_bounds: tuple[float, float] | None = None
) -> tuple[float, float, float, bool]:
    """Minimise loss_fn(N, C/(6N)) over ln N; returns (N*, D*, L*, at_bound).

    The default bounds are N in [1e3, C/6/1e3] (at least a thousand parameters and tokens).
    """
    lo, hi = n_bounds or (1e3, flops / 6.0 / 1e3)
    if not hi > lo:
        raise UsageError(f"flops={flops:.3g} is too small to allocate (search range empty)")
    f = lambda x: float(np.asarray(loss_fn(np.exp(x), flops / (6.0 * np.exp(x)))))  # noqa: E731
    res = optimize.minimize_scalar(f, bounds=(np.log(lo), np.log(hi)), method="bounded", options={"xatol": 1e-6})
    x = float(res.x)
    at_bound = bool(min(x - np.log(lo), np.log(hi) - x) < 1e-3)
    n_opt = float(np.exp(x))
    return n_opt, flops / (6.0 * n_opt), float(res.fun), at_bound


def optimum_for_law(law) -> Callable[[dict[str, float], float], tuple]:
    """(params, flops) -> (N*, D*, L*[, at_bound]) for a law object of params and tokens under C = 6ND:
    the closed form for Chinchilla, else the numeric optimum in ln N."""
    if law.name == "chinchilla":
        return chinchilla_optimum
    if not can_allocate(law):
        raise UsageError(
            f"law {law.name} has inputs {list(law.inputs)}; compute-optimal allocation needs a law of "
            "params and tokens (chinchilla or kaplan)"
        )
    return lambda p, c: numeric_optimum(lambda n, d: law.predict(p, params=n, tokens=d), c)


def allocate(
    optimum: Callable[[dict[str, float], float], tuple],
    params: dict[str, float],
    flops: float,
    *,
    samples: Sequence[dict[str, float]] = (),
    level: float = 0.95,
) -> Allocation:
    """Compute-optimal allocation at `flops` for a point estimate plus parameter samples.

    Args:
        optimum: maps (params, flops) to (N*, D*, L*[, at_bound]) - `chinchilla_optimum`, or
            `lambda p, c: numeric_optimum(make_loss_fn(p), c)`.
        params: the fitted parameters.
        flops: FLOP budget C.
        samples: bootstrap parameter dicts; intervals are their percentiles at `level`.
    Returns:
        Allocation.
    """
    if not (np.isfinite(flops) and flops > 0):
        raise UsageError(f"flops must be a positive number, got {flops}")
    n_opt, d_opt, loss, *rest = optimum(params, flops)
    at_bound = bool(rest[0]) if rest else False
    out = Allocation(
        flops=float(flops),
        n_opt=n_opt,
        d_opt=d_opt,
        loss_opt=loss,
        tokens_per_param=d_opt / n_opt,
        level=level,
        at_bound=at_bound,
    )
    if samples:
        vals = []
        for s in samples:
            try:
                vals.append(optimum(s, flops)[:3])
            except (UsageError, ValueError, FloatingPointError, ZeroDivisionError):
                vals.append((np.nan, np.nan, np.nan))
        arr = np.asarray(vals, dtype=float)
        out.n_opt_interval = percentile_interval(arr[:, 0], level)
        out.d_opt_interval = percentile_interval(arr[:, 1], level)
        out.loss_opt_interval = percentile_interval(arr[:, 2], level)
        out.tokens_per_param_interval = percentile_interval(arr[:, 1] / arr[:, 0], level)
    return out


def chinchilla_exponents(params: dict[str, float]) -> dict[str, float]:
    """a = beta/(alpha+beta) (N* exponent), b = alpha/(alpha+beta) (D* exponent), and G."""
    alpha, beta = params["alpha"], params["beta"]
    g = (alpha * params["A"] / (beta * params["B"])) ** (1.0 / (alpha + beta))
    return {"a": beta / (alpha + beta), "b": alpha / (alpha + beta), "G": g}


def size_for_data_budget(
    optimum: Callable[[dict[str, float], float], tuple],
    params: dict[str, float],
    num_tokens: float,
    *,
    flops_bounds: tuple[float, float] = (1e12, 1e32),
) -> tuple[float, float, float]:
    """The model size for which `num_tokens` is the compute-optimal data: solve D*(C) = num_tokens.

    Returns (N*, C, L*). D*(C) increases with C for every law with an interior optimum, so a
    bracketed root in ln C is unique.
    Raises:
        UsageError: no budget in `flops_bounds` has D* = num_tokens.
    """
    if not (np.isfinite(num_tokens) and num_tokens > 0):
        raise UsageError(f"tokens must be a positive number, got {num_tokens}")
    g = lambda lc: np.log(optimum(params, float(np.exp(lc)))[1]) - np.log(num_tokens)  # noqa: E731
    lo, hi = np.log(flops_bounds[0]), np.log(flops_bounds[1])
    if g(lo) * g(hi) > 0:
        raise UsageError(f"no FLOP budget in {flops_bounds} makes {num_tokens:.3g} tokens compute-optimal")
    lc = optimize.brentq(g, lo, hi, xtol=1e-10)
    n_opt, _, loss, *_ = optimum(params, float(np.exp(lc)))
    return float(n_opt), float(np.exp(lc)), float(loss)
