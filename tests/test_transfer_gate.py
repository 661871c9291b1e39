"""The LR-transfer gate (scalelab.sweeps.recipes.transfer, `sweep plan/launch` with `transfer:`): the check's
runs, the decision on measured losses, the ladder at the transferred LR, bad sections (exit 2 before
anything is written), and one launch on the session's Ray that writes the check into the store.

The gate on a real sp vs mup ladder (width x8) is experiments/transfer_gate.py (~16 min), not a test.
"""

import math

import polars as pl
import pytest
import yaml

from scalelab import store
from scalelab.cli.main import main
from scalelab.sweeps.recipes.transfer import evaluate_gate, format_gate, ladder_with_lr, plan_transfer
from scalelab.sweeps.specs.spec import expand_sweep

LRS = [2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2]


def _spec(parametrization="mup", **transfer):
    return {
        "name": "lad",
        "base": {
            "model": {"parametrization": parametrization, "kernels": "torch"},
            "data": {"seq_len": 32, "val_sequences": 8},
            "train": {"global_batch_tokens": 128},
            "eval": {"interval_steps": 0},
            "checkpoint": {"interval_steps": 0},
            "logging": {"wandb": "disabled"},
        },
        "ladder": {"sizes": [3.4e4, 1.3e5], "tokens_per_param": [1]},
        "transfer": {"check": True, "lrs": LRS, "tokens_per_param": 0.5} | transfer,
    }


def _plan(raw):
    return plan_transfer(raw, expand_sweep(raw))


def test_check_runs_cover_widths_and_lrs_at_the_same_tokens_per_param():
    plan = _plan(_spec(widths=[32, 128]))
    runs = plan.sweep.runs
    assert len(runs) == 2 * len(LRS)
    for r in runs:
        m = r.config["model"]
        assert (m["parametrization"], m["base_d_model"], m["base_num_layers"]) == ("mup", 32, 1)
        assert r.labels["transfer"] and r.config["optim"]["lr"] == r.labels["lr"]
        assert abs(r.num_tokens / r.params - 0.5) < 0.01  # whole steps of 128 tokens
    assert {r.config["model"]["d_model"] for r in runs} == {32, 128}
    # default widths: the ladder's smallest and largest d_model
    raw = _spec()
    ladder = {r.config["model"]["d_model"] for r in expand_sweep(raw).runs}
    assert {r.config["model"]["d_model"] for r in _plan(raw).sweep.runs} == {min(ladder), max(ladder)}


def _table(best_by_width: dict[int, int], widths=(32, 256)) -> pl.DataFrame:
    """Fake check results: a parabola in log LR with its minimum at LRS[best]."""
    rows = []
    for w in widths:
        for i, lr in enumerate(LRS):
            rows.append(dict(d_model=w, num_layers=1, lr=lr, params=w * 1000, status="done",
                             final_val_loss=3.0 + 0.1 * (i - best_by_width[w]) ** 2))  # fmt: skip
    return pl.DataFrame(rows)


def test_gate_decision_drift_edge_and_the_transferred_lr():
    plan = _plan(_spec(widths=[32, 256]))
    ok = evaluate_gate(plan, _table({32: 2, 256: 1}))
    assert ok.ok and ok.max_drift == pytest.approx(1) and ok.base_lr == LRS[2]
    drift = evaluate_gate(plan, _table({32: 3, 256: 1}))  # sp-like: the best LR falls with width
    assert not drift.ok and drift.max_drift == pytest.approx(2)
    # the best LR is the vertex of a parabola in log LR (fitting.hp_laws.hyperparams.best_lr), between grid
    # values: a drift of 1.5 steps fails a tolerance of 1 that the grid's argmin (1 step) would pass
    off_grid = evaluate_gate(plan, _table({32: 2.4, 256: 0.9}))
    assert off_grid.rows[0]["best_index"] == 2 and off_grid.rows[1]["best_index"] == 1
    assert off_grid.base_lr == pytest.approx(LRS[2] * 2**0.4, rel=5e-3)  # 3 significant digits
    assert off_grid.max_drift == pytest.approx(1.5) and not off_grid.ok
    text = format_gate(drift, LRS)
    assert "FAILS" in text and "-2" in text and text.count("*") == 2 + 1  # + the legend
    edge = evaluate_gate(plan, _table({32: 2, 256: 0}))  # drift 2, and the wide size's best at the edge
    assert not edge.ok and edge.edge == ["d_model 256 x 1 layers"]
    # a diverged run never counts as the best
    table = _table({32: 2, 256: 2}).with_columns(
        pl.when((pl.col("d_model") == 256) & (pl.col("lr") == LRS[2])).then(pl.lit("diverged")).otherwise(
            pl.col("status")).alias("status"))  # fmt: skip
    assert evaluate_gate(plan, table).rows[1]["best_index"] != 2
    ladder = ladder_with_lr(plan, ok.base_lr)
    assert {r.config["optim"]["lr"] for r in ladder.runs} == {LRS[2]}
    assert {r.config["model"]["base_d_model"] for r in ladder.runs} == {32}
    assert not math.isnan(ok.base_lr)


def test_seeds_train_every_point_k_times_and_the_best_lr_uses_all_of_them():
    plan = _plan(_spec(widths=[32, 256], seeds=2))
    runs = plan.sweep.runs
    assert len(runs) == 2 * 2 * len(LRS) and len({r.run_id for r in runs}) == len(runs)
    assert sorted({r.config["train"]["seed"] for r in runs}) == [0, 1]
    # seed 0 has its minimum at LRS[1], seed 1 at LRS[3]: together the vertex is LRS[2]
    rows = []
    for seed, best in ((0, 1), (1, 3)):
        for w in (32, 256):
            for i, lr in enumerate(LRS):
                rows.append(dict(d_model=w, num_layers=1, lr=lr, params=w * 1000, status="done", seed=seed,
                                 final_val_loss=3.0 + 0.1 * (i - best) ** 2))  # fmt: skip
    gate = evaluate_gate(plan, pl.DataFrame(rows))
    assert gate.rows[0]["best_lr"] == pytest.approx(LRS[2], rel=1e-6)
    assert gate.rows[0]["losses"][LRS[2]] == pytest.approx(3.1) and gate.ok
    assert "mean of 2 seeds" in format_gate(gate, LRS)


@pytest.mark.parametrize(
    ("transfer", "key"),
    [
        ({"widht": [32, 64]}, "transfer.widht"),
        ({"lrs": [4e-3, 2e-3, 8e-3]}, "transfer.lrs"),
        ({"lrs": [1e-3, 2e-3]}, "transfer.lrs"),
        ({"tolerance": -1}, "transfer.tolerance"),
        ({"widths": [32, 40]}, "transfer.widths"),
        ({"check": "yes"}, "transfer.check"),
        ({"seeds": 1.5}, "transfer.seeds"),
    ],
)
def test_bad_transfer_section_exits_2_before_anything_is_written(tmp_path, capsys, transfer, key):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(_spec(**transfer)))
    out = tmp_path / "sweep"
    assert main(["sweep", "launch", str(spec), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and key in err[0], err
    assert not out.exists() and not (tmp_path / "sweep-transfer").exists()


def test_plan_shows_the_check_and_its_cost(tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(_spec(widths=[32, 64])))
    assert main(["sweep", "plan", str(spec), "--no-measure"]) == 0
    text = capsys.readouterr().out
    assert "LR-transfer check (mup): 5 LRs x widths [32, 64]" in text
    assert "10 runs" in text and "sweep lad: generator ladder" in text


def test_launch_trains_the_check_into_the_store_then_gates(ray_local, tmp_path, capsys):
    raw = _spec(widths=[32, 64], lrs=[4e-3, 1.6e-2, 6.4e-2], tokens_per_param=0.25)
    raw["ladder"] = {"sizes": [3.4e4], "tokens_per_param": [0.25]}
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(raw))
    out = tmp_path / "lad"
    code = main(["sweep", "launch", str(spec), "--out", str(out), "--address", ray_local])
    captured = capsys.readouterr()
    check = store.load_runs(tmp_path / "lad-transfer")
    assert check.height == 6 and set(check["status"]) == {"done"}
    gate = (tmp_path / "lad-transfer" / "gate.txt").read_text()
    if "FAILS" in gate:  # refused: the table on stderr, the ladder never written
        assert code == 2 and "FAILS" in captured.err and not out.exists()
    else:  # passed: the ladder's run took the base width's best LR
        assert code == 0
        ladder = store.load_runs(out)
        lines = gate.splitlines()
        best = float(lines[-1].rsplit("the ladder takes lr ", 1)[1])
        base = [row.split() for row in lines[2:-1] if row.split()[-1] == "+0.00"]  # drift 0: the base size
        assert base and all(row[-4] == f"{best:.3g}" for row in base)  # its best LR, [lo, hi], drift
        assert ladder["lr"].to_list() == [pytest.approx(best)]  # the base's best LR, at 3 digits
