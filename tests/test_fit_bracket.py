"""The first round's bracket (scalelab.fitting.allocation.bracket): the power side goes through each
budget's best loss, and the bracket is the two sides' geometric mean with both inside its interval."""

import math

import numpy as np
import pytest

from scalelab.fitting.allocation.bracket import best_loss_power, bracket


def test_the_power_side_goes_through_each_budgets_best_loss():
    budgets = np.array([2e11, 6.3e11, 2e12])
    best = 3.0 * (budgets / 1e11) ** -0.08  # an exact power law in the budgets' best losses
    flops = np.repeat(budgets, 3)
    loss = np.repeat(best, 3) * np.tile([1.0, 1.02, 1.05], 3)  # worse sizes beside each best one
    power = best_loss_power(flops[::-1], loss[::-1])  # in any order
    assert power.params["gamma"] == pytest.approx(0.08, abs=1e-9)
    assert math.exp(power.log_predict(2e13)) == pytest.approx(3.0 * 200**-0.08, rel=1e-9)


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
