"""Law forms: the log-space fit forms equal the published formulas, and every law's parameters are
recovered from data simulated with known values (fitting/forms/laws.py, fitting/estimate/fit.py,
fitting/selection/simulate.py)."""

import json

import numpy as np
import pytest
import threadpoolctl
import torch

from scalelab.errors import UsageError
from scalelab.fitting.estimate import fit as fit_mod
from scalelab.fitting.estimate.fit import FitResult, fit_law
from scalelab.fitting.forms.laws import Chinchilla, get_law, law_names
from scalelab.fitting.selection.simulate import DEFAULT_PARAMS, design_points, simulate

N = np.array([7e7, 4e8, 2.8e9, 1.6e10])
D = np.array([5e9, 3e10, 1e11, 5e11])


def test_registry_and_names():
    assert law_names() == [
        "chinchilla",
        "data_constrained",
        "farseer",
        "kaplan",
        "lr_annealing",
        "lr_annealing_sized",
        "lr_area",
        "power_law",
        "power_law_no_e",
    ]
    law = get_law("chinchilla")
    assert law.param_names == ("E", "A", "B", "alpha", "beta")
    assert law.inputs == ("params", "tokens")
    assert law.init_grid().shape == (4500, 5)  # Hoffmann et al.'s grid
    assert law.bounds["alpha"] == (0.0, 3.0)
    with pytest.raises(UsageError, match="unknown law"):
        get_law("chinchila")


def test_predict_matches_published_formulas():
    p = DEFAULT_PARAMS["chinchilla"]
    want = p["E"] + p["A"] / N ** p["alpha"] + p["B"] / D ** p["beta"]
    np.testing.assert_allclose(get_law("chinchilla").predict(p, params=N, tokens=D), want, rtol=1e-12)

    k = DEFAULT_PARAMS["kaplan"]
    want = ((k["Nc"] / N) ** (k["alpha_N"] / k["alpha_D"]) + k["Dc"] / D) ** k["alpha_D"]
    np.testing.assert_allclose(get_law("kaplan").predict(k, params=N, tokens=D), want, rtol=1e-12)

    c = np.array([1e18, 1e20, 1e22])
    q = DEFAULT_PARAMS["power_law"]
    np.testing.assert_allclose(get_law("power_law").predict(q, flops=c), q["E"] + q["A"] * c ** -q["alpha"], rtol=1e-12)
    q0 = DEFAULT_PARAMS["power_law_no_e"]
    np.testing.assert_allclose(get_law("power_law_no_e").predict(q0, flops=c), q0["A"] * c ** -q0["alpha"], rtol=1e-12)


def test_data_constrained_formula():
    p = DEFAULT_PARAMS["data_constrained"]
    law = get_law("data_constrained")
    n, d, u = np.array([1e9, 1e9, 8e9]), np.array([2e10, 1.6e11, 1.6e11]), np.array([2e10, 2e10, 1e10])
    # Muennighoff et al. eq. 5: D' = U_D + U_D R_D* (1 - exp(-R_D / R_D*)), R_D = D / U_D - 1.
    r_d = d / u - 1
    d_eff = u + u * p["R_D_star"] * (1 - np.exp(-r_d / p["R_D_star"]))
    al, be = p["alpha"], p["beta"]
    g = (al * p["A"] / (be * p["B"])) ** (1 / (al + be))
    u_n = np.minimum(n, g * (u * g) ** (be / al))  # compute-optimal size for U_D tokens
    r_n = np.maximum(n / u_n - 1, 0)
    n_eff = u_n + u_n * p["R_N_star"] * (1 - np.exp(-r_n / p["R_N_star"]))
    want = p["E"] + p["A"] / n_eff**al + p["B"] / d_eff**be
    np.testing.assert_allclose(law.predict(p, params=n, tokens=d, unique_tokens=u), want, rtol=1e-10)
    # One epoch (no repetition) is exactly Chinchilla when N does not exceed N*(U_D).
    small = np.array([1e8])  # 200 tokens per parameter: below the compute-optimal size for 2e10 tokens
    one = law.predict(p, params=small, tokens=d[:1], unique_tokens=d[:1])
    base = {k: p[k] for k in ("E", "A", "B", "alpha", "beta")}
    np.testing.assert_allclose(one, get_law("chinchilla").predict(base, params=small, tokens=d[:1]), rtol=1e-12)


def test_tokens_per_param_closed_form():
    p = DEFAULT_PARAMS["chinchilla"]
    c = 1e23
    law = get_law("chinchilla")
    ns = np.logspace(9, 12, 20001)
    loss = law.predict(p, params=ns, tokens=c / (6 * ns))
    n_best = ns[np.argmin(loss)]
    np.testing.assert_allclose(Chinchilla.tokens_per_param(p, c), (c / (6 * n_best)) / n_best, rtol=2e-3)


def _rel(fit, truth, name):
    return abs(fit.params[name] / truth[name] - 1)


def test_chinchilla_recovery_full_grid():
    """Must-show: Approach 3 with the 4500-start grid on a Chinchilla-like design recovers alpha, beta
    within 0.02 (240 runs, 70M-16B params x 5B-500B tokens, 0.5% lognormal noise)."""
    truth = DEFAULT_PARAMS["chinchilla"]
    data = simulate("chinchilla", truth, noise_sigma=0.005, seed=0)
    fit = fit_law("chinchilla", data)
    assert fit.n_starts == 4500 and fit.converged and fit.warnings == []
    assert abs(fit.params["alpha"] - truth["alpha"]) < 0.02
    assert abs(fit.params["beta"] - truth["beta"]) < 0.02
    assert _rel(fit, truth, "E") < 0.02


def test_power_law_recovery():
    for name, tol_alpha in (("power_law", 0.01), ("power_law_no_e", 0.003)):
        truth = DEFAULT_PARAMS[name]
        data = simulate(name, noise_sigma=0.005, seed=3, n_points=30)
        fit = fit_law(name, data)
        assert fit.converged
        assert abs(fit.params["alpha"] - truth["alpha"]) < tol_alpha, (name, fit.params)
        if "E" in truth:
            assert _rel(fit, truth, "E") < 0.06  # the floor is weakly pinned by 5 decades of C


def test_kaplan_recovery():
    truth = DEFAULT_PARAMS["kaplan"]
    data = simulate("kaplan", noise_sigma=0.005, seed=4, n_sizes=10, n_tokens=10)
    fit = fit_law("kaplan", data)
    assert abs(fit.params["alpha_N"] - truth["alpha_N"]) < 0.005
    assert abs(fit.params["alpha_D"] - truth["alpha_D"]) < 0.005
    assert _rel(fit, truth, "Nc") < 0.5 and _rel(fit, truth, "Dc") < 0.5  # constants are weakly determined


def test_data_constrained_recovery_with_chinchilla_base():
    truth = DEFAULT_PARAMS["data_constrained"]
    base = {k: truth[k] for k in ("E", "A", "B", "alpha", "beta")}
    law = get_law("data_constrained", base=base)
    assert law.param_names == ("R_D_star", "R_N_star")
    data = simulate(law, truth, noise_sigma=0.005, seed=5, n_sizes=6, n_tokens=6, epochs=(1, 4, 16, 64, 256))
    fit = fit_law(law, data)
    assert _rel(fit, truth, "R_D_star") < 0.15, fit.params
    assert _rel(fit, truth, "R_N_star") < 0.5, fit.params
    again = FitResult.from_dict(json.loads(json.dumps(fit.to_dict())))  # base travels in law_config
    np.testing.assert_allclose(
        again.predict(**{k: data[k] for k in law.inputs}), fit.predict(**{k: data[k] for k in law.inputs})
    )


def test_fit_result_json_round_trip():
    data = simulate("chinchilla", noise_sigma=0.01, seed=7, n_sizes=6, n_tokens=6)
    fit = fit_law("chinchilla", data, starts=get_law("chinchilla").init_grid()[::50])
    again = FitResult.from_dict(json.loads(json.dumps(fit.to_dict())))
    assert again.params == fit.params and again.warnings == fit.warnings
    np.testing.assert_array_equal(again.inputs["loss"], data["loss"])
    np.testing.assert_allclose(again.predict(params=1e11, tokens=2e12), fit.predict(params=1e11, tokens=2e12))


def test_isoflop_design_has_constant_compute():
    x = design_points(
        "chinchilla", DEFAULT_PARAMS["chinchilla"], design="isoflop", budgets=[1e19, 1e20], points_per_budget=5
    )
    c = 6 * x["params"] * x["tokens"]
    np.testing.assert_allclose(c[:5], 1e19, rtol=1e-12)
    np.testing.assert_allclose(c[5:], 1e20, rtol=1e-12)


def test_data_constrained_joint_recovery():
    """All seven parameters at once (Chinchilla base + R_D*, R_N*), on runs repeating data 1-256x."""
    truth = DEFAULT_PARAMS["data_constrained"]
    law = get_law("data_constrained")
    data = simulate(law, truth, noise_sigma=0.005, seed=5, n_sizes=6, n_tokens=6, epochs=(1, 4, 16, 64, 256))
    fit = fit_law(law, data, starts=law.init_grid()[::8])
    assert abs(fit.params["alpha"] - truth["alpha"]) < 0.02 and abs(fit.params["beta"] - truth["beta"]) < 0.02
    assert _rel(fit, truth, "R_D_star") < 0.2 and _rel(fit, truth, "R_N_star") < 0.5, fit.params


def _blas_threads() -> dict[str, int]:
    return {d["filepath"]: d["num_threads"] for d in threadpoolctl.threadpool_info() if d["user_api"] == "blas"}


def test_fit_threads_limits_blas_and_torch_then_restores(monkeypatch):
    """A fit runs torch and scipy's L-BFGS-B (OpenBLAS underneath) on MAX_THREADS threads: threads
    that spin for a busy core made `scalelab fit` of 240 points several times slower on a shared
    2-core machine (bench/fit_process_time.py). The caller's settings come back afterwards. The
    caller here has 2 BLAS threads (the suite's conftest sets 1, which a missing limit would hide)."""
    monkeypatch.setattr(fit_mod, "MAX_THREADS", 1)
    torch_outside = torch.get_num_threads()
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        assert set(_blas_threads().values()) == {2}, "no BLAS library is loaded, or it cannot take 2 threads"
        with fit_mod.fit_threads():
            assert set(_blas_threads().values()) == {1}
            assert torch.get_num_threads() == 1
        assert set(_blas_threads().values()) == {2}
    assert torch.get_num_threads() == torch_outside
