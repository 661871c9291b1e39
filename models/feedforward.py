"""The dense feed-forward block: a Llama block's MLP and an MoE layer's shared experts.

ffn = FeedForward(d_model=256, d_ff=688)               # SwiGLU: w2(silu(w1 x) * w3 x)
ffn = FeedForward(d_model=256, d_ff=1024, mlp="gelu")  # GELU MLP: w2(gelu(w1 x)), no w3
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from scalelab.kernels import get_ops


class FeedForward(nn.Module):
    """SwiGLU MLP: w2(silu(w1 x) * w3 x); w1 = gate, w3 = up, w2 = down. With mlp="gelu" the
    ungated MLP w2(gelu(w1 x)) (exact erf GELU, GPT-2 / BERT), which has no w3."""

    def __init__(self, d_model: int, d_ff: int, mlp: str = "swiglu"):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d_model, bias=False)
        self.w3 = nn.Linear(d_model, d_ff, bias=False) if mlp == "swiglu" else None
        self.ops = get_ops("torch")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is None:
            return self.w2(F.gelu(self.w1(x)))
        return self.w2(self.ops.swiglu(self.w1(x), self.w3(x)))
