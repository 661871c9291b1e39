"""Tests for scalelab.models: config validation, presets, shape rule, accounting, init, forward/backward.

Everything runs on CPU with the debug-size models (a few seconds in total); big presets are only
built on the meta device.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from scalelab.errors import ConfigError
from scalelab.kernels.reference import rope_cos_sin
from scalelab.models.accounting import (
    flops_per_token,
    model_summary,
    num_params,
    num_params_nonembedding,
)
from scalelab.models.config import ModelConfig
from scalelab.models.hf_llama import to_hf_config
from scalelab.models.llama import Transformer, build_model
from scalelab.models.loss import lm_loss
from scalelab.models.presets import get_preset, list_presets
from scalelab.models.shapes import SHAPE_TOLERANCE, preferred_width, shape_for_params
from scalelab.parallel.backend import spawn
from scalelab.train.config import build_run_config
from scalelab.train.identity import config_hash

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one intra-op thread per module


def small_cfg(**kw) -> ModelConfig:
    fields = dict(
        vocab_size=96,
        num_layers=2,
        d_model=32,
        num_heads=4,
        num_kv_heads=2,
        d_ff=64,
        max_seq_len=32,
        kernels="torch",
    )
    fields.update(kw)
    return ModelConfig(**fields)


# --- config ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, key",
    [
        (dict(num_heads=5), "model.num_heads"),  # 32 % 5
        (dict(num_kv_heads=3), "model.num_kv_heads"),  # 4 % 3
        (dict(d_model=36, num_heads=4), "model.num_heads"),  # head_dim 9 is odd
        (dict(num_layers=0), "model.num_layers"),
        (dict(d_ff=-1), "model.d_ff"),
        (dict(vocab_size=2.5), "model.vocab_size"),
        (dict(norm_eps=0.0), "model.norm_eps"),
        (dict(kernels="cuda"), "model.kernels"),
        (dict(family="gpt"), "model.family"),
    ],
)
def test_validate_names_the_key(change, key):
    cfg = small_cfg(**change)
    with pytest.raises(ConfigError) as err:
        cfg.validate()
    assert str(err.value).startswith(key + ":")
    with pytest.raises(ConfigError, match=key.replace("model.", "train.model.")):
        cfg.validate(prefix="train.model")
    with pytest.raises(ConfigError):
        Transformer(cfg)


def test_head_dim_and_valid_config():
    cfg = small_cfg()
    cfg.validate()
    assert cfg.head_dim == 8


# --- presets --------------------------------------------------------------------------------------


def test_presets_validate_and_match_published_counts():
    names = list_presets()
    assert names[0] == "debug" and {"tiny-1m", "tiny-3m", "small-10m", "8b", "70b"} <= set(names)
    for name in names:
        get_preset(name).validate()
    # Published totals: Llama-3-8B 8.03e9, Llama-3-70B 70.55e9, Llama-3.2-1B 1.236e9 / 3B 3.21e9.
    assert num_params(get_preset("8b")) == 8_030_261_248
    assert num_params(get_preset("70b")) == 70_553_706_496
    assert num_params(get_preset("1b")) == 1_235_814_400
    assert num_params(get_preset("3b")) == 3_212_749_824
    counts = [num_params(get_preset(n)) for n in names]
    assert counts == sorted(counts)
    assert num_params(get_preset("debug")) < 2e5 and 0.8e6 < num_params(get_preset("tiny-1m")) < 1.2e6
    assert 8e6 < num_params(get_preset("small-10m")) < 12e6


def test_get_preset_overrides_and_unknown():
    cfg = get_preset("8b", vocab_size=32000, max_seq_len=4096)
    assert (cfg.vocab_size, cfg.max_seq_len, cfg.d_model) == (32000, 4096, 4096)
    assert get_preset("8b").vocab_size == 128256  # the table itself is unchanged
    with pytest.raises(ConfigError, match="model.preset.*debug.*70b"):
        get_preset("13b")
    with pytest.raises(ConfigError, match="model.widht"):
        get_preset("debug", widht=3)


# --- shape rule -----------------------------------------------------------------------------------


def _targets(lo: float, hi: float, per_decade: int = 6) -> list[float]:
    n = int(round(per_decade * math.log10(hi / lo)))
    return [lo * 10 ** (i / per_decade) for i in range(n + 1)]


@pytest.mark.parametrize(
    "vocab, lo, hi",
    [(256, 1e5, 1e7), (320, 1e5, 1e8), (32000, 1e7, 1e9), (50304, 3e7, 1e10), (128256, 3e8, 7e10)],
)
def test_shape_rule_hits_target(vocab, lo, hi):
    for target in _targets(lo, hi):
        cfg = shape_for_params(target, vocab)
        cfg.validate()
        n = num_params(cfg)
        assert abs(n / target - 1) <= SHAPE_TOLERANCE, (target, n, cfg)
        if target >= 1e8:
            assert abs(n / target - 1) <= 0.055, (target, n, cfg)
        aspect = cfg.d_model / preferred_width(cfg.num_layers)
        assert 0.5 <= aspect <= 2.0
        d = cfg.d_model
        assert cfg.head_dim == (16 if d < 128 else 32 if d < 256 else 64 if d < 2048 else 128)
        assert cfg.num_kv_heads == (cfg.num_heads if cfg.d_model < 2048 else math.gcd(cfg.num_heads, 8))
        assert cfg.num_kv_heads >= (4 if cfg.d_model >= 2048 else 1)
        assert 8 / 3 * cfg.d_model <= cfg.d_ff < 8 / 3 * cfg.d_model + 256


def test_shape_rule_options_and_errors():
    cfg = shape_for_params(5e7, 32000, count="nonembedding", tied_embeddings=True, max_seq_len=512)
    assert abs(num_params_nonembedding(cfg) / 5e7 - 1) < 0.055
    assert cfg.tied_embeddings and cfg.max_seq_len == 512
    big = shape_for_params(8e9, 128256)
    assert big.d_model >= 2048 and big.num_kv_heads == 8
    with pytest.raises(ConfigError, match="model.target_params"):
        shape_for_params(1e5, 128256)  # the embedding alone is bigger
    with pytest.raises(ConfigError, match="model.target_params"):
        shape_for_params(-1, 320)
    with pytest.raises(ConfigError, match="model.count"):
        shape_for_params(1e6, 320, count="all")


# --- accounting -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cfg",
    [small_cfg(), small_cfg(tied_embeddings=True), small_cfg(qk_norm=True, num_kv_heads=1)]
    + [get_preset(n) for n in ("tiny-3m", "125m", "8b", "70b")],
    ids=["small", "tied", "qknorm-mqa", "tiny-3m", "125m", "8b", "70b"],
)
def test_num_params_equals_module_count(cfg):
    with torch.device("meta"):  # no memory: 70b is counted without allocating it
        model = Transformer(cfg)
    assert num_params(cfg) == sum(p.numel() for p in model.parameters())
    emb = cfg.vocab_size * cfg.d_model
    assert num_params_nonembedding(cfg) == num_params(cfg) - emb
    if not cfg.tied_embeddings:  # the untied output layer stays in N_nonembed
        rest = sum(p.numel() for n, p in model.named_parameters() if n != "tok_embeddings.weight")
        assert num_params_nonembedding(cfg) == rest


@pytest.mark.parametrize("tied", [False, True])
def test_exact_flops_match_flop_counter(tied):
    cfg = small_cfg(tied_embeddings=True) if tied else small_cfg(qk_norm=True)
    model = build_model(cfg, seed=0)
    bsz, seq_len = 3, 24
    tokens = torch.randint(0, cfg.vocab_size, (bsz, seq_len))
    expected = flops_per_token(cfg, seq_len)

    def count(backend) -> int:
        with sdpa_kernel(backend), FlopCounterMode(display=False) as counter:
            logits = model(tokens)
            F.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
        return counter.get_total_flops()

    # The math SDPA backend runs q k^T and p v as matmuls, which FlopCounterMode sees: the full
    # T x T convention, x3 for forward + backward, output layer included -> exact equality.
    assert count(SDPBackend.MATH) == expected.exact * bsz * seq_len
    # CPU's fused SDPA kernel has no flop formula: only the matmul part is counted.
    assert count(SDPBackend.FLASH_ATTENTION) == expected.matmul * bsz * seq_len
    assert expected.exact_causal == expected.matmul + expected.attention / 2
    assert expected.six_n == 6 * num_params(cfg)


def test_flops_8b_known_values():
    f = flops_per_token(get_preset("8b"), 8192)
    # Matmul weights = N minus the embedding table (a lookup, no matmul) minus the RMSNorm gains.
    cfg = get_preset("8b")
    matmul_weights = num_params(cfg) - cfg.vocab_size * cfg.d_model - (2 * cfg.num_layers + 1) * cfg.d_model
    assert f.matmul == 6 * matmul_weights
    assert f.attention == 3 * 4 * 8192 * 4096 * 32
    row = model_summary(cfg)
    assert row["num_params"] == 8_030_261_248 and row["flops_per_token_exact"] == f.exact


# --- model: build, init, forward, backward --------------------------------------------------------


def test_build_init_statistics():
    cfg = small_cfg(num_layers=8, d_model=128, num_heads=4, num_kv_heads=4, d_ff=512, vocab_size=512)
    model = build_model(cfg, seed=0)
    out_std = cfg.init_std / math.sqrt(2 * cfg.num_layers)
    sd = model.state_dict()
    for name, p in sd.items():
        if name.endswith("norm.weight"):
            assert torch.all(p == 1), name
        elif name.endswith(("wo.weight", "w2.weight")):
            assert abs(p.std().item() / out_std - 1) < 0.05, name
        else:
            assert abs(p.std().item() / cfg.init_std - 1) < 0.05, name
            assert abs(p.mean().item()) < 3 * cfg.init_std / math.sqrt(p.numel())
    torch.testing.assert_close(model.rope_cos, rope_cos_sin(cfg.max_seq_len, cfg.head_dim)[0], rtol=0, atol=0)


def test_seeded_init_is_deterministic_and_per_parameter():
    cfg = small_cfg(num_layers=3)
    a, b, c = build_model(cfg, seed=7), build_model(cfg, seed=7), build_model(cfg, seed=8)
    for (name, pa), pb, pc in zip(a.state_dict().items(), b.state_dict().values(), c.state_dict().values()):
        assert torch.equal(pa, pb), name
        if not name.endswith("norm.weight"):
            assert not torch.equal(pa, pc), name
    # Parameters do not share draws (each has its own generator).
    assert not torch.equal(a.layers["0"].attention.wk.weight, a.layers["0"].attention.wv.weight)
    assert not torch.equal(a.layers["0"].attention.wq.weight, a.layers["1"].attention.wq.weight)
    # A pipeline stage holding only layer 2 gets the weights layer 2 has in the full model.
    with torch.device("meta"):
        stage = Transformer(cfg)
    del stage.layers["0"], stage.layers["1"]
    stage.tok_embeddings = None
    stage.to_empty(device="cpu")
    stage.init_weights(seed=7)
    for name, p in stage.layers["2"].state_dict().items():
        assert torch.equal(p, a.layers["2"].state_dict()[name]), name
    # With tied embeddings, a last stage (output without tok_embeddings) draws the embedding's values.
    tied = small_cfg(tied_embeddings=True)
    with torch.device("meta"):
        last = Transformer(tied)
    last.tok_embeddings = None
    last.to_empty(device="cpu")
    last.init_weights(seed=7)
    assert torch.equal(last.output.weight, build_model(tied, seed=7).tok_embeddings.weight)
    # seed=None follows the global RNG.
    torch.manual_seed(0)
    d = build_model(cfg)
    torch.manual_seed(0)
    e = build_model(cfg)
    assert all(torch.equal(x, y) for x, y in zip(d.state_dict().values(), e.state_dict().values()))


def test_forward_backward_and_overfit_debug_preset():
    cfg = get_preset("debug", kernels="torch")
    model = build_model(cfg, seed=0)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (4, 33), generator=gen)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    logits = model(inputs)
    assert logits.shape == (4, 32, cfg.vocab_size)
    torch.testing.assert_close(model.hidden_states(inputs) @ model.output.weight.t(), logits)
    loss, metrics = lm_loss(model, inputs, targets)
    assert abs(loss.item() - math.log(cfg.vocab_size)) < 0.1  # near-uniform predictions at init
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    first = loss.item()
    for _ in range(20):
        opt.zero_grad()
        loss, _ = lm_loss(model, inputs, targets)
        loss.backward()
        opt.step()
    assert loss.item() < 0.5 * first


def test_lm_loss_ce_z_loss_and_ignore_index():
    cfg = small_cfg()
    model = build_model(cfg, seed=1)
    tokens = torch.randint(0, cfg.vocab_size, (2, 16))
    targets = torch.randint(0, cfg.vocab_size, (2, 16))
    targets[0, :5] = -100
    logits = model(tokens).flatten(0, 1)
    ce = F.cross_entropy(logits, targets.flatten(), ignore_index=-100)
    valid = targets.flatten() != -100
    z = (torch.logsumexp(logits, -1)[valid] ** 2).mean()
    loss, metrics = lm_loss(model, tokens, targets, z_loss=1e-2)
    torch.testing.assert_close(metrics["ce"], ce.detach())
    torch.testing.assert_close(metrics["z_loss"], 1e-2 * z.detach())
    torch.testing.assert_close(loss, ce + 1e-2 * z)
    assert metrics["num_target_tokens"].item() == 27 and not metrics["ce"].requires_grad
    loss0, metrics0 = lm_loss(model, tokens, targets)
    torch.testing.assert_close(loss0, ce)
    assert metrics0["z_loss"].item() == 0.0


def test_pipeline_stages_compose_to_full_model():
    cfg = small_cfg(num_layers=4)
    model = build_model(cfg, seed=2)
    first, last = copy.deepcopy(model), copy.deepcopy(model)
    for i in ("2", "3"):
        del first.layers[i]
    first.norm = first.output = None
    for i in ("0", "1"):
        del last.layers[i]
    last.tok_embeddings = None
    tokens = torch.randint(0, cfg.vocab_size, (2, 12))
    hidden = first(tokens)
    assert hidden.shape == (2, 12, cfg.d_model)
    torch.testing.assert_close(last(hidden), model(tokens), rtol=0, atol=0)


def test_positions_select_rope_rows():
    cfg = small_cfg()
    model = build_model(cfg, seed=3)
    tokens = torch.randint(0, cfg.vocab_size, (2, 10))
    ref = model(tokens)
    torch.testing.assert_close(model(tokens, positions=torch.arange(10)), ref, rtol=0, atol=0)
    # RoPE is relative: shifting every position by the same offset leaves attention unchanged ...
    torch.testing.assert_close(model(tokens, positions=torch.arange(10) + 7), ref, atol=2e-5, rtol=1e-4)
    # ... while a permutation of positions does not.
    assert not torch.allclose(model(tokens, positions=torch.arange(10).flip(0)), ref, atol=1e-3)
    with pytest.raises(ValueError, match="max_seq_len"):
        model(torch.zeros(1, cfg.max_seq_len + 1, dtype=torch.long))


def test_attention_heads_follow_weight_shapes_for_tensor_parallel():
    """Column-sharding wq/wk/wv by heads and row-sharding wo: the partial outputs sum to the full one."""
    cfg = small_cfg(num_heads=4, num_kv_heads=2)
    model = build_model(cfg, seed=4)
    attn = model.layers["0"].attention
    x = torch.randn(2, 9, cfg.d_model)
    cos, sin = model.rope_cos[:9], model.rope_sin[:9]
    full = attn(x, cos, sin)
    dh = cfg.head_dim
    total = torch.zeros_like(full)
    for rank in range(2):  # TP degree 2: 2 query heads and 1 kv head per rank
        shard = copy.deepcopy(attn)
        q_rows = slice(rank * 2 * dh, (rank + 1) * 2 * dh)
        kv_rows = slice(rank * dh, (rank + 1) * dh)
        with torch.no_grad():
            shard.wq.weight = torch.nn.Parameter(attn.wq.weight[q_rows].clone())
            shard.wk.weight = torch.nn.Parameter(attn.wk.weight[kv_rows].clone())
            shard.wv.weight = torch.nn.Parameter(attn.wv.weight[kv_rows].clone())
            shard.wo.weight = torch.nn.Parameter(attn.wo.weight[:, q_rows].clone())
        total = total + shard(x, cos, sin)
    torch.testing.assert_close(total, full, atol=1e-6, rtol=1e-5)


def test_materialisation_recomputes_rope_and_reties():
    cfg = small_cfg(tied_embeddings=True)
    ref = build_model(cfg, seed=5)
    assert ref.output.weight is ref.tok_embeddings.weight
    with torch.device("meta"):
        model = Transformer(cfg)
    model.to_empty(device="cpu")  # no init_weights: load a checkpoint instead
    model.tie_weights()
    model.load_state_dict(ref.state_dict())
    tokens = torch.randint(0, cfg.vocab_size, (2, 8))
    torch.testing.assert_close(model(tokens), ref(tokens), rtol=0, atol=0)
    half = copy.deepcopy(ref).to(torch.bfloat16)
    assert half.rope_cos.dtype == torch.float32  # RoPE tables stay fp32 when the weights are cast
    assert half.layers["0"].attention.wq.weight.dtype == torch.bfloat16
    assert half(tokens).dtype == torch.bfloat16
    assert "rope_cos" not in ref.state_dict()


def test_kernel_backend_resolution():
    model = build_model(small_cfg(kernels="auto"), seed=0)
    model(torch.zeros(1, 4, dtype=torch.long))
    assert model.ops.name == "torch"  # auto picks the references on CPU
    assert model.layers["1"].feed_forward.ops is model.ops and model.norm.ops is model.ops


def test_models_cli_lists_presets(capsys):
    import argparse

    from scalelab.cli import models_cmd

    parser = argparse.ArgumentParser()
    models_cmd.add_parser(parser.add_subparsers())  # only this command: others may be mid-change

    def run(*argv: str) -> int:
        args = parser.parse_args(["models", *argv])
        return args.func(args)

    assert run() == 0
    out = capsys.readouterr().out
    assert all(name in out for name in list_presets()) and "8.03B" in out
    assert run("--target-params", "1e6", "--json") == 0
    assert '"num_params"' in capsys.readouterr().out
    with pytest.raises(ConfigError, match="unknown preset"):  # main() prints it as one line, exit 2
        run("13b")


def test_triton_kernels_match_torch_in_the_model():
    """The model with kernels='triton' (the interpreter on CPU, see conftest) equals kernels='torch'."""
    from scalelab.kernels import triton_available

    if not triton_available():
        pytest.skip("Triton missing, or no CUDA and TRITON_INTERPRET unset")
    cfg = get_preset("debug", kernels="torch", qk_norm=True)
    ref = build_model(cfg, seed=0)
    tri = build_model(get_preset("debug", kernels="triton", qk_norm=True), seed=0)
    tokens = torch.randint(0, cfg.vocab_size, (2, 17), generator=torch.Generator().manual_seed(0))
    losses = []
    for model in (ref, tri):
        loss, _ = lm_loss(model, tokens[:, :-1], tokens[:, 1:], z_loss=1e-3)
        loss.backward()
        losses.append(loss)
    assert tri.ops.name == "triton" and tri.layers["0"].attention.ops.name == "triton"
    torch.testing.assert_close(losses[1], losses[0], atol=1e-5, rtol=1e-5)
    for (name, a), b in zip(ref.named_parameters(), tri.parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-4, msg=name)


def _fsdp_init_worker() -> None:
    """One rank of a world-2 gloo group (scalelab.parallel.backend.spawn set it up)."""
    cfg = small_cfg(vocab_size=97, d_ff=72)  # odd row counts: uneven shards
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    with torch.device("meta"):
        model = Transformer(cfg)
    for layer in model.layers.values():
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    model.init_weights(seed=11)
    ref_model = build_model(cfg, seed=11)
    ref = ref_model.state_dict()
    for name, p in model.named_parameters():
        assert torch.equal(p.full_tensor(), ref[name]), name
    assert torch.equal(model.rope_cos, rope_cos_sin(cfg.max_seq_len, cfg.head_dim)[0])  # recomputed
    # lm_loss goes through model(...) (hidden_states), so FSDP2's all-gather hooks run; the same
    # batch on both ranks makes the averaged gradient equal the single-device one.
    tokens = torch.randint(0, cfg.vocab_size, (2, 13), generator=torch.Generator().manual_seed(0))
    ref_loss, _ = lm_loss(ref_model, tokens[:, :-1], tokens[:, 1:], z_loss=1e-3)
    ref_loss.backward()
    loss, _ = lm_loss(model, tokens[:, :-1], tokens[:, 1:], z_loss=1e-3)
    loss.backward()
    torch.testing.assert_close(loss, ref_loss, atol=1e-6, rtol=1e-6)
    ref_grads = dict(ref_model.named_parameters())
    for name, p in model.named_parameters():
        grad = p.grad.full_tensor()
        torch.testing.assert_close(grad, ref_grads[name].grad, atol=1e-6, rtol=1e-5, msg=name)


def test_seeded_init_of_fsdp_sharded_model_matches_single_device():
    """init_weights(seed) on DTensor (FSDP2) parameters gives the single-device weights, shard by shard;
    lm_loss through the sharded model gives the single-device loss and gradients."""
    spawn(_fsdp_init_worker, 2, backend="gloo")  # ranks forked from a server that imported torch once


def test_init_under_activation_checkpointing_wrappers_matches_plain_init():
    """A model wrapped before init (the meta-device path of parallel layouts) gets the single-device
    weights: the checkpoint wrapper's `_checkpoint_wrapped_module` is not part of the seed name."""
    from scalelab.models.llama import build_model
    from scalelab.parallel.activation_checkpointing import apply_ac

    cfg = get_preset("moe-debug", kernels="torch")
    plain = build_model(cfg, seed=3)
    for mode in ("full", "selective"):
        wrapped = build_model(cfg, device="meta")
        apply_ac(wrapped, mode)
        wrapped.to_empty(device="cpu")
        wrapped.init_weights(3)
        got = {n.replace("._checkpoint_wrapped_module", ""): p for n, p in wrapped.named_parameters()}
        assert got.keys() == dict(plain.named_parameters()).keys()
        for n, p in plain.named_parameters():
            assert torch.equal(p, got[n]), (mode, n)


# --- the GELU feed-forward (an architecture study's arm) ---------------------------------------------


def test_gelu_mlp_has_swiglus_parameters_shapes_and_flops():
    kw = dict(min_layers=2, width_per_layer=16, min_width=16, max_seq_len=128)
    for target in (3e4, 1e5, 4e5):
        swiglu = shape_for_params(target, 256, **kw)
        gelu = shape_for_params(target, 256, mlp="gelu", **kw)
        # the same (L, d), N and FLOPs: only the feed-forward's form differs
        assert (gelu.num_layers, gelu.d_model) == (swiglu.num_layers, swiglu.d_model)
        assert gelu.d_ff == 3 * swiglu.d_ff // 2
        assert num_params(gelu) == num_params(swiglu)
        assert flops_per_token(gelu, 64).exact == flops_per_token(swiglu, 64).exact
    cfg = small_cfg(mlp="gelu", d_ff=192)
    model = build_model(cfg, seed=0)
    assert num_params(cfg) == sum(p.numel() for p in model.parameters())
    ffn = model.layers["0"].feed_forward
    assert ffn.w3 is None
    x = torch.randn(2, 5, cfg.d_model)
    torch.testing.assert_close(ffn(x), ffn.w2(F.gelu(ffn.w1(x))))
    tokens = torch.randint(0, cfg.vocab_size, (2, 16))
    loss, _ = lm_loss(model, tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_mlp_is_validated_and_left_out_of_old_run_ids():
    with pytest.raises(ConfigError, match="model.mlp"):
        small_cfg(mlp="relu").validate()
    with pytest.raises(ConfigError, match="model.mlp"):
        small_cfg(family="moe", mlp="gelu").validate()
    tree = {"model": {"preset": "debug"}, "data": {"seq_len": 64}, "train": {"num_tokens": 16384}}
    plain = config_hash(build_run_config(tree))
    explicit = config_hash(build_run_config({**tree, "model": {"preset": "debug", "mlp": "swiglu"}}))
    gelu = config_hash(build_run_config({**tree, "model": {"preset": "debug", "mlp": "gelu"}}))
    assert plain == explicit != gelu
    assert plain == "7ba8340073e7"  # its id before the field existed: recorded runs keep their ids
    lib = {**tree, "data": {"seq_len": 64, "sources": [{"name": "stdlib", "train_exclude": ["*/test/*"]}]}}
    assert config_hash(build_run_config(lib)) != plain  # a train filter is a different run


def test_hf_export_refuses_a_gelu_mlp():
    with pytest.raises(ConfigError, match="model.mlp"):
        to_hf_config(small_cfg(mlp="gelu"))
