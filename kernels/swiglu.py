"""SwiGLU activation in Triton: out = silu(gate) * up, forward and backward.

gate and up are [..., F] with a contiguous last dim; they may be strided views (for instance the two
halves of a fused gate/up projection), which are read in place. Math is fp32 with one rounding to
the input dtype; the backward recomputes sigmoid(gate) instead of saving it:
  d gate = d out * up * s * (1 + gate * (1 - s)),   d up = d out * gate * s,   s = sigmoid(gate).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from scalelab.kernels._common import check_dtype, interpreting, next_pow2
from scalelab.kernels.reference import swiglu as swiglu_reference

__all__ = ["swiglu", "swiglu_reference"]


@triton.jit
def _swiglu_fwd(G, U, Out, sg, su, so, N, F, BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr):
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)[:, None]
    cols = (tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F))[None, :]  # int32; row bases int64
    ok = (rows < N) & (cols < F)
    g = tl.load(G + rows * sg + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(U + rows * su + cols, mask=ok, other=0.0).to(tl.float32)
    out = g * tl.sigmoid(g) * u
    tl.store(Out + rows * so + cols, out.to(Out.dtype.element_ty), mask=ok)


@triton.jit
def _swiglu_bwd(G, U, DO, DG, DU, sg, su, sdo, sdg, sdu, N, F, BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr):
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)[:, None]
    cols = (tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F))[None, :]  # int32; row bases int64
    ok = (rows < N) & (cols < F)
    g = tl.load(G + rows * sg + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(U + rows * su + cols, mask=ok, other=0.0).to(tl.float32)
    do = tl.load(DO + rows * sdo + cols, mask=ok, other=0.0).to(tl.float32)
    s = tl.sigmoid(g)
    dg = do * u * s * (1.0 + g * (1.0 - s))
    du = do * g * s
    tl.store(DG + rows * sdg + cols, dg.to(DG.dtype.element_ty), mask=ok)
    tl.store(DU + rows * sdu + cols, du.to(DU.dtype.element_ty), mask=ok)


def _rows(t: torch.Tensor) -> torch.Tensor:
    t2 = t.reshape(-1, t.shape[-1])  # a view when possible (e.g. chunks of a fused projection)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _launch(kernel, t: torch.Tensor, *args) -> None:
    # Tiles of rows x columns: 4K elements per GPU program; the interpreter pays per program, so
    # it takes 16K-element tiles.
    n, f = t.shape
    block_f = min(1024, next_pow2(f))
    block_r = max(1, (16384 if interpreting(t) else 4096) // block_f)
    grid = (triton.cdiv(n, block_r), triton.cdiv(f, block_f))
    kernel[grid](*args, n, f, block_r, block_f, num_warps=8)


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):
        g2, u2 = _rows(gate), _rows(up)
        n, f = g2.shape
        out = torch.empty((n, f), device=gate.device, dtype=gate.dtype)
        if out.numel():
            _launch(_swiglu_fwd, g2, g2, u2, out, g2.stride(0), u2.stride(0), out.stride(0))
        ctx.save_for_backward(g2, u2)
        ctx.shape = gate.shape
        return out.view(gate.shape)

    @staticmethod
    def backward(ctx, dout):
        g2, u2 = ctx.saved_tensors
        n, f = g2.shape
        do2 = _rows(dout)
        dg = torch.empty((n, f), device=g2.device, dtype=g2.dtype)
        du = torch.empty((n, f), device=u2.device, dtype=u2.dtype)
        if dg.numel():
            _launch(_swiglu_bwd, g2, g2, u2, do2, dg, du, g2.stride(0), u2.stride(0), do2.stride(0),
                    dg.stride(0), du.stride(0))  # fmt: skip
        return dg.view(ctx.shape), du.view(ctx.shape)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Triton silu(gate) * up with the reference's signature; gate and up of one shape and dtype."""
    check_dtype("gate", gate)
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError(f"gate {tuple(gate.shape)}/{gate.dtype} and up {tuple(up.shape)}/{up.dtype} differ")
    return _SwiGLU.apply(gate, up)
