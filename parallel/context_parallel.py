"""Context parallel, written by hand: causal attention with the sequence sharded over a `cp` axis.

    apply_cp(model, mesh["cp"], variant="allgather")      # or "ring"
    tokens_l, targets_l, positions = shard_sequence_batch(tokens, targets, cp_rank, cp)
    logits_l = model(tokens_l, positions)                 # [B, T/cp, V]: this rank's tokens only

(torch's native `context_parallel` has no CPU sharding rule for SDPA, so it cannot run on gloo.)

Load balancing (head-tail): the sequence is cut into 2·cp equal chunks; rank r holds chunks r and
2·cp-1-r, so every rank gets the same amount of causal work (an early chunk sees few keys, a late
one many). `positions` (absolute token positions of the local rows) picks the RoPE rows; every
other layer is position-wise and needs nothing.

Variants (the attention op of each Attention module is swapped through its `ops` namespace):
  allgather  K and V of all ranks are all-gathered (all_gather_into_tensor; backward =
             reduce-scatter of their gradients), reordered into sequence order, and the local
             queries attend to them with a causal mask on absolute positions (SDPA). Memory: the
             full K/V of one layer; communication: (cp-1)/cp of K/V per layer, forward and backward.
  ring       K/V blocks travel around the ring with send/recv (batch_isend_irecv), cp-1 hops; each
             hop computes a block of attention with its log-sum-exp and merges it online
             (flash-attention's rescaling). The hops are autograd functions whose backward sends
             the K/V gradients the other way round, so backward is exact. Backward keeps each hop's
             K/V block for the gradient (autograd saves them), i.e. this reference ring trades the
             O(1)-block memory of a hand-fused ring backward for simplicity; the communication
             volume and pattern are those of ring attention.
Both are exact up to floating point (tests: loss and every gradient within 1e-5 of one device).
Gradients of parameters are per-rank partial sums of the local tokens' losses; FSDP (or an
all-reduce) over the cp ranks averages them like data parallel does (`fsdp over dp_shard×cp`).
"""

from __future__ import annotations

import math
from functools import partial
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

VARIANTS = ("allgather", "ring")


def check_cp_supported(dims) -> None:
    """ConfigError for the layouts with cp > 1 that parallelize does not build."""
    from scalelab.errors import ConfigError

    if dims.cp > 1:
        for axis, why in (("pp", "pipeline stages"), ("dp_replicate", "HSDP replicas")):
            if getattr(dims, axis) > 1:
                raise ConfigError(
                    "parallel.cp", f"context parallel with {why} ({axis}>1) is not built", f"set parallel.{axis}=1"
                )


# --- sequence sharding -------------------------------------------------------------------------
def chunk_ids(cp_rank: int, cp: int) -> tuple[int, int]:
    """The two (head, tail) chunks of 2·cp that rank `cp_rank` holds."""
    return cp_rank, 2 * cp - 1 - cp_rank


def local_positions(seq_len: int, cp_rank: int, cp: int, device=None) -> torch.Tensor:
    """Absolute positions [seq_len / cp] of the rows rank `cp_rank` holds (head chunk, then tail)."""
    if seq_len % (2 * cp):
        raise ValueError(f"seq_len={seq_len} must be a multiple of 2*cp={2 * cp}")
    size = seq_len // (2 * cp)
    head, tail = chunk_ids(cp_rank, cp)
    return torch.cat([torch.arange(head * size, (head + 1) * size), torch.arange(tail * size, (tail + 1) * size)]).to(
        device
    )


def shard_sequence(x: torch.Tensor, cp_rank: int, cp: int, dim: int = 1) -> torch.Tensor:
    """This rank's rows of x along `dim` (head-tail load balancing)."""
    return x.index_select(dim, local_positions(x.shape[dim], cp_rank, cp, x.device)).contiguous()


def shard_sequence_batch(tokens: torch.Tensor, targets: torch.Tensor, cp_rank: int, cp: int):
    """(local tokens, local targets, positions) for a [B, T] batch."""
    pos = local_positions(tokens.shape[1], cp_rank, cp, tokens.device)
    return shard_sequence(tokens, cp_rank, cp), shard_sequence(targets, cp_rank, cp), pos


# --- collectives with autograd -------------------------------------------------------------------
class _AllGatherSeq(torch.autograd.Function):
    """all_gather_into_tensor along dim 0 (contiguous); backward = reduce-scatter (sum)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        world = dist.get_world_size(group)
        out = x.new_empty((world * x.shape[0],) + tuple(x.shape[1:]))
        dist.all_gather_into_tensor(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        world = dist.get_world_size(ctx.group)
        out = grad.new_empty((grad.shape[0] // world,) + tuple(grad.shape[1:]))
        dist.reduce_scatter_tensor(out, grad.contiguous(), group=ctx.group)
        return out, None


class _RingShift(torch.autograd.Function):
    """Send x to the next rank of the ring, receive the previous rank's; backward shifts back."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        return _shift(x.contiguous(), group, +1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _shift(grad.contiguous(), ctx.group, -1), None


def _shift(x: torch.Tensor, group, direction: int) -> torch.Tensor:
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    dst = dist.get_global_rank(group, (rank + direction) % world)
    src = dist.get_global_rank(group, (rank - direction) % world)
    out = torch.empty_like(x)
    ops = [dist.P2POp(dist.isend, x, dst, group=group), dist.P2POp(dist.irecv, out, src, group=group)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    return out


# --- attention -----------------------------------------------------------------------------------
def _repeat_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return k, v


def _seq_major(x: torch.Tensor) -> torch.Tensor:
    """[B, H, S, Dh] -> [S, B, H, Dh] contiguous (the sequence leads for the collectives)."""
    return x.permute(2, 0, 1, 3).contiguous()


def allgather_attention(q, k, v, causal: bool = True, *, group, cp_rank: int, cp: int) -> torch.Tensor:
    """q [B, Hq, S, Dh] local rows; k/v [B, Hk, S, Dh] local rows -> [B, Hq, S, Dh]."""
    seq_local = q.shape[2]
    seq_len = seq_local * cp
    kv = torch.stack([_seq_major(k), _seq_major(v)], dim=1)  # [S, 2, B, Hk, Dh]
    gathered = _AllGatherSeq.apply(kv, group)  # rank-major: rank r's (head, tail) rows
    order = torch.cat([local_positions(seq_len, r, cp, q.device) for r in range(cp)])
    kv_full = gathered.index_select(0, torch.argsort(order))  # sequence order
    k_full, v_full = (kv_full[:, i].permute(1, 2, 0, 3) for i in range(2))
    k_full, v_full = _repeat_kv(q, k_full, v_full)
    mask = None
    if causal:
        q_pos = local_positions(seq_len, cp_rank, cp, q.device)
        mask = torch.arange(seq_len, device=q.device)[None, :] <= q_pos[:, None]
    return F.scaled_dot_product_attention(q, k_full, v_full, attn_mask=mask)


def _block_attention(q, k, v, mask):
    """(out, lse) of q against one K/V block with boolean mask [Sq, Sk]; fully masked rows give
    out = 0, lse = -inf (so merging ignores them)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = (q @ k.transpose(-2, -1)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    row_max = scores.detach().amax(dim=-1, keepdim=True).clamp_min(-1e30)  # no autograd: saves nothing
    p = torch.exp(scores - row_max)
    denom = p.sum(dim=-1, keepdim=True)
    out = (p @ v) / denom.clamp_min(1e-30)
    lse = row_max + torch.log(denom.clamp_min(1e-30))  # clamped: no inf * 0 = nan in backward
    return out, lse


def ring_attention(q, k, v, causal: bool = True, *, group, cp_rank: int, cp: int) -> torch.Tensor:
    """Ring attention on head-tail shards: same signature and result as allgather_attention."""
    seq_local = q.shape[2]
    seq_len = seq_local * cp
    q_pos = local_positions(seq_len, cp_rank, cp, q.device)
    kv = torch.stack([k, v])  # one tensor travels the ring: [2, B, Hk, S, Dh]
    out = lse = None
    for hop in range(cp):
        if hop:
            kv = _RingShift.apply(kv, group)
        src = (cp_rank - hop) % cp
        k_pos = local_positions(seq_len, src, cp, q.device)
        mask = (
            k_pos[None, :] <= q_pos[:, None]
            if causal
            else torch.ones(seq_local, seq_local, dtype=torch.bool, device=q.device)
        )
        if not bool(mask.any()):
            continue  # nothing visible from this block (cannot happen with head-tail; kept general)
        k_blk, v_blk = _repeat_kv(q, kv[0], kv[1])
        blk_out, blk_lse = _block_attention(q, k_blk, v_blk, mask)
        if out is None:
            out, lse = blk_out, blk_lse
            continue
        new_lse = torch.logaddexp(lse, blk_lse)
        out = out * torch.exp(lse - new_lse) + blk_out * torch.exp(blk_lse - new_lse)
        lse = new_lse
    return out


def apply_cp(model: nn.Module, cp_mesh, variant: str = "allgather") -> None:
    """Swap every Attention module's attention op for the context-parallel one (in place).

    The forward must then get this rank's rows and their `positions` (shard_sequence_batch).
    """
    from scalelab.models.llama import Attention

    if variant not in VARIANTS:
        raise ValueError(f"context-parallel variant {variant!r} unknown; use one of {VARIANTS}")
    group = cp_mesh.get_group()
    cp, cp_rank = cp_mesh.size(), cp_mesh.get_local_rank()
    fn = allgather_attention if variant == "allgather" else ring_attention
    attention = partial(fn, group=group, cp_rank=cp_rank, cp=cp)
    for mod in model.modules():
        if isinstance(mod, Attention):
            mod.ops = SimpleNamespace(**{**vars(mod.ops), "attention": attention, "name": f"cp-{variant}"})
