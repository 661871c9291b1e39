"""The law of an optimizer setting's optimum over (N, D) (scalelab.fitting.hp_laws.lr_law), on synthetic
LR sweeps from a known optimum: ln lr* = ln 4e-3 - 0.5 ln(N / 5e4) - 0.25 ln(D / 2e6), a loss
parabolic in ln lr with relative curvature 0.1, each cell's grid centred on a per-size rule that
knows nothing of D (as an audit of such a recipe would be), so the cells' optima sit off-centre."""

import math

import numpy as np
import pytest

from scalelab.errors import UsageError
from scalelab.fitting.hp_laws.lr_law import OptimumLaw, cell_optima, fit_optimum_law

B, C, KAPPA = -0.5, -0.25, 0.1
SIZES = (2e4, 5e4, 1.3e5, 3.5e5)
TPP = (3, 10, 30, 100, 300)
MULTS = np.sqrt(2) ** np.arange(-3, 4)  # x the per-size rule's LR, sqrt(2) apart


def best_lr(n: float, d: float) -> float:
    return 4e-3 * (n / 5e4) ** B * (d / 2e6) ** C


def sweep(rng, noise: float, mults=MULTS):
    """An audit's runs: sizes x horizons (cells above 4e12 FLOPs left out) x LRs; log-normal noise
    per run plus a shift shared by a cell's runs (one seed per cell)."""
    out = ([], [], [], [])
    for n in SIZES:
        for tpp in TPP:
            d = tpp * n
            if 6 * n * d > 4e12:
                continue
            floor = 1.7 + 400 * n**-0.3 + 600 * d**-0.3
            shift = rng.normal(0, noise)
            for m in mults:
                lr = 5e-3 * (n / 5e4) ** -0.3 * m
                y = math.log(floor) + KAPPA * math.log(lr / best_lr(n, d)) ** 2 + shift + rng.normal(0, noise)
                for col, v in zip(out, (n, d, lr, math.exp(y))):
                    col.append(v)
    return out


def test_noise_free_sweep_recovers_the_law_and_the_curvature_exactly():
    cells = cell_optima(*sweep(np.random.default_rng(0), 0.0), n_boot=0)
    assert len(cells) == 13 and all(c.bracketed for c in cells)
    law = fit_optimum_law(cells, n_boot=0)
    assert law.coef[1:] == pytest.approx([B, C], abs=1e-9)
    for n, d in ((3e4, 1e6), (3e5, 3e7)):  # inside and beyond the cells
        assert law.predict(n, d)[0] == pytest.approx(best_lr(n, d), rel=1e-9)
        assert law.curvature(n, d) == pytest.approx(KAPPA, rel=1e-9)
        # twice the best LR costs exp(0.1 ln(2)^2) - 1 of the loss
        assert law.cost(n, d, 2 * best_lr(n, d))[0] == pytest.approx(math.expm1(KAPPA * math.log(2) ** 2), rel=1e-9)
    # the per-size rule without a horizon term misfits: its cells scatter about it
    assert fit_optimum_law(cells, terms=("params",), n_boot=0).resid_sd > 0.1


def test_intervals_cover_the_known_slopes_on_noisy_sweeps():
    """24 sweeps at 0.5% run noise (the demo's seed noise) plus a shared shift per cell: the 90%
    intervals of both slopes cover the truth in at least 85% of them (measured 97-100%: conservative,
    since a replicate both resamples cells and redraws their optima), without being uselessly wide."""
    covered, widths, errors = np.zeros(2), [], []
    for s in range(24):
        rng = np.random.default_rng(100 + s)
        law = fit_optimum_law(cell_optima(*sweep(rng, 0.005), n_boot=200, seed=s), n_boot=200, seed=s)
        for j, (term, truth) in enumerate((("params", B), ("tokens", C))):
            lo, hi = law.slope_interval(term)
            covered[j] += lo <= truth <= hi
            widths.append(hi - lo)
        errors.append(law.coef[1:] - [B, C])
    assert np.all(covered >= 0.85 * 24), covered
    assert np.median(widths) < 0.1  # a tenth in the exponent: narrow enough to separate -0.25 from 0
    assert np.all(np.abs(np.mean(errors, axis=0)) < 0.01)


def test_edge_cells_stay_out_and_too_few_cells_refuse():
    # the grid far below the optimum: every cell's best LR is the grid's top, nothing is bracketed
    cells = cell_optima(*sweep(np.random.default_rng(0), 0.0, mults=MULTS / 20), n_boot=0)
    assert not any(c.bracketed for c in cells)
    with pytest.raises(UsageError, match="bracketed cell"):
        fit_optimum_law(cells)
    # one size only: the N term cannot be fitted
    n, d, x, y = sweep(np.random.default_rng(0), 0.0)
    one = [i for i, v in enumerate(n) if v == 5e4]
    pick = [[col[i] for i in one] for col in (n, d, x, y)]
    with pytest.raises(UsageError, match="do not vary"):
        fit_optimum_law(cell_optima(*pick, n_boot=0))


def test_a_saved_law_predicts_alike():
    law = fit_optimum_law(cell_optima(*sweep(np.random.default_rng(3), 0.005), n_boot=50), n_boot=50)
    back = OptimumLaw.from_dict(law.to_dict())
    assert back.predict(1e5, 5e6) == law.predict(1e5, 5e6)
    assert back.cost(1e5, 5e6, 3e-3) == law.cost(1e5, 5e6, 3e-3)
    with pytest.raises(UsageError, match="optimum law"):
        OptimumLaw.from_dict({"terms": ["flops"]})


def test_three_values_bracket_but_give_no_interval():
    """A parabola through three points has no residual: the cell's optimum counts, its interval is
    unknown (nan), and the law's replicates then rest on resampling the cells."""
    cells = cell_optima(*sweep(np.random.default_rng(0), 0.0, mults=np.array([0.5, 1.0, 2.0])), n_boot=50)
    inside = [c for c in cells if c.bracketed]
    assert inside and all(math.isnan(c.interval[0]) and math.isnan(c.resid_sd) for c in inside)
    assert all(c.draws_u.size == 0 for c in inside)
