"""`sweep next` on synthetic stores (runs drawn from a known Chinchilla law, no training): partial-grid
warnings, the interval at C*, candidates that narrow it within the budget, the written round and
fit, and the `sweep next` / `sweep ledger` commands."""

import json

import pytest

from scalelab import store
from scalelab.analysis.synthetic import SyntheticLaw, launch_synthetic
from scalelab.cli.main import main
from scalelab.fitting.entry.fit_options import fit_options
from scalelab.sweeps.closed_loop import propose
from scalelab.sweeps.closed_loop.propose import propose_next
from scalelab.sweeps.specs.spec import load_sweep

LAW = SyntheticLaw()
SPEC = {
    "name": "fake",
    "base": {"data": {"seq_len": 64}, "train": {"global_batch_tokens": 512}},
    "isoflop": {"budgets": [3e11, 1e12, 3e12], "num_sizes": 5, "center": {"tokens_per_param": 5}, "span": 3},
    "fit": {"bootstrap": 8},
}


def _quiet(_):
    pass


def test_partial_grid_is_named_and_its_unfinished_budget_gets_bracketing_runs(tmp_path, monkeypatch):
    built = []  # the loop's options are built and checked once per round, then handed to the fit
    monkeypatch.setattr(propose, "fit_options", lambda *a, **k: built.append(k) or fit_options(*a, **k))
    sd = tmp_path / "fake"
    ids = launch_synthetic(SPEC, sd, LAW, noise_std=0.003)
    for run_id in ids[-2:]:  # the two largest sizes of the largest budget are still running
        status = store.read_status(store.run_path(sd, run_id))
        (store.run_path(sd, run_id) / "status.json").write_text(json.dumps(dict(status, status="running")))
    p = propose_next(sd, target_flops=1e13, replicates=8, log=_quiet)
    assert p["n_points"] == 13 and len(built) == 1
    assert any("partial grid: the fit uses 13 of 15" in w for w in p["warnings"])
    assert any("budget 3e+12: 3 of 5 runs done" in w for w in p["warnings"])
    brackets = {b["flops"]: b for b in p["gates"]["brackets"]}
    assert not brackets[3e12]["bracketed"] and brackets[3e12]["edge"] == "high"
    assert {q["kind"] for q in p["proposals"]} == {"bracket"}
    assert all(q["budget"] == 3e12 for q in p["proposals"])


def test_narrowing_candidates_fit_the_budget_and_the_round_is_exactly_what_was_predicted(tmp_path):
    sd = tmp_path / "fake"
    launch_synthetic(SPEC, sd, LAW, noise_std=0.003)
    p = propose_next(sd, target_flops=1e13, budget_flops=1.6e13, replicates=8, log=_quiet)
    assert p["gates"]["passed"]
    lo, hi = p["loss_at_target_interval"]
    assert lo <= p["loss_at_target"] <= hi
    assert p["backtest"]["holdout"]["mare"] < 0.05 and "mare" in p["backtest"]["leave_one_budget_out"]
    first = p["proposals"][0]
    assert first["kind"] == "compute_optimal" and first["flops"] == pytest.approx(9e12, rel=0.05)
    assert sum(q["flops"] for q in p["proposals"]) <= 1.6e13 * 1.001
    assert p["candidates_scored"] > 0 and len(p["proposals"]) > 1
    assert all(q["kind"] == "narrow_interval" and q["width_reduction"] > 0 for q in p["proposals"][1:])
    sweep = load_sweep(p["spec_path"])
    assert [r.run_id for r in sweep.runs] == [q["run_id"] for q in p["proposals"]]
    assert sweep.runs[0].labels["proposal"] == "compute_optimal" and sweep.runs[0].labels["round"] == 1
    saved = json.loads((sd / "fits" / "round_1.json").read_text())
    assert len(saved["run_ids"]) == 15 and saved["params"].keys() == {"E", "A", "B", "alpha", "beta"}
    assert saved["fit"]["gates"]["passed"] and len(saved["fit"]["draws"]) == 8


def test_next_and_ledger_commands(tmp_path, capsys):
    sd = tmp_path / "fake"
    launch_synthetic(SPEC, sd, LAW, noise_std=0.003)
    assert (
        main(["sweep", "next", str(sd), "--target-flops", "1e13", "--budget-flops", "9e12", "--replicates", "8"]) == 0
    )
    out = capsys.readouterr().out
    assert "gates: all passed" in out and "[pass] bracketed" in out and "compute_optimal" in out
    assert main(["sweep", "ledger", str(sd)]) == 0
    out = capsys.readouterr().out
    assert "predictions:" in out and "pending" in out and "coverage: no prediction scored yet" in out
    assert main(["sweep", "ledger", str(tmp_path / "nothing")]) == 2
