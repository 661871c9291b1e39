"""Named model sizes: a CPU ladder for tests and laptops, and GPU sizes up to Llama-3 70B.

    get_preset("debug")                       # 2 layers x 64, trains on a CPU in seconds
    get_preset("8b", vocab_size=32000)        # Llama-3-8B shape with another vocabulary
    list_presets()                            # names, smallest first

CPU presets use vocab 320 (a byte-level tokenizer's 256 bytes + specials, padded to a multiple of
64) and short contexts; a run config normally replaces vocab_size with its tokenizer's. The GPU
presets copy published shapes with SwiGLU d_ff ~ 8/3 d where the original used a 4d GELU MLP:
125m/350m/760m are GPT-3 Small/Medium/Large (tied embeddings, GPT-2 vocab padded to 50304);
1b/3b are Llama-3.2 1B/3B; 8b/70b are Llama-3 8B/70B (no RoPE scaling). MoE (family "moe"):
moe-debug (CPU), olmoe-1b-7b and mixtral-8x7b (shapes of the published models).
`scalelab models` prints every preset with its parameter and FLOP counts.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from scalelab.errors import ConfigError
from scalelab.models.config import ModelConfig

_CPU = dict(vocab_size=320, rope_theta=10000.0)
_GPT3 = dict(vocab_size=50304, max_seq_len=2048, tied_embeddings=True, rope_theta=10000.0)
_LLAMA3 = dict(vocab_size=128256, rope_theta=500000.0)

_PRESETS: dict[str, dict[str, Any]] = {
    # CPU ladder (total parameters with vocab 320 in the comment)
    "debug": dict(  # 0.12M; GQA (4 q / 2 kv heads) so tests exercise it
        **_CPU, num_layers=2, d_model=64, num_heads=4, num_kv_heads=2, d_ff=192, max_seq_len=128
    ),
    "moe-debug": dict(  # 0.36M total, 0.14M active: 8 experts of width 96, top-2 (MoE tests, CPU)
        **_CPU,
        family="moe",
        num_layers=2,
        d_model=64,
        num_heads=4,
        num_kv_heads=2,
        d_ff=192,
        max_seq_len=128,
        num_experts=8,
        num_experts_per_tok=2,
        moe_d_ff=96,
    ),
    "tiny-1m": dict(**_CPU, num_layers=4, d_model=128, num_heads=4, num_kv_heads=4, d_ff=384, max_seq_len=256),
    "tiny-3m": dict(**_CPU, num_layers=6, d_model=192, num_heads=6, num_kv_heads=6, d_ff=512, max_seq_len=256),
    "small-10m": dict(**_CPU, num_layers=8, d_model=320, num_heads=5, num_kv_heads=5, d_ff=896, max_seq_len=512),
    # GPU ladder
    "125m": dict(**_GPT3, num_layers=12, d_model=768, num_heads=12, num_kv_heads=12, d_ff=2048),
    "350m": dict(**_GPT3, num_layers=24, d_model=1024, num_heads=16, num_kv_heads=16, d_ff=2816),
    "760m": dict(**_GPT3, num_layers=24, d_model=1536, num_heads=16, num_kv_heads=16, d_ff=4096),
    "1b": dict(
        **_LLAMA3,
        num_layers=16,
        d_model=2048,
        num_heads=32,
        num_kv_heads=8,
        d_ff=8192,
        max_seq_len=8192,
        tied_embeddings=True,
    ),
    "3b": dict(
        **_LLAMA3,
        num_layers=28,
        d_model=3072,
        num_heads=24,
        num_kv_heads=8,
        d_ff=8192,
        max_seq_len=8192,
        tied_embeddings=True,
    ),
    # OLMoE-1B-7B shape (Muennighoff et al. 2024): 64 experts of 1024, top-8, softmax without
    # renormalisation; 6.92B total / 1.28B active (its full-width QK-norm is not modelled here)
    "olmoe-1b-7b": dict(
        family="moe",
        vocab_size=50304,
        num_layers=16,
        d_model=2048,
        num_heads=16,
        num_kv_heads=16,
        d_ff=1024,
        max_seq_len=4096,
        num_experts=64,
        num_experts_per_tok=8,
    ),
    "8b": dict(**_LLAMA3, num_layers=32, d_model=4096, num_heads=32, num_kv_heads=8, d_ff=14336, max_seq_len=8192),
    # Mixtral-8x7B shape: 8 experts of 14336, top-2; 46.70B total / 12.88B active (as published)
    "mixtral-8x7b": dict(
        family="moe",
        vocab_size=32000,
        num_layers=32,
        d_model=4096,
        num_heads=32,
        num_kv_heads=8,
        d_ff=14336,
        max_seq_len=32768,
        rope_theta=1e6,
        num_experts=8,
        num_experts_per_tok=2,
    ),
    "70b": dict(**_LLAMA3, num_layers=80, d_model=8192, num_heads=64, num_kv_heads=8, d_ff=28672, max_seq_len=8192),
}


def list_presets() -> list[str]:
    """Preset names, smallest first."""
    return list(_PRESETS)


def get_preset(name: str, vocab_size: int | None = None, **overrides: Any) -> ModelConfig:
    """The named ModelConfig (a fresh object); `vocab_size` and `overrides` replace its fields."""
    if name not in _PRESETS:
        raise ConfigError("model.preset", f"unknown preset {name!r}", f"use one of: {', '.join(_PRESETS)}")
    fields = dict(_PRESETS[name])
    if vocab_size is not None:
        fields["vocab_size"] = vocab_size
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    for key in overrides:
        if key not in known:
            raise ConfigError(f"model.{key}", "is not a ModelConfig field", f"use one of: {', '.join(sorted(known))}")
    fields.update(overrides)
    return ModelConfig(**fields)
