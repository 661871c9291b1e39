"""Approach 2 with the IsoFLOP curve's own shape (fitting/estimate/isoflop_shape.py) against the parabola.

Truth: Hoffmann et al.'s fitted law; the sizes of every budget are laid out around a guessed
N*(C) ~ C^0.55 (the truth's is 0.452), as a sweep centred on a wrong allocation would be. The
parabola's vertex then moves with the budget; the shape fit is exact on noise-free runs.
"""

import numpy as np
import pytest

from scalelab.cli.main import main as cli
from scalelab.errors import UsageError
from scalelab.fitting.estimate.approaches import approach2
from scalelab.fitting.estimate.isoflop_shape import shape_minima
from scalelab.fitting.forms.laws import Chinchilla

TRUTH = dict(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28)
BUDGETS = np.geomspace(1e18, 1e21, 4)


def _n_opt(flops):
    al, be = TRUTH["alpha"], TRUTH["beta"]
    g = (al * TRUTH["A"] / (be * TRUTH["B"])) ** (1 / (al + be))
    return g * (np.asarray(flops) / 6) ** (be / (al + be))


def _runs(sizes=7, width=2.5, guess=0.55, shift=-0.3):
    n, c = [], []
    for budget in BUDGETS:
        centre = _n_opt(BUDGETS[0]) * np.exp(shift) * (budget / BUDGETS[0]) ** guess
        n += list(centre * np.exp(np.linspace(-width, width, sizes)))
        c += [budget] * sizes
    n, c = np.array(n), np.array(c)
    d = c / (6 * n)
    return n, d, c, Chinchilla().predict(TRUTH, params=n, tokens=d)


def test_shape_fit_recovers_the_minima_where_the_parabola_is_biased():
    n, d, c, loss = _runs()
    far = 1e24
    parabola = approach2(params=n, tokens=d, loss=loss, flops=c)
    power = approach2(params=n, tokens=d, loss=loss, flops=c, shape="power")
    assert abs(parabola.n_opt(far) / _n_opt(far) - 1) > 0.015  # the grid bias this estimator removes
    assert power.n_opt(far) / _n_opt(far) == pytest.approx(1, abs=1e-4)
    assert power.n_opt.exponent == pytest.approx(0.28 / 0.62, abs=1e-6)
    _, shape, _ = shape_minima(params=n, loss=loss, flops=c, labels=np.log10(c).round(3))
    assert (shape.alpha, shape.beta) == pytest.approx((0.34, 0.28), abs=1e-6)


def test_three_sizes_per_budget_leave_the_shape_unidentified():
    n, d, c, loss = _runs(sizes=3, width=1.0)
    with pytest.raises(UsageError, match="isoflop_shape: parabola"):
        approach2(params=n, tokens=d, loss=loss, flops=c, shape="power")


def test_a_slice_without_an_interior_minimum_is_flagged_flat():
    n, d, c, loss = _runs(sizes=5, width=1.0)
    last = c == BUDGETS[-1]
    loss = loss.copy()
    loss[last] = np.linspace(3.0, 2.0, last.sum())  # falls with N across the whole slice
    res = approach2(params=n, tokens=d, loss=loss, flops=c, shape="power")
    assert [m.flops for m in res.minima if m.flat] == pytest.approx([BUDGETS[-1]])
    assert [m.flops for m in res.flagged_budgets()] == pytest.approx([BUDGETS[-1]])
    assert len([m for m in res.minima if m.used]) == 3


def test_fit_cli_takes_the_shape(tmp_path, capsys):
    n, d, c, loss = _runs()
    table = tmp_path / "runs.csv"
    rows = ["params,tokens,loss"] + [f"{a},{b},{x}" for a, b, x in zip(n, d, loss)]
    table.write_text("\n".join(rows) + "\n")
    assert cli(["fit", str(table), "--approach", "2", "--isoflop-shape", "power", "--no-backtest"]) == 0
    assert "isoflop shape: alpha 0.340, beta 0.280" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        cli(["fit", str(table), "--approach", "2", "--isoflop-shape", "cubic"])
    assert exc.value.code == 2
