"""Input errors, fit warnings, the mean-vs-sum trap, and the batched L-BFGS against scipy's."""

import numpy as np
import pytest
import torch

from scalelab.errors import UsageError
from scalelab.fitting.estimate.batched_lbfgs import lbfgs_batched
from scalelab.fitting.estimate.fit import fit_law
from scalelab.fitting.estimate.objective import BatchObjective, huber
from scalelab.fitting.forms.laws import get_law
from scalelab.fitting.selection.simulate import simulate

LAW = get_law("chinchilla")
GRID = LAW.init_grid()


def _small(seed=1, **kw):
    return simulate("chinchilla", noise_sigma=0.01, seed=seed, n_sizes=6, n_tokens=6, **kw)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.pop("tokens"), "missing columns"),
        (lambda d: d["loss"].__setitem__(3, np.nan), "non-positive or NaN"),
        (lambda d: d["params"].__setitem__(0, -1.0), "non-positive or NaN"),
        (lambda d: d["tokens"].__setitem__(2, 0.0), "non-positive or NaN"),
        (lambda d: d.update({k: v[:4] for k, v in d.items()}), "4 point"),
        (lambda d: d.update({k: np.r_[v, v[5]] for k, v in d.items()}), "duplicates"),
        (lambda d: d.update(loss=d["loss"][:-1]), "different lengths"),
    ],
)
def test_bad_inputs_raise_one_line_usage_errors(mutate, message):
    data = _small()
    mutate(data)
    with pytest.raises(UsageError, match=message) as e:
        fit_law("chinchilla", data, starts=GRID[:3])
    assert "\n" not in str(e.value)


def test_bad_options_raise():
    data = _small()
    with pytest.raises(UsageError, match="reduction"):
        fit_law("chinchilla", data, reduction="median", starts=GRID[:3])
    with pytest.raises(UsageError, match="weights"):
        fit_law("chinchilla", data, weights=-np.ones(36), starts=GRID[:3])
    with pytest.raises(UsageError, match="columns"):
        fit_law("chinchilla", data, starts=np.zeros((2, 3)))


def test_same_inputs_with_different_loss_are_allowed():
    data = _small()
    data = {k: np.r_[v, v[5]] for k, v in data.items()}
    data["loss"][-1] *= 1.01  # a second seed of the same configuration
    assert fit_law("chinchilla", data, starts=GRID[::500]).n_points == 37


def test_unidentified_exponent_warns_flat_and_disagreeing_starts():
    # A single token count: B and beta cannot be told apart from E.
    data = simulate("chinchilla", noise_sigma=0.01, seed=1, n_sizes=12, n_tokens=1, tokens_range=(1e10, 1e10))
    fit = fit_law("chinchilla", data, starts=GRID[::20])
    text = " | ".join(fit.warnings)
    assert "flat along a direction" in text
    assert "starts disagree" in text and "beta" in text


def test_bound_warning_when_loss_grows_with_size():
    rng = np.random.default_rng(0)
    n = np.repeat(np.logspace(8, 10, 6), 6)
    d = np.tile(np.logspace(9.5, 11.5, 6), 6)
    loss = (2.0 + 0.3 * (n / 1e8) ** 0.1 + 400 / d**0.3) * np.exp(0.005 * rng.standard_normal(36))
    fit = fit_law("chinchilla", {"params": n, "tokens": d, "loss": loss}, starts=GRID[::20])
    assert any("bound of alpha" in w for w in fit.warnings), fit.warnings


def test_stall_warning_and_not_converged():
    fit = fit_law(
        "chinchilla",
        _small(),
        starts=[{"E": 3.0, "A": 50.0, "B": 50.0, "alpha": 0.1, "beta": 0.1}],
        batch_max_iter=3,
        n_polish=0,
    )
    assert not fit.converged
    assert any("stalled" in w for w in fit.warnings)


def test_default_objective_is_summed_huber():
    data = _small()
    fit = fit_law("chinchilla", data, starts=GRID[::100])
    assert fit.reduction == "sum" and fit.objective_name == "huber" and fit.delta == 1e-3
    r = torch.as_tensor(fit.residuals())
    assert fit.objective == pytest.approx(float(huber(r, 1e-3).sum()), rel=1e-9)


def test_mean_huber_trap_stops_before_the_summed_optimum():
    """Averaging the Huber loss divides the objective by n, and scipy's default stopping rules do
    not scale with it: L-BFGS-B stops when an iteration lowers f by <= ftol * max(|f|, 1), an
    absolute test at these objective sizes (f < 1), so on the mean it stops with up to n times the
    summed objective's tolerance still to gain. Asserted against the optimum itself (L-BFGS-B with
    tight tolerances from both fits), over 8 simulated sets: where an L-BFGS-B path ends in this flat
    valley depends on the last bits of exp and log (the CPU's vector width), so one set decides
    nothing; on every machine the mean fit ends more than 5 ftol short on every set, while the summed
    fit reaches the optimum (within ftol) on some of them. n = 240."""
    from scipy import optimize

    ftol = 2.2e-9  # scipy's default, which fit_law uses
    tight = {"ftol": 1e-15, "gtol": 1e-10, "maxiter": 10_000}
    bounds = list(zip(*np.array(LAW.fit_bounds).T))
    starts = GRID[::450]  # 10 of Hoffmann's starting values
    reached = {"sum": 0, "mean": 0}
    for seed in range(1, 9):
        data = simulate("chinchilla", noise_sigma=0.02, seed=seed)
        fits = {red: fit_law("chinchilla", data, starts=starts, method="scipy", reduction=red) for red in reached}
        fun = BatchObjective(LAW, data, data["loss"]).numpy_fun()
        ends = {red: float(fun(np.asarray(f.theta))[0]) for red, f in fits.items()}
        assert ends["sum"] == pytest.approx(fits["sum"].objective, rel=1e-12)
        assert ends["mean"] == pytest.approx(fits["mean"].objective * data["loss"].size, rel=1e-12)  # mean = sum / n
        optimum = min(
            optimize.minimize(fun, np.asarray(f.theta), jac=True, method="L-BFGS-B", bounds=bounds, options=tight).fun
            for f in fits.values()
        )
        assert ends["mean"] - optimum > 5 * ftol, seed
        for red, end in ends.items():
            reached[red] += end - optimum <= ftol
    assert reached["mean"] == 0 and reached["sum"] >= 2, reached


def test_batched_lbfgs_matches_scipy_reference():
    from scipy import optimize

    data = _small(seed=2)
    obj = BatchObjective(LAW, data, data["loss"])
    lo, hi = np.array(LAW.fit_bounds).T
    # Starts with every term of the law alive (a start whose A/N^alpha term underflows sits on a
    # flat plateau, where any optimiser may stop).
    starts = np.stack(
        [
            LAW.to_fit({"E": 1.0, "A": np.exp(5), "B": np.exp(5), "alpha": 0.5, "beta": 0.5}),
            LAW.to_fit({"E": 3.0, "A": 50.0, "B": 50.0, "alpha": 0.1, "beta": 0.1}),
        ]
    )
    res = lbfgs_batched(obj, starts, lo, hi, gtol=1e-9, ftol=1e-12, max_iter=3000)
    fun = obj.numpy_fun()
    for i, x0 in enumerate(starts):
        ref = optimize.minimize(
            fun,
            x0,
            jac=True,
            method="L-BFGS-B",
            bounds=list(zip(lo, hi)),
            options={"gtol": 1e-9, "ftol": 1e-12, "maxiter": 3000},
        )
        assert res.f[i] <= ref.fun * (1 + 1e-6) + 1e-12 or np.isclose(res.f[i], ref.fun, rtol=1e-4)


def test_batched_lbfgs_solves_bounded_quadratics_exactly():
    target = torch.tensor([[1.0, -2.0, 0.5], [3.0, 0.0, -1.0]], dtype=torch.float64)
    scale = torch.tensor([1.0, 10.0, 100.0], dtype=torch.float64)

    def fun(x, idx):
        t = target if idx is None else target[idx]
        return ((x - t) ** 2 * scale).sum(1), 2 * (x - t) * scale

    lo, hi = np.array([-5.0, -1.0, -5.0]), np.array([5.0, 5.0, 5.0])
    res = lbfgs_batched(fun, np.zeros((2, 3)), lo, hi, gtol=1e-10)
    np.testing.assert_allclose(res.x, [[1.0, -1.0, 0.5], [3.0, 0.0, -1.0]], atol=1e-8)  # -2 clipped to -1
    assert set(res.status.tolist()) <= {0, 1}
