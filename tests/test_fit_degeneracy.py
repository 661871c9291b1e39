"""Degenerate laws (fitting/entry/degeneracy.py): each finding said in one line, the loop's gate refusing the
law, and its predictions falling back to the compute frontier's level, in the package and the CLI."""

import json

import numpy as np
import polars as pl
import pytest

from scalelab.cli.main import main
from scalelab.fitting.allocation.frontier import fit_frontier
from scalelab.fitting.entry.degeneracy import degenerate, diagnose
from scalelab.fitting.entry.fit_options import FitOptions
from scalelab.fitting.entry.fit_runs import fit_runs
from scalelab.fitting.entry.scaling_fit import optimum_fn
from scalelab.fitting.estimate.io import read_runs
from scalelab.fitting.forms.laws import get_law
from scalelab.fitting.selection.simulate import CHINCHILLA_EPOCH, simulate
from scalelab.fitting.uncertainty.compute_groups import compute_groups

# a floor the runs nearly reach: a Chinchilla fit puts its E within 1% of the lowest loss
AT_FLOOR = {"E": 3.0, "A": 3000.0, "B": 3000.0, "alpha": 0.6, "beta": 0.6}
CHIN = get_law("chinchilla")
SMALL = np.logspace(17, 18.5, 5)  # five budgets over 1.5 decades


def _runs(truth, seed=0, budgets=SMALL):
    return simulate("chinchilla", truth, design="isoflop", budgets=budgets, points_per_budget=7, isoflop_width=1.0,
                    noise_sigma=0.002, seed=seed)  # fmt: skip


@pytest.fixture(scope="module")
def floored():
    return fit_runs(read_runs(_runs(AT_FLOOR)), FitOptions(starts=300, gates=True))


def test_a_law_at_the_datas_floor_is_said_gated_and_predicts_at_the_frontiers_level(floored):
    fit = floored
    names = [f.name for f in fit.degeneracy]
    assert "floor" in names and not fit.surface_holds
    assert "law_holds" in fit.gates.failed
    n, d = 3e8, 1e10
    fallback, surface = fit.predict_interval(n, d), fit.surface_interval(n, d)
    assert fallback.point == pytest.approx(fit.optimal_run_interval(n, d, 6 * n * d).point)
    assert "frontier fit" in fallback.parts and "bootstrap" in surface.parts


def test_the_cli_says_each_finding_in_one_line_and_predict_falls_back(tmp_path, capsys):
    table = tmp_path / "runs.csv"
    pl.DataFrame(_runs(AT_FLOOR)).write_csv(table)
    out = tmp_path / "fit.json"
    assert main(["fit", str(table), "--starts", "300", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    lines = [line for line in text.splitlines() if line.startswith("degenerate law:")]
    assert lines and "floor" in lines[0] and "the law is degenerate: compute-optimal predictions" in text
    assert "frontier (compute-optimal predictions)" in text and "groups: 5 FLOP budgets" in text
    assert len(lines) == len({line for line in lines})  # each finding once
    assert main(["predict", str(out), "--params", "3e8", "--tokens", "1e10", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["note"].startswith("the law is degenerate") and got["loss_prediction_interval"]
    assert main(["predict", str(out), "--flops", "3e19", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["allocations"][0]
    assert row["source"] == "frontier" and "surface" in row and row["loss_opt_interval"][0] < row["loss_opt"]


def test_diagnose_names_each_finding_and_a_healthy_law_none():
    data = _runs(CHINCHILLA_EPOCH, budgets=np.logspace(18, 20, 5))
    table = read_runs(data)
    frontier = fit_frontier(table.params, table.tokens, table.loss, table.flops, compute_groups(table))
    theta = CHIN.to_fit(CHINCHILLA_EPOCH)
    kw = dict(loss=table.loss, frontier=frontier, optimum=optimum_fn(CHIN))
    assert diagnose(CHIN, dict(CHINCHILLA_EPOCH), theta, fit_warnings=[], **kw) == []
    at_floor = dict(CHINCHILLA_EPOCH, E=0.99 * float(table.loss.min()))
    assert [f.name for f in diagnose(CHIN, at_floor, CHIN.to_fit(at_floor), fit_warnings=[], **kw)][:1] == ["floor"]
    steep = dict(CHINCHILLA_EPOCH, alpha=1.18)
    found = diagnose(CHIN, steep, CHIN.to_fit(steep), fit_warnings=[], **kw)
    assert "exponents" in [f.name for f in found] and "alpha 1.18 above 1" in found[0].line
    # the slices' minima measured, a surface whose optimum is 10% off them
    off = dict(CHINCHILLA_EPOCH, E=CHINCHILLA_EPOCH["E"] * 1.15)
    found = diagnose(CHIN, off, CHIN.to_fit(off), fit_warnings=[], **kw)
    assert "minima" in [f.name for f in found] and degenerate(found)
    starts = diagnose(CHIN, dict(CHINCHILLA_EPOCH), theta, fit_warnings=["starts disagree: 5 starts; more"], **kw)
    assert [f.name for f in starts] == ["starts"] and not degenerate(starts)
