"""The dense SwiGLU feed-forward block: a Llama block's MLP and an MoE layer's shared experts.

ffn = FeedForward(d_model=256, d_ff=688)     # w2(silu(w1 x) * w3 x)
"""

from __future__ import annotations

import torch
import torch.nn as nn

from scalelab.kernels import get_ops


class FeedForward(nn.Module):
    """SwiGLU MLP: w2(silu(w1 x) * w3 x); w1 = gate, w3 = up, w2 = down."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d_model, bias=False)
        self.w3 = nn.Linear(d_model, d_ff, bias=False)
        self.ops = get_ops("torch")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(self.ops.swiglu(self.w1(x), self.w3(x)))
