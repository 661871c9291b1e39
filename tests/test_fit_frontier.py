"""The compute frontier on synthetic truths (fitting/allocation/frontier*.py, compute_optimal.py,
fitting/uncertainty/compute_groups.py): it recovers a known law's L*(C) and N*(C), its calibrated
interval covers the truth one decade out and is narrow while doing so, the calibration widens where
the forward folds missed, and a table's groups are its budgets, bins or models."""

import math

import numpy as np
import pytest

from scalelab.fitting.allocation.allocate import chinchilla_optimum
from scalelab.fitting.allocation.frontier import fit_frontier
from scalelab.fitting.allocation.frontier_calibration import Pair, calibrate
from scalelab.fitting.estimate.io import read_runs
from scalelab.fitting.selection.simulate import CHINCHILLA_EPOCH, simulate
from scalelab.fitting.uncertainty.compute_groups import MAX_GROUPS, compute_groups, is_curve_table

TRUTH = CHINCHILLA_EPOCH
BUDGETS = np.logspace(18, 20, 6)


def _table(seed: int, noise: float, budgets=BUDGETS, sizes: int = 7):
    data = simulate("chinchilla", TRUTH, design="isoflop", budgets=budgets, points_per_budget=sizes,
                    isoflop_width=0.6, noise_sigma=noise, seed=seed)  # fmt: skip
    return read_runs(data)


def _frontier(table):
    return fit_frontier(table.params, table.tokens, table.loss, table.flops, compute_groups(table))


def test_noise_free_runs_give_the_truths_frontier_exactly():
    """On a Chinchilla law, L*(C) = E + K C^-(alpha beta / (alpha + beta)): the slices' minima and the
    saturating form recover it, and N*(C) follows the closed form."""
    fr = _frontier(_table(0, 0.0))
    for p in fr.used:
        n_true, _, l_true = chinchilla_optimum(TRUTH, p.flops)
        assert p.loss == pytest.approx(l_true, rel=1e-6) and p.n_opt == pytest.approx(n_true, rel=1e-4)
    sat = fr.core.forms["saturating"]
    gamma = TRUTH["alpha"] * TRUTH["beta"] / (TRUTH["alpha"] + TRUTH["beta"])
    assert sat.params["E"] == pytest.approx(TRUTH["E"], rel=2e-3) and sat.params["gamma"] == pytest.approx(
        gamma, rel=2e-3
    )
    far = 1e21
    assert float(np.exp(sat.log_predict(far))) == pytest.approx(chinchilla_optimum(TRUTH, far)[2], rel=1e-4)
    a = TRUTH["beta"] / (TRUTH["alpha"] + TRUTH["beta"])
    assert fr.n_line["exponent"] == pytest.approx(a, rel=1e-3)
    assert fr.predict(far).n_opt == pytest.approx(chinchilla_optimum(TRUTH, far)[0], rel=2e-3)


def test_the_interval_covers_one_decade_out_and_stays_narrow():
    """16 seeds of 1% run noise: the 95% interval of L*(1e21) (one decade past the runs) covers the
    truth in most of them (coverage; measured 13 of 16 on this truth, where the power form is
    optimistic and the weights lean to it: the forms are fitted without the surface here) at a median
    half-width under 10% (sharpness); the point errs less than the half-width on average."""
    target = 1e21
    truth = chinchilla_optimum(TRUTH, target)[2]
    covered, half, err = [], [], []
    for seed in range(16):
        pred = _frontier(_table(seed, 0.01)).predict(target)
        covered.append(pred.lo <= truth <= pred.hi)
        half.append(math.log(pred.hi / pred.point))
        err.append(abs(math.log(pred.point / truth)))
    assert np.mean(covered) >= 0.75, np.mean(covered)
    assert np.median(half) < math.log(1.10), np.median(half)
    assert np.mean(err) < np.median(half)


def _pairs(errors: dict[str, float], folds=range(4, 10)) -> list[Pair]:
    return [
        Pair(fold=f, decades=d, errors={k: v * d for k, v in errors.items()}, fit=0.002, noise=0.002)
        for f in folds
        for d in (0.3, 0.6, 0.9)
    ]


def test_the_calibration_widens_where_the_folds_missed_and_weights_the_form_that_held():
    """Forward folds whose errors are far above their scale raise tau; folds that measured nothing
    leave the small-sample prior; folds where the power form held and the saturating one drifted put
    the weight on the power form."""
    missed = calibrate(_pairs({"saturating": 0.06, "power": 0.05}), n_points=10)
    held = calibrate(_pairs({"saturating": 0.0005, "power": -0.0005}), n_points=10)
    assert missed.tau(0.9) > 3 * held.tau(0.9) and held.tau(0.9) < 1.0
    assert calibrate([], n_points=3).tau(1.0) == pytest.approx(12.706 / 1.95996, rel=1e-3)  # t with 1 dof
    moved = calibrate(_pairs({"saturating": 0.05, "power": 0.0}), n_points=10)
    assert moved.weights["power"] > 0.8 and moved.weights["surface"] == 0.0


def test_a_tables_groups_are_its_budgets_its_bins_or_its_models():
    iso = _table(0, 0.01)
    assert compute_groups(iso).kind == "FLOP budgets" and compute_groups(iso).num_groups == 6
    rng = np.random.default_rng(0)
    flops = 10 ** rng.uniform(18, 21, 240)  # a figure's reading: every run its own budget
    n = np.sqrt(flops / 120) * 10 ** rng.uniform(-0.5, 0.5, 240)
    scattered = read_runs({"params": n, "tokens": flops / (6 * n), "flops": flops, "loss": 2 + 1e3 / flops**0.1})
    groups = compute_groups(scattered)
    assert groups.kind == "FLOP bins" and groups.num_groups == MAX_GROUPS and "FLOP bins" in groups.note
    # bins are contiguous in compute: every bin's runs lie between the previous bin's and the next's
    spans = sorted((flops[groups.labels == b].min(), flops[groups.labels == b].max()) for b in range(MAX_GROUPS))
    assert all(a[1] < b[0] for a, b in zip(spans, spans[1:]))
    sizes = np.repeat([1e8, 3e8, 1e9], 20)
    tokens = np.tile(np.geomspace(1e9, 1e11, 20), 3)
    assert is_curve_table(sizes, tokens) and not is_curve_table(iso.params, iso.tokens)
    curves = read_runs({"params": sizes, "tokens": tokens, "loss": 2 + 50 / sizes**0.2 + 80 / tokens**0.2})
    assert compute_groups(curves).kind == "models" and compute_groups(curves).scored.sum() < len(curves)
