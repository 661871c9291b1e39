"""Rotary position embeddings in Triton, applied to q and k, forward and backward.

Layout as the reference (imported here as `apply_rope_reference`): q [B, T, Hq, Dh], k [B, T, Hk, Dh],
cos/sin [T, Dh/2], half-split pairs (i, i + Dh/2) as in Hugging Face Llama:
  out[:half] = x1 * cos - x2 * sin,   out[half:] = x2 * cos + x1 * sin.
Each program rotates a tile of (batch, position, head) rows. The rotation is orthogonal, so the
backward is the same kernel with sin negated (rotation by -theta). Outputs are new tensors (q and k
are not modified), so autograd sees an ordinary op; cos/sin get no gradient (they are tables).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from scalelab.kernels._common import check_dtype, interpreting, next_pow2
from scalelab.kernels.reference import apply_rope as apply_rope_reference

__all__ = ["apply_rope", "apply_rope_reference"]


@triton.jit
def _rope_kernel(
    X,
    OUT,
    COS,
    SIN,
    sx_b,
    sx_t,
    sx_h,
    sx_d,
    so_b,
    so_t,
    so_h,
    so_d,
    sc_t,
    sc_d,
    ss_t,
    ss_d,
    R,
    T,
    H,
    HALF,
    BACKWARD: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # A tile of BLOCK_R (batch, position, head) rows x the half head dim; rows are flattened
    # b * T * H + t * H + h, so any strides work and T = 1 or few heads still fill a tile.
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    h = (rows % H)[:, None]
    t = ((rows // H) % T)[:, None]
    b = (rows // (H * T))[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]  # int32 column offsets; row bases are int64
    mask = (rows < R)[:, None] & (d < HALF)
    c = tl.load(COS + t * sc_t + d * sc_d, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(SIN + t * ss_t + d * ss_d, mask=mask, other=0.0).to(tl.float32)
    if BACKWARD:
        s = -s
    x_row = X + b * sx_b + t * sx_t + h * sx_h
    x1 = tl.load(x_row + d * sx_d, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_row + (d + HALF) * sx_d, mask=mask, other=0.0).to(tl.float32)
    o_row = OUT + b * so_b + t * so_t + h * so_h
    tl.store(o_row + d * so_d, (x1 * c - x2 * s).to(OUT.dtype.element_ty), mask=mask)
    tl.store(o_row + (d + HALF) * so_d, (x2 * c + x1 * s).to(OUT.dtype.element_ty), mask=mask)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backward: bool) -> torch.Tensor:
    B, T, H, D = x.shape
    out = torch.empty((B, T, H, D), device=x.device, dtype=x.dtype)
    rows, block_d = B * T * H, next_pow2(D // 2)
    # ~2K elements per GPU program; the interpreter pays per program, so 16K there.
    block_r = max(1, (16384 if interpreting(x) else 2048) // block_d)
    if out.numel():
        _rope_kernel[(triton.cdiv(rows, block_r),)](
            x, out, cos, sin, *x.stride(), *out.stride(), *cos.stride(), *sin.stride(),
            rows, T, H, D // 2, backward, block_r, block_d, num_warps=8,
        )  # fmt: skip
    return out


class _RoPE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rotate(q, cos, sin, False), _rotate(k, cos, sin, False)

    @staticmethod
    def backward(ctx, dq, dk):
        cos, sin = ctx.saved_tensors
        dq = _rotate(dq, cos, sin, True) if dq is not None else None
        dk = _rotate(dk, cos, sin, True) if dk is not None else None
        return dq, dk, None, None


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton rotary embedding on q [B, T, Hq, Dh] and k [B, T, Hk, Dh] with cos/sin [T, Dh/2]."""
    if q.dim() != 4 or k.dim() != 4 or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"apply_rope wants q [B, T, Hq, Dh], k [B, T, Hk, Dh]; got {q.shape}, {k.shape}")
    T, D = q.shape[1], q.shape[3]
    if D % 2 or cos.shape != (T, D // 2) or sin.shape != (T, D // 2):
        got = f"{tuple(cos.shape)}, {tuple(sin.shape)}"
        raise ValueError(f"cos/sin must be [T, Dh/2] = [{T}, {D // 2}]; got {got}")
    check_dtype("q", q)
    check_dtype("k", k)
    return _RoPE.apply(q, k, cos, sin)
