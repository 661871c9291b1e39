"""Approaches 1/2, hyperparameter laws, the loss-to-accuracy sigmoid and the run-table reader.

Data come from a Chinchilla law with known parameters (Hoffmann et al. 2022 fit) plus
multiplicative noise, so the compute-optimal exponent is known exactly: a = beta / (alpha + beta).
"""

import numpy as np
import polars as pl
import pytest

from scalelab.errors import ConfigError, UsageError
from scalelab.fitting.estimate.approaches import approach1, approach2, group_budgets
from scalelab.fitting.estimate.io import ColumnMap, read_runs
from scalelab.fitting.hp_laws.hyperparams import best_lr, fit_hyperparam_law, grid_position, optimal_per_budget
from scalelab.fitting.task_accuracy.loss_to_accuracy import fit_sigmoid, two_step_predict

E, A, B, ALPHA, BETA = 1.69, 406.4, 410.7, 0.34, 0.28
A_OPT = BETA / (ALPHA + BETA)  # N* ∝ C^a
G = (ALPHA * A / (BETA * B)) ** (1 / (ALPHA + BETA))


def chinchilla(n, d):
    return E + A / n**ALPHA + B / d**BETA


def isoflop_design(budgets, width=1.2, per_budget=9, noise=0.003, seed=0):
    rng = np.random.default_rng(seed)
    n, d, c = [], [], []
    for budget in budgets:
        n_opt = G * (budget / 6) ** A_OPT
        for f in np.linspace(-width, width, per_budget):
            n.append(n_opt * np.exp(f))
            d.append(budget / 6 / n[-1])
            c.append(budget)
    n, d, c = map(np.array, (n, d, c))
    loss = chinchilla(n, d) * np.exp(rng.normal(0, noise, n.size))
    return n, d, c, loss


def test_approach2_recovers_compute_optimal_exponent():
    n, d, c, loss = isoflop_design(np.logspace(18, 22, 5))
    res = approach2(params=n, tokens=d, loss=loss, flops=c)
    # The parabola in ln N is a symmetric stand-in for an asymmetric curve: a known bias of ~0.015
    # at this width, hence the 0.03 tolerance.
    assert abs(res.n_opt.exponent - A_OPT) < 0.03
    assert abs(res.d_opt.exponent - (1 - A_OPT)) < 0.03
    assert abs(res.n_opt.exponent + res.d_opt.exponent - 1.0) < 1e-9  # D* = C / (6 N*)
    assert not res.flagged_budgets()
    lo, hi = res.n_opt.exponent_interval
    assert lo < A_OPT < hi
    for m in res.minima:  # per-budget vertex near the closed-form optimum, which its interval holds
        true_n_opt = G * (m.flops / 6) ** A_OPT
        assert abs(np.log(m.n_opt / true_n_opt)) < 0.25
        assert m.n_opt_interval[0] < true_n_opt < m.n_opt_interval[1], (m.flops, m.n_opt_interval, true_n_opt)


def test_approach2_flags_flat_and_boundary_budgets():
    n, d, c, loss = isoflop_design(np.logspace(18, 21, 4), noise=0.0)
    # Boundary: a budget whose sizes all sit far above the optimum (the vertex is below them).
    budget = 1e20
    n_opt = G * (budget / 6) ** A_OPT
    nb = n_opt * np.exp(np.linspace(1.5, 3.0, 6))
    # Flat: a budget whose losses are pure noise around a constant.
    rng = np.random.default_rng(3)
    budget_f = 3e22
    nf = G * (budget_f / 6) ** A_OPT * np.exp(np.linspace(-1, 1, 7))
    lf = 2.0 + rng.normal(0, 0.01, nf.size)
    n_all = np.concatenate([n, nb, nf])
    c_all = np.concatenate([c, np.full(nb.size, budget * 1.5), np.full(nf.size, budget_f)])
    d_all = c_all / (6 * n_all)
    l_all = np.concatenate([loss, chinchilla(nb, budget * 1.5 / 6 / nb), lf])
    res = approach2(params=n_all, tokens=d_all, loss=l_all, flops=c_all)
    by_flops = {round(np.log10(m.flops), 2): m for m in res.minima}
    assert by_flops[round(np.log10(budget * 1.5), 2)].boundary
    assert by_flops[round(np.log10(budget_f), 2)].flat
    assert len(res.flagged_budgets()) == 2
    assert all(m.used for m in res.minima if not (m.flat or m.boundary))
    assert sum(m.used for m in res.minima) == 4
    assert any("flat" in w for w in res.warnings) and any("beyond" in w for w in res.warnings)
    assert abs(res.n_opt.exponent - A_OPT) < 0.03  # flagged budgets did not pollute the fit


def test_approach2_needs_two_located_budgets():
    n, d, c, loss = isoflop_design([1e20], noise=0.0)
    with pytest.raises(UsageError, match="budget"):
        approach2(params=n, tokens=d, loss=loss, flops=c)


def test_approach1_envelope_recovers_exponent():
    rng = np.random.default_rng(1)
    sizes = np.logspace(7, 10, 13)
    n = np.repeat(sizes, 40)
    d = np.tile(np.logspace(8, 12, 40), sizes.size)
    loss = chinchilla(n, d) * np.exp(rng.normal(0, 0.002, n.size))
    res = approach1(params=n, tokens=d, loss=loss)
    assert abs(res.n_opt.exponent - A_OPT) < 0.04
    assert abs(res.d_opt.exponent - (1 - A_OPT)) < 0.04
    lo, hi = res.n_opt.exponent_interval
    assert lo < A_OPT < hi
    assert any(m.boundary for m in res.minima) == any(not m.used for m in res.minima)


def test_approach1_needs_curves():
    with pytest.raises(UsageError, match="curves"):
        approach1(params=[1e8, 2e8, 4e8], tokens=[1e9, 1e9, 1e9], loss=[3.0, 2.9, 2.8])


def test_group_budgets_tolerance():
    labels = group_budgets(np.array([1e20, 1.02e20, 3e20, 2.99e20, 1e21]))
    assert labels.tolist() == [0, 0, 1, 1, 2]


@pytest.mark.parametrize("robust", [False, True])
def test_hyperparam_law_recovers_slope(robust):
    rng = np.random.default_rng(2)
    c = np.logspace(17, 22, 12)
    lr = 10 ** (1.5 - 0.25 * np.log10(c) + rng.normal(0, 0.03, c.size))
    if robust:
        lr[3] *= 10  # one outlying budget: RLM should shrug it off
    law = fit_hyperparam_law(c, lr, robust=robust)
    lo, hi = law.slope_interval
    assert lo < -0.25 < hi and hi - lo < 0.05
    assert abs(law.slope + 0.25) < 0.02
    point, plo, phi = law.predict(1e23)
    true = 10 ** (1.5 - 0.25 * 23)
    assert plo < true < phi
    _, qlo, qhi = law.predict(1e23, kind="prediction")
    assert qlo < true < qhi and qhi - qlo > phi - plo


def test_ols_outlier_breaks_ols_not_rlm():
    c = np.logspace(17, 22, 12)
    lr = 10 ** (1.5 - 0.25 * np.log10(c))
    lr[-1] *= 30
    assert abs(fit_hyperparam_law(c, lr, robust=True).slope + 0.25) < 0.01
    assert abs(fit_hyperparam_law(c, lr).slope + 0.25) > 0.05


def test_optimal_per_budget_parabola_vertex():
    c, h, loss = [], [], []
    for budget in np.logspace(18, 21, 4):
        h_opt = 10 ** (1.5 - 0.25 * np.log10(budget))
        for hv in h_opt * np.logspace(-1, 1, 7) * 1.13:  # grid offset so the vertex is off-grid
            c.append(budget)
            h.append(hv)
            loss.append(3 + 0.1 * np.log10(hv / h_opt) ** 2)
    opts = optimal_per_budget(np.array(c), np.array(h), np.array(loss))
    assert len(opts) == 4 and all(o.interior for o in opts)
    for o in opts:
        assert o.h_opt == pytest.approx(10 ** (1.5 - 0.25 * np.log10(o.flops)), rel=1e-6)
    law = fit_hyperparam_law([o.flops for o in opts], [o.h_opt for o in opts])
    assert law.slope == pytest.approx(-0.25, abs=1e-6)


LR_GRID = 1e-3 * 2.0 ** np.arange(7)


def _lr_sweep(best: float, curvature: float, noise: float, seeds: int, rng) -> tuple[np.ndarray, np.ndarray]:
    lrs = np.repeat(LR_GRID, seeds)
    return lrs, 3 + curvature * np.log2(lrs / best) ** 2 + rng.normal(0, noise, lrs.size)


def test_best_lr_sub_grid_vertex_and_bootstrap_interval():
    rng = np.random.default_rng(0)
    true = 5.2e-3  # between grid values 4e-3 and 8e-3, nearer 4e-3
    exact = best_lr(*_lr_sweep(true, 0.05, 0.0, 1, rng))
    assert exact.interior and exact.lr == pytest.approx(true, rel=1e-6) and exact.grid_lr == 4e-3
    # two seeds of noisy losses: the interval covers the truth in most of 40 repeats, and a flat
    # curve (curvature 10x smaller, same noise) gets a much wider one
    covered, widths = 0, {}
    for curvature in (0.05, 0.005):
        spans = []
        for rep in range(40):
            opt = best_lr(*_lr_sweep(true, curvature, 0.01, 2, rng), n_boot=300, seed=rep)
            spans.append(grid_position(opt.interval[1], LR_GRID) - grid_position(opt.interval[0], LR_GRID))
            covered += curvature == 0.05 and opt.interval[0] <= true <= opt.interval[1]
        widths[curvature] = float(np.median(spans))
    assert covered >= 30, covered  # nominal 90%
    assert widths[0.005] > 2 * widths[0.05], widths
    # the best at the grid's edge, or a diverged run, is never turned into a vertex
    edge = best_lr(*_lr_sweep(5e-4, 0.05, 0.0, 1, rng))
    assert not edge.interior and edge.lr == 1e-3
    lrs, loss = _lr_sweep(true, 0.05, 0.0, 1, rng)
    loss[3] = np.inf  # the run at 8e-3 diverged
    assert best_lr(lrs, loss).grid_lr == 4e-3
    assert grid_position(5.657e-3, LR_GRID) == pytest.approx(2.5, abs=1e-3)


def test_sigmoid_recovery_and_two_step():
    rng = np.random.default_rng(4)
    loss = np.linspace(2.0, 4.0, 40)
    acc = 0.7 / (1 + np.exp(3.0 * (loss - 3.0))) + 0.25 + rng.normal(0, 0.004, loss.size)
    sig = fit_sigmoid(loss, acc)
    assert sig.a == pytest.approx(0.7, abs=0.03)
    assert sig.k == pytest.approx(-3.0, abs=0.3)
    assert sig.L0 == pytest.approx(3.0, abs=0.03)
    assert sig.b == pytest.approx(0.25, abs=0.02)
    ci = sig.intervals()
    assert ci["k"][0] < -3.0 < ci["k"][1] and ci["L0"][0] < 3.0 < ci["L0"][1]
    mid, lo, hi = two_step_predict(np.array([2.9, 3.0, 3.1]), sig)
    assert lo < mid < hi and mid == pytest.approx(0.6, abs=0.02)


def test_sigmoid_rejects_too_few_points():
    with pytest.raises(UsageError, match="5 points"):
        fit_sigmoid([2.0, 3.0], [0.5, 0.4])


def test_read_runs_maps_columns_and_derives_tokens(tmp_path):
    frame = pl.DataFrame({"N": [1e8, 2e8], "C": [6e17, 2.4e18], "L": [3.1, 2.9], "run_id": ["a", "b"]})
    path = tmp_path / "runs.parquet"
    frame.write_parquet(path)
    t = read_runs(path, columns=ColumnMap(params="N", flops="C", loss="L", tokens="D"))
    assert t.tokens == pytest.approx([1e9, 2e9])
    assert t.tokens_source == "flops/(6N)" and t.flops_source == "column"
    assert t.run_id.tolist() == ["a", "b"]
    csv = tmp_path / "runs.csv"
    pl.DataFrame({"params": [1e8], "tokens": [1e9], "loss": [3.0]}).write_csv(csv)
    t = read_runs(csv)
    assert t.flops == pytest.approx([6e17]) and t.flops_source == "6ND"


@pytest.mark.parametrize(
    "table, match",
    [
        ({"params": [1e8], "loss": [3.0]}, "'tokens'"),
        ({"params": [1e8], "tokens": [1e9]}, "'loss'"),
        ({"params": [1e8, 2e8], "tokens": [1e9, 1e9], "loss": [3.0, float("nan")]}, "NaN"),
        ({"params": [-1.0], "tokens": [1e9], "loss": [3.0]}, "non-positive"),
    ],
)
def test_read_runs_errors_name_the_column(table, match):
    with pytest.raises(ConfigError, match=match):
        read_runs(table)
