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

Run the checks: `pytest tests/test_kernels_attention.py` (CPU, TRITON_INTERPRET=1).
"""

from __future__ import annotations

import math

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


@triton.jit
def _fwd_inner(
    acc,
    l_i,
    m_i,
    q,
    k_base,
    v_base,
    sk_t,
    sk_d,
    sv_t,
    sv_d,
    offs_m,
    offs_d,
    lo,
    hi,
    S,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASK_CAUSAL: tl.constexpr,
    MASK_S: tl.constexpr,
    DT: tl.constexpr,
    PREC: tl.constexpr,
):
    d_ok = offs_d < HEAD_DIM
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_ok = offs_n < S
        kT = tl.load(
            k_base + offs_n[None, :] * sk_t + offs_d[:, None] * sk_d,
            mask=n_ok[None, :] & d_ok[:, None],
            other=0.0,
        )
        v = tl.load(
            v_base + offs_n[:, None] * sv_t + offs_d[None, :] * sv_d,
            mask=n_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        qk = tl.dot(q, kT.to(DT), input_precision=PREC) * qk_scale
        if MASK_CAUSAL:
            qk = tl.where(offs_m[:, None] >= offs_n[None, :], qk, float("-inf"))
        if MASK_S:
            qk = tl.where(n_ok[None, :], qk, float("-inf"))
        # Online softmax; every row sees key 0 in its first block, so m_new is finite.
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(DT), v.to(DT), input_precision=PREC)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attn_fwd(
    Q,
    K,
    V,
    Out,
    LSE,
    sq_b,
    sq_h,
    sq_t,
    sq_d,
    sk_b,
    sk_h,
    sk_t,
    sk_d,
    sv_b,
    sv_h,
    sv_t,
    sv_d,
    so_b,
    so_h,
    so_t,
    so_d,
    H,
    T,
    S,
    GROUP,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr,
    MASK_S: tl.constexpr,
    DT: tl.constexpr,
    PREC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    hk = h // GROUP
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < T
    d_ok = offs_d < HEAD_DIM
    q = tl.load(
        Q + b * sq_b + h * sq_h + offs_m[:, None] * sq_t + offs_d[None, :] * sq_d,
        mask=m_ok[:, None] & d_ok[None, :],
        other=0.0,
    ).to(DT)
    k_base = K + b * sk_b + hk * sk_h
    v_base = V + b * sv_b + hk * sv_h
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if CAUSAL:
        # Keys below the diagonal block: no mask (they are < T == S). Then the diagonal block.
        diag = pid_m * BLOCK_M
        acc, l_i, m_i = _fwd_inner(
            acc,
            l_i,
            m_i,
            q,
            k_base,
            v_base,
            sk_t,
            sk_d,
            sv_t,
            sv_d,
            offs_m,
            offs_d,
            0,
            diag,
            S,
            qk_scale,
            HEAD_DIM,
            BLOCK_N,
            False,
            False,
            DT,
            PREC,
        )
        acc, l_i, m_i = _fwd_inner(
            acc,
            l_i,
            m_i,
            q,
            k_base,
            v_base,
            sk_t,
            sk_d,
            sv_t,
            sv_d,
            offs_m,
            offs_d,
            diag,
            tl.minimum(diag + BLOCK_M, S),
            S,
            qk_scale,
            HEAD_DIM,
            BLOCK_N,
            True,
            True,
            DT,
            PREC,
        )
    else:
        acc, l_i, m_i = _fwd_inner(
            acc,
            l_i,
            m_i,
            q,
            k_base,
            v_base,
            sk_t,
            sk_d,
            sv_t,
            sv_d,
            offs_m,
            offs_d,
            0,
            S,
            S,
            qk_scale,
            HEAD_DIM,
            BLOCK_N,
            False,
            MASK_S,
            DT,
            PREC,
        )
    acc = acc / l_i[:, None]
    tl.store(LSE + pid_bh.to(tl.int64) * T + offs_m, m_i + tl.log2(l_i), mask=m_ok)
    tl.store(
        Out + b * so_b + h * so_h + offs_m[:, None] * so_t + offs_d[None, :] * so_d,
        acc.to(Out.dtype.element_ty),
        mask=m_ok[:, None] & d_ok[None, :],
    )


@triton.jit
def _attn_bwd_delta(
    Out,
    DO,
    DELTA,
    so_b,
    so_h,
    so_t,
    so_d,
    sdo_b,
    sdo_h,
    sdo_t,
    sdo_d,
    H,
    T,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    # delta_i = sum_d O[i, d] * dO[i, d] (fp32): the softmax-backward correction term.
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m < T)[:, None] & (offs_d < HEAD_DIM)[None, :]
    o = tl.load(Out + b * so_b + h * so_h + offs_m[:, None] * so_t + offs_d[None, :] * so_d, mask=mask, other=0.0)
    do = tl.load(DO + b * sdo_b + h * sdo_h + offs_m[:, None] * sdo_t + offs_d[None, :] * sdo_d, mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(DELTA + pid_bh.to(tl.int64) * T + offs_m, delta, mask=offs_m < T)


@triton.jit
def _dkdv_inner(
    dk,
    dv,
    k,
    v,
    q_base,
    do_base,
    lse_base,
    delta_base,
    sq_t,
    sq_d,
    sdo_t,
    sdo_d,
    offs_n,
    offs_d,
    lo,
    hi,
    T,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    MASK_CAUSAL: tl.constexpr,
    DT: tl.constexpr,
    PREC: tl.constexpr,
):
    d_ok = offs_d < HEAD_DIM
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        m_ok = offs_m < T
        qT = tl.load(
            q_base + offs_m[None, :] * sq_t + offs_d[:, None] * sq_d,
            mask=m_ok[None, :] & d_ok[:, None],
            other=0.0,
        ).to(DT)
        do = tl.load(
            do_base + offs_m[:, None] * sdo_t + offs_d[None, :] * sdo_d,
            mask=m_ok[:, None] & d_ok[None, :],
            other=0.0,
        ).to(DT)
        # lse = +inf past the end makes p = 0 for padded query rows.
        lse = tl.load(lse_base + offs_m, mask=m_ok, other=float("inf"))
        delta = tl.load(delta_base + offs_m, mask=m_ok, other=0.0)
        qkT = tl.dot(k, qT, input_precision=PREC) * qk_scale  # [BLOCK_N, BLOCK_M]
        pT = tl.exp2(qkT - lse[None, :])
        if MASK_CAUSAL:
            pT = tl.where(offs_m[None, :] >= offs_n[:, None], pT, 0.0)
        dv += tl.dot(pT.to(DT), do, input_precision=PREC)
        dpT = tl.dot(v, tl.trans(do), input_precision=PREC)
        dsT = pT * (dpT - delta[None, :])
        dk += tl.dot(dsT.to(DT), tl.trans(qT), input_precision=PREC)
    return dk, dv


@triton.jit
def _attn_bwd_dkdv(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DK,
    DV,
    sq_b,
    sq_h,
    sq_t,
    sq_d,
    sk_b,
    sk_h,
    sk_t,
    sk_d,
    sv_b,
    sv_h,
    sv_t,
    sv_d,
    sdo_b,
    sdo_h,
    sdo_t,
    sdo_d,
    sdk_b,
    sdk_h,
    sdk_t,
    sdk_d,
    sdv_b,
    sdv_h,
    sdv_t,
    sdv_d,
    H,
    HK,
    T,
    S,
    GROUP,
    qk_scale,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr,
    DT: tl.constexpr,
    PREC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_bhk = tl.program_id(1)
    b = (pid_bhk // HK).to(tl.int64)
    hk = (pid_bhk % HK).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    kv_mask = (offs_n < S)[:, None] & (offs_d < HEAD_DIM)[None, :]
    k = tl.load(K + b * sk_b + hk * sk_h + offs_n[:, None] * sk_t + offs_d[None, :] * sk_d, mask=kv_mask, other=0.0).to(
        DT
    )
    v = tl.load(V + b * sv_b + hk * sv_h + offs_n[:, None] * sv_t + offs_d[None, :] * sv_d, mask=kv_mask, other=0.0).to(
        DT
    )
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    # The query heads sharing this kv head are summed here, so GQA needs no atomics.
    for g in range(0, GROUP):
        h = hk * GROUP + g
        q_base = Q + b * sq_b + h * sq_h
        do_base = DO + b * sdo_b + h * sdo_h
        lse_base = LSE + (b * H + h) * T
        delta_base = DELTA + (b * H + h) * T
        if CAUSAL:
            # Query rows >= this key block's start see it; the first BLOCK_N rows need the mask.
            start = pid_n * BLOCK_N
            dk, dv = _dkdv_inner(
                dk,
                dv,
                k,
                v,
                q_base,
                do_base,
                lse_base,
                delta_base,
                sq_t,
                sq_d,
                sdo_t,
                sdo_d,
                offs_n,
                offs_d,
                start,
                tl.minimum(start + BLOCK_N, T),
                T,
                qk_scale,
                HEAD_DIM,
                BLOCK_M,
                True,
                DT,
                PREC,
            )
            dk, dv = _dkdv_inner(
                dk,
                dv,
                k,
                v,
                q_base,
                do_base,
                lse_base,
                delta_base,
                sq_t,
                sq_d,
                sdo_t,
                sdo_d,
                offs_n,
                offs_d,
                start + BLOCK_N,
                T,
                T,
                qk_scale,
                HEAD_DIM,
                BLOCK_M,
                False,
                DT,
                PREC,
            )
        else:
            dk, dv = _dkdv_inner(
                dk,
                dv,
                k,
                v,
                q_base,
                do_base,
                lse_base,
                delta_base,
                sq_t,
                sq_d,
                sdo_t,
                sdo_d,
                offs_n,
                offs_d,
                0,
                T,
                T,
                qk_scale,
                HEAD_DIM,
                BLOCK_M,
                False,
                DT,
                PREC,
            )
    dk = dk * sm_scale
    tl.store(
        DK + b * sdk_b + hk * sdk_h + offs_n[:, None] * sdk_t + offs_d[None, :] * sdk_d,
        dk.to(DK.dtype.element_ty),
        mask=kv_mask,
    )
    tl.store(
        DV + b * sdv_b + hk * sdv_h + offs_n[:, None] * sdv_t + offs_d[None, :] * sdv_d,
        dv.to(DV.dtype.element_ty),
        mask=kv_mask,
    )


@triton.jit
def _dq_inner(
    dq,
    q,
    do,
    lse,
    delta,
    k_base,
    v_base,
    sk_t,
    sk_d,
    sv_t,
    sv_d,
    offs_m,
    offs_d,
    lo,
    hi,
    S,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASK_CAUSAL: tl.constexpr,
    MASK_S: tl.constexpr,
    DT: tl.constexpr,
    PREC: tl.constexpr,
):
    d_ok = offs_d < HEAD_DIM
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_ok = offs_n < S
        kT = tl.load(
            k_base + offs_n[None, :] * sk_t + offs_d[:, None] * sk_d,
            mask=n_ok[None, :] & d_ok[:, None],
            other=0.0,
        ).to(DT)
        vT = tl.load(
            v_base + offs_n[None, :] * sv_t + offs_d[:, None] * sv_d,
            mask=n_ok[None, :] & d_ok[:, None],
            other=0.0,
        ).to(DT)
        qk = tl.dot(q, kT, input_precision=PREC) * qk_scale
        p = tl.exp2(qk - lse[:, None])
        if MASK_CAUSAL:
            p = tl.where(offs_m[:, None] >= offs_n[None, :], p, 0.0)
        if MASK_S:
            p = tl.where(n_ok[None, :], p, 0.0)
        dp = tl.dot(do, vT, input_precision=PREC)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(DT), tl.trans(kT), input_precision=PREC)
    return dq


@triton.jit
def _attn_bwd_dq(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DQ,
    sq_b,
    sq_h,
    sq_t,
    sq_d,
    sk_b,
    sk_h,
    sk_t,
    sk_d,
    sv_b,
    sv_h,
    sv_t,
    sv_d,
    sdo_b,
    sdo_h,
    sdo_t,
    sdo_d,
    sdq_b,
    sdq_h,
    sdq_t,
    sdq_d,
    H,
    T,
    S,
    GROUP,
    qk_scale,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr,
    MASK_S: tl.constexpr,
    DT: tl.constexpr,
    PREC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    hk = h // GROUP
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < T
    mask = m_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    q = tl.load(Q + b * sq_b + h * sq_h + offs_m[:, None] * sq_t + offs_d[None, :] * sq_d, mask=mask, other=0.0).to(DT)
    do = tl.load(
        DO + b * sdo_b + h * sdo_h + offs_m[:, None] * sdo_t + offs_d[None, :] * sdo_d, mask=mask, other=0.0
    ).to(DT)
    lse = tl.load(LSE + pid_bh.to(tl.int64) * T + offs_m, mask=m_ok, other=float("inf"))
    delta = tl.load(DELTA + pid_bh.to(tl.int64) * T + offs_m, mask=m_ok, other=0.0)
    k_base = K + b * sk_b + hk * sk_h
    v_base = V + b * sv_b + hk * sv_h
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if CAUSAL:
        diag = pid_m * BLOCK_M
        dq = _dq_inner(
            dq,
            q,
            do,
            lse,
            delta,
            k_base,
            v_base,
            sk_t,
            sk_d,
            sv_t,
            sv_d,
            offs_m,
            offs_d,
            0,
            diag,
            S,
            qk_scale,
            HEAD_DIM,
            BLOCK_N,
            False,
            False,
            DT,
            PREC,
        )
        dq = _dq_inner(
            dq,
            q,
            do,
            lse,
            delta,
            k_base,
            v_base,
            sk_t,
            sk_d,
            sv_t,
            sv_d,
            offs_m,
            offs_d,
            diag,
            tl.minimum(diag + BLOCK_M, S),
            S,
            qk_scale,
            HEAD_DIM,
            BLOCK_N,
            True,
            True,
            DT,
            PREC,
        )
    else:
        dq = _dq_inner(
            dq,
            q,
            do,
            lse,
            delta,
            k_base,
            v_base,
            sk_t,
            sk_d,
            sv_t,
            sv_d,
            offs_m,
            offs_d,
            0,
            S,
            S,
            qk_scale,
            HEAD_DIM,
            BLOCK_N,
            False,
            MASK_S,
            DT,
            PREC,
        )
    dq = dq * sm_scale
    tl.store(
        DQ + b * sdq_b + h * sdq_h + offs_m[:, None] * sdq_t + offs_d[None, :] * sdq_d,
        dq.to(DQ.dtype.element_ty),
        mask=mask,
    )


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


def _block_d(head_dim: int) -> int:
    # Head dims pad to a power of two, and to >= 16: tl.dot on a GPU needs K >= 16.
    return max(16, next_pow2(head_dim))


def _launch(kernel, tuned, interp_blocks, grid_fn, args, interp: bool):
    if interp:
        kernel[grid_fn(interp_blocks)](*args, **interp_blocks)
    else:
        tuned[grid_fn](*args)


def _forward(q, k, v, causal: bool):
    B, H, T, D = q.shape
    HK, S = k.shape[1], k.shape[2]
    o = torch.empty((B, H, T, D), device=q.device, dtype=q.dtype)
    lse = torch.empty((B * H, T), device=q.device, dtype=torch.float32)
    sm_scale = 1.0 / math.sqrt(D)
    interp = interpreting(q)
    even_s = S % (_INTERP_FWD["BLOCK_N"] if interp else 128) == 0
    args = (
        q,
        k,
        v,
        o,
        lse,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *o.stride(),
        H,
        T,
        S,
        H // HK,
        sm_scale * _LOG2E,
        D,
        _block_d(D),
        causal,
        not even_s,
        dot_dtype(q),
        dot_precision(q),
    )
    grid = lambda meta: (triton.cdiv(T, meta["BLOCK_M"]), B * H)
    _launch(_attn_fwd, _attn_fwd_tuned, _INTERP_FWD, grid, args, interp)
    return o, lse


def _backward(q, k, v, o, lse, do, causal: bool):
    B, H, T, D = q.shape
    HK, S = k.shape[1], k.shape[2]
    sm_scale = 1.0 / math.sqrt(D)
    interp = interpreting(q)
    dt, prec, bd = dot_dtype(q), dot_precision(q), _block_d(D)
    delta = torch.empty_like(lse)
    _attn_bwd_delta[(triton.cdiv(T, 64), B * H)](o, do, delta, *o.stride(), *do.stride(), H, T, D, bd, 64)
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    args = (
        q,
        k,
        v,
        do,
        lse,
        delta,
        dk,
        dv,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *do.stride(),
        *dk.stride(),
        *dv.stride(),
        H,
        HK,
        T,
        S,
        H // HK,
        sm_scale * _LOG2E,
        sm_scale,
        D,
        bd,
        causal,
        dt,
        prec,
    )
    grid = lambda meta: (triton.cdiv(S, meta["BLOCK_N"]), B * HK)
    _launch(_attn_bwd_dkdv, _attn_bwd_dkdv_tuned, _INTERP_DKDV, grid, args, interp)
    even_s = S % (_INTERP_DQ["BLOCK_N"] if interp else 128) == 0
    args = (
        q,
        k,
        v,
        do,
        lse,
        delta,
        dq,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *do.stride(),
        *dq.stride(),
        H,
        T,
        S,
        H // HK,
        sm_scale * _LOG2E,
        sm_scale,
        D,
        bd,
        causal,
        not even_s,
        dt,
        prec,
    )
    grid = lambda meta: (triton.cdiv(T, meta["BLOCK_M"]), B * H)
    _launch(_attn_bwd_dq, _attn_bwd_dq_tuned, _INTERP_DQ, grid, args, interp)
    return dq, dk, dv


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
