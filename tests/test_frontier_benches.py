"""The frontier's experiments on tiny inputs (fast): experiments/frontier_public.py scores a table by the
registered protocol, experiments/score_store.py scores a store's first round against its far runs."""

import json
import math

import numpy as np
import polars as pl
import pytest

from experiments import frontier_public, score_store
from scalelab.analysis.synthetic import SyntheticLaw, launch_synthetic
from scalelab.fitting.allocation.allocate import chinchilla_optimum
from scalelab.fitting.selection.simulate import CHINCHILLA_EPOCH, simulate


def _run(main, argv: list[str], capsys) -> str:
    assert main(argv) == 0
    return capsys.readouterr().out


def test_the_public_benchmark_scores_a_table_by_distance(tmp_path, capsys):
    data = simulate("chinchilla", CHINCHILLA_EPOCH, design="isoflop", budgets=np.logspace(18, 20.5, 6),
                    points_per_budget=5, isoflop_width=0.5, noise_sigma=0.005, seed=0)  # fmt: skip
    table = tmp_path / "tiny.csv"
    pl.DataFrame(data).write_csv(table)
    argv = ["--table", str(table), "--name", "tiny", "--origins", "0.6", "--json", str(tmp_path / "out.json")]
    out = _run(frontier_public.main, argv, capsys)
    assert out.splitlines()[0].startswith("family      targets  default MARE  approach 3 MARE")
    assert "tiny" in out and "pooled by distance" in out and (tmp_path / "out.json").exists()


def test_a_stores_first_round_is_scored_against_its_far_runs(tmp_path, capsys):
    law = SyntheticLaw()
    spec = {
        "name": "sim",
        "base": {"data": {"seq_len": 64}, "train": {"global_batch_tokens": 512}},
        "isoflop": {"budgets": [3e11, 1e12, 3e12], "num_sizes": 5, "center": {"tokens_per_param": 5}, "span": 3},
        "fit": {"bootstrap": 4},
    }
    sd = tmp_path / "loop"
    launch_synthetic(spec, sd, law, noise_std=0.003)
    far = tmp_path / "far.csv"
    rows = []
    for mult in (10, 30):
        n, d, loss = chinchilla_optimum(law.params_dict(), mult * 3e12)
        rows.append({"seed": 0, "params": n, "tokens": d, "loss": loss, "distance": mult})
    pl.DataFrame(rows).write_csv(far)
    argv = [str(sd), "--far", str(far), "--seed", "0", "--json", str(tmp_path / "s.json")]
    out = _run(score_store.main, argv, capsys)
    assert out.startswith("first round: 15 runs, chinchilla")
    assert "--far seed 0" in out and " 30x  1 run(s)" in out and "goal |error| <= 4%, width <= 20%" in out
    # the bracket column: the geometric mean of the surface and the power law through the budgets'
    # best losses, whose ends are the two sides, inside its 95% interval
    assert "the bracket column" in out
    for row in json.loads((tmp_path / "s.json").read_text()):
        point, lo, hi, low, high = row["bracket"]
        assert point == pytest.approx(math.sqrt(low * high)) and lo < low <= point <= high < hi
        assert row["surface"][0] in (pytest.approx(low), pytest.approx(high)) and high / low > 1.0001
