"""Architecture comparison on synthetic stores with a known compute multiplier (1.5x, and 1x)."""

import math

import numpy as np
import pytest

from scalelab.analysis.compare import compare_fits, fit_side, flops_to_reach, frontier_loss, multiplier
from scalelab.analysis.store_reader import load_store_runs
from scalelab.analysis.synthetic import SyntheticLaw, isoflop_design, write_synthetic_sweep
from scalelab.fitting.entry.fit_options import FitOptions
from scalelab.fitting.forms.laws import get_law
from scalelab.sweeps.closed_loop.store_fit import fit_store

BUDGETS = [1e13, 3e13, 1e14, 3e14, 1e15, 3e15]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("cmp")
    design = isoflop_design(BUDGETS)
    write_synthetic_sweep(root / "A", design, SyntheticLaw(), noise_seed=1)
    write_synthetic_sweep(root / "B", design, SyntheticLaw(efficiency=1.5), noise_seed=2)
    write_synthetic_sweep(root / "A2", design, SyntheticLaw(), noise_seed=3)
    return root


@pytest.fixture(scope="module")
def sides(stores):
    """Each store fitted once (60 bootstrap draws), with the seeds compare_sweeps gives its two sides
    (A: seed 0; B and A2: seed 1), so compare_fits on these pairs is compare_sweeps(A, B) and
    compare_sweeps(A, A2) to the bit, and A, common to both comparisons, is fitted once (a side's fit
    is most of a comparison's time). compare_sweeps itself runs in test_compare_cli_by_tag_and_errors."""
    return {
        name: fit_side(name, load_store_runs(stores / name), "chinchilla", n_boot=60, seed=seed)
        for name, seed in (("A", 0), ("B", 1), ("A2", 1))
    }


def test_multiplier_is_exact_for_the_true_laws():
    law = get_law("chinchilla")
    pa, pb = SyntheticLaw().params_dict(), SyntheticLaw(efficiency=1.5).params_dict()
    for c in (1e12, 1e15, 1e20):
        assert multiplier(law, pa, law, pb, c) == pytest.approx(1.5, rel=1e-6)
        assert multiplier(law, pa, law, pa, c) == pytest.approx(1.0, rel=1e-6)
    # frontier and its inverse agree; a loss under the irreducible term is never reached
    c = 3e14
    assert flops_to_reach(law, pa, frontier_loss(law, pa, c)) == pytest.approx(c, rel=1e-6)
    assert math.isinf(flops_to_reach(law, pa, pa["E"] * 0.99))


def test_b_built_1p5x_more_efficient_recovers_1p5(sides):
    cmp = compare_fits(sides["A"], sides["B"], target_flops=1e16)
    print(
        {
            f"{c:.2g}": (round(m, 3), tuple(round(x, 3) for x in iv))
            for c, m, iv in zip(cmp.budgets, cmp.multipliers, cmp.intervals)
        }
    )
    print("target", cmp.multiplier_at_target, cmp.target_interval, "slope", cmp.slope, cmp.slope_interval)
    lo, hi = cmp.target_interval
    assert lo <= 1.5 <= hi
    # per budget: point estimates within 10% of the truth (one noise realisation: the per-budget
    # intervals are strongly correlated, so their coverage is not checked budget by budget here)
    assert all(abs(m / 1.5 - 1) < 0.1 for m in cmp.multipliers)
    assert all(iv[0] > 1.0 for iv in cmp.intervals)  # B is better at every measured budget
    assert cmp.slope_interval[0] <= 0.0 <= cmp.slope_interval[1]  # the true multiplier is constant
    # B was built 1.5x more efficient: the verdict must say so (its interval [1.01, 1.98] is above 1)
    assert cmp.verdict.startswith("The data support 'B is better'"), cmp.verdict
    assert "No evidence that the multiplier changes with scale" in cmp.verdict  # the truth is constant


def test_a_side_is_the_one_fit_entrys_fit_of_its_store(stores):
    """compare fits a side through the one fit entry: the store's fit with the same options (law,
    bootstrap, seed, no backtests) has the same parameters and the same bootstrap draws."""
    side = fit_side("A", load_store_runs(stores / "A"), "chinchilla", n_boot=4, seed=3)
    fit, _ = fit_store(stores / "A", FitOptions(law="chinchilla", bootstrap=4, seed=3, backtest=False))
    assert side.params == fit.params
    names = get_law("chinchilla").param_names
    assert np.array_equal(side.draws, np.array([[d[k] for k in names] for d in fit.draws]))
    assert side.n_runs == fit.n_points


def test_equal_sides_interval_contains_one(sides):
    cmp = compare_fits(sides["A"], sides["A2"], target_flops=1e16)
    print("A=B target", cmp.multiplier_at_target, cmp.target_interval)
    assert cmp.target_interval[0] <= 1.0 <= cmp.target_interval[1]
    assert all(iv[0] <= 1.0 <= iv[1] for iv in cmp.intervals)
    assert "do NOT support" in cmp.verdict
    assert np.isfinite(cmp.slope)


def test_compare_cli_by_tag_and_errors(tmp_path, capsys):
    from scalelab.cli.main import main

    design = isoflop_design(BUDGETS[:4])
    write_synthetic_sweep(tmp_path / "s", design, SyntheticLaw(), tags={"arch": "base"}, noise_seed=5)
    write_synthetic_sweep(tmp_path / "s", design, SyntheticLaw(efficiency=2.0), tags={"arch": "new"}, noise_seed=6)
    assert main(["compare", str(tmp_path / "s"), "--by", "arch", "--bootstrap", "8", "--target-flops", "1e15"]) == 0
    out = capsys.readouterr().out
    assert "new vs base" in out and "slope" in out
    assert main(["compare", str(tmp_path / "s")]) == 2
    assert main(["compare", str(tmp_path / "s"), "--by", "nope"]) == 2
    assert "takes 0 value(s)" in capsys.readouterr().err
