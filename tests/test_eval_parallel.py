"""Evaluation under parallel layouts: a checkpoint loaded sharded, scored through the layout's step.

Contract: a trained debug checkpoint (and a MoE one for ep2) evaluated under fsdp2, tp2 (+SP, loss
parallel), pp2, cp2, pp2 x cp2 and ep2 on gloo gives the single-device evaluation's numbers: every example's
choice log-likelihoods within 1e-5 relative, the same accuracies, and the validation loss within
1e-5 (fp32). Nothing in a rank holds the whole model: the model is built on the meta device,
sharded, and the checkpoint loaded into the shards.
"""

import math

import pytest

from scalelab.parallel.config import ParallelConfig
from scalelab.train.config import build_run_config
from scalelab.train.eval_checkpoint import evaluate_checkpoint
from scalelab.train.eval_tasks import load_tasks
from scalelab.train.loop import train_run

pytestmark = pytest.mark.usefixtures("one_thread")
TASKS = ["bundled:stdlib_nextline@8"]
REL = 1e-5

RUN = {
    "name": "evalpar",
    "model": {"preset": "debug"},
    "data": {"seq_len": 64, "val_sequences": 8},
    "train": {"num_tokens": 3 * 512, "global_batch_tokens": 512, "seed": 2, "device": "cpu"},
    "optim": {"lr": 1e-2},
    "eval": {"interval_steps": 0, "val_batch_sequences": 4},
    "checkpoint": {"interval_steps": 3},
    "logging": {"wandb": "disabled", "progress": "off"},
}


def _single(ckpt):
    ev = evaluate_checkpoint(ckpt, load_tasks(TASKS))  # one device
    val = {(r["task"], r["metric"]): r["value"] for r in ev.rows if r["task"].startswith("val")}
    return ev.examples[load_tasks(TASKS)[0].name], val


def _check(ckpt, layout: ParallelConfig):
    ref_examples, ref_val = _single(ckpt)
    ev = evaluate_checkpoint(ckpt, load_tasks(TASKS), layout=layout)
    rows, examples = ev.rows, ev.examples
    got = examples[load_tasks(TASKS)[0].name]
    assert len(got) == len(ref_examples)
    for a, b in zip(got, ref_examples):
        for x, y in zip(a["logprobs"], b["logprobs"]):
            assert abs(x - y) <= REL * abs(y), (x, y)
        assert a["pred"] == b["pred"] and a["pred_norm"] == b["pred_norm"]
    vals = {(r["task"], r["metric"]): r["value"] for r in rows}
    for key, value in ref_val.items():
        assert math.isclose(vals[key], value, rel_tol=REL), (key, vals[key], value)
    assert {r["metric"] for r in rows if r["task"].startswith("bundled")} == {"acc", "acc_norm", "bpb"}


@pytest.fixture(scope="module")
def dense_ckpt(tmp_path_factory):
    out = tmp_path_factory.mktemp("dense") / "run"
    train_run(build_run_config(RUN), out)
    return out / "checkpoints" / "step_3"


@pytest.mark.parametrize(
    "layout",
    [
        ParallelConfig(dp_shard=2),
        ParallelConfig(tp=2),
        ParallelConfig(pp=2),
        ParallelConfig(cp=2),
        ParallelConfig(pp=2, cp=2),
    ],
    ids=["fsdp2", "tp2sp", "pp2", "cp2", "pp2xcp2"],
)
def test_dense_layouts_evaluate_like_one_device(dense_ckpt, layout):
    _check(dense_ckpt, layout)


def test_moe_under_ep2_evaluates_like_one_device(tmp_path):
    out = tmp_path / "moe"
    train_run(build_run_config({**RUN, "model": {"preset": "moe-debug"}}), out)
    _check(out / "checkpoints" / "step_3", ParallelConfig(dp_shard=2, ep=2))


def test_training_under_pp2_scores_tasks_like_one_device(tmp_path, monkeypatch):
    """eval.tasks inside training under a pipeline layout (refused before: no rank held the model)."""
    import polars as pl
    import yaml

    from scalelab.cli.main import main

    monkeypatch.chdir(tmp_path)
    cfg = {**RUN, "eval": {"interval_steps": 3, "val_batch_sequences": 4, "tasks": TASKS}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["run", "run.yaml", "--out", "one"]) == 0
    assert main(["run", "run.yaml", "--out", "pp2", "--set", "parallel.pp=2"]) == 0
    rows = {}
    for name in ("one", "pp2"):
        ev = pl.read_parquet(tmp_path / name / "evals.parquet").filter(pl.col("task").str.starts_with("bundled"))
        rows[name] = {(r["step"], r["metric"]): r["value"] for r in ev.iter_rows(named=True)}
    assert set(rows["one"]) == set(rows["pp2"]) and len(rows["one"]) == 3
    for key, value in rows["one"].items():  # the runs agree to the pipeline parity tolerance
        assert math.isclose(rows["pp2"][key], value, rel_tol=1e-4), (key, rows["pp2"][key], value)
