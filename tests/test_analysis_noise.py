"""Noise analysis on a synthetic store of 3 seeds x 3 sizes (x 2 recipes, so decisions exist),
checked against a from-scratch hand computation on the raw evals.parquet files."""

import json
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from scalelab.analysis.noise import NoiseOptions, fit_weights, noise_table, recommendations
from scalelab.analysis.store import load_evals, load_store_runs
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
            recipe=cfg["tags"]["recipe"],
            shape=(cfg["model"]["num_layers"], cfg["model"]["d_model"]),
            final=v.mean(),
            ckpt=math.sqrt((resid**2).sum() / (len(v) - 2)),
            flops=json.loads((run / "status.json").read_text())["flops_6n"],
        )
    groups = {}
    for r in per_run.values():
        groups.setdefault((r["recipe"], r["shape"]), []).append(r)
    assert all(len(g) == 3 for g in groups.values()) and len(groups) == 6
    seed_std = math.sqrt(np.mean([np.var([r["final"] for r in g], ddof=1) for g in groups.values()]))
    means = {k: np.mean([r["final"] for r in g]) for k, g in groups.items()}
    signal = max(means.values()) - min(means.values())
    ckpt = np.mean([r["ckpt"] for r in per_run.values()])
    snr = signal / math.sqrt(seed_std**2 + ckpt**2)
    # decisions: recipe a vs b at the two smaller shapes, judged against the largest shape
    target = SHAPES[-1]
    want = np.sign(means[("a", target)] - means[("b", target)])
    agree = [np.sign(means[("a", s)] - means[("b", s)]) == want for s in SHAPES[:-1]]
    return dict(seed_std=seed_std, signal=signal, ckpt_std=ckpt, snr=snr, decision_acc=np.mean(agree), per_run=per_run)


def test_noise_table_matches_hand_computation(store):
    runs = load_store_runs(store)
    assert runs.height == 18
    table = noise_table(runs, options=NoiseOptions(last_n=5))
    got = {(r["task"], r["metric"]): r for r in table.iter_rows(named=True)}
    assert set(got) == {("val", "loss"), ("val", "bpb"), ("synthetic/mc", "bpb"), ("synthetic/mc", "acc")}
    for key in got:
        hand = _hand(store, *key)
        row = got[key]
        for name in ("seed_std", "signal", "ckpt_std", "snr", "decision_acc"):
            assert row[name] == pytest.approx(hand[name], rel=1e-9), (key, name)
        assert row["decision_pairs"] == 2 and row["n_runs"] == 18
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
