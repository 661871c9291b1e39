"""`scalelab run` (train_run under a 2-process layout) with context and expert parallel vs one device.

The training loop's own multi-process path: ParallelDims -> parallelize (CP attention, EP experts
with their FSDP) -> ParallelStep (sequence sharding, loss averaged over cp, EP gradient norm).
Losses per step must match the single-device run of the same config within 1e-5 (fp32, 3 steps):
  cp2 with ring attention (dense; parallel.cp_variant=ring) vs single; tp2 with sequence parallel x cp2,
  and 2 HSDP replicas x cp2 ring (world 4);
  MoE fsdp2 x ep2 (without and with selective activation checkpointing, whose recompute keeps
  the all_to_all outputs) vs single with micro-batches of one rank's share (each rank's aux loss is that of
  its own tokens, as for the single run's micro-batches); MoE ep2 inside 2 pipeline stages;
  MoE checkpointed at step 2 under dp_shard 2 x ep 2 x tp 2 (+SP, loss parallel; world 4) and
  continued from that checkpoint on one device and under TP 2 alone: steps 3-4 match an
  uninterrupted single-device run (the experts are DTensors with their global shapes, so DCP
  stores each expert once and reshards them).
"""

from __future__ import annotations

import polars as pl
import pytest
import torch

from scalelab.store.records import read_status
from scalelab.train.config import build_run_config
from scalelab.train.launch import launch_local
from scalelab.train.loop import train_run

BASE = {
    "name": "epcp",
    "model": {"preset": "debug", "kernels": "torch"},
    "data": {"seq_len": 32, "val_sequences": 8},
    # cpu pinned: on a CUDA machine `auto` would train in bf16 and the 1e-5 checks would not hold
    "train": {"num_tokens": 3 * 256, "global_batch_tokens": 256, "seed": 3, "device": "cpu"},
    "eval": {"interval_steps": 100, "val_batch_sequences": 4},
    "checkpoint": {"interval_steps": 100, "keep_last": 1},
    "logging": {"wandb": "disabled", "progress": "off"},
    "optim": {"lr": 1e-3},
}


def _losses(run_dir) -> list[float]:
    return pl.read_parquet(run_dir / "metrics.parquet")["loss"].to_list()


def test_run_cp2_ring_matches_single(tmp_path):
    torch.set_num_threads(1)
    single = build_run_config(BASE)
    train_run(single, tmp_path / "single")
    cp = build_run_config(BASE, ["parallel.cp=2", "parallel.cp_variant=ring", "parallel.backend=gloo"])
    assert launch_local(cp, tmp_path / "cp") == 0
    ref, got = _losses(tmp_path / "single"), _losses(tmp_path / "cp")
    assert len(got) == 3 and max(abs(a - b) for a, b in zip(ref, got)) <= 1e-5, (ref, got)


@pytest.mark.parametrize(
    "layout",
    [
        ["parallel.tp=2", "parallel.cp=2", "parallel.sequence_parallel=true"],  # SP inside each cp rank
        ["parallel.dp_replicate=2", "parallel.cp=2", "parallel.cp_variant=ring"],  # HSDP over dp_shard x cp
    ],
    ids=["tp2sp-cp2", "hsdp2-cp2-ring"],
)
def test_run_cp_world4_layouts_match_single(tmp_path, layout):
    torch.set_num_threads(1)
    train_run(build_run_config(BASE), tmp_path / "single")
    cfg = build_run_config(BASE, [*layout, "parallel.backend=gloo"])
    assert launch_local(cfg, tmp_path / "par") == 0
    ref, got = _losses(tmp_path / "single"), _losses(tmp_path / "par")
    assert len(got) == 3 and max(abs(a - b) for a, b in zip(ref, got)) <= 1e-5, (ref, got)


@pytest.mark.parametrize("ac", ["none", "selective"])
def test_run_moe_fsdp2_ep2_matches_single(tmp_path, ac):
    torch.set_num_threads(1)
    moe = ["model.preset=moe-debug", "train.micro_batch_sequences=4"]
    single = build_run_config(BASE, moe)
    train_run(single, tmp_path / "single")
    layout = ["parallel.dp_shard=2", "parallel.ep=2", f"parallel.activation_checkpoint={ac}"]
    ep = build_run_config(BASE, [*moe, *layout, "parallel.backend=gloo"])
    assert launch_local(ep, tmp_path / "ep") == 0
    ref, got = _losses(tmp_path / "single"), _losses(tmp_path / "ep")
    assert len(got) == 3 and max(abs(a - b) for a, b in zip(ref, got)) <= 1e-5, (ref, got)
    # a row per step (their values against one device: test_run_moe_router_records_are_the_global_batch)
    assert pl.read_parquet(tmp_path / "ep" / "router.parquet").height == 3


def test_run_moe_ep2_pp2_matches_single(tmp_path):
    """EP inside each pipeline stage; the single run's micro-batches are the pipeline's (2 sequences)
    so that every aux loss is over the same tokens."""
    torch.set_num_threads(1)
    train_run(build_run_config(BASE, ["model.preset=moe-debug", "train.micro_batch_sequences=2"]), tmp_path / "single")
    layout = ["parallel.pp=2", "parallel.pp_microbatches=2", "parallel.dp_shard=2", "parallel.ep=2"]
    cfg = build_run_config(
        BASE, ["model.preset=moe-debug", "train.micro_batch_sequences=4", *layout, "parallel.backend=gloo"]
    )
    assert launch_local(cfg, tmp_path / "par") == 0
    ref, got = _losses(tmp_path / "single"), _losses(tmp_path / "par")
    assert len(got) == 3 and max(abs(a - b) for a, b in zip(ref, got)) <= 1e-5, (ref, got)
    assert pl.read_parquet(tmp_path / "par" / "router.parquet").height == 3  # rank 0's stage's layers


def test_run_moe_router_records_are_the_global_batch(tmp_path):
    """dp2 x ep2: the router row sums both ranks' tokens. At step 1 (same weights) its imbalance
    equals a single run that routes the whole 8-sequence batch in one micro-batch."""
    torch.set_num_threads(1)
    train_run(build_run_config(BASE, ["model.preset=moe-debug", "train.micro_batch_sequences=8"]), tmp_path / "single")
    layout = ["parallel.dp_shard=2", "parallel.ep=2", "train.micro_batch_sequences=4", "parallel.backend=gloo"]
    assert launch_local(build_run_config(BASE, ["model.preset=moe-debug", *layout]), tmp_path / "par") == 0
    ref = pl.read_parquet(tmp_path / "single" / "router.parquet").row(0, named=True)
    got = pl.read_parquet(tmp_path / "par" / "router.parquet").row(0, named=True)
    for col in ("moe_imbalance", "moe_imbalance_max", "moe_dropped_frac"):
        assert abs(ref[col] - got[col]) <= 1e-9, (col, ref[col], got[col])


def test_run_moe_pp2_router_records_cover_every_stage(tmp_path):
    """Rank 0 holds only the first stage's layers; the router statistics it writes are gathered
    from both stages and equal the single run's (same last micro-batch: sequences 6-7)."""
    torch.set_num_threads(1)
    train_run(build_run_config(BASE, ["model.preset=moe-debug", "train.micro_batch_sequences=2"]), tmp_path / "single")
    layout = ["parallel.pp=2", "parallel.pp_microbatches=4", "train.micro_batch_sequences=8", "parallel.backend=gloo"]
    assert launch_local(build_run_config(BASE, ["model.preset=moe-debug", *layout]), tmp_path / "par") == 0
    ref = pl.read_parquet(tmp_path / "single" / "router.parquet")
    got = pl.read_parquet(tmp_path / "par" / "router.parquet")
    assert ref.columns == got.columns and ref.height == got.height == 3
    for col in ref.columns:
        assert max(abs(a - b) for a, b in zip(ref[col], got[col])) <= 1e-5, (col, ref[col], got[col])


def test_moe_ep2_tp2_checkpoint_resumes_on_other_layouts(tmp_path):
    from scalelab.parallel.backend import spawn
    from scalelab.train.launch import train_worker

    torch.set_num_threads(1)
    moe = ["model.preset=moe-debug", "train.micro_batch_sequences=4", "train.num_tokens=1024"]
    moe += ["checkpoint.interval_steps=2", "checkpoint.keep_last=2"]
    train_run(build_run_config(BASE, moe), tmp_path / "ref")
    expected = _losses(tmp_path / "ref")
    assert len(expected) == 4
    big = build_run_config(BASE, [*moe, "parallel.dp_shard=2", "parallel.ep=2", "parallel.tp=2"])
    spawn(train_worker, 4, (big, str(tmp_path / "ep2tp2"), False, 2), backend="gloo")
    first = _losses(tmp_path / "ep2tp2")
    assert len(first) == 2 and max(abs(a - b) for a, b in zip(first, expected)) <= 1e-5, (first, expected)
    step2 = tmp_path / "ep2tp2" / "checkpoints" / "step_2"
    tp = build_run_config(BASE, [*moe, "parallel.tp=2", f"train.init_from={step2}"])
    spawn(train_worker, 2, (tp, str(tmp_path / "tp2")), backend="gloo")
    train_run(build_run_config(BASE, [*moe, f"train.init_from={step2}"]), tmp_path / "single")
    for name in ("tp2", "single"):
        got = _losses(tmp_path / name)
        assert len(got) == 4, name
        assert max(abs(a - b) for a, b in zip(got[2:], expected[2:])) <= 1e-5, (name, got, expected)
        assert read_status(tmp_path / name)["loaded_steps"] == [2], name  # continued, not retrained


def test_bad_cp_variant_fails_before_launch():
    from scalelab.errors import ConfigError

    with pytest.raises(ConfigError, match="parallel.cp_variant"):  # with the rest of the config
        build_run_config(BASE, ["parallel.cp=2", "parallel.cp_variant=spiral", "parallel.backend=gloo"])
