"""Parity of scalelab's Transformer with Hugging Face LlamaForCausalLM (fp32, eager attention).

Weights are converted both ways with scalelab.models.hf_llama; logits must match to 1e-5. No
download: the HF model is built from a LlamaConfig with random weights.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from scalelab.models.accounting import num_params  # noqa: E402
from scalelab.models.config import ModelConfig  # noqa: E402
from scalelab.models.hf_llama import from_hf_state_dict, to_hf_config, to_hf_model, to_hf_state_dict  # noqa: E402
from scalelab.models.llama import Transformer, build_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one intra-op thread per module


def _cfg(tied: bool, rope_theta: float = 10000.0) -> ModelConfig:
    return ModelConfig(
        vocab_size=300,
        num_layers=2,
        d_model=64,
        num_heads=4,
        num_kv_heads=2,
        d_ff=160,
        max_seq_len=64,
        rope_theta=rope_theta,
        norm_eps=1e-5,
        tied_embeddings=tied,
        kernels="torch",
    )


def _hf_model(cfg: ModelConfig, seed: int):
    torch.manual_seed(seed)
    hf_cfg = transformers.LlamaConfig(**to_hf_config(cfg), attn_implementation="eager")
    model = transformers.LlamaForCausalLM(hf_cfg).eval()
    # HF inits norm weights to 1; randomise them so a swapped norm mapping cannot pass.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("tied", [False, True])
def test_hf_to_scalelab_logits_match(tied):
    cfg = _cfg(tied, rope_theta=500000.0 if tied else 10000.0)
    hf = _hf_model(cfg, seed=0)
    ours = Transformer(cfg).eval()
    ours.load_state_dict(from_hf_state_dict(hf.state_dict(), cfg), strict=True)
    assert (ours.output.weight is ours.tok_embeddings.weight) == tied
    tokens = torch.randint(0, cfg.vocab_size, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(input_ids=tokens).logits
        got = ours(tokens)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert hf.num_parameters() == num_params(cfg) == sum(p.numel() for p in ours.parameters())


@pytest.mark.parametrize("tied", [False, True])
def test_scalelab_to_hf_logits_match(tied):
    cfg = _cfg(tied)
    ours = build_model(cfg, "cpu", seed=3).eval()
    with torch.no_grad():  # non-unit norm gains, as in the other direction
        for name, p in ours.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    hf = to_hf_model(ours, cfg)
    hf_sd = hf.state_dict()
    for ours_key, tensor in ours.state_dict().items():  # every tensor arrived under some HF name
        assert any(torch.equal(tensor, v) for v in hf_sd.values()), ours_key
    tokens = torch.randint(0, cfg.vocab_size, (3, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens), hf(input_ids=tokens).logits, atol=1e-5, rtol=1e-5)
    assert hf.num_parameters() == num_params(cfg)
    # Round trip: back from HF gives the same state dict.
    back = from_hf_state_dict(to_hf_state_dict(ours.state_dict(), cfg), cfg)
    assert back.keys() == ours.state_dict().keys()
    for k, v in ours.state_dict().items():
        assert torch.equal(back[k], v), k


def test_qk_norm_refused():
    from scalelab.errors import ConfigError

    cfg = _cfg(False)
    cfg.qk_norm = True
    with pytest.raises(ConfigError, match="model.qk_norm"):
        to_hf_config(cfg)
