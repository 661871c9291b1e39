"""sp | mup | completep (scalelab.models.parametrization): sp unchanged bit for bit, the multipliers,
init and AdamW groups of mup/completep, and their config errors.

The sp digests below are of a 3-layer qk-norm model (untied and tied) built with seed 3, after three
AdamW steps at a changing LR. Unpinned, they were recorded with the code before parametrizations
existed (commit 49373eb) and held on AVX-512 machines only; the sp path reproduced them there, and
the pinned digests were recorded from it.
"""

import hashlib
import math

import pytest
import torch
from pinned import run_pinned, skip_unless_recorded_here

from scalelab.errors import ConfigError
from scalelab.models import parametrization
from scalelab.models.config import ModelConfig
from scalelab.models.llama import build_model
from scalelab.models.loss import lm_loss
from scalelab.train.config import OptimConfig, build_run_config
from scalelab.train.identity import config_hash, identity_dict
from scalelab.train.optim import build_optimizer, set_lr
from scalelab.train.runtime import machine_type

pytestmark = pytest.mark.usefixtures("one_thread")

# sp digests under tests/pinned.py's numerics (unpinned, the digests held on one vector width only)
SP_DIGESTS = {  # by machine type: the pinned numerics still differ in the last bits between these two
    "torch": "2.13.0",
    "x86_64/AuthenticAMD/avx2": {False: "92aa244bd119b353", True: "a955f1032427042f"},
    "x86_64/GenuineIntel/avx512": {False: "c1a348174b2a6317", True: "65d5432df2859414"},
}


def _cfg(**kw) -> ModelConfig:
    fields = dict(
        vocab_size=256, num_layers=3, d_model=64, num_heads=4, num_kv_heads=2, d_ff=128, max_seq_len=32,
        kernels="torch", qk_norm=True,
    )  # fmt: skip
    return ModelConfig(**(fields | kw))


def _train_digest(cfg: ModelConfig) -> tuple[str, list]:
    model = build_model(cfg, seed=3)
    opt = build_optimizer(model, OptimConfig(lr=1e-2), "cpu")
    gen = torch.Generator().manual_seed(0)
    for i in range(3):
        set_lr(opt, 1e-2 * (i + 1) / 3)
        batch = torch.randint(0, 256, (4, 17), generator=gen)
        loss, _ = lm_loss(model, batch[:, :-1], batch[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
    h = hashlib.sha256()
    for k, v in model.state_dict().items():
        h.update(k.encode())
        h.update(v.detach().numpy().tobytes())
    groups = [(len(g["params"]), g["weight_decay"], g["lr"], "lr_scale" in g) for g in opt.param_groups]
    return h.hexdigest()[:16], groups


@pytest.mark.parametrize("tied", [False, True])
def test_sp_model_and_optimizer_are_bit_identical_to_before(tied):
    decay = 21 if tied else 22
    digest, groups = _train_digest(_cfg(tied_embeddings=tied))
    assert groups == [(decay, 0.1, 1e-2, False), (14, 0.0, 1e-2, False)]
    # sp with a base shape given computes the same (the base only matters to mup/completep)
    assert _train_digest(_cfg(tied_embeddings=tied, base_d_model=16, base_num_layers=1))[0] == digest
    machines = tuple(k for k in SP_DIGESTS if k != "torch")
    skip_unless_recorded_here(SP_DIGESTS["torch"], machines)
    code = "import test_parametrization as t\nfor base in ({}, dict(base_d_model=16, base_num_layers=1)):\n"
    code += f"    print(t._train_digest(t._cfg(tied_embeddings={tied}, **base))[0])"
    assert run_pinned(code).split() == [SP_DIGESTS[machine_type()][tied]] * 2


def test_sp_run_ids_unchanged_and_mup_ids_distinct():
    base = {"model": {"preset": "debug"}, "data": {"seq_len": 64}}
    sp = build_run_config(base)
    new = {"parametrization", "base_d_model", "base_num_layers", "base_head_dim", "base_d_ff", "mlp"}
    assert set(identity_dict(sp)["model"]) == set(ModelConfig.__dataclass_fields__) - new  # the old fields
    mup = build_run_config(base, ["model.parametrization=mup", "model.base_d_model=32"])
    mup2 = build_run_config(base, ["model.parametrization=mup", "model.base_d_model=16"])
    assert len({config_hash(sp), config_hash(mup), config_hash(mup2)}) == 3


def test_mup_multipliers_init_and_lr_groups():
    cfg = _cfg(d_model=128, num_heads=4, d_ff=256, parametrization="mup", base_d_model=32, base_head_dim=8)
    m = parametrization.multipliers(cfg)
    assert (m.width, m.output, m.residual) == (4.0, 0.25, 1.0)
    assert m.attention == pytest.approx(math.sqrt(8 / 32))  # logits sqrt(8)/32: 1/d_head, = sp at the base
    model = build_model(cfg, seed=0)
    assert model.output_mult == 0.25 and model.layers["0"].attention.q_mult == m.attention
    assert not model.output.weight.detach().any()  # zero readout
    std = {n: float(p.detach().std()) for n, p in model.named_parameters()}
    assert std["tok_embeddings.weight"] == pytest.approx(0.02, rel=0.05)  # input: width-independent
    assert std["layers.0.attention.wq.weight"] == pytest.approx(0.02 / 2, rel=0.05)  # / sqrt(4)
    assert std["layers.1.feed_forward.w2.weight"] == pytest.approx(0.02 / 2 / math.sqrt(6), rel=0.05)
    opt = build_optimizer(model, OptimConfig(lr=1e-2), "cpu")
    set_lr(opt, 4e-3)
    lr_of = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        hidden = p.ndim == 2 and name.startswith("layers.")
        assert lr_of[id(p)] == pytest.approx(1e-3 if hidden else 4e-3), name


def test_mup_w2_scales_with_its_own_fan_in_when_d_ff_is_not_in_proportion():
    """A shape rule's d_ff need not grow with d_model (32 -> 128 wide: d_ff 96 -> 352, x3.67 not x4):
    w2's init and LR follow its fan-in d_ff / base_d_ff; 0 keeps d_ff in proportion (x4)."""
    cfg = _cfg(d_model=128, d_ff=352, parametrization="mup", base_d_model=32, base_head_dim=8, base_d_ff=96)
    assert parametrization.lr_scale(cfg, "layers.0.feed_forward.w2.weight", 2) == pytest.approx(96 / 352)
    assert parametrization.lr_scale(cfg, "layers.0.feed_forward.w1.weight", 2) == pytest.approx(1 / 4)
    w2_std = 0.02 * math.sqrt(96 / 352) / math.sqrt(2 * 3)
    assert parametrization.init_std(cfg, "layers.0.feed_forward.w2") == pytest.approx(w2_std)
    model = build_model(cfg, seed=0)
    opt = build_optimizer(model, OptimConfig(lr=1e-2, weight_decay=0.1), "cpu")
    w2 = model.layers["1"].feed_forward.w2.weight
    group = next(g for g in opt.param_groups if any(p is w2 for p in g["params"]))
    assert group["lr"] == pytest.approx(1e-2 * 96 / 352) and group["weight_decay"] == pytest.approx(0.1 * 352 / 96)
    in_proportion = _cfg(d_model=128, d_ff=352, parametrization="mup", base_d_model=32, base_head_dim=8)
    assert parametrization.lr_scale(in_proportion, "layers.0.feed_forward.w2.weight", 2) == pytest.approx(1 / 4)
    # base_d_ff left at 0 keeps the run ids mup runs had before the field existed
    base = {"model": {"preset": "debug", "parametrization": "mup", "base_d_model": 32}, "data": {"seq_len": 64}}
    assert "base_d_ff" not in identity_dict(build_run_config(base))["model"]
    assert identity_dict(build_run_config(base, ["model.base_d_ff=96"]))["model"]["base_d_ff"] == 96


def test_completep_depth_multiplier_and_base_equals_sp():
    cfg = _cfg(num_layers=4, parametrization="completep", base_d_model=64, base_num_layers=2)
    m = parametrization.multipliers(cfg)
    assert (m.width, m.depth, m.residual, m.output) == (1.0, 2.0, 0.5, 1.0)
    # at alpha = 1 the hidden AdamW LR has no depth factor; the branch init keeps the base depth's
    assert parametrization.lr_scale(cfg, "layers.3.attention.wq.weight", 2) == 1.0
    assert parametrization.init_std(cfg, "layers.3.attention.wo") == pytest.approx(0.02 / math.sqrt(4))
    # at its base shape a mup/completep model is the sp model except for the zero readout
    for kind in ("mup", "completep"):
        at_base = build_model(_cfg(parametrization=kind), seed=1).state_dict()
        sp = build_model(_cfg(), seed=1).state_dict()
        for k in sp:
            if k != "output.weight":
                assert torch.equal(sp[k], at_base[k]), (kind, k)


@pytest.mark.parametrize(
    ("fields", "key"),
    [
        ({"parametrization": "mupp"}, "model.parametrization"),
        ({"parametrization": "mup", "base_d_model": -1}, "model.base_d_model"),
        ({"parametrization": "mup", "tied_embeddings": True}, "model.tied_embeddings"),
        ({"parametrization": "completep", "family": "moe"}, "model.parametrization"),
    ],
)
def test_bad_parametrization_names_the_key(fields, key):
    with pytest.raises(ConfigError) as e:
        _cfg(**fields).validate()
    assert e.value.key == key


def test_completep_run_resumes_bit_exactly(tmp_path):
    """The groups' LR factors live in the optimizer state: a resumed run keeps them (same losses)."""
    import polars as pl

    from scalelab.train.loop import train_run

    model = dict(preset="debug", parametrization="completep", base_d_model=32, base_num_layers=1, base_head_dim=8)
    cfg = build_run_config(
        dict(
            model=model | {"kernels": "torch"},
            data=dict(seq_len=32, val_sequences=8),
            train=dict(num_tokens=128 * 30, global_batch_tokens=128),
            checkpoint=dict(interval_steps=10),
            eval=dict(interval_steps=0),
            logging=dict(wandb="disabled", progress="off"),
        )
    )
    train_run(cfg, tmp_path / "a")
    train_run(cfg, tmp_path / "b", stop_after_steps=15)
    train_run(cfg, tmp_path / "b", resume=True)
    a, b = (pl.read_parquet(tmp_path / r / "metrics.parquet") for r in ("a", "b"))
    assert a["loss"].to_list() == b["loss"].to_list() and len(a) == 30


def _mup_groups(d_model: int, **kw):
    cfg = _cfg(d_model=d_model, d_ff=2 * d_model, parametrization="mup", base_d_model=32, base_head_dim=8, **kw)
    model = build_model(cfg, seed=0)
    return model, build_optimizer(model, OptimConfig(lr=1e-2, weight_decay=0.1, eps=1e-8), "cpu")


def test_mup_eps_follows_the_gradient_and_decay_per_step_is_width_independent():
    """ε x 1/m (every gradient shrinks as 1/m); a decayed group's lr x wd equals the base's."""
    model, opt = _mup_groups(128)  # width multiplier 4
    group_of = {id(p): g for g in opt.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        g = group_of[id(p)]
        assert g["eps"] == pytest.approx(1e-8 / 4), name
        hidden = p.ndim == 2 and name.startswith("layers.")
        decayed = p.ndim == 2 and name != "tok_embeddings.weight"
        assert g["weight_decay"] == pytest.approx(0.4 if hidden else 0.1 if decayed else 0.0), name
    # one step with zero gradients only decays: a hidden weight shrinks by 1 - lr x wd at every width
    for d_model in (32, 128):
        model, opt = _mup_groups(d_model)
        w = model.layers["0"].feed_forward.w1.weight
        before = w.detach().clone()
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        torch.testing.assert_close(w.detach(), before * (1 - 1e-2 * 0.1), rtol=1e-6, atol=0)


def test_completep_eps_inside_blocks_has_the_branch_factor():
    cfg = _cfg(num_layers=4, d_model=128, d_ff=256, parametrization="completep", base_d_model=32, base_num_layers=2)
    assert parametrization.eps_scale(cfg, "layers.3.attention.wq.weight") == pytest.approx(1 / 8)  # 1/m x 1/r
    assert parametrization.eps_scale(cfg, "layers.0.ffn_norm.weight") == pytest.approx(1 / 8)
    assert parametrization.eps_scale(cfg, "tok_embeddings.weight") == pytest.approx(1 / 4)
    assert parametrization.eps_scale(cfg, "output.weight") == pytest.approx(1 / 4)
    assert parametrization.eps_scale(_cfg(), "layers.0.attention.wq.weight") == 1.0  # sp
