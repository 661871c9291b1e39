"""The Triton kernel namespace handed out by `scalelab.kernels.get_ops("triton" | "auto")`.

Importing this module imports Triton and compiles nothing; kernels compile on first call (on CUDA)
or run in the interpreter (CPU tensors, TRITON_INTERPRET=1 set before Triton was imported).
"""

from __future__ import annotations

from types import SimpleNamespace

from scalelab.kernels.attention import attention
from scalelab.kernels.fused_ce import fused_linear_cross_entropy
from scalelab.kernels.rms_norm import rms_norm
from scalelab.kernels.rope import apply_rope
from scalelab.kernels.swiglu import swiglu


def ops() -> SimpleNamespace:
    """The five fused ops, each with exactly the signature of its `scalelab.kernels.reference` twin."""
    return SimpleNamespace(
        name="triton",
        rms_norm=rms_norm,
        swiglu=swiglu,
        apply_rope=apply_rope,
        attention=attention,
        fused_linear_cross_entropy=fused_linear_cross_entropy,
    )
