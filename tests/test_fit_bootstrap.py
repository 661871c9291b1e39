"""Bootstrap, delta-method and prediction intervals; the simulator's planning helper; and the smoke
version of the calibration study (the full 200-dataset one is experiments/fit_calibration.py)."""

import numpy as np
import pytest
import torch

from scalelab.errors import UsageError
from scalelab.fitting.allocation.allocate import chinchilla_optimum
from scalelab.fitting.estimate.fit import fit_law
from scalelab.fitting.estimate.intervals import delta_method_intervals, huber_variance_factor
from scalelab.fitting.estimate.objective import BatchObjective
from scalelab.fitting.forms.laws import get_law
from scalelab.fitting.selection.simulate import CHINCHILLA_EPOCH, precision_vs_runs, simulate
from scalelab.fitting.uncertainty.bootstrap import bootstrap, refit_law, refit_replicates, resample_counts

LAW = get_law("chinchilla")
STARTS = LAW.init_grid()[::45]  # 100 of Hoffmann's starts: same optimum on these designs, 45x cheaper


def _data(seed, n_sizes=8, n_tokens=8, noise=0.01):
    return simulate("chinchilla", CHINCHILLA_EPOCH, noise_sigma=noise, seed=seed, n_sizes=n_sizes, n_tokens=n_tokens)


def test_resample_counts_rows_and_groups():
    rng = np.random.default_rng(0)
    c = resample_counts(10, 50, rng)
    assert c.shape == (50, 10) and (c.sum(axis=1) == 10).all()
    groups = np.repeat([1, 2, 3, 4], 3)
    g = resample_counts(12, 50, rng, groups)
    # Runs of one group always get the same count; the number of groups drawn is 4.
    assert (g.reshape(50, 4, 3).std(axis=2) == 0).all()
    assert (g.reshape(50, 4, 3)[:, :, 0].sum(axis=1) == 4).all()
    with pytest.raises(UsageError, match="2 distinct groups"):
        resample_counts(3, 5, rng, np.zeros(3))


def test_bootstrap_intervals_derived_and_prediction():
    data = _data(0)
    fit = fit_law(LAW, data, starts=STARTS)
    boot = bootstrap(LAW, data, fit, n_boot=200, seed=0, flops_budgets=[1e22])
    assert boot.converged.mean() > 0.95
    # the simulated law's own values (not the fit's estimates) lie inside the intervals
    alpha, beta = CHINCHILLA_EPOCH["alpha"], CHINCHILLA_EPOCH["beta"]
    n_opt, d_opt, _ = chinchilla_optimum(CHINCHILLA_EPOCH, 1e22)
    truth = {**CHINCHILLA_EPOCH, "a_opt": beta / (alpha + beta), "b_opt": alpha / (alpha + beta)}
    truth["tokens_per_param@1e+22"] = d_opt / n_opt
    for name, value in truth.items():
        lo, hi = boot.interval(name)
        assert lo < value < hi, (name, lo, value, hi)
    np.testing.assert_allclose(boot.samples["a_opt"] + boot.samples["b_opt"], 1.0)
    # Bootstrap and delta method agree on the spread of the exponents (within a factor 1.6).
    dm = delta_method_intervals(LAW, data, fit)
    for name in ("alpha", "beta"):
        ratio = np.diff(boot.interval(name))[0] / np.diff(dm.interval(name))[0]
        assert 1 / 1.6 < ratio < 1.6, (name, ratio)
    med, lo, hi = boot.prediction_interval(0.95, params=np.array([1e11]), tokens=np.array([2e12]))
    truth = LAW.predict(CHINCHILLA_EPOCH, params=1e11, tokens=2e12)
    assert lo[0] < truth < hi[0]
    _, lo_c, hi_c = boot.prediction_interval(
        0.95, include_noise=False, params=np.array([1e11]), tokens=np.array([2e12])
    )
    assert hi_c[0] - lo_c[0] < hi[0] - lo[0]  # the mean's interval is narrower than a new run's
    assert boot.to_dict()["n_boot"] == 200


def test_grouped_bootstrap_by_model_size():
    data = _data(1)
    fit = fit_law(LAW, data, starts=STARTS)
    boot = bootstrap(LAW, data, fit, n_boot=100, groups="params", seed=1)
    assert boot.grouped
    lo, hi = boot.interval("alpha")
    assert lo < CHINCHILLA_EPOCH["alpha"] < hi
    with pytest.raises(UsageError, match="groups"):
        bootstrap(LAW, data, fit, n_boot=10, groups=np.arange(3))


def test_huber_variance_factor_limits():
    sigma = 0.01
    assert huber_variance_factor(sigma, None) == pytest.approx(sigma**2)
    assert huber_variance_factor(sigma, 1.0) == pytest.approx(sigma**2, rel=1e-6)  # delta >> sigma: least squares
    assert huber_variance_factor(sigma, 1e-7) == pytest.approx(np.pi / 2 * sigma**2, rel=1e-3)  # -> LAD


def test_bootstrap_coverage_smoke():
    """Smoke version of the calibration (experiments/fit_calibration.py runs 200 datasets): over 12 small
    synthetic sweeps the 95% bootstrap intervals for alpha and beta cover the truth in most cases."""
    hits = []
    for seed in range(12):
        data = _data(100 + seed, n_sizes=6, n_tokens=6)
        fit = fit_law(LAW, data, starts=LAW.init_grid()[::150])
        boot = bootstrap(LAW, data, fit, n_boot=100, seed=seed, n_extra_starts=0)
        for name in ("alpha", "beta"):
            lo, hi = boot.interval(name)
            hits.append(lo <= CHINCHILLA_EPOCH[name] <= hi)
    assert np.mean(hits) >= 0.75, np.mean(hits)  # wide tolerance: 24 intervals, nominal 0.95


def test_precision_vs_runs_shrinks_with_more_runs():
    rows = precision_vs_runs(
        "power_law_no_e",
        designs=[{"n_points": 8}, {"n_points": 64}],
        n_datasets=6,
        noise_sigma=0.02,
        fit_kwargs={"n_polish": 1, "starts": get_law("power_law_no_e").init_grid()[::4]},
    )
    assert [r["n_runs"] for r in rows] == [8, 64]
    assert rows[1]["std"]["alpha"] < rows[0]["std"]["alpha"]


def test_refit_replicates_match_one_refit_per_replicate():
    """Every replicate's batched stage in one L-BFGS (the path `scalelab fit` and the stacked law
    take) ends where refit_law ends on that replicate's own runs: the same objective to 1e-9 and
    parameters to 1e-4, for resampled counts, per-replicate losses (a run added at a drawn loss, as
    refit_with_runs adds them) and a resample too small to fit (None, as fit_law refuses it)."""
    data = _data(1, n_sizes=4, n_tokens=4)
    rng = np.random.default_rng(3)
    n = data["loss"].size
    inputs = {k: np.append(data[k], v) for k, v in (("params", 3e10), ("tokens", 9e11))}
    counts = np.vstack([np.bincount(rng.integers(0, n, n), minlength=n) for _ in range(5)] + [np.eye(n)[0] * 3])
    counts = np.hstack([counts, np.ones((6, 1))])  # the added run is in every replicate
    losses = np.tile(np.append(data["loss"], 2.0), (6, 1))
    losses[:, -1] *= np.exp(rng.normal(0, 0.02, 6))  # each replicate draws its own loss for it
    starts = np.stack([np.vstack([LAW.to_fit(CHINCHILLA_EPOCH), STARTS[rng.choice(len(STARTS), 4)]])] * 6)
    got = refit_replicates(LAW, inputs, losses, counts > 0, counts, starts)
    assert got[-1] is None  # two distinct runs for five parameters
    for r in range(5):
        keep = counts[r] > 0
        sub = {**{k: v[keep] for k, v in inputs.items()}, "loss": losses[r][keep]}
        ref = refit_law(LAW, sub, starts[r], counts[r][keep])
        obj = BatchObjective(LAW, {k: sub[k] for k in LAW.inputs}, sub["loss"], weights=counts[r][keep])
        f_got = float(obj.value(torch.tensor(LAW.to_fit(got[r]))[None])[0])
        assert f_got == pytest.approx(ref.objective, rel=1e-9)
        assert got[r] == pytest.approx(dict(ref.params), rel=1e-4)


def test_objective_rows_carry_their_own_losses_and_weights():
    """A BatchObjective with per-row losses and weights (S, n) gives row s, alone or picked out by
    idx, the value and gradient of an objective built from losses[s] and weights[s] only."""
    data = _data(2, n_sizes=3, n_tokens=3)
    rng = np.random.default_rng(0)
    x = {k: data[k] for k in LAW.inputs}
    losses = data["loss"] * np.exp(rng.normal(0, 0.03, (4, data["loss"].size)))
    weights = rng.integers(0, 3, (4, data["loss"].size)).astype(float)
    theta = torch.tensor(STARTS[:4])
    both = BatchObjective(LAW, x, losses, weights=weights)
    f_all, g_all = both(theta)
    idx = torch.tensor([3, 1])
    f_idx, g_idx = both(theta[idx], idx)
    for s in range(4):
        one = BatchObjective(LAW, x, losses[s], weights=weights[s])
        f, g = one(theta[s : s + 1])
        assert float(f_all[s]) == pytest.approx(float(f[0]), rel=1e-12)
        assert torch.allclose(g_all[s], g[0], rtol=1e-12, atol=0)
        assert float(both.value(theta)[s]) == pytest.approx(float(f[0]), rel=1e-12)
    for j, s in enumerate(idx.tolist()):
        assert float(f_idx[j]) == pytest.approx(float(f_all[s]), rel=1e-12)
        assert torch.allclose(g_idx[j], g_all[s], rtol=1e-12, atol=0)
