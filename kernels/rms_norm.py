"""RMSNorm in Triton, optionally fused with the residual add ("add & norm"), forward and backward.

Contract (see the reference, imported here as `rms_norm_reference`):
  rms_norm(x, w, eps)              -> y = x / sqrt(mean(x^2) + eps) * w        (fp32 math, cast back)
  rms_norm(x, w, eps, residual=r)  -> (rms_norm(s, w, eps), s) with s = x + r  (s in x's dtype)
x is [..., D], w is [D]. One program normalises one row in the forward (the whole row fits a block
up to D = 65536) and saves 1/rms per row (fp32). The backward processes several rows per program,
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
def _rms_fwd(X, R, W, Y, S_OUT, RSTD, sx, sr, sy, ss, D, eps, HAS_RES: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    ok = cols < D
    x = tl.load(X + row * sx + cols, mask=ok, other=0.0)
    if HAS_RES:
        r = tl.load(R + row * sr + cols, mask=ok, other=0.0)
        # Round the sum to x's dtype first, as the reference's `x + residual` does.
        s = (x.to(tl.float32) + r.to(tl.float32)).to(S_OUT.dtype.element_ty)
        tl.store(S_OUT + row * ss + cols, s, mask=ok)
        x = s
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / D + eps)
    tl.store(RSTD + row, rstd)
    w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(Y + row * sy + cols, (xf * rstd * w).to(Y.dtype.element_ty), mask=ok)


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
    rows_per_program,
    HAS_DS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    ok = cols < D
    w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_D], tl.float32)
    for i in range(0, rows_per_program):
        row = (pid * rows_per_program + i).to(tl.int64)
        row_ok = (cols * 0 + row) < N  # a vector: the interpreter rejects a scalar & vector mask
        mask = ok & row_ok
        dy = tl.load(DY + row * sdy + cols, mask=mask, other=0.0).to(tl.float32)
        x = tl.load(X + row * sx + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.max(tl.load(RSTD + row + cols * 0, mask=row_ok, other=0.0), axis=0)
        xhat = x * rstd
        wdy = w * dy
        c = tl.sum(xhat * wdy, axis=0) / D
        dx = (wdy - xhat * c) * rstd
        if HAS_DS:
            dx += tl.load(DS + row * sds + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + row * sdx + cols, dx.to(DX.dtype.element_ty), mask=mask)
        dw += dy * xhat
    tl.store(DW_PART + pid * BLOCK_D + cols, dw, mask=ok)


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
            _rms_fwd[(n,)](
                x2,
                r2,
                weight,
                y,
                s,
                rstd,
                x2.stride(0),
                r2.stride(0),
                y.stride(0),
                s.stride(0),
                d,
                eps,
                has_res,
                next_pow2(d),
                num_warps=_num_warps(d),
            )
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
        # Several rows per program amortise the weight load and the dw partial sums.
        num_programs = max(1, min(n, 8 if interpreting(normed) else 4 * _sm_count(normed.device)))
        rows_per_program = triton.cdiv(n, num_programs) if n else 0
        block_d = next_pow2(d)
        dw_part = torch.empty((num_programs, block_d), device=normed.device, dtype=torch.float32)
        if n:
            _rms_bwd[(num_programs,)](
                dy2,
                normed,
                weight,
                rstd,
                ds2,
                dx,
                dw_part,
                dy2.stride(0),
                normed.stride(0),
                ds2.stride(0),
                dx.stride(0),
                n,
                d,
                rows_per_program,
                ds is not None,
                block_d,
                num_warps=_num_warps(d),
            )
        else:
            dw_part.zero_()
        dw = dw_part[:, :d].sum(0).to(weight.dtype) if ctx.needs_input_grad[1] else None
        dx = dx.view(ctx.shape)
        # s = x + residual: both inputs get the full gradient of s.
        dres = dx if ctx.has_res and ctx.needs_input_grad[2] else None
        return dx, dw, dres, None


def _num_warps(d: int) -> int:
    # One row per block: ~8-16 elements per thread (4096 -> 8 warps); ignored by the interpreter.
    return max(1, min(16, next_pow2(d) // 512))


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
