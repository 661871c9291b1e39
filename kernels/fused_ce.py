"""Fused linear + cross-entropy (+ optional z-loss) that never holds the full [tokens x vocab] logits.

Contract as the reference (imported here as `fused_linear_cross_entropy_reference`):
  loss = mean over non-ignored tokens of  CE(hidden @ weight.T, target) + z_loss * lse^2
hidden [N, D], weight [V, D], targets [N]. Returns a float32 scalar.

How (the Liger-Kernel scheme): the forward walks over chunks of tokens. For each chunk
  1. logits = hidden_chunk @ weight.T with a torch matmul (cuBLAS), upcast to fp32: [chunk, V];
  2. a Triton kernel, one program per token, computes the log-sum-exp online over vocab blocks, the
     token's loss, and then overwrites its logits row in place with d loss / d logits
     = (softmax * (1 + 2 z lse) - onehot(target)) / n_valid   (0 for ignored tokens);
  3. torch matmuls turn that into grad_hidden_chunk = dlogits @ weight and accumulate
     grad_weight += dlogits.T @ hidden_chunk (in the weight's dtype, as Liger does).
So the forward already holds both gradients; the backward only scales them by grad_output. Peak
extra memory is one [chunk, V] fp32 logits block (plus its low-precision copy) and grad_weight,
instead of several [N, V] tensors. The matmuls stay in torch on purpose: cuBLAS is as fast as it
gets there; what is fused is everything between them (softmax, CE, z-loss, the logits gradient).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from scalelab.kernels._common import check_dtype, interpreting
from scalelab.kernels.reference import fused_linear_cross_entropy as fused_linear_cross_entropy_reference

__all__ = ["fused_linear_cross_entropy", "fused_linear_cross_entropy_reference", "default_chunk_size"]

# Bytes of one fp32 logits chunk that default_chunk_size aims for (512 MiB: 1024 tokens at V=128k).
_CHUNK_LOGITS_BYTES = 512 * 2**20


@triton.jit
def _ce_rows(
    LOGITS,
    TARGETS,
    LOSS,
    SCALE,
    stride_row,
    V,
    ignore_index,
    z_loss,
    HAS_Z: tl.constexpr,
    COMPUTE_GRAD: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    base = LOGITS + row * stride_row
    target = tl.load(TARGETS + row).to(tl.int64)
    valid = target != ignore_index
    # Pass 1: online max and sum of exp over the vocab, in fp32.
    m = float("-inf")
    acc = 0.0
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        acc = acc * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    lse = m + tl.log(acc)
    x_target = tl.load(base + target, mask=valid, other=0.0).to(tl.float32)
    loss = lse - x_target
    if HAS_Z:
        loss += z_loss * lse * lse
    tl.store(LOSS + row, tl.where(valid, loss, 0.0))
    if COMPUTE_GRAD:
        # Pass 2: overwrite the row with d(sum of losses)/d logits times SCALE (= 1 / n_valid).
        scale = tl.where(valid, tl.load(SCALE), 0.0)
        coef = 1.0
        if HAS_Z:
            coef = 1.0 + 2.0 * z_loss * lse  # d(z * lse^2)/dx = 2 z lse * softmax
        for start in range(0, V, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            x = tl.load(base + cols, mask=cols < V, other=0.0).to(tl.float32)
            g = tl.exp(x - lse) * coef - tl.where(cols == target, 1.0, 0.0)
            tl.store(base + cols, (g * scale).to(LOGITS.dtype.element_ty), mask=cols < V)


def default_chunk_size(num_tokens: int, vocab_size: int) -> int:
    """Tokens per chunk: a power of two whose fp32 logits block is about 512 MiB (16..4096 tokens)."""
    rows = max(16, min(4096, _CHUNK_LOGITS_BYTES // (4 * vocab_size)))
    rows = 1 << (rows.bit_length() - 1)
    return max(1, min(rows, num_tokens))


def _block_v(vocab_size: int, interp: bool) -> int:
    # The interpreter pays per op, not per element: bigger blocks are faster there.
    return min(triton.next_power_of_2(vocab_size), 4096 if interp else 2048)


def _fused_forward(hidden, weight, targets, z_loss, ignore_index, chunk_size, need_dh, need_dw):
    n, _ = hidden.shape
    v = weight.shape[0]
    chunk = default_chunk_size(n, v) if chunk_size is None else max(1, min(chunk_size, n))
    valid = targets != ignore_index
    n_valid = valid.sum().clamp(min=1)
    scale = (1.0 / n_valid.to(torch.float32)).reshape(1)  # stays on device: no host sync
    loss_rows = torch.empty(n, device=hidden.device, dtype=torch.float32)
    grad_hidden = torch.empty_like(hidden) if need_dh else None
    grad_weight = torch.zeros_like(weight) if need_dw else None
    compute_grad = need_dh or need_dw
    interp = interpreting(hidden)
    # Matmuls run in hidden's dtype (a bf16 copy of an fp32 weight, made once, as autocast would).
    w_mm = weight if weight.dtype == hidden.dtype else weight.to(hidden.dtype)
    for start in range(0, n, chunk):
        end = min(start + chunk, n)
        h = hidden[start:end]
        logits = (h @ w_mm.t()).float()  # fp32 [chunk, V]: CE and its gradient in full precision
        _ce_rows[(end - start,)](
            logits,
            targets[start:end],
            loss_rows[start:end],
            scale,
            logits.stride(0),
            v,
            ignore_index,
            float(z_loss),
            bool(z_loss),
            compute_grad,
            _block_v(v, interp),
            num_warps=8,
        )
        if compute_grad:
            dlogits = logits.to(hidden.dtype)
            del logits
            if need_dh:
                torch.mm(dlogits, w_mm, out=grad_hidden[start:end])
            if need_dw:
                grad_weight.addmm_(dlogits.t().to(weight.dtype), h.to(weight.dtype))
    loss = loss_rows.sum() / n_valid
    return loss, grad_hidden, grad_weight


class _FusedLinearCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, z_loss, ignore_index, chunk_size):
        loss, dh, dw = _fused_forward(
            hidden,
            weight,
            targets,
            z_loss,
            ignore_index,
            chunk_size,
            ctx.needs_input_grad[0],
            ctx.needs_input_grad[1],
        )
        # Intermediates may be saved (Liger does the same); the backward scales them in place once,
        # so a second backward through this graph fails autograd's version check instead of
        # silently double-scaling.
        ctx.save_for_backward(dh, dw)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        dh, dw = ctx.saved_tensors
        go = grad_output.to(torch.float32)
        if dh is not None:
            dh = dh.mul_(go.to(dh.dtype))
        if dw is not None:
            dw = dw.mul_(go.to(dw.dtype))
        return dh, dw, None, None, None, None


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    z_loss: float = 0.0,
    ignore_index: int = -100,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Chunked fused linear + CE (+ z-loss) with the reference's signature; chunk_size None = automatic."""
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        shapes = f"{tuple(hidden.shape)}, {tuple(weight.shape)}"
        raise ValueError(f"want hidden [N, D], weight [V, D]; got {shapes}")
    if targets.shape != (hidden.shape[0],):
        raise ValueError(f"targets shape {tuple(targets.shape)} != ({hidden.shape[0]},)")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be >= 1 (or None for automatic)")
    check_dtype("hidden", hidden)
    check_dtype("weight", weight)
    if interpreting(hidden) and targets.numel():
        # Out-of-range ids would read outside the row; cheap to check on CPU (no device sync there).
        bad = (targets != ignore_index) & ((targets < 0) | (targets >= weight.shape[0]))
        if bool(bad.any()):
            raise ValueError(f"targets hold ids outside [0, {weight.shape[0]}) other than ignore_index")
    return _FusedLinearCE.apply(hidden, weight, targets.contiguous(), float(z_loss), ignore_index, chunk_size)
