"""One law for two arms: per-arm E, A, B with shared exponents alpha, beta (the joint view of a study).

    joint = fit_shared_exponents(n, d, arm, loss, starts_from=(params_a, params_b))
    joint.params["a"], joint.params["b"]            # each arm's Chinchilla parameters (shared alpha, beta)
    draws = joint.replicates(counts)                 # refitted on a design-point resample each
    joint.frontier_loss("b", 2e13) - joint.frontier_loss("a", 2e13)

    L_arm(N, D) = E_arm + A_arm / N^alpha + B_arm / D^beta,     arm in {a, b} (a = 0, b = 1 in `arm`)

Fitted as every law here is (Huber on log loss, summed, multi-start L-BFGS: scalelab.fitting.estimate.fit):
both arms' runs together, so the exponents rest on twice the runs of one arm's fit, and the arms
differ only where the data say they do. It is the second view of a study's gap (the first,
scalelab.fitting.comparisons.gap_model, models the ratio directly). The irreducible terms stay per arm: a law
that also shared E would force the gap to vanish or keep a fixed share at scale whatever the data
say, and its interval would be too narrow unless its drift were backtested.

Starts: each arm's own fit combined (its E, A, B with the exponents of one arm, of the other, and
their mean), then `GRID_STARTS` points of the Chinchilla grid given to both arms alike. Replicates
refit from the point fit plus `REPLICATE_STARTS` of those (scalelab.fitting.uncertainty.bootstrap.refit_replicates);
a backtest fold (`refit_from`) from the point fit and the per-arm starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from scalelab.fitting.allocation import allocate
from scalelab.fitting.estimate.fit import fit_law
from scalelab.fitting.forms.laws import Chinchilla, Law
from scalelab.fitting.uncertainty.bootstrap import REFIT_TOLERANCES, refit_law, refit_replicates

ARMS = ("a", "b")
GRID_STARTS = 64  # Chinchilla grid points (both arms alike) beside the per-arm starts
REPLICATE_STARTS = 4  # starts per replicate beside the point fit's optimum
_CHIN = Chinchilla()


@dataclass(frozen=True, kw_only=True)
class SharedExponents(Law):
    """The law of module docstring; input `arm` is 0 for arm a and 1 for arm b."""

    name: str = "shared_exponents"
    param_names: tuple[str, ...] = ("E_a", "A_a", "B_a", "E_b", "A_b", "B_b", "alpha", "beta")
    fit_names: tuple[str, ...] = ("e_a", "a_a", "b_a", "e_b", "a_b", "b_b", "alpha", "beta")
    inputs: tuple[str, ...] = ("params", "tokens", "arm")
    fit_bounds: tuple[tuple[float, float], ...] = _CHIN.fit_bounds[:3] * 2 + _CHIN.fit_bounds[3:]
    log_fit: tuple[bool, ...] = (True,) * 6 + (False, False)
    nonnegative_inputs: tuple[str, ...] = ("arm",)

    def log_predict_fit(self, theta: torch.Tensor, x: Mapping[str, torch.Tensor]) -> torch.Tensor:
        arm = x["arm"]
        e, a, b = (theta[:, i : i + 1] * (1 - arm) + theta[:, i + 3 : i + 4] * arm for i in range(3))
        alpha, beta = theta[:, 6:7], theta[:, 7:8]
        log_n, log_d = torch.log(x["params"]), torch.log(x["tokens"])
        stacked = torch.stack(torch.broadcast_tensors(a - alpha * log_n, b - beta * log_d, e), dim=-1)
        return torch.logsumexp(stacked, dim=-1)

    def init_grid(self) -> np.ndarray:
        g = _CHIN.init_grid()
        return np.hstack([g[:, :3], g[:, :3], g[:, 3:]])


def arm_params(params: Mapping[str, float], arm: str) -> dict[str, float]:
    """One arm's Chinchilla parameters out of the joint law's."""
    return {
        "E": params[f"E_{arm}"],
        "A": params[f"A_{arm}"],
        "B": params[f"B_{arm}"],
        "alpha": params["alpha"],
        "beta": params["beta"],
    }


def _starts(law: SharedExponents, per_arm: tuple[Mapping[str, float], Mapping[str, float]] | None) -> np.ndarray:
    grid = law.init_grid()
    rows = [grid[np.linspace(0, grid.shape[0] - 1, min(GRID_STARTS, grid.shape[0])).astype(int)]]
    if per_arm is not None:
        pa, pb = (_CHIN.to_fit(p) for p in per_arm)
        for al, be in ((pa[3], pa[4]), (pb[3], pb[4]), ((pa[3] + pb[3]) / 2, (pa[4] + pb[4]) / 2)):
            rows.append(np.concatenate([pa[:3], pb[:3], [al, be]])[None, :])
    lo, hi = (np.array(b) for b in zip(*law.fit_bounds))
    return np.clip(np.vstack(rows), lo, hi)


@dataclass(kw_only=True)
class SharedFit:
    """The joint law fitted to both arms' runs (module docstring)."""

    params: dict[str, dict[str, float]]  # arm -> E, A, B, alpha, beta
    natural: dict[str, float]  # the joint law's own parameters
    data: dict[str, np.ndarray]  # params, tokens, arm, loss as fitted
    starts: np.ndarray  # the point fit's starts (fit space)

    def predict(self, arm: str, n, d, params: Mapping[str, float] | None = None) -> np.ndarray:
        p = arm_params(params, arm) if params is not None else self.params[arm]
        return _CHIN.predict(p, params=np.asarray(n, dtype=float), tokens=np.asarray(d, dtype=float))

    def frontier_loss(self, arm: str, flops: float, params: Mapping[str, float] | None = None) -> float:
        p = arm_params(params, arm) if params is not None else self.params[arm]
        return allocate.chinchilla_optimum(p, flops)[2]

    def replicates(self, counts: np.ndarray, seed: int = 0) -> list[dict[str, float] | None]:
        """The joint law refitted on each row of `counts` (replicates, runs): its weights; None where a
        replicate could not be fitted."""
        law = SharedExponents()
        counts = np.asarray(counts, dtype=float)
        if counts.size == 0:
            return []
        rng = np.random.default_rng(seed)
        warm = law.to_fit(self.natural)
        starts = np.stack(
            [
                np.vstack([warm, self.starts[rng.choice(len(self.starts), REPLICATE_STARTS, replace=False)]])
                for _ in range(counts.shape[0])
            ]
        )
        inputs = {k: self.data[k] for k in law.inputs}
        losses = np.broadcast_to(self.data["loss"], counts.shape)
        return refit_replicates(law, inputs, losses, counts > 0, counts, starts)


def _data(n, d, arm, loss) -> dict[str, np.ndarray]:
    return {
        "params": np.asarray(n, dtype=float),
        "tokens": np.asarray(d, dtype=float),
        "arm": np.asarray(arm, dtype=float),
        "loss": np.asarray(loss, dtype=float),
    }


def fit_shared_exponents(
    n, d, arm, loss, *, starts_from: tuple[Mapping[str, float], Mapping[str, float]] | None = None
) -> SharedFit:
    """The joint law on both arms' runs (arm: 0 for a, 1 for b), from the starts of module docstring.

    Args:
        starts_from: each arm's own Chinchilla fit (module docstring).
    Raises:
        UsageError: fewer runs than the law's 8 parameters, or bad values (scalelab.fitting.estimate.fit).
    """
    law = SharedExponents()
    data = _data(n, d, arm, loss)
    starts = _starts(law, starts_from)
    # run to the refits' tolerances: in a flat valley a looser stop leaves the point short of the
    # optimum its replicates (scalelab.fitting.uncertainty.bootstrap.refit_replicates) go on to
    fit = fit_law(law, data, starts=starts, diagnose=False, **REFIT_TOLERANCES)
    natural = dict(fit.params)
    return SharedFit(params={a: arm_params(natural, a) for a in ARMS}, natural=natural, data=data, starts=starts)


def refit_from(joint: SharedFit, n, d, arm, loss) -> SharedFit:
    """The joint law refitted on other runs (a backtest fold), from the point fit's optimum and the
    per-arm starts (scalelab.fitting.uncertainty.bootstrap.refit_law: one polish, tight tolerances)."""
    law = SharedExponents()
    data = _data(n, d, arm, loss)
    starts = np.vstack([law.to_fit(joint.natural)[None, :], joint.starts[-3:]])
    natural = dict(refit_law(law, data, starts).params)
    return SharedFit(params={a: arm_params(natural, a) for a in ARMS}, natural=natural, data=data, starts=joint.starts)
