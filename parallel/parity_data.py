"""What the EP and CP parity checks share: their token batches and how they compare results.

batches(vocab, steps, batch, seq_len, seed)   # [batch, seq_len + 1] token ids per step
cross_entropy(logits, targets)                # mean CE in fp32
max_diff(reference, got)                      # (max |Δ| over matching tensors, where)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def batches(vocab: int, steps: int, batch: int, seq_len: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed + 1)
    return [torch.randint(0, vocab, (batch, seq_len + 1), generator=gen) for _ in range(steps)]


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def max_diff(a: dict, b: dict) -> tuple[float, str]:
    worst, where = 0.0, ""
    for key, ref in a.items():
        if key not in b:
            return float("inf"), f"missing {key}"
        d = float((ref.float() - b[key].float()).abs().max())
        if d > worst:
            worst, where = d, key
    return worst, where
