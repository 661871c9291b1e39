"""Tests for the layout planner (scalelab.parallel.planner, planner_memory, planner_validate).

State bytes must be exact (against the tensors a model and optimizer hold, and against the parallel
memory accounting for sharded layouts); the activation formula within 10% of the bytes autograd
saves; the search must return fitting layouts for the published configurations; calibration must
recover known constants from synthetic measurements.
"""

from __future__ import annotations

import json
from dataclasses import replace

import polars as pl
import pytest
import torch

from experiments.planner_validate import local_rows
from scalelab.models.llama import build_model
from scalelab.models.presets import get_preset
from scalelab.parallel.config import ParallelConfig
from scalelab.parallel.memory import expected_memory, measured_memory
from scalelab.parallel.parity import moe_debug_model
from scalelab.parallel.planner import (
    CostConstants,
    Hardware,
    Measurement,
    calibrate,
    estimate,
    measurements_from_runs,
    plan_layouts,
)
from scalelab.parallel.planner_memory import param_shapes, state_bytes

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one intra-op thread per module


@pytest.mark.parametrize("cfg", [get_preset("debug", kernels="torch"), moe_debug_model()], ids=["dense", "moe"])
def test_state_bytes_single_device_equal_the_tensors(cfg):
    model = build_model(cfg, seed=0)
    assert {n: tuple(p.shape) for n, p in model.named_parameters()} == param_shapes(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, cfg.vocab_size, (2, 9))
    model(x[:, :-1]).sum().backward()
    opt.step()
    measured = measured_memory(model, opt)
    assert state_bytes(cfg, ParallelConfig(), seq_len=8).as_dict() == measured.as_dict()


@pytest.mark.parametrize(
    "axes",
    [
        dict(dp_shard=2),
        dict(dp_shard=3),
        dict(tp=2),
        dict(dp_shard=2, tp=2),
        dict(dp_replicate=2, dp_shard=2),
        dict(pp=2),
        dict(pp=2, pp_schedule="interleaved-1f1b"),
        dict(dp_shard=4, pp=2),
    ],
)
def test_state_bytes_equal_parallel_accounting(axes):
    cfg = replace(get_preset("tiny-1m", kernels="torch"), num_layers=8)
    pcfg = ParallelConfig(**axes)
    worst = max(
        (expected_memory(cfg, pcfg, {"pp": r}, optimizer="adamw", seq_len=64) for r in range(pcfg.pp)),
        key=lambda m: m.total_bytes,
    )
    assert state_bytes(cfg, pcfg, seq_len=64).as_dict() == worst.as_dict()


def test_activation_formula_within_10_percent_of_saved_tensors():
    rows = local_rows(quick=True)
    assert len(rows) >= 6
    for row in rows:
        assert abs(row["rel_error"]) <= 0.10, row


def test_published_layouts_fit_and_rank():
    hw = Hardware(gpu_memory_bytes=80 * 2**30)
    plans = plan_layouts(get_preset("8b"), num_gpus=8, seq_len=8192, global_batch_tokens=32 * 8192, hw=hw)
    assert plans and all(p.fits for p in plans)
    assert all(a.step_time_s <= b.step_time_s for a, b in zip(plans, plans[1:]))
    best = plans[0]
    assert best.parallel.world_size == 8 and best.memory["total"] <= hw.gpu_memory_bytes
    assert set(best.memory) == {"params", "grads", "optimizer", "activations", "buffers", "total"}
    # A layout that cannot fit: 8B on one 80 GiB GPU with AdamW (16 bytes/param of state > 80 GiB)
    assert plan_layouts(get_preset("8b"), num_gpus=1, seq_len=8192, global_batch_tokens=8192, hw=hw) == []


def test_more_memory_pressure_buys_checkpointing_or_sharding():
    cfg = get_preset("8b")
    lay = ParallelConfig(dp_shard=8)
    kw = dict(micro_batch_sequences=4, seq_len=8192, global_batch_sequences=32, hw=Hardware(), consts=CostConstants())
    none = estimate(cfg, lay, **kw)
    full = estimate(cfg, replace(lay, activation_checkpoint="full"), **kw)
    assert full.memory["activations"] < none.memory["activations"] / 5
    assert full.step_time_s > none.step_time_s  # the recompute costs time
    cp2 = estimate(cfg, replace(lay, dp_shard=4, cp=2), **kw)
    assert cp2.memory["activations"] < none.memory["activations"] and cp2.comm_bytes["cp"] > 0


def test_calibrate_recovers_constants_from_synthetic_runs():
    truth = CostConstants(mfu=0.3, comm_efficiency=0.4, fsdp_overlap=0.5, activation_scale=1.25, overhead_bytes=5e9)
    hw = Hardware(inter_node_bytes_per_s=25e9)
    cfg = get_preset("1b")
    layouts = [  # (layout, sequences per micro-batch)
        (ParallelConfig(dp_shard=16), 1),
        (ParallelConfig(dp_shard=16), 4),
        (ParallelConfig(dp_shard=8, tp=2), 2),
        (ParallelConfig(dp_replicate=2, dp_shard=8, activation_checkpoint="full"), 2),
        (ParallelConfig(dp_shard=4, cp=4), 1),
    ]
    runs = []
    for lay, mbs in layouts:
        p = estimate(cfg, lay, micro_batch_sequences=mbs, seq_len=4096, global_batch_sequences=64, hw=hw, consts=truth)
        runs.append(
            Measurement(
                cfg=cfg,
                parallel=lay,
                micro_batch_sequences=mbs,
                seq_len=4096,
                global_batch_sequences=64,
                step_time_s=p.step_time_s,
                peak_memory_bytes=p.memory["total"],
                hw=hw,
            )
        )
    got = calibrate(runs, CostConstants())
    assert got.mfu == pytest.approx(0.3, rel=0.02)
    assert got.activation_scale == pytest.approx(1.25, rel=1e-6)
    assert got.overhead_bytes == pytest.approx(5e9, rel=1e-6)
    for m in runs:  # the refitted model reproduces every measured step time
        p = estimate(
            m.cfg,
            m.parallel,
            micro_batch_sequences=m.micro_batch_sequences,
            seq_len=4096,
            global_batch_sequences=64,
            hw=hw,
            consts=got,
        )
        assert p.step_time_s == pytest.approx(m.step_time_s, rel=0.02)


def test_measurements_from_run_records(tmp_path):
    cfg = get_preset("debug")
    from dataclasses import asdict

    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model": asdict(cfg),
                "parallel": {"dp_shard": 2, "activation_checkpoint": "full"},
                "data": {"seq_len": 128},
                "train": {"global_batch_tokens": 1024, "micro_batch_sequences": 2},
            }
        )
    )
    pl.DataFrame({"step": [1, 2, 3, 4, 5], "tokens_per_s": [10.0, 500.0, 1000.0, 1024.0, 2048.0]}).write_parquet(
        tmp_path / "metrics.parquet"
    )
    (m,) = measurements_from_runs([tmp_path], skip_steps=2)
    assert m.parallel.dp_shard == 2 and m.parallel.activation_checkpoint == "full"
    assert m.micro_batch_sequences == 2 and m.global_batch_sequences == 8
    assert m.step_time_s == pytest.approx(1.0)  # 1024 tokens at the median 1024 tokens/s


def test_plan_layout_cli(capsys, tmp_path):
    from scalelab.cli.main import main

    args = ["plan-layout", "--model", "1b", "--gpus", "8", "--gpu-memory", "80GiB", "--seq-len", "4096"]
    assert main([*args, "--global-batch-tokens", "1M", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "params" in out and "fits" in out and len(out.strip().splitlines()) == 5
    assert main([*args, "--global-batch-tokens", "1M", "--top", "2", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert len(rows) == 2 and rows[0]["step_time_s"] <= rows[1]["step_time_s"] and rows[0]["fits"]
    # a model file with an MoE config
    (tmp_path / "m.yaml").write_text(
        "model:\n  family: moe\n  vocab_size: 32000\n  num_layers: 8\n  d_model: 1024\n  num_heads: 16\n"
        "  num_kv_heads: 8\n  d_ff: 2816\n  max_seq_len: 4096\n  num_experts: 8\n  moe_d_ff: 704\n"
    )
    assert main(["plan-layout", "--model", str(tmp_path / "m.yaml"), "--gpus", "8", "--seq-len", "4096",
                 "--global-batch-tokens", "512K", "--top", "1", "--json"]) == 0  # fmt: skip
    row = json.loads(capsys.readouterr().out)
    assert row["ep"] >= 1 and row["fits"]
    assert main([*args, "--global-batch-tokens", "1000"]) == 2  # not a multiple of the sequence
    assert "multiple" in capsys.readouterr().err
