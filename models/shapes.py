"""The shape rule: a target parameter count -> a Llama-style ModelConfig.

    cfg = shape_for_params(1.2e8, vocab_size=50304)     # ~ 12 layers x 768
    num_params(cfg)                                      # within SHAPE_TOLERANCE of 1.2e8

The rule (all sizes derive from (num_layers L, d_model d)):
  aspect      preferred width for L layers: d*(L) = 64 L for L <= 16 (GPT-3 125M: 12 x 768), then
              +128 per further layer: d*(L) = 1024 + 128 (L - 16) (GPT-3 XL: 24 x 2048,
              32 -> 3072, 80 -> 9216, between Llama-3 8B 32 x 4096 and 70B 80 x 8192). Kaplan et
              al. (2020) find the loss within a few % for d/L between ~20 and ~200, so d may
              deviate from d*(L) by up to 2x to hit the count.
  heads       head_dim 8 for d < 32, 16 for d < 128, 32 for d < 256, 64 for d < 2048, 128 above.
  widths      d is a multiple of 8 / 16 / 32 below 32 / 128 / 256 (whole heads; widths under 32
              only when min_width allows them, for CPU-sized designs); of 128 below 2048 (an even
              number of heads, so TP=2 shards them); from 2048 a multiple of 512 (num_heads a
              multiple of 4).
  GQA         num_kv_heads = num_heads for d < 2048, else gcd(num_heads, 8) (4 or 8; Llama-3: 8).
  d_ff        8/3 d (SwiGLU with the FLOPs of a 4d GELU MLP) rounded up to a multiple of 32
              (d < 256), 64 (d < 2048) or 256; for `mlp: gelu` 3/2 of that (~4 d): two matrices with
              exactly the parameters and FLOPs of SwiGLU's three, so the rule picks the same (L, d).
  choice      among (L, d) with d within 2x of d*(L): the shape closest to the aspect rule
              (smallest |log(d / d*(L))|) among those whose count is within 5% of the target;
              when none is, the one with the closest count.

The count is `num_params` (total, tied matrix once) or, with count="nonembedding",
`num_params_nonembedding`. Tolerance (tested on 1e5..7e10 with vocab sizes 256..128256): the
count is within 15% of the target (SHAPE_TOLERANCE; the misses above 5% are tiny models, where
one more head or layer is a large step) and within 5% for targets >= 1e8. A target the grid
cannot reach within 15% (the vocabulary alone nearly fills it) raises ConfigError.
"""

from __future__ import annotations

import math
from typing import Any

from scalelab.errors import ConfigError
from scalelab.models.accounting import num_params, num_params_nonembedding
from scalelab.models.config import ModelConfig

SHAPE_TOLERANCE = 0.15  # |N / target - 1| guaranteed by tests for 1e5..7e10 (see tests/test_models.py)
_GOOD_ENOUGH = 0.05  # counts within 5% are equally good; then the aspect rule decides
_ASPECT_BAND = 2.0  # d may deviate from d*(L) by this factor
_MAX_LAYERS = 512


def preferred_width(num_layers: int, width_per_layer: int = 64) -> int:
    """d*(L): width_per_layer * L up to 16 layers, then 128 more per layer."""
    if num_layers <= 16:
        return width_per_layer * num_layers
    return width_per_layer * 16 + 128 * (num_layers - 16)


def head_dim_for_width(d_model: int) -> int:
    return 8 if d_model < 32 else 16 if d_model < 128 else 32 if d_model < 256 else 64 if d_model < 2048 else 128


def ffn_width(d_model: int) -> int:
    """8/3 d_model rounded up to a multiple of 64 (d < 2048) or 256."""
    multiple = 32 if d_model < 256 else 64 if d_model < 2048 else 256
    return -(-(8 * d_model) // (3 * multiple)) * multiple


def base_shape(d_model: int, num_layers: int) -> dict[str, int]:
    """The `model.base_*` keys of mup/completep for a base of the shape rule at this width and depth."""
    return {
        "base_d_model": d_model,
        "base_num_layers": num_layers,
        "base_head_dim": head_dim_for_width(d_model),
        "base_d_ff": ffn_width(d_model),
    }


def shape_for_width(num_layers: int, d_model: int, vocab_size: int, **fields: Any) -> ModelConfig:
    """The full config the rule gives to (num_layers, d_model); `fields` set the other keys."""
    head_dim = head_dim_for_width(d_model)
    if d_model % head_dim:
        raise ConfigError("model.d_model", f"{d_model} is not a multiple of head_dim {head_dim}")
    num_heads = d_model // head_dim
    num_kv_heads = num_heads if d_model < 2048 else math.gcd(num_heads, 8)
    fields.setdefault("max_seq_len", 2048)
    return ModelConfig(
        vocab_size=vocab_size,
        num_layers=num_layers,
        d_model=d_model,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        d_ff=ffn_width(d_model) if fields.get("mlp", "swiglu") == "swiglu" else 3 * ffn_width(d_model) // 2,
        **fields,
    )


def width_step(d_model: int) -> int:
    """Allowed d_model are multiples of this: 8 / 16 / 32 below 32 / 128 / 256 (one head_dim), then an
    even number of 64-wide heads (TP=2), and from 2048 a multiple of 8 heads of 128 (TP up to 8)."""
    return 8 if d_model < 32 else 16 if d_model < 128 else 32 if d_model < 256 else 128 if d_model < 2048 else 512


def _width_grid(lo: float, hi: float, min_width: int = 32) -> list[int]:
    """Every allowed d_model (a multiple of its head_dim) in [lo, hi], from min_width up."""
    start = max(min_width, math.ceil(lo / 8) * 8)
    return [d for d in range(start, int(hi) + 1, 8) if d % width_step(d) == 0]


def shape_for_params(
    target_params: float,
    vocab_size: int,
    *,
    count: str = "total",
    min_layers: int = 1,
    width_per_layer: int = 64,
    min_width: int = 32,
    exclude: frozenset[tuple[int, int]] = frozenset(),
    **fields: Any,
) -> ModelConfig:
    """The ModelConfig the shape rule (module docstring) gives to `target_params`.

    Args:
        target_params: wanted parameter count (total, or non-embedding with count="nonembedding").
        vocab_size: embedding rows.
        count: "total" (num_params) or "nonembedding" (num_params_nonembedding).
        min_layers: the shallowest depth considered (a design of tiny models may ask for 2: one
            layer cannot form induction heads).
        width_per_layer: d*(L) = width_per_layer * L up to 16 layers (64: GPT-3's 12 x 768; tiny CPU
            ladders may ask for less so that small sizes keep 2+ layers within the aspect band).
        min_width: the narrowest d_model considered (16 allows one 16-wide head).
        exclude: (num_layers, d_model) pairs not to return (so a design's sizes stay distinct).
        fields: other ModelConfig keys (max_seq_len=2048 by default, tied_embeddings, qk_norm, mlp,
            rope_theta, norm_eps, init_std, kernels); tied_embeddings, qk_norm and mlp change the count.
    Raises:
        ConfigError: bad target/count, or a target the vocabulary alone (nearly) fills.
    """
    if count not in ("total", "nonembedding"):
        raise ConfigError("model.count", f"{count!r} is not a count", "use 'total' or 'nonembedding'")
    if not target_params > 0:
        raise ConfigError("model.target_params", f"{target_params} must be > 0", "e.g. 1e7")
    counter = num_params if count == "total" else num_params_nonembedding
    best: tuple[float, float, ModelConfig] | None = None  # (count miss, aspect miss, cfg)
    for num_layers in range(max(1, min_layers), _MAX_LAYERS + 1):
        d_star = preferred_width(num_layers, width_per_layer)
        widths = _width_grid(d_star / _ASPECT_BAND, d_star * _ASPECT_BAND, min_width)
        smallest = None
        for d_model in widths:
            cfg = shape_for_width(num_layers, d_model, vocab_size, **fields)
            n = counter(cfg)
            smallest = n if smallest is None else min(smallest, n)
            if (num_layers, d_model) in exclude:
                continue
            miss = abs(math.log(n / target_params))
            aspect_miss = abs(math.log(d_model / d_star))
            key = (max(miss, math.log1p(_GOOD_ENOUGH)), aspect_miss)
            if best is None or key < best[:2]:
                best = (key[0], key[1], cfg)
        if smallest is not None and smallest > 2 * target_params:
            break  # deeper shapes only grow
    if best is None:
        raise ConfigError("model.target_params", f"{target_params:.3g}: every shape is excluded", "widen the range")
    cfg = best[2]
    n = counter(cfg)
    if abs(n / target_params - 1) > SHAPE_TOLERANCE:
        raise ConfigError(
            "model.target_params",
            f"{target_params:.3g} cannot be met by the shape rule with vocab_size={vocab_size} "
            f"(closest: {n:.3g} params, embeddings {vocab_size * cfg.d_model:.3g})",
            "raise target_params, lower vocab_size, or give the sizes explicitly",
        )
    return cfg
