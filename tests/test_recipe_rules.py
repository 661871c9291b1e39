"""The small-scale recipe's rules for the optimizer (scalelab.sweeps.recipes.recipe): the LR of N and of the
run's tokens, AdamW's weight-decay timescale held at a fraction of the run, beta2 held in tokens; the
old per-size LR rule unchanged, and the demo's runs keeping their ids."""

import math

import pytest

from scalelab.errors import ConfigError
from scalelab.sweeps.closed_loop.demo import demo_spec
from scalelab.sweeps.recipes.recipe import parse_recipe, timescale_of
from scalelab.sweeps.specs.spec import expand_sweep

BASE = {"data": {"seq_len": 64}, "train": {"global_batch_tokens": 512}}
ISO = {"budgets": [3e11, 1e12], "num_sizes": 3, "center": {"tokens_per_param": 5}, "span": 3}
LR = {"ref_params": 1e5, "ref_lr": 4e-3, "exponent": -0.5}
# the demo's 12 first-round runs: a change to the recipe's code must not rename them (stores keep their runs)
DEMO_IDS = [
    "1653690d8308", "50103c65f9fe", "5d01154f315b", "71ef59646b46", "7a1ea98adf19", "8bae736eb5fd",
    "a23f3c62c58f", "a94eb5e52dfd", "ad2770428af4", "bbc8f0579460", "d4b00b3bab96", "d906fc9a2c34",
]  # fmt: skip


def _runs(recipe: dict, **spec):
    return expand_sweep({"name": "r", "base": BASE, "isoflop": ISO, "recipe": recipe, **spec}).runs


def _steps(run) -> int:
    return run.num_tokens // run.config["train"]["global_batch_tokens"]


def test_lr_of_size_and_horizon():
    horizon = dict(LR, ref_num_tokens=4e6, tokens_exponent=-0.3)
    for run in _runs({"min_steps": 20, "lr": horizon}):
        want = 4e-3 * (run.params / 1e5) ** -0.5 * (run.num_tokens / 4e6) ** -0.3
        assert run.config["optim"]["lr"] == pytest.approx(want, rel=1e-3)
    # without the horizon term: the per-size rule, the same LR at every token count of a size
    for run in _runs({"min_steps": 20, "lr": LR}):
        assert run.config["optim"]["lr"] == pytest.approx(4e-3 * (run.params / 1e5) ** -0.5, rel=1e-3)


def test_weight_decay_timescale_is_a_fixed_fraction_of_every_run():
    runs = _runs({"min_steps": 20, "lr": LR, "weight_decay": {"timescale": 0.4}})
    fractions = [timescale_of(r.config["optim"]["weight_decay"], r.config["optim"]["lr"], _steps(r)) for r in runs]
    assert fractions == pytest.approx([0.4] * len(runs), rel=1e-3)
    assert len({r.config["optim"]["weight_decay"] for r in runs}) == len(runs)  # so wd itself varies
    # an LR axis: the decay follows the point's LR; a point's own weight decay is kept
    axis = _runs({"min_steps": 20, "weight_decay": {"timescale": 0.4}}, axes={"optim.lr": [1e-3, 4e-3]})
    for r in axis:
        assert timescale_of(r.config["optim"]["weight_decay"], r.config["optim"]["lr"], _steps(r)) == pytest.approx(
            0.4, rel=1e-3
        )
    kept = _runs({"min_steps": 20, "weight_decay": {"timescale": 0.4}}, axes={"optim.weight_decay": [0.05]})
    assert {r.config["optim"]["weight_decay"] for r in kept} == {0.05}


def test_beta2_holds_its_length_in_tokens():
    runs = _runs({"min_steps": 20, "beta2": {"ref_batch_tokens": 4096, "ref_beta2": 0.95}})
    for r in runs:
        batch = r.config["train"]["global_batch_tokens"]
        assert r.config["optim"]["beta2"] == pytest.approx(0.95 ** (batch / 4096), rel=1e-6)
        # the average's length in tokens, batch / (1 - beta2), is the reference's to first order
        assert batch / (1 - r.config["optim"]["beta2"]) == pytest.approx(4096 / 0.05, rel=0.05)


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"lr": {"tokens_exponent": -0.3}}, "recipe.lr.tokens_exponent"),
        ({"lr": {"ref_num_tokens": -1}}, "recipe.lr.ref_num_tokens"),
        ({"weight_decay": {"timescale": -0.5}}, "recipe.weight_decay.timescale"),
        ({"beta2": {"ref_batch_tokens": 512, "ref_beta2": 1.0}}, "recipe.beta2.ref_beta2"),
        ({"weight_decay": {"time_scale": 0.5}}, "recipe.weight_decay.time_scale"),
    ],
)
def test_bad_rules_name_their_key(section, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        parse_recipe(section)


def test_demo_runs_keep_their_ids():
    runs = expand_sweep(demo_spec(), default_name="demo").runs
    assert sorted(r.run_id for r in runs) == DEMO_IDS
    assert all(r.config["optim"]["weight_decay"] == 0.1 and r.config["optim"]["beta2"] == 0.95 for r in runs)
    assert all(math.isfinite(r.config["optim"]["lr"]) for r in runs)
