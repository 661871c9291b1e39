"""Scaling-law forms: small typed objects with parameter names, bounds, an init grid and predict().

Every law is fitted in *log-loss space*: `log_predict_fit(theta, x)` returns log L for a batch of
parameter vectors `theta` (shape (S, P), torch float64) at n points, so the fitter can run thousands of
starts at once. `theta` is the law's *fit parametrisation* (`fit_names`, e.g. e = ln E); results are
reported in natural form (`param_names`, e.g. E) via `to_natural` / `to_fit`.

    law = get_law("chinchilla")
    law.param_names            # ("E", "A", "B", "alpha", "beta")
    law.predict({"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28},
                params=np.array([1e9]), tokens=np.array([2e10]))

Registry names: "chinchilla", "kaplan", "farseer" (Chinchilla with an N-dependent data term),
"power_law" (with E), "power_law_no_e", "data_constrained",
and the loss-curve laws "lr_annealing" and "lr_area" (inputs from fitting/loss_curves/lr_areas.py, fitted on
every checkpoint of every run by fitting/loss_curves/curves.py).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from scalelab.errors import UsageError

Params = Mapping[str, float] | np.ndarray | list | tuple


def _grid(*axes: list[float]) -> np.ndarray:
    """Cartesian product of axes as a (K, len(axes)) float64 array, first axis slowest."""
    return np.array(list(itertools.product(*axes)), dtype=np.float64)


def _lse(*terms: torch.Tensor) -> torch.Tensor:
    """log(sum(exp(t))) over the given broadcastable terms, stable."""
    return torch.logsumexp(torch.stack(torch.broadcast_tensors(*terms), dim=-1), dim=-1)


@dataclass(frozen=True, kw_only=True)
class Law:
    """Base of every law form. Subclasses set the class-level names and implement the math.

    Attributes (per law):
        name: registry name.
        param_names: natural parameter names, the order of `predict`'s array form.
        fit_names: names in the fit parametrisation (same length and order as param_names).
        inputs: data columns the law reads besides "loss" (e.g. ("params", "tokens")).
        fit_bounds: (lo, hi) per fit parameter; the optimiser stays inside them.
        log_fit: which fit parameters are logs of their natural counterparts.
        nonnegative_inputs: inputs allowed to be 0 (e.g. an annealing area before any decay).
    """

    name: str = ""
    param_names: tuple[str, ...] = ()
    fit_names: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()
    fit_bounds: tuple[tuple[float, float], ...] = ()
    log_fit: tuple[bool, ...] = ()
    nonnegative_inputs: tuple[str, ...] = ()  # inputs that may be 0 (all others must be > 0)

    # -- parametrisation ---------------------------------------------------------------------
    @property
    def n_params(self) -> int:
        return len(self.param_names)

    @property
    def bounds(self) -> dict[str, tuple[float, float]]:
        """Bounds in natural units, keyed by natural name (fit bounds mapped through exp where logged)."""
        out = {}
        for name, (lo, hi), is_log in zip(self.param_names, self.fit_bounds, self.log_fit):
            out[name] = (math.exp(lo), math.exp(hi)) if is_log else (lo, hi)
        return out

    def to_natural(self, theta: np.ndarray) -> dict[str, float]:
        """Fit-space vector (P,) -> {natural name: value}."""
        theta = np.asarray(theta, dtype=np.float64).reshape(-1)
        return {
            n: float(math.exp(t)) if is_log else float(t) for n, t, is_log in zip(self.param_names, theta, self.log_fit)
        }

    def to_natural_array(self, theta: np.ndarray) -> np.ndarray:
        """Fit-space array (..., P) -> natural array (..., P), vectorised."""
        theta = np.asarray(theta, dtype=np.float64)
        mask = np.array(self.log_fit)
        return np.where(mask, np.exp(np.where(mask, theta, 0.0)), theta)

    def to_fit(self, params: Params) -> np.ndarray:
        """Natural params (dict by name, or array in param_names order) -> fit-space vector (P,)."""
        vals = self._as_array(params)
        out = np.empty_like(vals)
        for i, is_log in enumerate(self.log_fit):
            if is_log:
                if vals[i] <= 0:
                    raise UsageError(f"{self.name}: parameter {self.param_names[i]}={vals[i]} must be > 0")
                out[i] = math.log(vals[i])
            else:
                out[i] = vals[i]
        return out

    def _as_array(self, params: Params) -> np.ndarray:
        if isinstance(params, Mapping):
            missing = [n for n in self.param_names if n not in params]
            if missing:
                raise UsageError(f"{self.name}: missing parameters {missing}; expected {self.param_names}")
            return np.array([float(params[n]) for n in self.param_names], dtype=np.float64)
        arr = np.asarray(params, dtype=np.float64).reshape(-1)
        if arr.size != self.n_params:
            raise UsageError(f"{self.name}: expected {self.n_params} parameters {self.param_names}")
        return arr

    # -- math ----------------------------------------------------------------------------------
    def log_predict_fit(self, theta: torch.Tensor, x: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """log L for a batch: theta (S, P) fit-space, x[input] (n,) -> (S, n). Subclasses implement."""
        raise NotImplementedError

    def log_predict_vjp(
        self, theta: torch.Tensor, x: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
        """(log L (S, n), vjp) where vjp(w (S, n)) = sum_i w_i d log L_i / d theta -> (S, P).

        The default uses autograd; laws on the hot path (Chinchilla) override it analytically.
        """
        t = theta.detach().requires_grad_(True)
        with torch.enable_grad():
            out = self.log_predict_fit(t, x)

        def vjp(w: torch.Tensor) -> torch.Tensor:
            return torch.autograd.grad(out, t, grad_outputs=w)[0]

        return out.detach(), vjp

    def predict(self, params: Params, /, **inputs: Any) -> np.ndarray:
        """Predicted loss L at the given inputs (arrays broadcast together), natural params."""
        missing = [k for k in self.inputs if k not in inputs]
        if missing:
            raise UsageError(f"{self.name}.predict: missing inputs {missing}; expected {self.inputs}")
        arrays = np.broadcast_arrays(*[np.asarray(inputs[k], dtype=np.float64) for k in self.inputs])
        shape = arrays[0].shape
        x = {k: torch.from_numpy(np.ascontiguousarray(a).reshape(-1)) for k, a in zip(self.inputs, arrays)}
        theta = torch.from_numpy(self.to_fit(params)).reshape(1, -1)
        with torch.no_grad():
            logl = self.log_predict_fit(theta, x)[0].numpy()
        return np.exp(logl).reshape(shape)

    def init_grid(self) -> np.ndarray:
        """Starting points (K, P) in fit space. Subclasses implement."""
        raise NotImplementedError

    def exponent_names(self) -> tuple[str, ...]:
        """Natural names of the exponents (used by identifiability and disagreement diagnostics)."""
        return tuple(n for n in self.param_names if n.startswith("alpha") or n.startswith("beta"))

    def config(self) -> dict[str, Any]:
        """Keyword arguments that rebuild this law through get_law(name, **config)."""
        return {}


@dataclass(frozen=True, kw_only=True)
class Chinchilla(Law):
    """Chinchilla (Hoffmann et al. 2022, Approach 3):  L(N, D) = E + A / N^alpha + B / D^beta.

    Fitted in log space as  log L = LSE(a - alpha log N, b - beta log D, e)  with a = ln A,
    b = ln B, e = ln E. Init grid: Hoffmann et al.'s alpha, beta in {0, 0.5, ..., 2}, e in
    {-1, -0.5, ..., 1}, a, b in {0, 5, ..., 25} (4500 starts). Inputs: params (N), tokens (D).
    """

    name: str = "chinchilla"
    param_names: tuple[str, ...] = ("E", "A", "B", "alpha", "beta")
    fit_names: tuple[str, ...] = ("e", "a", "b", "alpha", "beta")
    inputs: tuple[str, ...] = ("params", "tokens")
    fit_bounds: tuple[tuple[float, float], ...] = ((-5.0, 3.0), (-10.0, 60.0), (-10.0, 60.0), (0.0, 3.0), (0.0, 3.0))
    log_fit: tuple[bool, ...] = (True, True, True, False, False)

    def log_predict_fit(self, theta: torch.Tensor, x: Mapping[str, torch.Tensor]) -> torch.Tensor:
        e, a, b, alpha, beta = (theta[:, i : i + 1] for i in range(5))
        log_n, log_d = torch.log(x["params"]), torch.log(x["tokens"])
        return _lse(a - alpha * log_n, b - beta * log_d, e)

    def log_predict_vjp(
        self, theta: torch.Tensor, x: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
        # Analytic, with L = E + P_A + P_B, P_A = exp(a - alpha log N), P_B = exp(b - beta log D):
        # d logL/de = E/L, d/da = P_A/L, d/db = P_B/L, d/dalpha = -log N P_A/L, d/dbeta = -log D P_B/L.
        # No max-shift is needed: inside the fit bounds every exponent stays far from float64
        # overflow, and a non-finite trial value is rejected by the line search. Few full-size ops:
        # this is the hot loop of the 4500-start fit.
        log_n, log_d = torch.log(x["params"]), torch.log(x["tokens"])
        big_e = torch.exp(theta[:, 0:1])
        p_a = torch.addcmul(theta[:, 1:2], theta[:, 3:4], log_n, value=-1.0).exp_()
        p_b = torch.addcmul(theta[:, 2:3], theta[:, 4:5], log_d, value=-1.0).exp_()
        total = torch.add(p_a, p_b).add_(big_e)
        out = torch.log(total)

        def vjp(w: torch.Tensor) -> torch.Tensor:
            ws = w / total
            ws_sum = ws.sum(1)
            q_a, q_b = ws.mul(p_a), ws.mul_(p_b)  # ws is consumed in place by the second product
            cols = [big_e[:, 0] * ws_sum, q_a.sum(1), q_b.sum(1), -(q_a @ log_n), -(q_b @ log_d)]
            return torch.stack(cols, dim=1)

        return out, vjp

    def init_grid(self) -> np.ndarray:
        alphas = [0.0, 0.5, 1.0, 1.5, 2.0]
        es = [-1.0, -0.5, 0.0, 0.5, 1.0]
        abs_ = [0.0, 5.0, 10.0, 15.0, 20.0, 25.0]
        return _grid(es, abs_, abs_, alphas, alphas)

    @staticmethod
    def optimal_exponents(params: Mapping[str, float]) -> tuple[float, float]:
        """Compute-optimal exponents (a, b) with N* ~ C^a, D* ~ C^b: a = beta/(alpha+beta)."""
        s = params["alpha"] + params["beta"]
        return params["beta"] / s, params["alpha"] / s

    @staticmethod
    def tokens_per_param(params: Mapping[str, float], flops: float | np.ndarray) -> np.ndarray:
        """D*/N* at a FLOP budget under C = 6 N D (Hoffmann et al. eq. 4, closed form)."""
        al, be = params["alpha"], params["beta"]
        g = (al * params["A"] / (be * params["B"])) ** (1.0 / (al + be))
        a, b = be / (al + be), al / (al + be)
        c6 = np.asarray(flops, dtype=np.float64) / 6.0
        return (c6**b / g) / (g * c6**a)


@dataclass(frozen=True, kw_only=True)
class Kaplan(Law):
    """Kaplan et al. 2020:  L(N, D) = [(Nc / N)^(alpha_N / alpha_D) + Dc / D]^alpha_D.

    Fitted in log space as  log L = alpha_D * LSE((alpha_N/alpha_D)(nc - log N), dc - log D)
    with nc = ln Nc, dc = ln Dc. Published values: Nc = 8.8e13, Dc = 5.4e13, alpha_N = 0.076,
    alpha_D = 0.095 (N without embeddings, D in tokens, loss in nats).
    """

    name: str = "kaplan"
    param_names: tuple[str, ...] = ("Nc", "Dc", "alpha_N", "alpha_D")
    fit_names: tuple[str, ...] = ("nc", "dc", "alpha_N", "alpha_D")
    inputs: tuple[str, ...] = ("params", "tokens")
    fit_bounds: tuple[tuple[float, float], ...] = ((0.0, 80.0), (0.0, 80.0), (1e-3, 2.0), (1e-3, 2.0))
    log_fit: tuple[bool, ...] = (True, True, False, False)

    def log_predict_fit(self, theta: torch.Tensor, x: Mapping[str, torch.Tensor]) -> torch.Tensor:
        nc, dc, an, ad = (theta[:, i : i + 1] for i in range(4))
        log_n, log_d = torch.log(x["params"]), torch.log(x["tokens"])
        return ad * _lse((an / ad) * (nc - log_n), dc - log_d)

    def init_grid(self) -> np.ndarray:
        logs = [20.0, 25.0, 30.0, 35.0, 40.0]
        exps = [0.03, 0.06, 0.1, 0.2, 0.4]
        return _grid(logs, logs, exps, exps)


@dataclass(frozen=True, kw_only=True)
class Farseer(Law):
    """Chinchilla with a data term whose coefficient depends on the model size:

        L(N, D) = E + A / N^alpha + B (N / 1e6)^gamma / D^beta

    Farseer (Li et al. 2025, "Predictable Scale: Part II") lets the data term's coefficient and
    exponent vary with N; this is its one-parameter case (gamma = 0 is Chinchilla). gamma is
    identified only by runs that vary D at several N far enough apart: an IsoFLOP design ties D to
    N within a budget, so gamma trades against alpha and beta unless the budgets span a wide range
    (experiments/identify.py measures whether a design pins it). N is scaled by 1e6 so that B keeps
    Chinchilla's order of magnitude. Fitted in log space (g = gamma).
    """

    name: str = "farseer"
    param_names: tuple[str, ...] = ("E", "A", "B", "alpha", "beta", "gamma")
    fit_names: tuple[str, ...] = ("e", "a", "b", "alpha", "beta", "gamma")
    inputs: tuple[str, ...] = ("params", "tokens")
    fit_bounds: tuple[tuple[float, float], ...] = (*Chinchilla.fit_bounds, (-1.0, 1.0))
    log_fit: tuple[bool, ...] = (True, True, True, False, False, False)

    def log_predict_fit(self, theta: torch.Tensor, x: Mapping[str, torch.Tensor]) -> torch.Tensor:
        e, a, b, alpha, beta, gamma = (theta[:, i : i + 1] for i in range(6))
        log_n, log_d = torch.log(x["params"]), torch.log(x["tokens"])
        return _lse(a - alpha * log_n, b + gamma * (log_n - math.log(1e6)) - beta * log_d, e)

    def init_grid(self) -> np.ndarray:
        base = Chinchilla.init_grid(self)[::4]
        return np.concatenate([np.column_stack([base, np.full(len(base), g)]) for g in (-0.2, 0.0, 0.2)])


@dataclass(frozen=True, kw_only=True)
class PowerLaw(Law):
    """Power law in compute with an irreducible term:  L(C) = E + A * C^-alpha.

    Fitted in log space as  log L = LSE(a - alpha log C, e), a = ln A, e = ln E. Input: flops.
    """

    name: str = "power_law"
    param_names: tuple[str, ...] = ("E", "A", "alpha")
    fit_names: tuple[str, ...] = ("e", "a", "alpha")
    inputs: tuple[str, ...] = ("flops",)
    fit_bounds: tuple[tuple[float, float], ...] = ((-5.0, 3.0), (-10.0, 60.0), (0.0, 3.0))
    log_fit: tuple[bool, ...] = (True, True, False)

    def log_predict_fit(self, theta: torch.Tensor, x: Mapping[str, torch.Tensor]) -> torch.Tensor:
        e, a, alpha = (theta[:, i : i + 1] for i in range(3))
        return _lse(a - alpha * torch.log(x["flops"]), e)

    def init_grid(self) -> np.ndarray:
        es = [-1.0, -0.5, 0.0, 0.5, 1.0]
        as_ = [0.0, 2.5, 5.0, 7.5, 10.0, 15.0, 20.0, 25.0]
        alphas = [0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0]
        return _grid(es, as_, alphas)


@dataclass(frozen=True, kw_only=True)
class PowerLawNoE(Law):
    """Pure power law in compute:  L(C) = A * C^-alpha, i.e. log L = a - alpha log C (a = ln A)."""

    name: str = "power_law_no_e"
    param_names: tuple[str, ...] = ("A", "alpha")
    fit_names: tuple[str, ...] = ("a", "alpha")
    inputs: tuple[str, ...] = ("flops",)
    fit_bounds: tuple[tuple[float, float], ...] = ((-10.0, 60.0), (0.0, 3.0))
    log_fit: tuple[bool, ...] = (True, False)

    def log_predict_fit(self, theta: torch.Tensor, x: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return theta[:, 0:1] - theta[:, 1:2] * torch.log(x["flops"])

    def init_grid(self) -> np.ndarray:
        return _grid([0.0, 2.5, 5.0, 10.0, 15.0, 20.0, 25.0], [0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0])


_DC_BASE = ("E", "A", "B", "alpha", "beta")


@dataclass(frozen=True, kw_only=True)
class DataConstrained(Law):
    """Data-constrained scaling (Muennighoff et al. 2023) on the Chinchilla base.

        L = E + A / N'^alpha + B / D'^beta
        D' = U_D + U_D R_D* (1 - exp(-R_D / R_D*)),   R_D = D / U_D - 1   (repeated epochs beyond 1)
        N' = U_N + U_N R_N* (1 - exp(-R_N / R_N*)),   R_N = max(N / U_N - 1, 0)
        U_N = min(N, N*(U_D)),  N*(U_D) = G (U_D G)^(a/b): the compute-optimal size for U_D tokens
              (G, a, b from the Chinchilla base: G = (alpha A / (beta B))^(1/(alpha+beta))).

    Inputs: params (N), tokens (D, total seen) and unique_tokens (U_D). Fitted in log space with
    r_d = ln R_D*, r_n = ln R_N*. With `base` given (natural E, A, B, alpha, beta, e.g. from a
    single-epoch Chinchilla fit), only R_D* and R_N* are fitted, as in the paper; otherwise all
    seven parameters are fitted jointly. Paper values: R_D* ~ 15.4, R_N* ~ 5.3.
    """

    name: str = "data_constrained"
    base: dict[str, float] | None = field(default=None)
    inputs: tuple[str, ...] = ("params", "tokens", "unique_tokens")

    def __post_init__(self) -> None:
        cb = Chinchilla()
        if self.base is not None:
            missing = [k for k in _DC_BASE if k not in self.base]
            if missing:
                raise UsageError(f"data_constrained: base is missing {missing}; give {_DC_BASE}")
            object.__setattr__(self, "base", {k: float(self.base[k]) for k in _DC_BASE})
            names, fnames, bnds, logs = (), (), (), ()
        else:
            names, fnames, bnds, logs = cb.param_names, cb.fit_names, cb.fit_bounds, cb.log_fit
        object.__setattr__(self, "param_names", names + ("R_D_star", "R_N_star"))
        object.__setattr__(self, "fit_names", fnames + ("r_d", "r_n"))
        object.__setattr__(self, "fit_bounds", bnds + ((-3.0, 8.0), (-3.0, 8.0)))
        object.__setattr__(self, "log_fit", logs + (True, True))

    def config(self) -> dict[str, Any]:
        return {"base": dict(self.base)} if self.base is not None else {}

    def _base_theta(self, theta: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.base is None:
            return tuple(theta[:, i : i + 1] for i in range(5))
        b = self.base
        vals = (math.log(b["E"]), math.log(b["A"]), math.log(b["B"]), b["alpha"], b["beta"])
        return tuple(torch.full((theta.shape[0], 1), v, dtype=theta.dtype) for v in vals)

    def log_predict_fit(self, theta: torch.Tensor, x: Mapping[str, torch.Tensor]) -> torch.Tensor:
        e, a, b, alpha, beta = self._base_theta(theta)
        r_d_star, r_n_star = torch.exp(theta[:, -2:-1]), torch.exp(theta[:, -1:])
        n, d = x["params"], x["tokens"]
        u_d = torch.minimum(x["unique_tokens"], d)  # a run that sees fewer tokens than exist repeats none
        rep_d = torch.clamp(d / u_d - 1.0, min=0.0)
        d_eff = u_d * (1.0 + r_d_star * (1.0 - torch.exp(-rep_d / r_d_star)))
        # N*(U_D) in log form: log G = (log(alpha A) - log(beta B)) / (alpha + beta); eps keeps
        # the logs finite when an exponent sits at its bound of 0.
        eps = 1e-12
        s = alpha + beta + eps
        log_g = (torch.log(alpha + eps) + a - torch.log(beta + eps) - b) / s
        log_un_opt = log_g + (beta / (alpha + eps)) * (log_g + torch.log(u_d))
        log_u_n = torch.minimum(torch.log(n).expand_as(log_un_opt), log_un_opt)
        u_n = torch.exp(log_u_n)
        rep_n = torch.clamp(n / u_n - 1.0, min=0.0)
        n_eff = u_n * (1.0 + r_n_star * (1.0 - torch.exp(-rep_n / r_n_star)))
        return _lse(a - alpha * torch.log(n_eff), b - beta * torch.log(d_eff), e)

    def init_grid(self) -> np.ndarray:
        rs = [0.0, 1.5, 3.0, 4.5]  # ln R*: R* from 1 to 90 epochs
        if self.base is not None:
            return _grid(rs, rs)
        # A reduced Hoffmann grid for the base keeps the joint fit at 1152 starts (7 parameters).
        return _grid([-0.5, 0.5], [0.0, 10.0, 20.0], [0.0, 10.0, 20.0], [0.25, 0.5], [0.25, 0.5], rs, rs)


@dataclass(frozen=True, kw_only=True)
class LRAnnealing(Law):
    """Loss-curve law with LR annealing (Tissue et al. 2024) plus a Chinchilla size term:

        L(N, s) = E + A / N^alpha + B / S1(s)^beta - C * S2(s)

    S1 is the forward area in tokens at the run's peak LR and S2 the annealing area (the fraction
    of the peak LR shed so far, through a momentum of 1 / (1 - decay) steps); see
    fitting/loss_curves/lr_areas.py. At a constant LR S2 = 0 and S1 = D: Chinchilla on every checkpoint.
    Fitted in log space with e, a, b, c the logs of E, A, B, C. `decay` is the momentum lambda the
    S2 inputs were computed with (kept so a saved fit recomputes them); the curve fitter profiles it.
    Inputs: params (N), s1, s2 (s2 >= 0; zero before any annealing).
    """

    name: str = "lr_annealing"
    decay: float = 0.999
    units: str = "peak_tokens"  # or "lr_steps": Tissue et al.'s raw LR x steps (see RunCurve.areas)
    param_names: tuple[str, ...] = ("E", "A", "B", "C", "alpha", "beta")
    fit_names: tuple[str, ...] = ("e", "a", "b", "c", "alpha", "beta")
    inputs: tuple[str, ...] = ("params", "s1", "s2")
    fit_bounds: tuple[tuple[float, float], ...] = (
        (-5.0, 3.0),
        (-10.0, 60.0),
        (-10.0, 60.0),
        (-20.0, 40.0),  # C spans ~0.1 (areas at the peak LR) to ~1e4 (raw LR areas)
        (0.0, 3.0),
        (0.0, 3.0),
    )
    log_fit: tuple[bool, ...] = (True, True, True, True, False, False)
    nonnegative_inputs: tuple[str, ...] = ("s2",)

    def log_predict_fit(self, theta: torch.Tensor, x: Mapping[str, torch.Tensor]) -> torch.Tensor:
        e, a, b, c, alpha, beta = (theta[:, i : i + 1] for i in range(6))
        log_n, log_s1 = torch.log(x["params"]), torch.log(x["s1"])
        total = torch.exp(e) + torch.exp(a - alpha * log_n) + torch.exp(b - beta * log_s1) - torch.exp(c) * x["s2"]
        # A start can put the annealing bonus above the loss; the floor keeps the log finite and
        # the objective there huge, so the search moves away (no gradient is lost elsewhere).
        return torch.log(total.clamp_min(1e-6))

    def init_grid(self) -> np.ndarray:
        return _grid(
            [-1.0, 0.0, 0.5],
            [0.0, 5.0, 10.0, 20.0],
            [0.0, 5.0, 10.0, 20.0],
            [-4.0, -2.0, 0.0],
            [0.1, 0.3, 0.7],
            [0.1, 0.3, 0.7],
        )

    def config(self) -> dict[str, Any]:
        return {"decay": self.decay, "units": self.units}


@dataclass(frozen=True, kw_only=True)
class LRAnnealingSized(LRAnnealing):
    """LRAnnealing whose data term's coefficient depends on the model size:

        L(N, s) = E + A / N^alpha + B N^gamma / S1(s)^beta - C * S2(s)

    Chinchilla's data term B / D^beta is the same for every size; Farseer (Li et al. 2025,
    "Predictable Scale: Part II") lets its coefficient and exponent vary with N. This is the
    one-parameter case of that: a power of N on B (gamma = 0 is lr_annealing). On the CPU IsoFLOP
    sweeps (one peak LR for every size) the larger models gain less per token than the smaller
    ones, which a common B cannot express (experiments/curve_sweeps.py). Fitted in log space (g = gamma).
    """

    name: str = "lr_annealing_sized"
    param_names: tuple[str, ...] = ("E", "A", "B", "C", "alpha", "beta", "gamma")
    fit_names: tuple[str, ...] = ("e", "a", "b", "c", "alpha", "beta", "gamma")
    fit_bounds: tuple[tuple[float, float], ...] = (*LRAnnealing.fit_bounds, (-1.5, 1.5))
    log_fit: tuple[bool, ...] = (True, True, True, True, False, False, False)

    def log_predict_fit(self, theta: torch.Tensor, x: Mapping[str, torch.Tensor]) -> torch.Tensor:
        e, a, b, c, alpha, beta, gamma = (theta[:, i : i + 1] for i in range(7))
        log_n, log_s1 = torch.log(x["params"]), torch.log(x["s1"])
        data = torch.exp(b + gamma * log_n - beta * log_s1)
        total = torch.exp(e) + torch.exp(a - alpha * log_n) + data - torch.exp(c) * x["s2"]
        return torch.log(total.clamp_min(1e-6))  # the floor: see LRAnnealing

    def init_grid(self) -> np.ndarray:
        base = LRAnnealing.init_grid(self)
        return np.concatenate([np.column_stack([base, np.full(len(base), g)]) for g in (-0.3, 0.0, 0.3)])


@dataclass(frozen=True, kw_only=True)
class LRArea(Law):
    """The forward-area law: Chinchilla with D replaced by the LR area S1 (no annealing term),

        L(N, s) = E + A / N^alpha + B / S1(s)^beta,   log L = LSE(a - alpha log N, b - beta log S1, e)

    i.e. LRAnnealing with C = 0: the schedule enters only through how much LR-weighted data a
    checkpoint has seen. Kept as its own candidate so law selection can tell whether the annealing
    term earns its parameter. Inputs: params (N), s1.
    """

    name: str = "lr_area"
    units: str = "peak_tokens"
    param_names: tuple[str, ...] = ("E", "A", "B", "alpha", "beta")
    fit_names: tuple[str, ...] = ("e", "a", "b", "alpha", "beta")
    inputs: tuple[str, ...] = ("params", "s1")
    fit_bounds: tuple[tuple[float, float], ...] = Chinchilla.fit_bounds
    log_fit: tuple[bool, ...] = (True, True, True, False, False)

    def log_predict_fit(self, theta: torch.Tensor, x: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return Chinchilla.log_predict_fit(self, theta, {"params": x["params"], "tokens": x["s1"]})

    def log_predict_vjp(
        self, theta: torch.Tensor, x: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
        return Chinchilla.log_predict_vjp(self, theta, {"params": x["params"], "tokens": x["s1"]})

    def init_grid(self) -> np.ndarray:
        return Chinchilla.init_grid(self)

    def config(self) -> dict[str, Any]:
        return {"units": self.units}


_REGISTRY: dict[str, type[Law]] = {
    "chinchilla": Chinchilla,
    "kaplan": Kaplan,
    "farseer": Farseer,
    "power_law": PowerLaw,
    "power_law_no_e": PowerLawNoE,
    "data_constrained": DataConstrained,
    "lr_annealing": LRAnnealing,
    "lr_area": LRArea,
    "lr_annealing_sized": LRAnnealingSized,
}
CURVE_LAWS = (
    "lr_annealing",
    "lr_area",
    "lr_annealing_sized",
)  # laws of LR areas: fitted on loss curves (fitting/loss_curves/curves.py)


def get_law(name: str | Law, **config: Any) -> Law:
    """Registry lookup: get_law("chinchilla"), get_law("data_constrained", base={...}).

    Raises:
        UsageError: unknown name (the message lists the known ones).
    """
    if isinstance(name, Law):
        return name
    if name not in _REGISTRY:
        raise UsageError(f"unknown law {name!r}; choose one of {sorted(_REGISTRY)}")
    return _REGISTRY[name](**config)


def law_names() -> list[str]:
    """Names accepted by get_law."""
    return sorted(_REGISTRY)
