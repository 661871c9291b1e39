"""Backtest arithmetic on a hand-computable table, and compute-optimal allocation.

The backtest fitter here is deliberately trivial ("predict the mean training loss") so every
number can be checked by hand; the real fitter is exercised in test_fit_cli.py.
"""

import numpy as np
import pytest

from scalelab.errors import UsageError
from scalelab.fitting.allocation.allocate import (
    allocate,
    chinchilla_exponents,
    chinchilla_optimum,
    numeric_optimum,
    size_for_data_budget,
)
from scalelab.fitting.estimate.io import read_runs
from scalelab.fitting.uncertainty.backtest import holdout_backtest, holdout_mask, leave_one_budget_out, relative_errors

CHIN = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}


def mean_fitter(train):
    mean = float(train.loss.mean())
    return lambda test: np.full(len(test), mean)


def tiny_table():
    # Three budgets: 6e16 (2 runs), 6e17 (2 runs), 6e18 (1 run).
    return read_runs(
        {
            "params": [1e7, 2e7, 1e8, 2e8, 1e9],
            "tokens": [1e9, 5e8, 1e9, 5e8, 1e9],
            "loss": [4.0, 4.2, 3.5, 3.3, 3.0],
            "run_id": ["a", "b", "c", "d", "e"],
        }
    )


def test_holdout_backtest_matches_hand_computation():
    res = holdout_backtest(tiny_table(), mean_fitter)
    # Train on a-d: mean 3.75. Held out: e (loss 3.0). rel = (3.75 - 3.0) / 3.0 = 0.25.
    assert res.run_id == ["e"]
    assert res.predicted.tolist() == [3.75]
    assert res.rel_error == pytest.approx([0.25])
    assert res.mare == pytest.approx(0.25) and res.bias == pytest.approx(0.25)
    assert res.n_train == 4 and res.n_test == 1
    assert res.extrapolation_decades == pytest.approx(1.0)


def test_holdout_fraction_and_ties():
    res = holdout_backtest(tiny_table(), mean_fitter, holdout_frac=0.4)
    # Top 2 runs by FLOPs: e (6e18) and one of the 6e17 pair; the tie holds out both c and d.
    assert sorted(res.run_id) == ["c", "d", "e"]
    mean = (4.0 + 4.2) / 2
    expected = [(mean - 3.5) / 3.5, (mean - 3.3) / 3.3, (mean - 3.0) / 3.0]
    got = dict(zip(res.run_id, res.rel_error))
    assert [got["c"], got["d"], got["e"]] == pytest.approx(expected)
    assert res.mare == pytest.approx(np.mean(np.abs(expected)))
    assert res.bias == pytest.approx(np.mean(expected))
    assert holdout_mask(np.array([1.0, 2.0, 3.0, 4.0]), 0.5).tolist() == [False, False, True, True]
    with pytest.raises(UsageError, match="fraction"):
        holdout_mask(np.array([1.0, 2.0]), 1.5)


def test_leave_one_budget_out_matches_hand_computation():
    res = leave_one_budget_out(tiny_table(), mean_fitter)
    loss = {"a": 4.0, "b": 4.2, "c": 3.5, "d": 3.3, "e": 3.0}
    budgets = [["a", "b"], ["c", "d"], ["e"]]
    expected = {}
    for held in budgets:
        rest = [v for k, v in loss.items() if k not in held]
        for k in held:
            expected[k] = (np.mean(rest) - loss[k]) / loss[k]
    got = dict(zip(res.run_id, res.rel_error))
    assert got == pytest.approx(expected)
    assert res.mare == pytest.approx(np.mean(np.abs(list(expected.values()))))
    assert res.bias == pytest.approx(np.mean(list(expected.values())))
    assert len(res.per_budget) == 3
    assert res.per_budget["6e+18"]["mare"] == pytest.approx(abs(expected["e"]))


def test_relative_errors_signs():
    rel, mare, bias = relative_errors([1.1, 0.9], [1.0, 1.0])
    assert rel == pytest.approx([0.1, -0.1]) and mare == pytest.approx(0.1) and bias == pytest.approx(0.0)


@pytest.mark.parametrize("flops", [1e19, 5.76e23, 1e26])
def test_chinchilla_allocation_closed_form(flops):
    alpha, beta = CHIN["alpha"], CHIN["beta"]
    g = (alpha * CHIN["A"] / (beta * CHIN["B"])) ** (1 / (alpha + beta))
    n_closed = g * (flops / 6) ** (beta / (alpha + beta))
    n_opt, d_opt, loss = chinchilla_optimum(CHIN, flops)
    assert n_opt == pytest.approx(n_closed, rel=1e-12)
    assert 6 * n_opt * d_opt == pytest.approx(flops, rel=1e-12)
    # The numeric optimiser, given only L(N, D), finds the same point.
    loss_fn = lambda n, d: CHIN["E"] + CHIN["A"] / n**alpha + CHIN["B"] / d**beta  # noqa: E731
    n_num, d_num, loss_num, at_bound = numeric_optimum(loss_fn, flops)
    assert n_num == pytest.approx(n_opt, rel=1e-4) and loss_num == pytest.approx(loss, rel=1e-9)
    assert not at_bound
    ex = chinchilla_exponents(CHIN)
    assert ex["a"] + ex["b"] == pytest.approx(1.0) and ex["G"] == pytest.approx(g)


def test_allocation_intervals_from_samples():
    # Two parameter sets, 100 samples each: the 95% percentile interval runs from one set's optimum
    # to the other's, whatever the estimate in the middle.
    low, high = {**CHIN, "alpha": CHIN["alpha"] - 0.02}, {**CHIN, "alpha": CHIN["alpha"] + 0.02}
    alloc = allocate(chinchilla_optimum, CHIN, 1e23, samples=[low] * 100 + [high] * 100)
    (n_a, d_a, _), (n_b, d_b, _) = chinchilla_optimum(low, 1e23), chinchilla_optimum(high, 1e23)
    assert alloc.n_opt_interval == pytest.approx(sorted([n_a, n_b]), rel=1e-9)
    assert alloc.tokens_per_param == pytest.approx(alloc.d_opt / alloc.n_opt)
    assert alloc.tokens_per_param_interval == pytest.approx(sorted([d_a / n_a, d_b / n_b]), rel=1e-9)
    assert set(alloc.to_dict()) >= {"n_opt", "n_opt_interval", "d_opt", "tokens_per_param", "loss_opt"}


def test_size_for_data_budget_inverts_allocation():
    n_opt, d_opt, _ = chinchilla_optimum(CHIN, 1e22)
    n_back, flops, _ = size_for_data_budget(chinchilla_optimum, CHIN, d_opt)
    assert flops == pytest.approx(1e22, rel=1e-8) and n_back == pytest.approx(n_opt, rel=1e-8)
    with pytest.raises(UsageError, match="positive"):
        size_for_data_budget(chinchilla_optimum, CHIN, -5.0)


def test_numeric_optimum_flags_bound_for_monotone_law():
    n, d, loss, at_bound = numeric_optimum(lambda n, d: 2.0 + 100.0 / n**0.3, 1e20)  # no data term
    assert at_bound and n == pytest.approx(1e20 / 6 / 1e3, rel=1e-3)
