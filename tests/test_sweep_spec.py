"""Sweep specs without Ray: generators, axes, seeds, cooldown branches, the plan, bad specs (exit 2)."""

import pytest
import yaml

from scalelab.cli.main import main
from scalelab.errors import ConfigError
from scalelab.sweeps.specs.spec import expand_sweep

BASE = {
    "model": {"preset": "debug"},
    "data": {"seq_len": 64},
    "train": {"global_batch_tokens": 256, "num_tokens": 2560},
    "logging": {"wandb": "disabled"},
}


def test_grid_seeds_axes_and_ids():
    sweep = expand_sweep(
        {
            "base": BASE,
            "grid": {"optim.lr": [1e-3, 3e-3], "model.d_model": [32, 64]},
            "seeds": 2,
            "axes": {"optim.weight_decay": [0.0, 0.1]},
        }
    )
    assert len(sweep.runs) == 2 * 2 * 2 * 2
    assert len({r.run_id for r in sweep.runs}) == 16
    seeds = {r.config["train"]["seed"] for r in sweep.runs}
    assert seeds == {0, 1}
    assert {r.config["model"]["d_model"] for r in sweep.runs} == {32, 64}
    assert all(r.config["train"]["num_threads"] == 1 for r in sweep.runs)  # = execution.cpus_per_run
    # The id is the config's: the same run from another generator (and other labels) has the same id.
    point = expand_sweep(
        {
            "base": BASE,
            "points": [
                {
                    "optim.lr": 3e-3,
                    "model.d_model": 64,
                    "train.seed": 1,
                    "optim.weight_decay": 0.1,
                    "labels": {"note": "x"},
                }
            ],
        }
    )
    assert point.runs[0].run_id in {r.run_id for r in sweep.runs}


def test_isoflop_budgets_within_tolerance_and_sizes_from_shape_rule():
    spec = {
        "base": {**BASE, "model": {}},
        "isoflop": {"budgets": [5e9, 1.5e10], "num_sizes": 3, "params": [5e4, 1.5e5], "tolerance": 0.03},
    }
    sweep = expand_sweep(spec)
    by_budget = {}
    for r in sweep.runs:
        c = r.labels["flops_budget"]
        assert abs(r.flops_6n / c - 1) <= 0.03
        assert r.num_tokens % 256 == 0
        by_budget.setdefault(c, []).append(r)
    for runs in by_budget.values():
        params = [r.params for r in runs]
        tokens = [r.num_tokens for r in runs]
        assert params == sorted(params) and tokens == sorted(tokens, reverse=True) and len(set(params)) == 3
    with pytest.raises(ConfigError, match="isoflop.tolerance"):
        expand_sweep({**spec, "isoflop": {**spec["isoflop"], "tolerance": 1e-5}})


def test_ladder_random_and_data_axes():
    ladder = expand_sweep(
        {"base": {**BASE, "model": {}}, "ladder": {"sizes": [6e4, 1.2e5], "tokens_per_param": [0.5, 1]}}
    )
    assert len(ladder.runs) == 4
    for r in ladder.runs:
        assert r.num_tokens / r.params == pytest.approx(r.labels["tokens_per_param"], rel=0.05)
    spec = {
        "base": BASE,
        "random": {
            "num_samples": 5,
            "seed": 3,
            "params": {"optim.lr": {"loguniform": [1e-4, 1e-2]}, "optim.beta2": {"choice": [0.95, 0.99]}},
        },
        "data": {"num_tokens": [2560, 5120]},
    }
    a, b = expand_sweep(spec), expand_sweep(spec)
    assert [r.run_id for r in a.runs] == [r.run_id for r in b.runs] and len(a.runs) == 10
    assert all(1e-4 <= r.config["optim"]["lr"] <= 1e-2 for r in a.runs)
    assert {r.config["train"]["num_tokens"] for r in a.runs} == {2560, 5120}
    two = {
        **BASE,
        "data": {"seq_len": 64, "sources": [{"name": "a", "path": "default"}, {"name": "b", "path": "default"}]},
    }
    mix = expand_sweep(
        {"base": two, "grid": {"optim.lr": [1e-3]}, "data": {"mixtures": [{"a": 3, "b": 1}, {"a": 1, "b": 1}]}}
    )
    assert [[s["weight"] for s in r.config["data"]["sources"]] for r in mix.runs] == [[3.0, 1.0], [1.0, 1.0]]


def test_cooldown_branches_share_the_stable_prefix():
    spec = {
        "base": {
            **BASE,
            "schedule": {"name": "wsd", "decay_fraction": 0.2},
            "train": {"global_batch_tokens": 256, "num_tokens": 25600},
        },
        "grid": {"optim.lr": [3e-3]},
        "cooldowns": {"fractions": [0.25, 0.5]},
    }
    runs = expand_sweep(spec).runs
    stable, branches = runs[0], runs[1:]
    assert stable.labels["cooldown"] == "stable" and stable.config["checkpoint"]["keep_last"] == 0
    interval = stable.config["checkpoint"]["interval_steps"]
    warmup = stable.config["schedule"]["warmup_tokens"]
    assert warmup > 0
    for b, f in zip(branches, (0.25, 0.5)):
        assert b.depends_on == stable.run_id
        start = b.labels["branch_step"]
        assert (
            start % interval == 0 and b.config["train"]["init_from"] == f"../{stable.run_id}/checkpoints/step_{start}"
        )
        assert b.config["schedule"]["warmup_tokens"] == warmup
        steps = b.num_tokens // 256
        decay_start = b.num_tokens - int(0.2 * b.num_tokens)
        assert start * 256 <= decay_start and b.num_tokens == pytest.approx(f * stable.num_tokens, rel=0.15)
        assert b.cost_flops == pytest.approx(b.flops_6n * (steps - start) / steps)
    with pytest.raises(ConfigError, match="wsd"):
        expand_sweep({**spec, "base": BASE})


def test_cooldown_branch_equals_a_standalone_run(tmp_path):
    """A branch started from the stable run's checkpoint reproduces the standalone WSD run of its length."""
    import json
    import os

    import torch

    from scalelab.train.identity import same_run
    from scalelab.train.loop import train_run

    base = {
        **BASE,
        "schedule": {"name": "wsd", "decay_fraction": 0.25},
        "train": {"global_batch_tokens": 256, "num_tokens": 5120},
        "eval": {"interval_steps": 0},
        "data": {"seq_len": 64, "val_sequences": 4},
        "logging": {"wandb": "disabled", "progress": "off"},
    }
    stable, branch = expand_sweep({"base": base, "grid": {"optim.lr": [3e-3]}, "cooldowns": {"fractions": [0.5]}}).runs
    threads = torch.get_num_threads()
    cwd = os.getcwd()
    try:
        train_run(same_run(stable.config, stable.run_id), tmp_path / "runs" / stable.run_id)
        (tmp_path / "runs" / branch.run_id).mkdir(parents=True)
        os.chdir(tmp_path / "runs" / branch.run_id)
        train_run(same_run(branch.config, branch.run_id), tmp_path / "runs" / branch.run_id)
        alone_cfg = dict(branch.config, train=dict(branch.config["train"], init_from=None))
        from scalelab.train.config import build_run_config

        train_run(build_run_config(alone_cfg), tmp_path / "alone")
    finally:
        os.chdir(cwd)
        torch.set_num_threads(threads)
    a = json.loads((tmp_path / "runs" / branch.run_id / "status.json").read_text())
    b = json.loads((tmp_path / "alone" / "status.json").read_text())
    assert a["final_val_loss"] == b["final_val_loss"] and a["final_train_loss"] == b["final_train_loss"]
    # the branch really started from the stable run's checkpoint (a branch that loaded nothing
    # would be the standalone run and pass the equality above)
    assert a["loaded_steps"] == [branch.labels["branch_step"]] and b["loaded_steps"] == [None]


def test_plan_table(capsys, tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"base": BASE, "grid": {"optim.lr": [1e-3, 3e-3]}}))
    assert main(["sweep", "plan", str(spec)]) == 0
    out = capsys.readouterr().out
    assert "2 runs" in out and "1 proc, 1 cpu" in out and "one after another" in out


@pytest.mark.parametrize(
    "spec, match",
    [
        ({"base": BASE, "isoflops": {"budgets": [1e9]}}, "isoflops: unknown key; did you mean 'isoflop'"),
        (
            {"base": {**BASE, "model": {}}, "isoflop": {"budgets": [1e8], "num_sizes": 3, "tokens_per_param": [4, 40]}},
            r"isoflop.budgets\[0\]: budget 1e\+08 is too small for the smallest size",
        ),
        ({"base": {**BASE, "optim": {"lrr": 1}}, "grid": {"optim.lr": [1e-3]}}, "optim.lrr: unknown key"),
        ({"base": BASE}, "generator: the spec names no generator"),
        (
            {"base": BASE, "grid": {"optim.lr": [1e-3]}, "execution": {"max_concurent": 2}},
            "execution.max_concurent: unknown key",
        ),
    ],
)
def test_bad_specs_exit_2_before_ray(spec, match, tmp_path, capsys, monkeypatch):
    import re

    from scalelab.sweeps.execution import execute

    def no_ray(*a, **k):
        raise AssertionError("Ray started for a bad spec")

    monkeypatch.setattr(execute, "start_ray", no_ray)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(spec))
    for cmd in (
        ["sweep", "plan", str(path), "--no-measure"],
        ["sweep", "launch", str(path), "--out", str(tmp_path / "o")],
    ):
        assert main(cmd) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and re.search(match, err), err
    assert not (tmp_path / "o").exists()


def test_runs_stored_by_older_code_are_found_and_resumable(tmp_path):
    """A new config field changes every run id; the store still finds a finished run by re-resolving
    its stored config, and a trial accepts a stored config that lacks only the new fields."""
    import json

    from scalelab import store
    from scalelab.train.config import build_run_config
    from scalelab.train.identity import current_run_id, same_run

    run = expand_sweep({"base": BASE, "grid": {"optim.lr": [1e-3]}}).runs[0]
    old = json.loads(json.dumps(run.config))
    del old["optim"]["z_loss"]  # as if written before the field existed (its default is 0.0)
    a = tmp_path / "root" / "a"
    d = store.run_path(a, "0ld0ld0ld0ld")
    d.mkdir(parents=True)
    (a / "sweep.yaml").write_text("name: a\n")
    (d / "config.json").write_text(json.dumps(old))
    (d / "status.json").write_text(json.dumps({"status": "done"}))
    b = tmp_path / "root" / "b"
    assert store.attach_runs(b, [run.run_id], current_id=current_run_id) == {run.run_id: "done"}
    assert store.run_path(b, run.run_id).resolve() == d.resolve()
    same_run(old, "0ld0ld0ld0ld", today=build_run_config(old))  # only a field was added: accepted
    changed = json.loads(json.dumps(old))
    changed["optim"]["lr"] = 2e-3
    with pytest.raises(RuntimeError, match="optim.lr"):
        same_run(old, "0ld0ld0ld0ld", today=build_run_config(changed))
