"""The recipe audit and the recipe gate on a synthetic audit store (no training): the audit's runs are
expanded from a spec with the `audit:` generator and finished with losses from a known truth, whose
best LR depends on size and run length (ln lr* = ln 4e-3 - 0.5 ln(N/5e4) - 0.25 ln(D/2e6)), whose
best weight-decay timescale is 0.5 of the run, best beta2 0.99 and best aspect d_model/layers 24.
The audit recovers each; the gate refuses a design run by the per-size recipe and passes one run by
the audited recipe, naming the runs it refuses."""

import math

import numpy as np
import pytest
import yaml

from scalelab import store
from scalelab.cli.main import main
from scalelab.errors import ConfigError
from scalelab.store.atomic import atomic_write_json
from scalelab.sweeps.closed_loop.demo import demo_spec
from scalelab.sweeps.closed_loop.rounds import run_rounds
from scalelab.sweeps.recipes.recipe import timescale_of
from scalelab.sweeps.recipes.recipe_audit import audit_store, audited_recipe, format_audit, load_audit, save_audit
from scalelab.sweeps.recipes.recipe_gate import GateRow, RecipeGate, check_sweep, format_recipe_gate
from scalelab.sweeps.specs.spec import expand_sweep

# the demo's per-size LR rule, shorter runs allowed, and the decay held at one run length (so an LR
# grid does not move the decay's timescale: the LR's optimum is the truth's alone)
RECIPE = {**demo_spec()["recipe"], "min_steps": 50, "weight_decay": {"timescale": 1.0}}
AUDIT = {
    "sizes": [2e4, 5e4, 1.3e5],
    "tokens_per_param": [3, 10, 30, 100],
    "max_flops": 3e12,
    "lr_multipliers": [0.35, 0.5, 0.71, 1.0, 1.41, 2.0, 2.83],
    "weight_decay": {"cells": [[5e4, 10], [1.3e5, 3]], "timescales": [0.05, 0.15, 0.5, 1.5, 5]},
    "beta2": {"cells": [[2e4, 30]], "values": [0.95, 0.99, 0.999]},
    "shape": {"cells": [[5e4, 30]], "layers": [1, 2, 3, 4, 6]},
}


def best_lr(n, d):
    return 4e-3 * (n / 5e4) ** -0.5 * (d / 2e6) ** -0.25


def truth(config: dict, n: int, d: int) -> float:
    """The synthetic loss of a run config (the module docstring's optimum), 0.1% noise by run."""
    o, m = config["optim"], config["model"]
    steps = d // config["train"]["global_batch_tokens"]
    log_loss = math.log(1.2 + 40 * n**-0.3 + 80 * d**-0.3)
    log_loss += 0.1 * math.log(o["lr"] / best_lr(n, d)) ** 2
    log_loss += 0.02 * math.log(timescale_of(o["weight_decay"], o["lr"], steps) / 0.5) ** 2
    log_loss += 0.01 * math.log((1 - o["beta2"]) / 0.01) ** 2
    log_loss += 0.02 * math.log(m["d_model"] / m["num_layers"] / 24) ** 2
    rng = np.random.default_rng(abs(hash((n, d, o["lr"], o["weight_decay"], o["beta2"], m["num_layers"]))) % 2**32)
    return math.exp(log_loss + rng.normal(0, 0.001))


def finish(sweep_dir, spec: dict) -> None:
    """Record the spec's runs in the store as a launch does, each done at its synthetic loss."""
    sweep = expand_sweep(spec)
    store.init_sweep(sweep_dir, yaml.safe_dump(spec), "audit", [r.to_dict() for r in sweep.runs], sweep.name)
    for run in sweep.runs:
        run_dir = store.run_path(sweep_dir, run.run_id)
        loss = truth(run.config, run.params, run.num_tokens)
        atomic_write_json(run_dir / "config.json", run.config)
        atomic_write_json(run_dir / "status.json", dict(status="done", run_id=run.run_id, params=run.params,
                          num_tokens=run.num_tokens, flops_6n=run.flops_6n, final_val_loss=loss))  # fmt: skip


def _spec(generator: dict, **extra) -> dict:
    d = demo_spec()
    return {"name": "audit", "base": d["base"], "recipe": RECIPE, "fit": d["fit"], **generator, **extra}


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    sweep_dir = tmp_path_factory.mktemp("store") / "audit"
    finish(sweep_dir, _spec({"audit": AUDIT}))
    result = audit_store(sweep_dir, n_boot=100)
    save_audit(sweep_dir, result)
    return sweep_dir, result


def test_the_audit_finds_the_known_optima(audited):
    _, result = audited
    law = result.lr_law
    # the smallest model's shortest cell wants 2.3x the recipe's LR, at the grid's edge: left out, and said so
    assert law.n_cells == len(result.lr_cells) - 1 >= 9 and law.left_out == [(18512.0, 55552.0)]
    assert any("not bracketed" in w and "D=55,552" in w for w in result.warnings)
    for term, want in (("params", -0.5), ("tokens", -0.25)):
        lo, hi = law.slope_interval(term)
        assert lo <= want <= hi and hi - lo < 0.15, (term, lo, hi)
    # the per-size rule cannot follow the horizon: its cells scatter about it several times more
    assert result.lr_law_size.resid_sd > 3 * law.resid_sd
    # the recipe's LR costs loss where it is far from the best: most at short horizons of small models
    costs = [c.cost(lr) if c.bracketed else 0.0 for c, lr in zip(result.lr_cells, result.recipe_lr)]
    worst = result.lr_cells[int(np.argmax(costs))]
    assert worst.params < 3e4 and worst.tokens / worst.params < 15 and max(costs) > 0.02
    tau, lo, hi = result.wd_law.predict()
    assert lo <= 0.5 <= hi and 0.3 < tau < 0.8
    assert result.recipe_timescale == [1.0, 1.0] and all(c.cost(1.0) > 0.005 for c in result.wd_cells)
    (b2,) = result.beta2
    assert b2.best == 0.99 and b2.current == 0.95 and b2.cost > 0
    (shape,) = result.shape_cells
    # the depths' models are 2-30% off the cell's size; moved to it by the frontier's slope, the best
    # aspect is pinned (without the move: 38 in [4, 48])
    assert shape.bracketed and shape.interval[0] <= 24 <= shape.interval[1] < 1.3 * shape.interval[0]
    assert result.frontier["law"] == "chinchilla" and result.frontier["n_points"] >= 6


def test_the_audited_recipe_and_the_saved_audit(audited):
    sweep_dir, result = audited
    recipe = audited_recipe(result)
    assert recipe["lr"]["exponent"] == pytest.approx(-0.5, abs=0.05)
    assert recipe["lr"]["tokens_exponent"] == pytest.approx(-0.25, abs=0.05)
    assert recipe["weight_decay"]["timescale"] == pytest.approx(0.5, rel=0.3)
    assert recipe["beta2"]["ref_beta2"] == 0.99
    back = load_audit(sweep_dir)
    assert back.lr_law.predict(1e5, 1e7) == result.lr_law.predict(1e5, 1e7)
    assert format_audit(back).splitlines()[1:4] == format_audit(result).splitlines()[1:4]
    assert yaml.safe_load((sweep_dir / "recipe.yaml").read_text())["recipe"] == recipe


def _design(recipe: dict, audit_dir, max_cost=0.01) -> dict:
    iso = {"budgets": [2e11, 2e12], "num_sizes": 3, "center": {"tokens_per_param": 20}, "span": 3}
    return _spec({"isoflop": iso}, recipe=recipe, recipe_gate={"audit": str(audit_dir), "max_cost": max_cost})


def test_the_gate_refuses_the_per_size_recipe_and_passes_the_audited_one(audited, tmp_path):
    sweep_dir, result = audited
    old = check_sweep(expand_sweep(_design(RECIPE, sweep_dir)))
    assert not old.ok and old.over
    # refused: the long runs, whose LR the horizon moves from the per-size rule's (+1.8% to +2.7% of
    # the loss), and one more by their decay's timescale at a run's length (+1% everywhere)
    assert all(r.cost > 0.01 for r in old.over) and max(r.lr_cost[0] for r in old.over) > 0.015
    assert {r.run_id for r in old.rows if r.lr_cost[0] > 0.01} < {r.run_id for r in old.over}
    new = check_sweep(expand_sweep(_design(audited_recipe(result), sweep_dir)))
    assert new.ok, [(r.run_id, r.cost) for r in new.over]
    assert max(r.cost for r in new.rows) < 0.002
    # the loop refuses before anything is written
    out = tmp_path / "design"
    res = run_rounds(expand_sweep(_design(RECIPE, sweep_dir)), out, spec_text="x", rounds=1, log=lambda m: None)
    assert "recipe gate refused the design" in res.stopped and not out.exists()


def test_cli_audit_and_launch_refusal(audited, tmp_path, capsys):
    sweep_dir, _ = audited
    spec = tmp_path / "design.yaml"
    spec.write_text(yaml.safe_dump(_design(RECIPE, sweep_dir)))
    assert main(["sweep", "audit", str(sweep_dir), "--design", str(spec), "--replicates", "20"]) == 0
    out = capsys.readouterr().out
    assert "best LR by size and horizon" in out and "fitted LR(N, D)" in out
    assert "the design of" in out and "OVER" in out
    assert main(["sweep", "launch", str(spec), "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert "error: recipe_gate:" in err and "REFUSES" in err
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"max_cost": 0.01}, "recipe_gate.audit"),
        ({"audit": "x", "max_cost": 5}, "recipe_gate.max_cost"),
        ({"audit": "x", "max_kost": 0.1}, "recipe_gate.max_kost"),
    ],
)
def test_bad_gate_sections_name_the_key(section, key):
    iso = {"budgets": [2e11], "num_sizes": 3, "center": {"tokens_per_param": 20}, "span": 3}
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        expand_sweep(_spec({"isoflop": iso}, recipe_gate=section))


def test_an_audit_without_a_recipe_is_refused():
    with pytest.raises(ConfigError, match="add a recipe"):
        expand_sweep({"base": demo_spec()["base"], "audit": AUDIT})


@pytest.mark.parametrize("section", ["weight_decay", "beta2", "shape"])
def test_a_named_cell_too_short_to_train_is_refused_with_its_key(section):
    # 0.05 tokens per parameter is far under recipe.min_steps at the demo's batch (the first cell trains)
    size = 5e4 if section == "shape" else 2e4  # a size every audited depth reaches within 30%
    audit = {**AUDIT, section: {**AUDIT[section], "cells": [[size, 30], [size, 0.05]]}}
    with pytest.raises(ConfigError, match=rf"audit\.{section}\.cells\[1\].*too short for recipe\.min_steps"):
        expand_sweep(_spec({"audit": audit}))


def test_gate_table_caps_a_cost_bound_past_100_percent():
    """A cell far from the audited ones can have an LR interval wide enough that its parabola's cost
    bound is astronomically large (+5e70% was printed); the table says >+100% instead."""
    row = GateRow(
        run_id="r", params=369_360, tokens=902_656, lr=0.00274, best_lr=(0.00211, 0.000582, 0.00324),
        lr_cost=(0.0049, 0.0, 5.3e68), timescale=2.07, best_timescale=None, wd_cost=None,
    )  # fmt: skip
    text = format_recipe_gate(RecipeGate(rows=[row], max_cost=0.005, source="a"))
    assert "+0.49% [+0.00%, >+100%]" in text
    assert "e+" not in text and "0000" not in text
