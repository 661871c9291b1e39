"""`sweep next` on a synthetic store (runs drawn from a known Chinchilla law, no training): the fit,
its backtest and interval, the proposals within the budget, the new spec, partial-grid warnings."""

import json

import numpy as np
import pytest
import yaml

from scalelab.fitting.laws import get_law
from scalelab.sweeps import store
from scalelab.sweeps.propose import propose_next
from scalelab.sweeps.spec import load_sweep
from scalelab.train.records import atomic_write_json

TRUE = {"E": 1.8, "A": 60.0, "B": 300.0, "alpha": 0.3, "beta": 0.3}
BUDGETS = [1e11, 3e11, 1e12]


def _fake_sweep(root, pending: int = 0):
    law = get_law("chinchilla")
    sd = root / "fake"
    spec = {
        "name": "fake",
        "base": {"data": {"seq_len": 64}, "train": {"global_batch_tokens": 512}},
        "isoflop": {"budgets": BUDGETS, "num_sizes": 4, "params": [6e4, 1e6]},
    }
    (sd / "runs").mkdir(parents=True)
    (sd / "sweep.yaml").write_text(yaml.safe_dump(spec))
    rng = np.random.default_rng(1)
    runs = []
    for c in BUDGETS:
        for n in np.geomspace(6e4, 1e6, 4):
            d = int(c / (6 * n))
            loss = float(law.predict(TRUE, params=n, tokens=d)) * float(np.exp(rng.normal(0, 0.005)))
            run_id = f"r{len(runs):02d}"
            status = {
                "status": "done",
                "params": int(n),
                "num_tokens": d,
                "flops_6n": 6 * n * d,
                "final_val_loss": loss,
            }
            if len(runs) >= 12 - pending:
                status = {"status": "running"}
            atomic_write_json(sd / "runs" / run_id / "status.json", status)
            runs.append(
                {
                    "run_id": run_id,
                    "labels": {"flops_budget": c},
                    "params": int(n),
                    "num_tokens": d,
                    "flops_6n": 6 * n * d,
                }
            )
    atomic_write_json(sd / store.RESOLVED, {"name": "fake", "runs": runs, "specs": ["sweep.yaml"]})
    return sd


def test_next_round_from_a_partial_grid(tmp_path):
    sd = _fake_sweep(tmp_path, pending=2)
    p = propose_next(sd, target_flops=1e13, budget_flops=6e12, replicates=8, fit_starts=200, log=lambda m: None)
    assert p["n_points"] == 10
    assert any("partial grid: the fit uses 10 of 12" in w for w in p["warnings"])
    assert any("budget 1e+12: 2 of 4 runs done" in w for w in p["warnings"])
    lo, hi = p["loss_at_target_interval"]
    assert lo <= p["loss_at_target"] <= hi
    law = get_law("chinchilla")
    true_opt_loss = float(law.predict(TRUE, params=p["n_opt_at_target"], tokens=p["d_opt_at_target"]))
    assert abs(p["loss_at_target"] - true_opt_loss) / true_opt_loss < 0.05
    assert p["backtest"]["holdout"]["mare"] < 0.05 and "mare" in p["backtest"]["leave_one_budget_out"]
    first = p["proposals"][0]
    assert first["kind"] == "compute_optimal" and first["flops"] == pytest.approx(3e12, rel=0.05)
    assert first["predicted_interval"][0] <= first["predicted_loss"] <= first["predicted_interval"][1]
    assert sum(q["flops"] for q in p["proposals"]) <= 6e12 * 1.001
    assert p["candidates_scored"] > 0
    assert all(q["width_reduction"] > 0 for q in p["proposals"][1:])
    # The written spec expands to exactly the proposed runs; the fit is saved under fits/.
    sweep = load_sweep(p["spec_path"])
    assert [(r.params, r.num_tokens) for r in sweep.runs] == [(q["params"], q["tokens"]) for q in p["proposals"]]
    assert sweep.runs[0].labels["proposal"] == "compute_optimal" and sweep.runs[0].labels["round"] == 1
    saved = json.loads((sd / "fits" / "round_1.json").read_text())
    assert len(saved["run_ids"]) == 10 and saved["params"].keys() == TRUE.keys()
