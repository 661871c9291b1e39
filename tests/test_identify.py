"""experiments/identify.py: which parameters of a law a design's runs pin down (profile likelihood and
forward folds), on designs drawn from a known Chinchilla law, and its command on a small table."""

import numpy as np
import polars as pl
from isoflop_design import CHIN
from isoflop_design import isoflop_design as _design

from experiments import identify as identify_experiment
from experiments.identify import identify
from scalelab.fitting.forms.laws import get_law


def test_the_command_pins_the_exponent_on_a_wide_design(tmp_path, capsys):
    """`python experiments/identify.py RUNS.csv`: four budgets over three decades pin alpha, its profile
    interval holds the truth, and each forward fold's estimate is printed (folds: the FLOP budgets)."""
    n, d, _ = _design([1e11, 1e12, 1e13, 1e14], sizes=5)
    y = get_law("chinchilla").predict(CHIN, params=n, tokens=d) * np.exp(
        0.003 * np.random.default_rng(1).standard_normal(n.size)
    )
    pl.DataFrame({"params": n, "tokens": d, "loss": y}).write_csv(tmp_path / "runs.csv")
    assert identify_experiment.main([str(tmp_path / "runs.csv"), "--names", "alpha"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "chinchilla on 20 runs in 4 groups (fit-space parameters)", out
    name, _, interval, folds = out[2].split(maxsplit=3)[:2] + out[2].split("[")[1].split("]")[:2]
    lo, hi = (float(v) for v in interval.split(","))
    assert name == "alpha" and lo <= CHIN["alpha"] <= hi and out[2].endswith("identified"), out
    assert len(folds.split("identified")[0].split(",")) == 2  # folds of 2 and 3 budgets


def test_one_token_count_leaves_beta_free():
    """Every run sees one token count: B / D^beta is a constant, so beta trades against E exactly."""
    n = np.geomspace(1e5, 1e8, 9)
    d = np.full(n.size, 1e9)
    y = get_law("chinchilla").predict(CHIN, params=n, tokens=d) * np.exp(
        0.003 * np.random.default_rng(2).standard_normal(n.size)
    )
    rows = identify("chinchilla", n, d, y, names=["beta"])
    assert rows["beta"].verdict.startswith("not identified"), rows["beta"]
