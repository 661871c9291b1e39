"""The first round's bracket (scalelab.fitting.allocation.bracket): the power side goes through each
budget's best loss, and the bracket is the two sides' geometric mean with both inside its interval;
the loop predicts a first round's runs beyond its budgets by it (ScalingFit.run_interval), and keeps
the fit's own prediction inside the budgets and wherever a calibrated frontier sets the level."""

import math

import numpy as np
import pytest

from scalelab.fitting.allocation.bracket import best_loss_power, bracket
from scalelab.fitting.entry.fit_options import FitOptions
from scalelab.fitting.entry.fit_runs import fit_runs
from scalelab.fitting.estimate.io import read_runs
from scalelab.fitting.selection.simulate import CHINCHILLA_EPOCH, simulate


def test_the_power_side_goes_through_each_budgets_best_loss():
    budgets = np.array([2e11, 6.3e11, 2e12])
    best = 3.0 * (budgets / 1e11) ** -0.08  # an exact power law in the budgets' best losses
    flops = np.repeat(budgets, 3)
    loss = np.repeat(best, 3) * np.tile([1.0, 1.02, 1.05], 3)  # worse sizes beside each best one
    power = best_loss_power(flops[::-1], loss[::-1])  # in any order
    assert power.params["gamma"] == pytest.approx(0.08, abs=1e-9)
    # a table's 6ND: each run within a percent of its budget, the budgets' best losses as before
    jitter = flops * np.tile([0.98, 1.0, 1.0 / 0.98], 3)  # geometric mean: the budget
    assert best_loss_power(jitter, loss).params["gamma"] == pytest.approx(0.08, abs=1e-9)
    assert math.exp(power.log_predict(2e13)) == pytest.approx(3.0 * 200**-0.08, rel=1e-9)
    assert math.exp(best_loss_power(jitter, loss).log_predict(2e13)) == pytest.approx(3.0 * 200**-0.08, rel=1e-9)


def test_the_bracket_is_the_sides_geometric_mean_inside_its_interval():
    b = bracket((1.33, 1.12, 1.58), 1.10)  # a pessimistic surface, an optimistic power side
    assert b.point == pytest.approx(math.sqrt(1.33 * 1.10))
    assert (b.low_end, b.high_end) == (1.10, 1.33)
    assert b.lo < b.low_end < b.point < b.high_end < b.hi
    # the half-width: the surface's and half the sides' gap, in quadrature
    half = math.hypot(math.log(1.58 / 1.12) / 2, math.log(1.33 / 1.10) / 2)
    assert math.log(b.hi / b.point) == pytest.approx(half) and math.log(b.point / b.lo) == pytest.approx(half)
    same = bracket((1.2, 1.1, 1.3), 1.2)  # the sides agree: the surface's own interval about its point
    assert (same.point, same.low_end, same.high_end) == (1.2, 1.2, 1.2)
    assert same.hi / same.lo == pytest.approx(1.3 / 1.1)


@pytest.fixture(scope="module")
def first_round():
    """A first round: three budgets over one decade, five sizes each, from a known Chinchilla law."""
    runs = simulate("chinchilla", CHINCHILLA_EPOCH, design="isoflop", budgets=np.logspace(18, 19, 3),
                    points_per_budget=5, isoflop_width=1.0, noise_sigma=0.002, seed=3)  # fmt: skip
    return fit_runs(read_runs(runs), FitOptions(starts=100, bootstrap=8))


def test_the_loop_predicts_a_first_rounds_far_runs_by_the_bracket(first_round):
    fit = first_round
    assert not fit.frontier_calibrated  # three budgets: no forward fold for the frontier
    n, d, flops = 1.2e9, 1.4e10, 1e20  # 10x past the largest budget, near its optimum
    assert fit.brackets(flops)
    got, b = fit.run_interval(n, d, flops, optimal=True), fit.bracket_interval(n, d, flops)
    assert (got.point, got.lo, got.hi) == (b.point, b.lo, b.hi)
    assert got.ends == (b.low_end, b.high_end) and set(got.parts) == {"surface", "sides"}
    surface = fit.surface_interval(n, d, flops)
    assert surface.point in (b.low_end, b.high_end)  # one end is the surface's own prediction
    # inside the fitted budgets the loop's prediction is the fit's own, as before
    inside = 1e19
    assert not fit.brackets(inside)
    assert fit.run_interval(5e8, inside / 3e9, inside) == fit.predict_interval(5e8, inside / 3e9, inside)


def test_a_calibrated_frontier_keeps_its_level_and_no_bracket():
    runs = simulate("chinchilla", CHINCHILLA_EPOCH, design="isoflop", budgets=np.logspace(18, 19.5, 6),
                    points_per_budget=5, isoflop_width=1.0, noise_sigma=0.002, seed=3)  # fmt: skip
    fit = fit_runs(read_runs(runs), FitOptions(starts=100, bootstrap=4))
    assert fit.frontier_calibrated
    n, d, flops = 3e9, 5.5e10, 1e21
    assert not fit.brackets(flops)
    assert fit.run_interval(n, d, flops, optimal=True) == fit.optimal_run_interval(n, d, flops)
    assert fit.run_interval(n, d, flops) == fit.predict_interval(n, d, flops)
