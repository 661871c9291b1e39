"""Layout arithmetic, names, stage splitting, memory formulas and the parity CLI (no processes spawned)."""

import dataclasses
import itertools
import json
import random

import pytest
import torch

from scalelab.cli.main import main
from scalelab.errors import ConfigError, UsageError
from scalelab.models.llama import build_model
from scalelab.parallel.config import AC_MODES, ParallelConfig
from scalelab.parallel.dims import ParallelDims
from scalelab.parallel.layouts import layout_name, parse_layout
from scalelab.parallel.memory import expected_memory, measured_memory
from scalelab.parallel.parity import debug_model
from scalelab.parallel.pipeline_split import split_layers, stage_ids_for_rank
from scalelab.parallel.planner_memory import local_shape, param_shapes


def _dims(world=None, model=None, seq_len=None, batch=None, **kw):
    return ParallelDims.from_config(
        ParallelConfig(**kw), world_size=world, model=model, seq_len=seq_len, global_batch_sequences=batch
    )


def test_world_size_mismatch_names_the_product_and_the_fix():
    with pytest.raises(ConfigError) as e:
        _dims(world=4, dp_shard=2)
    assert (
        "parallel" in e.value.key and "= 2 but the world has 4" in str(e.value) and "start 2 processes" in str(e.value)
    )


@pytest.mark.parametrize(
    "kw, key, words",
    [
        (dict(tp=3), "parallel.tp", "divisors of num_heads"),
        (dict(tp=4), "parallel.tp", "num_kv_heads=2"),
        (dict(pp=5), "parallel.pp", "exceed model.num_layers=4"),
        (dict(pp=4, pp_schedule="interleaved-1f1b"), "parallel.pp", "8 pipeline stages"),
        (dict(pp=2, pp_schedule="bogus"), "parallel.pp_schedule", "use one of"),
        (dict(activation_checkpoint="most"), "parallel.activation_checkpoint", "selective"),
        (dict(dp_shard=0), "parallel.dp_shard", ">= 1"),
        (dict(tp=2, seq=31), "parallel.tp", "seq_len=31 over tp=2 unevenly"),
    ],
)
def test_model_shape_rules(kw, key, words):
    seq_len = kw.pop("seq", 32)
    with pytest.raises(ConfigError) as e:
        _dims(model=debug_model(4), seq_len=seq_len, **kw)
    assert e.value.key == key and words in str(e.value)


def test_batch_rules_and_unsupported_axes():
    with pytest.raises(ConfigError, match="do not split over 3"):
        _dims(batch=8, dp_shard=3)
    with pytest.raises(ConfigError, match="pipeline micro-batches"):
        _dims(batch=8, dp_shard=2, pp=2, pp_microbatches=8)
    with pytest.raises(ConfigError, match="seq_len=30 is not divisible by 2\\*cp=4"):
        _dims(model=debug_model(4), seq_len=30, cp=2)
    with pytest.raises(ConfigError, match="zero-bubble with FSDP resharding after forward"):
        _dims(dp_shard=2, pp=2, pp_schedule="zero-bubble")
    assert _dims(dp_shard=2, pp=2, pp_schedule="zero-bubble", fsdp_reshard_after_forward=False).pp == 2
    assert _dims(seq_len=32, cp=2, pp=2).pp == 2  # cp composes with pp and HSDP
    assert _dims(seq_len=32, cp=2, dp_replicate=2).dp_replicate == 2
    with pytest.raises(ConfigError, match="expert parallel needs an MoE model"):
        _dims(model=debug_model(4), dp_shard=2, ep=2)
    ok = _dims(world=8, model=debug_model(4), seq_len=32, batch=8, dp_replicate=2, tp=2, pp=2)
    assert ok.dp_size == 2 and ok.mesh_shape() == (("pp", "dp_replicate", "dp_shard", "tp"), (2, 2, 1, 2))


def test_every_ac_mode_has_one_owner_the_grammar_and_the_checks_read():
    """parallel.config.AC_MODES is the one list: each mode is checked, named and parsed back through it."""
    assert list(AC_MODES) == ["none", "selective", "full"]  # the planner's search order
    for mode in AC_MODES:
        cfg = ParallelConfig(dp_shard=2, activation_checkpoint=mode)
        assert parse_layout(layout_name(cfg)).activation_checkpoint == mode
        _dims(model=debug_model(2), dp_shard=2, activation_checkpoint=mode)
    with pytest.raises(ConfigError, match="use one of none, selective, full"):
        _dims(model=debug_model(2), dp_shard=2, activation_checkpoint="partial")


def test_layout_names():
    c = parse_layout("dp2xfsdp2-zero2xtp2spxpp2-zb+sac")
    assert (c.dp_replicate, c.dp_shard, c.tp, c.pp, c.world_size) == (2, 2, 2, 2, 16)
    assert not c.fsdp_reshard_after_forward and c.sequence_parallel and c.loss_parallel
    assert c.pp_schedule == "zero-bubble" and c.activation_checkpoint == "selective"
    plain = parse_layout("tp2")
    assert not plain.sequence_parallel and not plain.loss_parallel and plain.fsdp_reshard_after_forward
    assert parse_layout("pp2").pp_schedule == "1f1b" and parse_layout("single").world_size == 1
    for bad in ("dp", "tp2x", "qq2", "tp2xtp2", "fsdp2-zero9", "dp2+fast", "cp2-fast", "ep2sp"):
        with pytest.raises(UsageError):
            parse_layout(bad)
    ring = parse_layout("dp2xcp2-ring+compile")
    assert (ring.dp_replicate, ring.cp, ring.cp_variant, ring.compile) == (2, 2, "ring", True)
    # one grammar both ways: every name reads back as the same ParallelConfig
    for name in (
        "single",
        "dp2xfsdp2-zero2xtp2spxpp2-zb+sac",
        "ep2xtp2",
        "fsdp4xep2",
        "cp2-ring+bf16",
        "pp2-interleaved",
    ):
        assert layout_name(parse_layout(name)) == name
        assert parse_layout(layout_name(parse_layout(name))) == parse_layout(name)


def _worst(bounds, costs, first, last):
    s = len(bounds)
    return max(
        sum(costs[i] for i in b) + (first if k == 0 else 0) + (last if k == s - 1 else 0) for k, b in enumerate(bounds)
    )


def test_split_layers_is_the_min_max_contiguous_partition():
    assert split_layers([1.0] * 4, 2) == [[0, 1], [2, 3]]
    assert split_layers([1.0] * 4, 2, last_extra=2.0) == [[0, 1, 2], [3]]  # output layer weighs on the last
    rng = random.Random(0)
    for _ in range(30):
        n, s = rng.randint(2, 7), rng.randint(1, 4)
        if s > n:
            continue
        costs = [rng.random() for _ in range(n)]
        first, last = rng.random(), rng.random()

        best = min(
            _worst([list(range(a, b)) for a, b in zip((0, *cuts), (*cuts, n))], costs, first, last)
            for cuts in itertools.combinations(range(1, n), s - 1)
        )
        got = split_layers(costs, s, first, last)
        assert sorted(i for b in got for i in b) == list(range(n)) and all(got)
        assert _worst(got, costs, first, last) == pytest.approx(best)


def test_stage_placement():
    assert [stage_ids_for_rank(r, 2, "1f1b") for r in range(2)] == [[0], [1]]
    assert [stage_ids_for_rank(r, 2, "interleaved-1f1b") for r in range(2)] == [[0, 2], [1, 3]]
    assert [stage_ids_for_rank(r, 2, "zero-bubble") for r in range(2)] == [[0, 3], [1, 2]]


def test_memory_formula_single_device_matches_the_model():
    cfg = debug_model(2)
    model = build_model(cfg, "cpu", seed=0)
    assert {k: tuple(v.shape) for k, v in model.named_parameters()} == param_shapes(cfg)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    opt.step()
    got = measured_memory(model, opt)
    want = expected_memory(cfg, ParallelConfig(), {}, optimizer="adamw", seq_len=32)
    assert got == want


def test_memory_formula_knows_the_gelu_mlp():
    """A GELU MLP has no w3: the planner's parameter shapes and memory are the model's, and at the
    shape rule's widths (3/2 SwiGLU's d_ff) its parameter and gradient bytes are SwiGLU's (two fewer
    tensors: AdamW's per-tensor step counters differ)."""
    swiglu = debug_model(2)
    cfg = dataclasses.replace(swiglu, mlp="gelu", d_ff=3 * swiglu.d_ff // 2)
    model = build_model(cfg, "cpu", seed=0)
    assert {k: tuple(v.shape) for k, v in model.named_parameters()} == param_shapes(cfg)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    opt.step()
    got = measured_memory(model, opt)
    assert got == expected_memory(cfg, ParallelConfig(), {}, optimizer="adamw", seq_len=32)
    same = expected_memory(swiglu, ParallelConfig(), {}, optimizer="adamw", seq_len=32)
    assert (got.param_bytes, got.grad_bytes) == (same.param_bytes, same.grad_bytes)
    assert got.num_param_tensors == same.num_param_tensors - 2  # one w3 per block


def test_fsdp_chunks_cover_uneven_shapes_exactly():
    dims = ParallelDims(dp_shard=3, tp=2)
    total = sum(local_shape("layers.0.attention.wk.weight", (32, 64), dims, {"dp_shard": r})[0] for r in range(3))
    assert total == 16  # 32 rows / tp 2 = 16, chunked 6 + 6 + 4 over dp_shard 3
    assert local_shape("layers.0.attention.wo.weight", (64, 64), dims, {"dp_shard": 2}) == (20, 32)


def _cli(capsys, *args):
    code = main(["parity", "--layers", "2", "--steps", "2", *args])
    return code, capsys.readouterr()


def test_parity_cli_json_and_exit_codes(capsys):
    code, out = _cli(capsys, "--layouts", "single,single-accum2", "--json", "--optimizer", "adamw,sgd")
    assert code == 0, out.err
    report = json.loads(out.out)
    assert report["ok"] and [r["layout"] for r in report["layouts"]] == ["single", "single-accum2"] * 2
    accum = report["layouts"][1]
    assert 0 < accum["max_param_diff"] <= 1e-5  # a real (nonzero) floating-point floor, within tolerance
    code, out = _cli(capsys, "--layouts", "single-accum2", "--tolerance", "1e-12")
    assert code == 1 and "FAIL" in out.out


@pytest.mark.parametrize("layout", ["tp3", "pp8", "fsdp3", "tp2xq2"])
def test_parity_cli_bad_layouts_exit_2_before_spawning(capsys, monkeypatch, layout):
    from scalelab.parallel import parity as launch

    monkeypatch.setattr(launch, "spawn", lambda *a, **k: pytest.fail("spawned despite a bad layout"))
    code, out = _cli(capsys, "--layouts", f"single,{layout}")
    assert code == 2 and "error" in out.err and "Traceback" not in out.err


def test_torchrun_world_mismatch_exits_before_joining(monkeypatch):
    from scalelab.train import launch
    from scalelab.train.config import build_run_config

    cfg = build_run_config(
        {
            "model": {"preset": "debug"},
            "data": {"seq_len": 32},
            "train": {"num_tokens": 1024, "global_batch_tokens": 256},
            "parallel": {"dp_shard": 2},
        }
    )
    monkeypatch.setenv("WORLD_SIZE", "4")  # as torchrun --nproc_per_node 4 would set it
    monkeypatch.setattr(launch, "init_distributed", lambda *a, **k: pytest.fail("joined a group"))
    with pytest.raises(ConfigError, match="torchrun started 4"):
        launch.launch_local(cfg, "/nonexistent")
