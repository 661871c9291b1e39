"""Causal flash attention in Triton: forward and backward, grouped-query heads, ragged lengths.

Layout as the reference: q [B, Hq, T, Dh], k/v [B, Hk, S, Dh], Hq a multiple of Hk (GQA: query head
h reads kv head h // (Hq // Hk)). Any strides; the output is a fresh contiguous [B, Hq, T, Dh].

Algorithm (FlashAttention-2):
  forward   one program per (query block, query head, batch); online softmax over key blocks in base 2
            (scores are multiplied by softmax_scale * log2(e) so that exp2 can be used); saves the
            log-sum-exp per query row (base 2) for the backward. Causal blocks strictly below the
            diagonal run without a mask; only the diagonal block is masked.
  backward  delta = rowsum(O * dO) first; then a dK/dV pass (one program per key block and kv head,
            looping over the query heads of its group and the query blocks at or after the diagonal,
            so GQA needs no atomics) and a separate dQ pass (one program per query block and head).
Lengths that are not multiples of the block sizes are handled by masked loads (zeros) and by
masking scores of keys past the end. Head dims are padded to a power of two inside the kernel
(64 and 128 are exact). With causal=True, T must equal S (self-attention, as in the model).

Argument bundles: every [B, H, T, Dh] tensor travels with its strides as one tuple (`q.stride()`);
inside a program, one head's matrix is `(pointer to its [T, Dh] matrix, strides)`, and `_tile` /
`_store_tile` address its blocks. Reading order: the forward (its inner loop over key blocks, then
the kernel), the three backward kernels likewise, the launchers, the autograd Function.

Run the checks: `pytest tests/test_kernels_attention.py` (CPU, TRITON_INTERPRET=1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from scalelab.kernels._common import check_dtype, dot_dtype, dot_precision, interpreting, next_pow2
from scalelab.kernels.reference import attention as attention_reference

__all__ = ["attention", "attention_reference"]

_LOG2E = 1.4426950408889634

# Interpreter block sizes: small so that tests at T ~ 40-100 cross several blocks and end ragged.
# Constraints used by the causal split into "below the diagonal" and "diagonal" stages:
# fwd/dq BLOCK_M % BLOCK_N == 0, dkdv BLOCK_N % BLOCK_M == 0.
_INTERP_FWD = {"BLOCK_M": 32, "BLOCK_N": 16}
_INTERP_DKDV = {"BLOCK_M": 16, "BLOCK_N": 32}
_INTERP_DQ = {"BLOCK_M": 32, "BLOCK_N": 16}


# --- addressing ------------------------------------------------------------------------------------
@triton.jit
def _head(ptr, strides, b, h):
    """One head's [T, Dh] matrix of a [B, H, T, Dh] tensor: (pointer to it, the tensor's strides)."""
    return ptr + b * strides[0] + h * strides[1], strides


@triton.jit
def _tile(mat, rows, n_rows, cols, n_cols, TRANSPOSED: tl.constexpr):
    """The [rows, cols] block of a head's matrix (`_head`), or its transpose [cols, rows] read in
    place; zeros past n_rows (sequence) or n_cols (head dim)."""
    base, strides = mat
    if TRANSPOSED:
        ptrs = base + rows[None, :] * strides[2] + cols[:, None] * strides[3]
        mask = (rows < n_rows)[None, :] & (cols < n_cols)[:, None]
    else:
        ptrs = base + rows[:, None] * strides[2] + cols[None, :] * strides[3]
        mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _store_tile(mat, rows, n_rows, cols, n_cols, value):
    base, strides = mat
    ptrs = base + rows[:, None] * strides[2] + cols[None, :] * strides[3]
    tl.store(ptrs, value.to(base.dtype.element_ty), mask=(rows < n_rows)[:, None] & (cols < n_cols)[None, :])


# --- forward ---------------------------------------------------------------------------------------
@triton.jit
def _fwd_inner(state, q, k, v, rows, lo, hi, S, qk_scale, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
               MASK_CAUSAL: tl.constexpr, MASK_S: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """Online softmax of the query block `rows` = (offs_m, offs_d) over keys [lo, hi);
    state = (acc, row sum l, row max m), returned updated."""
    acc, l_i, m_i = state
    offs_m, offs_d = rows
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kT = _tile(k, offs_n, S, offs_d, HEAD_DIM, True)
        v_blk = _tile(v, offs_n, S, offs_d, HEAD_DIM, False)
        qk = tl.dot(q, kT.to(DT), input_precision=PREC) * qk_scale
        if MASK_CAUSAL:
            qk = tl.where(offs_m[:, None] >= offs_n[None, :], qk, float("-inf"))
        if MASK_S:
            qk = tl.where((offs_n < S)[None, :], qk, float("-inf"))
        # Online softmax; every row sees key 0 in its first block, so m_new is finite.
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(DT), v_blk.to(DT), input_precision=PREC)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attn_fwd(Q, K, V, Out, LSE, sq, sk, sv, so, H, T, S, GROUP, qk_scale,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, MASK_S: tl.constexpr,
              DT: tl.constexpr, PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_D))
    offs_m, offs_d = rows
    q = _tile(_head(Q, sq, b, h), offs_m, T, offs_d, HEAD_DIM, False).to(DT)
    k, v = _head(K, sk, b, h // GROUP), _head(V, sv, b, h // GROUP)
    state = (
        tl.zeros([BLOCK_M, BLOCK_D], tl.float32),
        tl.zeros([BLOCK_M], tl.float32),
        tl.full([BLOCK_M], float("-inf"), tl.float32),
    )
    if CAUSAL:
        # Keys below the diagonal block: no mask (they are < T == S). Then the diagonal block.
        diag = pid_m * BLOCK_M
        state = _fwd_inner(state, q, k, v, rows, 0, diag, S, qk_scale, HEAD_DIM, BLOCK_N, False, False, DT, PREC)
        hi = tl.minimum(diag + BLOCK_M, S)
        state = _fwd_inner(state, q, k, v, rows, diag, hi, S, qk_scale, HEAD_DIM, BLOCK_N, True, True, DT, PREC)
    else:
        state = _fwd_inner(state, q, k, v, rows, 0, S, S, qk_scale, HEAD_DIM, BLOCK_N, False, MASK_S, DT, PREC)
    acc, l_i, m_i = state
    tl.store(LSE + pid_bh.to(tl.int64) * T + offs_m, m_i + tl.log2(l_i), mask=offs_m < T)
    _store_tile(_head(Out, so, b, h), offs_m, T, offs_d, HEAD_DIM, acc / l_i[:, None])


# --- backward --------------------------------------------------------------------------------------
@triton.jit
def _attn_bwd_delta(Out, DO, DELTA, so, sdo, H, T, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                    BLOCK_M: tl.constexpr):  # fmt: skip
    # delta_i = sum_d O[i, d] * dO[i, d] (fp32): the softmax-backward correction term.
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    o = _tile(_head(Out, so, b, h), offs_m, T, offs_d, HEAD_DIM, False)
    do = _tile(_head(DO, sdo, b, h), offs_m, T, offs_d, HEAD_DIM, False)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(DELTA + pid_bh.to(tl.int64) * T + offs_m, delta, mask=offs_m < T)


@triton.jit
def _dkdv_inner(grads, kv, q, do, rowstats, cols, lo, hi, T, qk_scale, HEAD_DIM: tl.constexpr,
                BLOCK_M: tl.constexpr, MASK_CAUSAL: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """dK, dV of the key block `cols` = (offs_n, offs_d) from query rows [lo, hi) of one query head:
    grads = (dk, dv), kv = (k, v) blocks, q / do that head's matrices, rowstats = (lse, delta) pointers."""
    dk, dv = grads
    k, v = kv
    offs_n, offs_d = cols
    lse_base, delta_base = rowstats
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        m_ok = offs_m < T
        qT = _tile(q, offs_m, T, offs_d, HEAD_DIM, True).to(DT)
        do_blk = _tile(do, offs_m, T, offs_d, HEAD_DIM, False).to(DT)
        # lse = +inf past the end makes p = 0 for padded query rows.
        lse = tl.load(lse_base + offs_m, mask=m_ok, other=float("inf"))
        delta = tl.load(delta_base + offs_m, mask=m_ok, other=0.0)
        qkT = tl.dot(k, qT, input_precision=PREC) * qk_scale  # [BLOCK_N, BLOCK_M]
        pT = tl.exp2(qkT - lse[None, :])
        if MASK_CAUSAL:
            pT = tl.where(offs_m[None, :] >= offs_n[:, None], pT, 0.0)
        dv += tl.dot(pT.to(DT), do_blk, input_precision=PREC)
        dpT = tl.dot(v, tl.trans(do_blk), input_precision=PREC)
        dsT = pT * (dpT - delta[None, :])
        dk += tl.dot(dsT.to(DT), tl.trans(qT), input_precision=PREC)
    return dk, dv


@triton.jit
def _attn_bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, sq, sk, sv, sdo, sdk, sdv, H, HK, T, S, GROUP, qk_scale,
                   sm_scale, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
                   DT: tl.constexpr, PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_bhk = tl.program_id(1)
    b = (pid_bhk // HK).to(tl.int64)
    hk = (pid_bhk % HK).to(tl.int64)
    cols = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N), tl.arange(0, BLOCK_D))
    offs_n, offs_d = cols
    kv = (
        _tile(_head(K, sk, b, hk), offs_n, S, offs_d, HEAD_DIM, False).to(DT),
        _tile(_head(V, sv, b, hk), offs_n, S, offs_d, HEAD_DIM, False).to(DT),
    )
    grads = (tl.zeros([BLOCK_N, BLOCK_D], tl.float32), tl.zeros([BLOCK_N, BLOCK_D], tl.float32))
    # The query heads sharing this kv head are summed here, so GQA needs no atomics.
    for g in range(0, GROUP):
        h = hk * GROUP + g
        q, do = _head(Q, sq, b, h), _head(DO, sdo, b, h)
        rowstats = (LSE + (b * H + h) * T, DELTA + (b * H + h) * T)
        if CAUSAL:
            # Query rows >= this key block's start see it; the first BLOCK_N rows need the mask.
            start = pid_n * BLOCK_N
            hi = tl.minimum(start + BLOCK_N, T)
            grads = _dkdv_inner(grads, kv, q, do, rowstats, cols, start, hi, T, qk_scale, HEAD_DIM, BLOCK_M, True, DT,
                                PREC)  # fmt: skip
            grads = _dkdv_inner(grads, kv, q, do, rowstats, cols, start + BLOCK_N, T, T, qk_scale, HEAD_DIM, BLOCK_M,
                                False, DT, PREC)  # fmt: skip
        else:
            grads = _dkdv_inner(grads, kv, q, do, rowstats, cols, 0, T, T, qk_scale, HEAD_DIM, BLOCK_M, False, DT, PREC)
    dk, dv = grads
    _store_tile(_head(DK, sdk, b, hk), offs_n, S, offs_d, HEAD_DIM, dk * sm_scale)
    _store_tile(_head(DV, sdv, b, hk), offs_n, S, offs_d, HEAD_DIM, dv)


@triton.jit
def _dq_inner(dq, q, do, rowstats, k, v, rows, lo, hi, S, qk_scale, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
              MASK_CAUSAL: tl.constexpr, MASK_S: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """dQ of the query block `rows` = (offs_m, offs_d) from keys [lo, hi): q / do its blocks,
    rowstats = (lse, delta) of its rows, k / v the kv head's matrices."""
    offs_m, offs_d = rows
    lse, delta = rowstats
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kT = _tile(k, offs_n, S, offs_d, HEAD_DIM, True).to(DT)
        vT = _tile(v, offs_n, S, offs_d, HEAD_DIM, True).to(DT)
        qk = tl.dot(q, kT, input_precision=PREC) * qk_scale
        p = tl.exp2(qk - lse[:, None])
        if MASK_CAUSAL:
            p = tl.where(offs_m[:, None] >= offs_n[None, :], p, 0.0)
        if MASK_S:
            p = tl.where((offs_n < S)[None, :], p, 0.0)
        dp = tl.dot(do, vT, input_precision=PREC)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(DT), tl.trans(kT), input_precision=PREC)
    return dq


@triton.jit
def _attn_bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, sq, sk, sv, sdo, sdq, H, T, S, GROUP, qk_scale, sm_scale,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, MASK_S: tl.constexpr,
                 DT: tl.constexpr, PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_D))
    offs_m, offs_d = rows
    m_ok = offs_m < T
    q = _tile(_head(Q, sq, b, h), offs_m, T, offs_d, HEAD_DIM, False).to(DT)
    do = _tile(_head(DO, sdo, b, h), offs_m, T, offs_d, HEAD_DIM, False).to(DT)
    rowstats = (
        tl.load(LSE + pid_bh.to(tl.int64) * T + offs_m, mask=m_ok, other=float("inf")),
        tl.load(DELTA + pid_bh.to(tl.int64) * T + offs_m, mask=m_ok, other=0.0),
    )
    k, v = _head(K, sk, b, h // GROUP), _head(V, sv, b, h // GROUP)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if CAUSAL:
        diag = pid_m * BLOCK_M
        dq = _dq_inner(dq, q, do, rowstats, k, v, rows, 0, diag, S, qk_scale, HEAD_DIM, BLOCK_N, False, False, DT, PREC)
        hi = tl.minimum(diag + BLOCK_M, S)
        dq = _dq_inner(dq, q, do, rowstats, k, v, rows, diag, hi, S, qk_scale, HEAD_DIM, BLOCK_N, True, True, DT, PREC)
    else:
        dq = _dq_inner(dq, q, do, rowstats, k, v, rows, 0, S, S, qk_scale, HEAD_DIM, BLOCK_N, False, MASK_S, DT, PREC)
    _store_tile(_head(DQ, sdq, b, h), offs_m, T, offs_d, HEAD_DIM, dq * sm_scale)


# --- launchers -------------------------------------------------------------------------------------
# GPU launch configurations, autotuned per (T, S, head dim, causal) and dtype. Candidates follow the
# Triton fused-attention tutorial's Hopper settings; configs that do not fit are skipped by the tuner.
def _cfgs(pairs):
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in pairs]


_attn_fwd_tuned = triton.autotune(
    _cfgs([(128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 4), (64, 64, 4, 4), (128, 32, 4, 4)]),
    key=["T", "S", "HEAD_DIM", "CAUSAL"],
)(_attn_fwd)
_attn_bwd_dkdv_tuned = triton.autotune(
    _cfgs([(32, 128, 8, 3), (64, 128, 8, 3), (32, 64, 8, 3), (64, 64, 8, 2), (16, 64, 4, 4)]),
    key=["T", "S", "HEAD_DIM", "CAUSAL", "GROUP"],
)(_attn_bwd_dkdv)
_attn_bwd_dq_tuned = triton.autotune(
    _cfgs([(128, 32, 4, 5), (128, 32, 8, 3), (128, 64, 8, 3), (64, 32, 4, 3), (64, 16, 4, 4)]),
    key=["T", "S", "HEAD_DIM", "CAUSAL"],
)(_attn_bwd_dq)


@dataclass(frozen=True, slots=True)
class _Problem:
    """The shapes and scalars every launch of one attention call shares."""

    B: int
    H: int  # query heads
    HK: int  # kv heads
    T: int  # query length
    S: int  # key length
    D: int  # head dim
    sm_scale: float
    interp: bool  # Triton interpreter (CPU tensors): fixed small blocks instead of the autotuner
    dt: object  # tl dtype of the tl.dot operands
    prec: str  # tl.dot input precision

    @classmethod
    def of(cls, q: torch.Tensor, k: torch.Tensor) -> _Problem:
        B, H, T, D = q.shape
        return cls(B, H, k.shape[1], T, k.shape[2], D, 1.0 / math.sqrt(D), interpreting(q), dot_dtype(q),
                   dot_precision(q))  # fmt: skip

    @property
    def group(self) -> int:
        return self.H // self.HK

    @property
    def block_d(self) -> int:
        # Head dims pad to a power of two, and to >= 16: tl.dot on a GPU needs K >= 16.
        return max(16, next_pow2(self.D))

    def mask_s(self, interp_blocks: dict) -> bool:
        """Whether key blocks can run past S (S not a multiple of every candidate BLOCK_N)."""
        return self.S % (interp_blocks["BLOCK_N"] if self.interp else 128) != 0

    def launch(self, kernel, tuned, interp_blocks: dict, grid_fn, *args) -> None:
        if self.interp:
            kernel[grid_fn(interp_blocks)](*args, **interp_blocks)
        else:
            tuned[grid_fn](*args)


def _forward(q, k, v, causal: bool):
    p = _Problem.of(q, k)
    o = torch.empty((p.B, p.H, p.T, p.D), device=q.device, dtype=q.dtype)
    lse = torch.empty((p.B * p.H, p.T), device=q.device, dtype=torch.float32)
    grid = lambda meta: (triton.cdiv(p.T, meta["BLOCK_M"]), p.B * p.H)
    p.launch(_attn_fwd, _attn_fwd_tuned, _INTERP_FWD, grid,
             q, k, v, o, lse, q.stride(), k.stride(), v.stride(), o.stride(), p.H, p.T, p.S, p.group,
             p.sm_scale * _LOG2E, p.D, p.block_d, causal, p.mask_s(_INTERP_FWD), p.dt, p.prec)  # fmt: skip
    return o, lse


def _backward(q, k, v, o, lse, do, causal: bool):
    p = _Problem.of(q, k)
    delta = torch.empty_like(lse)
    _attn_bwd_delta[(triton.cdiv(p.T, 64), p.B * p.H)](o, do, delta, o.stride(), do.stride(), p.H, p.T, p.D,
                                                       p.block_d, 64)  # fmt: skip
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    grid = lambda meta: (triton.cdiv(p.S, meta["BLOCK_N"]), p.B * p.HK)
    p.launch(_attn_bwd_dkdv, _attn_bwd_dkdv_tuned, _INTERP_DKDV, grid,
             q, k, v, do, lse, delta, dk, dv, q.stride(), k.stride(), v.stride(), do.stride(), dk.stride(),
             dv.stride(), p.H, p.HK, p.T, p.S, p.group, p.sm_scale * _LOG2E, p.sm_scale, p.D, p.block_d, causal,
             p.dt, p.prec)  # fmt: skip
    grid = lambda meta: (triton.cdiv(p.T, meta["BLOCK_M"]), p.B * p.H)
    p.launch(_attn_bwd_dq, _attn_bwd_dq_tuned, _INTERP_DQ, grid,
             q, k, v, do, lse, delta, dq, q.stride(), k.stride(), v.stride(), do.stride(), dq.stride(), p.H, p.T,
             p.S, p.group, p.sm_scale * _LOG2E, p.sm_scale, p.D, p.block_d, causal, p.mask_s(_INTERP_DQ), p.dt,
             p.prec)  # fmt: skip
    return dq, dk, dv


# --- autograd --------------------------------------------------------------------------------------
class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal: bool):
        o, lse = _forward(q, k, v, causal)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal = causal
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _backward(q, k, v, o, lse, do, ctx.causal)
        return dq, dk, dv, None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """Flash attention, the reference's contract: q [B, Hq, T, Dh], k/v [B, Hk, S, Dh] -> [B, Hq, T, Dh]."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"attention wants 4-d q/k/v [B, H, T, Dh], got {q.shape}, {k.shape}, {v.shape}")
    B, H, T, D = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k/v shapes {tuple(k.shape)}, {tuple(v.shape)} do not match q {tuple(q.shape)}")
    if H % k.shape[1]:
        raise ValueError(f"query heads {H} not a multiple of kv heads {k.shape[1]}")
    if causal and k.shape[2] != T:
        raise ValueError(f"causal attention needs T == S (self-attention), got T={T}, S={k.shape[2]}")
    if D > 256:
        raise ValueError(f"head dim {D} > 256 is not supported by the Triton attention kernel")
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_dtype(name, t)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q/k/v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    return _FlashAttention.apply(q, k, v, causal)
