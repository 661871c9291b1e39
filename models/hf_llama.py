"""Convert between scalelab's Transformer and Hugging Face `LlamaForCausalLM` (weights and config).

    hf_cfg = transformers.LlamaConfig(**to_hf_config(cfg))
    hf_model.load_state_dict(to_hf_state_dict(model.state_dict(), cfg))
    model.load_state_dict(from_hf_state_dict(hf_model.state_dict(), cfg))

Weights map one to one, without the q/k row permutation older Meta->HF converters apply: HF's Llama
and `scalelab.kernels.reference.apply_rope` both rotate the half-split pairs (i, i + head_dim/2).
transformers is imported only inside `to_hf_model`, never at module import.
qk_norm has no Llama counterpart (it is Qwen-3's layout) and is refused.
"""

from __future__ import annotations

from typing import Any

import torch

from scalelab.errors import ConfigError
from scalelab.models.config import ModelConfig

# (scalelab name inside layers.{i}., HF name inside model.layers.{i}.)
_LAYER_KEYS = (
    ("attention_norm.weight", "input_layernorm.weight"),
    ("attention.wq.weight", "self_attn.q_proj.weight"),
    ("attention.wk.weight", "self_attn.k_proj.weight"),
    ("attention.wv.weight", "self_attn.v_proj.weight"),
    ("attention.wo.weight", "self_attn.o_proj.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
    ("feed_forward.w1.weight", "mlp.gate_proj.weight"),
    ("feed_forward.w3.weight", "mlp.up_proj.weight"),
    ("feed_forward.w2.weight", "mlp.down_proj.weight"),
)


def hf_key_map(cfg: ModelConfig) -> list[tuple[str, str]]:
    """(scalelab key, HF key) for every tensor, the output/lm_head pair included."""
    pairs = [("tok_embeddings.weight", "model.embed_tokens.weight")]
    for i in range(cfg.num_layers):
        pairs += [(f"layers.{i}.{ours}", f"model.layers.{i}.{theirs}") for ours, theirs in _LAYER_KEYS]
    pairs += [("norm.weight", "model.norm.weight"), ("output.weight", "lm_head.weight")]
    return pairs


def _check(cfg: ModelConfig) -> None:
    cfg.validate()
    if cfg.qk_norm:
        raise ConfigError("model.qk_norm", "Llama has no q/k norm", "set qk_norm: false to export to HF Llama")
    if cfg.mlp != "swiglu":
        raise ConfigError("model.mlp", f"{cfg.mlp!r}: Llama's MLP is SwiGLU", "export a model with mlp: swiglu")


def to_hf_config(cfg: ModelConfig) -> dict[str, Any]:
    """Keyword arguments for `transformers.LlamaConfig` describing the same architecture."""
    _check(cfg)
    return dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        hidden_act="silu",
        max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=cfg.norm_eps,
        rope_theta=cfg.rope_theta,  # transformers >= 5 moves it into rope_parameters itself
        tie_word_embeddings=cfg.tied_embeddings,
        attention_bias=False,
        mlp_bias=False,
        initializer_range=cfg.init_std,
    )


def to_hf_state_dict(sd: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """scalelab Transformer state dict -> LlamaForCausalLM state dict (same tensors, renamed).

    With tied embeddings lm_head.weight is the embedding tensor, as in HF's own state_dict().
    """
    _check(cfg)
    out = {}
    for ours, theirs in hf_key_map(cfg):
        if ours == "output.weight" and cfg.tied_embeddings:
            out[theirs] = sd["tok_embeddings.weight"]
            continue
        if ours not in sd:
            raise KeyError(f"state dict has no {ours!r} (is it a full, unsharded scalelab Transformer?)")
        out[theirs] = sd[ours]
    return out


def from_hf_state_dict(hf_sd: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """LlamaForCausalLM state dict -> scalelab Transformer state dict (same tensors, renamed).

    With tied embeddings lm_head.weight may be absent; output.weight is then the embedding tensor.
    Rotary `inv_freq` buffers and other non-weight entries of the HF dict are ignored.
    """
    _check(cfg)
    out = {}
    for ours, theirs in hf_key_map(cfg):
        if ours == "output.weight" and cfg.tied_embeddings:
            out[ours] = hf_sd["model.embed_tokens.weight"]
            continue
        if theirs not in hf_sd:
            raise KeyError(f"Hugging Face state dict has no {theirs!r}")
        out[ours] = hf_sd[theirs]
    return out


def to_hf_model(model: torch.nn.Module, cfg: ModelConfig):
    """A `transformers.LlamaForCausalLM` (fp32, eager attention) holding a copy of `model`'s weights."""
    import transformers  # optional: the dev extra (export checks and tests), not a dependency

    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**to_hf_config(cfg), attn_implementation="eager"))
    hf.load_state_dict(to_hf_state_dict(model.state_dict(), cfg), strict=True)
    return hf.eval()
