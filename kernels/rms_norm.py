"""RMSNorm in Triton, optionally fused with the residual add ("add & norm"), forward and backward.

Contract (see the reference, imported here as `rms_norm_reference`):
  rms_norm(x, w, eps)              -> y = x / sqrt(mean(x^2) + eps) * w        (fp32 math, cast back)
  rms_norm(x, w, eps, residual=r)  -> (rms_norm(s, w, eps), s) with s = x + r  (s in x's dtype)
x is [..., D], w is [D]. A program normalises a tile of whole rows in the forward (D up to 65536)
and saves 1/rms per row (fp32). The backward loops each program over several row tiles,
computes dx = rstd * (w*dy - xhat * mean(xhat * w*dy)), adds the gradient flowing into s (the
residual stream) and accumulates dw partial sums per program, reduced by torch at the end.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from scalelab.kernels._common import check_dtype, interpreting, next_pow2
from scalelab.kernels.reference import rms_norm as rms_norm_reference

__all__ = ["rms_norm", "rms_norm_reference"]


@triton.jit
def _rms_fwd(
    X,
    R,
    W,
    Y,
    S_OUT,
    RSTD,
    sx,
    sr,
    sy,
    ss,
    N,
    D,
    eps,
    HAS_RES: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # One [BLOCK_R, BLOCK_D] tile of rows per program; whole rows (BLOCK_D >= D).
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)
    cols = tl.arange(0, BLOCK_D).to(tl.int64)
    mask = (rows < N)[:, None] & (cols < D)[None, :]
    x = tl.load(X + rows[:, None] * sx + cols[None, :], mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(R + rows[:, None] * sr + cols[None, :], mask=mask, other=0.0)
        # Round the sum to x's dtype first, as the reference's `x + residual` does.
        s = (x.to(tl.float32) + r.to(tl.float32)).to(S_OUT.dtype.element_ty)
        tl.store(S_OUT + rows[:, None] * ss + cols[None, :], s, mask=mask)
        x = s
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=1) / D + eps)
    tl.store(RSTD + rows, rstd, mask=rows < N)
    w = tl.load(W + cols, mask=cols < D, other=0.0).to(tl.float32)
    y = xf * rstd[:, None] * w[None, :]
    tl.store(Y + rows[:, None] * sy + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rms_bwd(
    DY,
    X,
    W,
    RSTD,
    DS,
    DX,
    DW_PART,
    sdy,
    sx,
    sds,
    sdx,
    N,
    D,
    num_row_blocks,
    HAS_DS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # Grid-stride loop over row tiles; dw partial sums stay in registers, one row of DW_PART each.
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D).to(tl.int64)
    col_ok = cols < D
    w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_D], tl.float32)
    for blk in range(pid, num_row_blocks, tl.num_programs(0)):
        rows = (blk * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
        mask = (rows < N)[:, None] & col_ok[None, :]
        dy = tl.load(DY + rows[:, None] * sdy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        x = tl.load(X + rows[:, None] * sx + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=rows < N, other=0.0)
        xhat = x * rstd[:, None]
        wdy = w[None, :] * dy
        c = tl.sum(xhat * wdy, axis=1) / D
        dx = (wdy - xhat * c[:, None]) * rstd[:, None]
        if HAS_DS:
            dx += tl.load(DS + rows[:, None] * sds + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + rows[:, None] * sdx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        dw += tl.sum(dy * xhat, axis=0)
    tl.store(DW_PART + pid * BLOCK_D + cols, dw, mask=col_ok)


def _tile(d: int, interp: bool) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_D, num_warps): whole rows, >= ~2K elements per GPU program (1 row at D=4096,
    32 rows at D=64); the interpreter pays per program, so it takes up to 16K elements per tile."""
    block_d = next_pow2(d)
    block_r = max(1, (16384 if interp else 2048) // block_d)
    return block_r, block_d, max(1, min(16, block_r * block_d // 512))


def _rows(t: torch.Tensor, d: int) -> torch.Tensor:
    t2 = t.reshape(-1, d)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, residual, eps: float):
        d = x.shape[-1]
        x2 = _rows(x, d)
        n = x2.shape[0]
        y = torch.empty((n, d), device=x.device, dtype=x.dtype)
        rstd = torch.empty(n, device=x.device, dtype=torch.float32)
        has_res = residual is not None
        if has_res:
            r2 = _rows(residual, d)
            s = torch.empty((n, d), device=x.device, dtype=x.dtype)
        else:
            r2, s = x2, y  # unused placeholders (HAS_RES=False never touches them)
        if n:
            block_r, block_d, warps = _tile(d, interpreting(x))
            _rms_fwd[(triton.cdiv(n, block_r),)](
                x2, r2, weight, y, s, rstd, x2.stride(0), r2.stride(0), y.stride(0), s.stride(0), n, d, eps,
                has_res, block_r, block_d, num_warps=warps,
            )  # fmt: skip
        normed = s if has_res else x2
        ctx.save_for_backward(normed, weight, rstd)
        ctx.has_res = has_res
        ctx.shape = x.shape
        ctx.set_materialize_grads(False)
        if has_res:
            return y.view(x.shape), s.view(x.shape)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy, ds=None):
        normed, weight, rstd = ctx.saved_tensors
        n, d = normed.shape
        if dy is None:
            dy = torch.zeros((n, d), device=normed.device, dtype=normed.dtype)
        dy2 = _rows(dy, d)
        ds2 = _rows(ds, d) if ds is not None else dy2
        dx = torch.empty((n, d), device=normed.device, dtype=normed.dtype)
        block_r, block_d, warps = _tile(d, interpreting(normed))
        num_row_blocks = triton.cdiv(n, block_r)
        # A few programs per SM, each looping over row tiles: amortises the dw partial sums.
        max_programs = 4 if interpreting(normed) else 4 * _sm_count(normed.device)
        num_programs = max(1, min(num_row_blocks, max_programs))
        dw_part = torch.zeros((num_programs, block_d), device=normed.device, dtype=torch.float32)
        if n:
            _rms_bwd[(num_programs,)](
                dy2, normed, weight, rstd, ds2, dx, dw_part, dy2.stride(0), normed.stride(0), ds2.stride(0),
                dx.stride(0), n, d, num_row_blocks, ds is not None, block_r, block_d, num_warps=warps,
            )  # fmt: skip
        dw = dw_part[:, :d].sum(0).to(weight.dtype) if ctx.needs_input_grad[1] else None
        dx = dx.view(ctx.shape)
        # s = x + residual: both inputs get the full gradient of s.
        dres = dx if ctx.has_res and ctx.needs_input_grad[2] else None
        return dx, dw, dres, None


def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Triton RMSNorm with the reference's signature; with `residual` returns (norm(x + r), x + r)."""
    check_dtype("x", x)
    check_dtype("weight", weight)
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"weight shape {tuple(weight.shape)} != (x.shape[-1],) = ({x.shape[-1]},)")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        got = f"{tuple(residual.shape)}/{residual.dtype}"
        raise ValueError(f"residual {got} must match x {tuple(x.shape)}/{x.dtype}")
    return _RMSNorm.apply(x, weight, residual, eps)
