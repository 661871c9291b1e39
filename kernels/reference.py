"""Plain-torch reference implementations of every fused kernel.

These are the numerical contract: each Triton kernel in this folder is tested against the function
of the same name here, and on CPU (or with `kernels: torch`) the model runs these directly.

Shapes follow the model's layout:
  rms_norm:   x [..., D], weight [D]
  swiglu:     gate, up [..., F]
  apply_rope: q [B, T, Hq, Dh], k [B, T, Hk, Dh], cos/sin [T, Dh//2] (pairs are (2i, 2i+1)... see below)
  attention:  q [B, Hq, T, Dh], k/v [B, Hk, T, Dh] (GQA when Hq > Hk), causal
  fused_linear_cross_entropy: hidden [N, D], weight [V, D], targets [N] (ignore_index skipped)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm: x / sqrt(mean(x^2) + eps) * weight, computed in fp32 and cast back.

    With `residual`, first forms s = x + residual and returns (rms_norm(s), s): the fused
    "add & norm" of a pre-norm block, where s is the new residual stream.
    """
    if residual is not None:
        s = x + residual
        return rms_norm(s, weight, eps), s
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU activation: silu(gate) * up."""
    return F.silu(gate) * up


def rope_cos_sin(
    seq_len: int, head_dim: int, theta: float = 10000.0, device=None, dtype=torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [seq_len, head_dim // 2] for rotary embeddings (Llama convention, base theta)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float64) / head_dim))
    t = torch.arange(seq_len, device=device, dtype=torch.float64)
    freqs = torch.outer(t, inv_freq)
    return freqs.cos().to(dtype), freqs.sin().to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # Half-split convention (as Hugging Face Llama): the rotated pairs are (i, i + Dh/2).
    # cos/sin: [T, Dh/2] broadcast over batch and heads.
    d2 = x.shape[-1] // 2
    x1, x2 = x[..., :d2].float(), x[..., d2:].float()
    c = cos[None, :, None, :].float()
    s = sin[None, :, None, :].float()
    out = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
    return out.to(x.dtype)


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding on q [B, T, Hq, Dh] and k [B, T, Hk, Dh] with cos/sin [T, Dh/2]."""
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """Scaled dot-product attention, q [B, Hq, T, Dh], k/v [B, Hk, S, Dh]; GQA by repeating k/v heads."""
    hq, hk = q.shape[1], k.shape[1]
    if hq != hk:
        rep = hq // hk
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    z_loss: float = 0.0,
    ignore_index: int = -100,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Mean cross-entropy of logits = hidden @ weight.T against targets, plus z_loss * mean(lse^2).

    Args:
        hidden: [N, D] final hidden states.
        weight: [V, D] output projection.
        targets: [N] token ids; positions equal to `ignore_index` are excluded from the mean.
        z_loss: weight of the PaLM-style log-partition penalty.
        chunk_size: if given, logits are formed chunk by chunk over tokens under activation
            checkpointing so that at most [chunk_size, V] logits live at once (the CPU path of the
            memory-saving variant); None forms the full [N, V] logits.
    Returns:
        Scalar loss (cross-entropy + z-loss) averaged over non-ignored tokens.
    """
    valid = targets != ignore_index
    n_valid = valid.sum().clamp(min=1)
    if chunk_size is None or chunk_size >= hidden.shape[0]:
        return _ce_chunk(hidden, weight, targets, z_loss, ignore_index) / n_valid
    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, hidden.shape[0], chunk_size):
        sl = slice(start, start + chunk_size)
        total = total + torch.utils.checkpoint.checkpoint(
            _ce_chunk, hidden[sl], weight, targets[sl], z_loss, ignore_index, use_reentrant=False
        )
    return total / n_valid


def _ce_chunk(hidden, weight, targets, z_loss: float, ignore_index: int) -> torch.Tensor:
    """Summed (not averaged) CE + z-loss over one chunk of tokens, in fp32."""
    logits = (hidden @ weight.t()).float()
    ce = F.cross_entropy(logits, targets, ignore_index=ignore_index, reduction="sum")
    if z_loss:
        lse = torch.logsumexp(logits, dim=-1)
        valid = targets != ignore_index
        ce = ce + z_loss * (lse.pow(2) * valid).sum()
    return ce
