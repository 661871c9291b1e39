"""Learning-rate schedules as pure functions of tokens seen (not steps), so runs with different
batch sizes and WSD decay branches started from a stable run's checkpoint agree on the lr.

    cosine:   linear warmup, then cosine from lr to min_lr_ratio*lr at the end of the run
    wsd:      linear warmup, constant ("stable"), then decay over the final decay_fraction
              of the run (linear, 1-sqrt, or cosine shape) to min_lr_ratio*lr
    constant: linear warmup, then constant
"""

from __future__ import annotations

import math


def lr_at(
    tokens: int,
    *,
    name: str,
    peak_lr: float,
    total_tokens: int,
    warmup_tokens: int,
    decay_fraction: float = 0.2,
    decay_shape: str = "linear",
    min_lr_ratio: float = 0.1,
) -> float:
    """Learning rate after `tokens` tokens of a run of `total_tokens` tokens."""
    if name not in ("constant", "cosine", "wsd"):
        raise ValueError(f"unknown schedule {name!r}")
    if warmup_tokens > 0 and tokens < warmup_tokens:
        return peak_lr * (tokens + 1) / warmup_tokens  # +1: the first step does not use lr=0
    min_lr = peak_lr * min_lr_ratio
    if name == "constant":
        return peak_lr
    if name == "cosine":
        span = max(total_tokens - warmup_tokens, 1)
        progress = min(max((tokens - warmup_tokens) / span, 0.0), 1.0)
        return min_lr + 0.5 * (peak_lr - min_lr) * (1 + math.cos(math.pi * progress))
    # wsd
    decay_start = max(total_tokens - int(decay_fraction * total_tokens), warmup_tokens)
    if tokens < decay_start:
        return peak_lr
    progress = min((tokens - decay_start) / max(total_tokens - decay_start, 1), 1.0)
    if decay_shape == "linear":
        frac = 1 - progress
    elif decay_shape == "sqrt":
        frac = 1 - math.sqrt(progress)
    elif decay_shape == "cosine":
        frac = 0.5 * (1 + math.cos(math.pi * progress))
    else:
        raise ValueError(f"unknown decay_shape {decay_shape!r}")
    return min_lr + (peak_lr - min_lr) * frac


def schedule_for(cfg) -> callable:
    """lr(tokens) for a RunConfig."""
    s = cfg.schedule
    kw = dict(
        name=s.name,
        peak_lr=cfg.optim.lr,
        total_tokens=cfg.num_steps * cfg.tokens_per_step,
        warmup_tokens=cfg.warmup_tokens,
        decay_fraction=s.decay_fraction,
        decay_shape=s.decay_shape,
        min_lr_ratio=s.min_lr_ratio,
    )
    return lambda tokens: lr_at(tokens, **kw)
