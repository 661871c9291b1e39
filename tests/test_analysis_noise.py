"""Noise analysis on synthetic stores whose noise is known (analysis/synthetic.py's SyntheticLaw):
the seed and checkpoint noise it simulated are recovered, and decisions between a recipe that is
truly better and the reference agree across scales. A 3 seeds x 3 sizes x 2 recipes store checks the
table's rows, the advice and the fit weights."""

import json
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from scalelab.analysis.noise import NoiseOptions, fit_weights, noise_table, recommendations
from scalelab.analysis.store_reader import load_evals, load_store_runs
from scalelab.analysis.synthetic import DesignPoint, SyntheticLaw, write_synthetic_sweep
from scalelab.models.accounting import num_params
from scalelab.models.shapes import shape_for_width

SHAPES = [(2, 64), (4, 128), (6, 192)]


def _design():
    return [
        DesignPoint(num_layers=layers, d_model=w, num_tokens=int(20 * num_params(shape_for_width(layers, w, 320))))
        for layers, w in SHAPES
    ]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("noise") / "sweep"
    write_synthetic_sweep(root, _design(), SyntheticLaw(), seeds=[0, 1, 2], tags={"recipe": "a"})
    # recipe b: 1.08x more compute-efficient, a difference of the order of the accuracy noise
    write_synthetic_sweep(root, _design(), SyntheticLaw(efficiency=1.08), seeds=[0, 1, 2], tags={"recipe": "b"})
    return root


def _hand(store: Path, task: str, metric: str, last_n: int = 5) -> dict:
    """Per run: final (mean of the last n values) and ckpt (std about a straight line, ddof=2);
    seed_std over the seed groups: the inputs of the fit weights."""
    per_run = {}
    for run in sorted((store / "runs").iterdir()):
        cfg = json.loads((run / "config.json").read_text())
        ev = pl.read_parquet(run / "evals.parquet").filter((pl.col("task") == task) & (pl.col("metric") == metric))
        ev = ev.sort("step")
        v = ev["value"].to_numpy()[-last_n:]
        s = ev["step"].to_numpy()[-last_n:].astype(float)
        coef = np.polyfit(s, v, 1)
        resid = v - (coef[0] * s + coef[1])
        per_run[run.name] = dict(
            group=(cfg["tags"]["recipe"], cfg["model"]["num_layers"], cfg["model"]["d_model"]),
            final=v.mean(),
            ckpt=math.sqrt((resid**2).sum() / (len(v) - 2)),
        )
    groups = {}
    for r in per_run.values():
        groups.setdefault(r["group"], []).append(r["final"])
    seed_std = math.sqrt(np.mean([np.var(g, ddof=1) for g in groups.values()]))
    return dict(seed_std=seed_std, per_run=per_run)


def test_noise_table_recovers_the_simulated_noise(tmp_path):
    """Seeds 0-5 x 3 sizes x recipes a and b (1.5x more compute-efficient), 40 evaluations per run
    (the last 5 span the final 12% of training, where a straight line detrends the loss curve).

    Truth, val/loss: seed_std = sqrt(0.02^2 + 0.004^2 / 5) (a run's final averages 5 checkpoints),
    ckpt_std = 0.004 (the mean of per-run stds with 3 degrees of freedom runs ~8% low: E[s] = 0.92
    sigma); task bpb = 1.3 x loss, so both scale by 1.3. Measured over noise seeds 0-3: seed_std
    within -8%/+2%, ckpt_std within -13%/+2%; the bounds are 15% and 20%. b is better at every size
    by far more than the noise: every decision between a and b agrees with the largest scale."""
    root = tmp_path / "sweep"
    for recipe, efficiency in (("a", 1.0), ("b", 1.5)):
        law = SyntheticLaw(seed_std=0.02, checkpoint_std=0.004, efficiency=efficiency)
        write_synthetic_sweep(root, _design(), law, seeds=range(6), num_evals=40, tags={"recipe": recipe})
    table = noise_table(load_store_runs(root), options=NoiseOptions(last_n=5))
    got = {(r["task"], r["metric"]): r for r in table.iter_rows(named=True)}
    for key, scale in ((("val", "loss"), 1.0), (("synthetic/mc", "bpb"), 1.3)):
        row = got[key]
        assert row["n_runs"] == 36 and row["decision_pairs"] == 2
        assert row["seed_std"] == pytest.approx(scale * math.sqrt(0.02**2 + 0.004**2 / 5), rel=0.15), key
        assert row["ckpt_std"] == pytest.approx(scale * 0.004, rel=0.20), key
        assert row["decision_acc"] == 1.0, key


def test_noise_table_rows_and_advice(store):
    runs = load_store_runs(store)
    assert runs.height == 18
    table = noise_table(runs, options=NoiseOptions(last_n=5))
    got = {(r["task"], r["metric"]): r for r in table.iter_rows(named=True)}
    assert set(got) == {("val", "loss"), ("val", "bpb"), ("synthetic/mc", "bpb"), ("synthetic/mc", "acc")}
    for row in got.values():
        assert row["decision_pairs"] == 2 and row["n_runs"] == 18
        assert row["snr"] == pytest.approx(row["signal"] / math.hypot(row["seed_std"], row["ckpt_std"]), rel=1e-12)
    print(table.select("task", "metric", "signal", "seed_std", "ckpt_std", "snr", "tau", "decision_acc"))
    # bpb is the continuous metric: higher SNR than accuracy, and the advice says so
    assert got[("synthetic/mc", "bpb")]["snr"] > got[("synthetic/mc", "acc")]["snr"]
    assert got[("val", "loss")]["tau"] > 0.9  # loss falls monotonically with training
    plain = noise_table(runs, options=NoiseOptions(last_n=5, detrend=False))
    stds = []
    for run in sorted((store / "runs").iterdir()):
        ev = pl.read_parquet(run / "evals.parquet").filter((pl.col("task") == "val") & (pl.col("metric") == "loss"))
        stds.append(np.std(ev.sort("step")["value"].to_numpy()[-5:], ddof=1))
    row = plain.filter((pl.col("task") == "val") & (pl.col("metric") == "loss"))
    assert row["ckpt_std"][0] == pytest.approx(np.mean(stds), rel=1e-9)
    notes = recommendations(table)
    assert any(n.startswith("synthetic/mc: decide with bpb") for n in notes)


def test_fit_weights_are_inverse_variances(store):
    runs = load_store_runs(store)
    evals = load_evals(runs)
    hand = _hand(store, "val", "loss")
    values, w = fit_weights(runs, evals, "val", "loss", last_n=5)
    var = np.array([hand["seed_std"] ** 2 + hand["per_run"][r]["ckpt"] ** 2 / 5 for r in runs["run_id"]])
    want = (1 / var) / (1 / var).mean()
    np.testing.assert_allclose(w, want, rtol=1e-9)
    np.testing.assert_allclose(values, [hand["per_run"][r]["final"] for r in runs["run_id"]], rtol=1e-12)


def test_noise_cli_prints_table_and_advice(store, capsys):
    from scalelab.cli.main import main

    assert main(["noise", str(store), "--last-n", "5"]) == 0
    out = capsys.readouterr().out
    assert "synthetic/mc" in out and "decide with bpb" in out
    assert main(["noise", str(store / "missing")]) == 2
