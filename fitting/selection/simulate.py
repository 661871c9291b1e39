"""Simulate sweeps from a known law with lognormal loss noise, for tests and for planning.

    loss_i = L_true(x_i) * exp(noise_sigma * z_i),   z_i ~ N(0, 1)     (lognormal in loss)

Designs (inputs are log-spaced):
- "grid": every model size x every token count (laws on (N, D)); for laws on compute alone,
  `n_points` FLOP budgets between flops_range.
- "isoflop": for each FLOP budget C, `points_per_budget` sizes N spread `isoflop_width` decades
  either side of the centre size, D = C / (6 N). The centre is the true compute-optimal N* for a
  Chinchilla law, else sqrt(C / (6 * 20)) (20 tokens per parameter).
- data-constrained laws: the grid is repeated for each entry of `epochs`, with unique tokens
  U_D = D / epochs.

`simulate_curve` gives one run's whole loss curve under any LR schedule from the lr_annealing law
(for the curve fits' tests). `precision_vs_runs` answers the planning question: how does the spread of a fitted exponent
shrink with the number of runs (simulate, fit, repeat)?

    data = simulate("chinchilla", CHINCHILLA_EPOCH, design="isoflop", budgets=np.logspace(18, 21, 5))

It stays in the package, not in experiments/, though no command calls it: it is the public way to test
a law or a design against a known truth (docs/architecture.md, "How to add a law", step 4), which the
fitting tests, the experiments (fit_calibration, frontier_synthetic) and bench/fit_speed.py all use,
and a package module is what each of them can import without path tricks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from scalelab.errors import UsageError
from scalelab.fitting.estimate.fit import fit_law
from scalelab.fitting.forms.laws import Chinchilla, Law, get_law
from scalelab.fitting.loss_curves.curves import RunCurve

# Reference parameter sets (natural units: N in parameters, D in tokens, loss in nats).
CHINCHILLA_HOFFMANN = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}
CHINCHILLA_EPOCH = {"E": 1.8172, "A": 482.01, "B": 2085.43, "alpha": 0.3478, "beta": 0.3658}  # Besiroglu et al. 2024
KAPLAN_2020 = {"Nc": 8.8e13, "Dc": 5.4e13, "alpha_N": 0.076, "alpha_D": 0.095}
POWER_LAW_EXAMPLE = {"E": 1.7, "A": 300.0, "alpha": 0.12}
POWER_LAW_NO_E_EXAMPLE = {"A": 30.0, "alpha": 0.05}
DATA_CONSTRAINED_EXAMPLE = {**CHINCHILLA_HOFFMANN, "R_D_star": 15.4, "R_N_star": 5.3}

DEFAULT_PARAMS = {
    "chinchilla": CHINCHILLA_EPOCH,
    "kaplan": KAPLAN_2020,
    "power_law": POWER_LAW_EXAMPLE,
    "power_law_no_e": POWER_LAW_NO_E_EXAMPLE,
    "data_constrained": DATA_CONSTRAINED_EXAMPLE,
}


def _isoflop_centre(law: Law, params: Mapping[str, float], flops: float) -> float:
    if isinstance(law, Chinchilla) or {"alpha", "beta", "A", "B"} <= set(params):
        al, be = params["alpha"], params["beta"]
        g = (al * params["A"] / (be * params["B"])) ** (1.0 / (al + be))
        return g * (flops / 6.0) ** (be / (al + be))
    return float(np.sqrt(flops / (6.0 * 20.0)))


def design_points(
    law: Law | str,
    params: Mapping[str, float],
    *,
    design: str = "grid",
    n_sizes: int = 16,
    n_tokens: int = 15,
    params_range: tuple[float, float] = (7e7, 1.6e10),
    tokens_range: tuple[float, float] = (5e9, 5e11),
    budgets: Sequence[float] | None = None,
    points_per_budget: int = 9,
    isoflop_width: float = 1.0,
    n_points: int = 30,
    flops_range: tuple[float, float] = (1e17, 1e22),
    epochs: Sequence[float] = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0),
) -> dict[str, np.ndarray]:
    """The inputs of a design (no loss). See the module docstring for the designs."""
    law = get_law(law)
    if law.inputs == ("flops",):
        if design != "grid":
            raise UsageError(f"design={design!r}: laws on compute alone take design='grid'")
        return {"flops": np.logspace(*np.log10(flops_range), n_points)}
    if design == "grid":
        n = np.logspace(*np.log10(params_range), n_sizes)
        d = np.logspace(*np.log10(tokens_range), n_tokens)
        nn, dd = (a.reshape(-1) for a in np.meshgrid(n, d, indexing="ij"))
    elif design == "isoflop":
        budgets = np.logspace(18, 21, 6) if budgets is None else np.asarray(budgets, dtype=np.float64)
        offsets = np.linspace(-isoflop_width, isoflop_width, points_per_budget)
        nn_l, dd_l = [], []
        base = {k: v for k, v in params.items()}
        for c in budgets:
            centre = _isoflop_centre(law, base, float(c))
            n_c = centre * 10.0**offsets
            nn_l.append(n_c)
            dd_l.append(c / (6.0 * n_c))
        nn, dd = np.concatenate(nn_l), np.concatenate(dd_l)
    else:
        raise UsageError(f"design={design!r} is not known; choose 'grid' or 'isoflop'")
    out = {"params": nn, "tokens": dd}
    if "unique_tokens" in law.inputs:
        ep = np.asarray(epochs, dtype=np.float64)
        out = {
            "params": np.repeat(nn, ep.size),
            "tokens": np.repeat(dd, ep.size),
            "unique_tokens": np.repeat(dd, ep.size) / np.tile(ep, nn.size),
        }
    return out


def simulate(
    law: Law | str,
    true_params: Mapping[str, float] | None = None,
    *,
    design: str = "grid",
    noise_sigma: float = 0.01,
    seed: int = 0,
    **design_kwargs: Any,
) -> dict[str, np.ndarray]:
    """Generate a synthetic sweep: inputs from the design, loss = L_true * exp(noise_sigma * z).

    Args:
        law: law object or registry name.
        true_params: natural parameters; defaults to DEFAULT_PARAMS[law.name].
        design: "grid" or "isoflop" (see design_points for its keyword arguments).
        noise_sigma: standard deviation of log loss noise (0.01 = about 1% of the loss).
        seed: numpy random seed.

    Returns:
        dict with the law's inputs and "loss", each a float64 array of the same length.
    """
    law = get_law(law)
    params = dict(DEFAULT_PARAMS[law.name] if true_params is None else true_params)
    x = design_points(law, params, design=design, **design_kwargs)
    rng = np.random.default_rng(seed)
    clean = law.predict(params, **x)
    loss = clean * np.exp(noise_sigma * rng.standard_normal(clean.shape))
    return {**x, "loss": loss}


def precision_vs_runs(
    law: Law | str,
    true_params: Mapping[str, float] | None = None,
    *,
    designs: Sequence[Mapping[str, Any]],
    n_datasets: int = 20,
    noise_sigma: float = 0.01,
    seed: int = 0,
    fit_kwargs: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """For each design (keyword dicts for `simulate`), simulate n_datasets sweeps, fit each, and
    report per parameter the bias, standard deviation and RMSE of the estimates.

    Returns:
        one dict per design: {"n_runs", "design", "bias": {p: ...}, "std": {...}, "rmse": {...}}.
    """
    law = get_law(law)
    params = dict(DEFAULT_PARAMS[law.name] if true_params is None else true_params)
    rows = []
    for i, dkw in enumerate(designs):
        est = []
        n_runs = 0
        for k in range(n_datasets):
            data = simulate(law, params, noise_sigma=noise_sigma, seed=seed + 1000 * i + k, **dict(dkw))
            n_runs = data["loss"].size
            fit = fit_law(law, data, **dict(fit_kwargs or {}))
            est.append([fit.params[p] for p in law.param_names])
        est_a = np.array(est)
        truth = np.array([params[p] for p in law.param_names])
        bias, std = est_a.mean(axis=0) - truth, est_a.std(axis=0, ddof=1)
        rmse = np.sqrt(((est_a - truth) ** 2).mean(axis=0))
        rows.append(
            {
                "n_runs": n_runs,
                "design": dict(dkw),
                "bias": dict(zip(law.param_names, bias.tolist())),
                "std": dict(zip(law.param_names, std.tolist())),
                "rmse": dict(zip(law.param_names, rmse.tolist())),
            }
        )
    return rows


def simulate_curve(
    true_params: Mapping[str, float],
    *,
    run_id: str,
    params: float,
    lr: np.ndarray,
    tokens_per_step: float = 1024.0,
    decay: float = 0.99,
    log_every: int = 1,
    noise_sigma: float = 0.005,
    run_sigma: float = 0.0,
    seed: int = 0,
    law: str = "lr_annealing",
):
    """One run's logged losses from a curve law (`law`: lr_annealing, fitting/laws.LRAnnealing, or
    lr_annealing_sized) with noise:

        loss(step) = L(N, S1, S2) * exp(run_sigma * u + noise_sigma * z_step),   u, z ~ N(0, 1)

    (u: the run's seed offset, shared by its points; z: per logged point). `lr` is the whole
    schedule (one LR per step). Returns a fitting.loss_curves.curves.RunCurve whose final_loss is the noisy
    loss at the last step.
    """
    law = get_law(law, decay=decay)
    rng = np.random.default_rng(seed)
    steps = np.unique(np.r_[np.arange(log_every, len(lr) + 1, log_every), len(lr)])
    curve = RunCurve(
        run_id=run_id, params=params, lr=lr, steps=steps, loss=np.ones(steps.size), tokens_per_step=tokens_per_step
    )
    x = curve.inputs(steps, decay)
    clean = law.predict(true_params, **{k: x[k] for k in law.inputs})
    curve.loss = clean * np.exp(run_sigma * rng.standard_normal() + noise_sigma * rng.standard_normal(steps.size))
    curve.final_loss = float(curve.loss[-1])
    return curve
