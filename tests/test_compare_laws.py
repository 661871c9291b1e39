"""experiments/compare_laws.py (law forms compared on one table: held-out error, AIC/BIC) and the
real-fitter backtest it is built on (fitting/uncertainty/backtest.py), on simulated data."""

import numpy as np
import polars as pl
import pytest

from experiments import compare_laws as compare_laws_experiment
from experiments.compare_laws import compare_laws, information_criteria
from scalelab.fitting.entry.fit_runs import one_torch_thread
from scalelab.fitting.estimate.fit import subsample_starts
from scalelab.fitting.estimate.io import read_runs
from scalelab.fitting.forms.laws import get_law
from scalelab.fitting.selection.simulate import CHINCHILLA_HOFFMANN, simulate
from scalelab.fitting.uncertainty.backtest import holdout_backtest, law_fitter


@pytest.fixture(scope="module")
def table():
    data = simulate(
        "chinchilla",
        CHINCHILLA_HOFFMANN,
        design="isoflop",
        budgets=np.logspace(18, 21, 4),
        points_per_budget=7,
        noise_sigma=0.005,
        seed=1,
    )
    return read_runs(data)


def test_information_criteria_formula():
    r = np.array([0.1, -0.1, 0.2, -0.2, 0.0])
    rss = float(np.sum(r * r))
    aic, bic = information_criteria(r, 2)
    assert aic == pytest.approx(5 * np.log(rss / 5) + 4)
    assert bic == pytest.approx(5 * np.log(rss / 5) + 2 * np.log(5))
    assert information_criteria(r, 4) == (None, None)  # n <= k + 1: not defined


def test_compare_prefers_the_true_form(table):
    rows = compare_laws(table, laws=("chinchilla", "power_law_no_e"), max_starts=100)
    by = {r.law: r for r in rows}
    assert rows[0].law == "chinchilla"
    assert by["chinchilla"].holdout_mare < by["power_law_no_e"].holdout_mare
    assert by["chinchilla"].aic < by["power_law_no_e"].aic
    assert by["chinchilla"].rmse_log < 0.01


def test_real_fitter_backtest_is_within_noise(table):
    law = get_law("chinchilla")
    with one_torch_thread():
        res = holdout_backtest(table, law_fitter(law, subsample_starts(law, 100), objective="huber", delta=1e-3))
    assert res.n_test == 7 and res.n_train == 21
    assert res.mare < 0.015  # 0.5% noise, one decade of extrapolation
    # against the simulated law itself: the held-out predictions sit on the noise-free losses
    true = CHINCHILLA_HOFFMANN
    idx = [int(np.flatnonzero(table.run_id == r)[0]) for r in res.run_id]
    n, d = table.params[idx], table.tokens[idx]
    noise_free = true["E"] + true["A"] / n ** true["alpha"] + true["B"] / d ** true["beta"]
    assert np.abs(res.predicted / noise_free - 1).max() < 0.005, res.predicted / noise_free - 1


def test_the_command_prints_every_law_best_first(tmp_path, capsys):
    n, d = np.geomspace(1e6, 1e8, 8), np.geomspace(2e7, 2e9, 8)[::-1].copy()
    n, d = np.concatenate([n, n]), np.concatenate([d, 3 * d])
    loss = 1.7 + 400 / n**0.34 + 410 / d**0.28
    pl.DataFrame({"params": n, "tokens": d, "loss": loss}).write_csv(tmp_path / "runs.csv")
    argv = [str(tmp_path / "runs.csv"), "--laws", "chinchilla,power_law_no_e", "--max-starts", "20"]
    assert compare_laws_experiment.main([*argv, "--json", str(tmp_path / "rows.json")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("law") and [line.split()[0] for line in lines[1:]] == ["chinchilla", "power_law_no_e"]
