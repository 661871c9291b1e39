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
  ring       K/V blocks travel around the ring with send/recv (batch_isend_irecv, the next block
             posted before the current one is computed), cp-1 hops; each hop computes a block of
             attention with its log-sum-exp and merges it online (flash-attention's rescaling).
             The whole ring is ONE autograd function: it saves only the local q, k, v, the output
             and the merged lse (local rows only, however many hops), and its backward recomputes each hop's block from
             the lse while the K/V blocks travel the ring again, with a dK/dV accumulator (fp32)
             travelling beside each block; one last shift hands every accumulator to its owner.
             Memory: one K/V block in flight; communication: K/V (cp-1) hops forward, K/V (cp-1)
             plus dK/dV cp hops backward. `attention_saved_bytes` gives both variants' saved bytes.
Both are exact up to floating point (tests: loss and every gradient within 1e-5 of one device).
Gradients of parameters are per-rank partial sums of the local tokens' losses; FSDP (or an
all-reduce) over the cp ranks averages them like data parallel does (`ParallelDims.fsdp_mesh`:
FSDP over dp_shard×cp, HSDP (dp_replicate, dp_shard×cp) with replicas).

Composition: TP with or without sequence parallel inside each cp rank (SP shards this rank's rows
further; attention sees them whole after SP's all-gather); pipeline stages (the chunks take their
positions from apply_cp's forward pre-hook; Pipeline shards each batch and averages the loss over
cp; the zero-bubble schedule only with parallel.fsdp_reshard_after_forward=false).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from scalelab.models.llama import Attention, override_ops

VARIANTS = ("allgather", "ring")


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


def _start_shift(x: torch.Tensor, out: torch.Tensor, group, direction: int) -> list:
    """Post send of x to rank+direction and receive into `out` from rank-direction (async)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    dst = dist.get_global_rank(group, (rank + direction) % world)
    src = dist.get_global_rank(group, (rank - direction) % world)
    ops = [dist.P2POp(dist.isend, x, dst, group=group), dist.P2POp(dist.irecv, out, src, group=group)]
    return dist.batch_isend_irecv(ops)


def _shift(x: torch.Tensor, group, direction: int = 1) -> torch.Tensor:
    """x of rank-direction (blocking ring shift)."""
    out = torch.empty_like(x)
    for req in _start_shift(x.contiguous(), out, group, direction):
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


def _ring_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool) -> torch.Tensor | None:
    """Boolean [Sq, Sk] visibility of one K/V block (None: all visible)."""
    return k_pos[None, :] <= q_pos[:, None] if causal else None


def _block_scores(q5: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """fp32 scores [B, Hk, rep, Sq, Sk] of grouped queries q5 [B, Hk, rep, Sq, Dh] against k [B, Hk, Sk, Dh]
    (GQA by broadcasting over rep: no repeated K/V copy); masked entries are -inf."""
    scores = (q5.float() @ k.float().unsqueeze(2).transpose(-2, -1)) * scale
    return scores if mask is None else scores.masked_fill(~mask, float("-inf"))


class _RingAttention(torch.autograd.Function):
    """Ring attention as one autograd function (flash-attention style backward).

    Forward: cp hops; at hop h this rank holds the K/V block of rank (r - h) mod cp, computes its
    block of attention with the block's log-sum-exp and merges it online, while the next block is
    already in flight (send/recv posted before the compute). Saved for backward: only the local
    q, k, v, the output and the merged lse (fp32), however many hops.
    Backward: the K/V blocks travel the same way again; each hop recomputes P = exp(S - lse) of its
    block, adds to dQ, and adds the block's dK/dV to an fp32 accumulator that travels with the block;
    after the last hop one more shift hands each accumulator to the block's owner.
    """

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, group, cp_rank: int, cp: int):
        bsz, heads, seq_local, head_dim = q.shape
        kv_heads = k.shape[1]
        scale = 1.0 / math.sqrt(head_dim)
        seq_len = seq_local * cp
        q5 = q.view(bsz, kv_heads, heads // kv_heads, seq_local, head_dim)
        q_pos = local_positions(seq_len, cp_rank, cp, q.device)
        kv = torch.stack([k, v])  # the one tensor that travels the ring: [2, B, Hk, S, Dh]
        out = lse = None
        for hop in range(cp):
            reqs, nxt = [], None
            if hop < cp - 1:  # prefetch the next block while this one is computed
                nxt = torch.empty_like(kv)
                reqs = _start_shift(kv, nxt, group, +1)
            # every block has a visible key for every rank under head-tail (rank r's tail chunk comes
            # after all head chunks), so no block is skipped; single rows may be fully masked
            mask = _ring_mask(q_pos, local_positions(seq_len, (cp_rank - hop) % cp, cp, q.device), causal)
            scores = _block_scores(q5, kv[0], mask, scale)
            row_max = scores.amax(dim=-1, keepdim=True).clamp_min(-1e30)  # fully masked rows: finite
            p = torch.exp(scores - row_max)
            denom = p.sum(dim=-1, keepdim=True)
            blk_out = (p @ kv[1].float().unsqueeze(2)) / denom.clamp_min(1e-30)
            blk_lse = row_max + torch.log(denom)  # -inf for a fully masked row: ignored by the merge
            if out is None:  # hop 0, the diagonal block: every row sees itself, so lse is finite
                out, lse = blk_out, blk_lse
            else:
                new_lse = torch.logaddexp(lse, blk_lse)
                out = out * torch.exp(lse - new_lse) + blk_out * torch.exp(blk_lse - new_lse)
                lse = new_lse
            for req in reqs:
                req.wait()
            kv = nxt if nxt is not None else kv
        # laid out as [B, S, H, Dh] (like SDPA's output): the caller's transpose(1, 2).reshape is a view
        out = out.to(q.dtype).view(bsz, heads, seq_local, head_dim).transpose(1, 2).contiguous().transpose(1, 2)
        ctx.save_for_backward(q, k, v, out, lse.view(bsz, heads, seq_local))
        ctx.group, ctx.cp_rank, ctx.cp, ctx.causal = group, cp_rank, cp, causal
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        group, cp_rank, cp = ctx.group, ctx.cp_rank, ctx.cp
        bsz, heads, seq_local, head_dim = q.shape
        kv_heads, rep = k.shape[1], heads // k.shape[1]
        scale = 1.0 / math.sqrt(head_dim)
        seq_len = seq_local * cp
        grouped = (bsz, kv_heads, rep, seq_local, head_dim)
        q5 = q.view(grouped)
        do5 = grad_out.float().reshape(grouped)
        lse5 = lse.view(bsz, kv_heads, rep, seq_local, 1)
        delta = (do5 * out.float().view(grouped)).sum(dim=-1, keepdim=True)  # rowsum(dO ∘ O)
        q_pos = local_positions(seq_len, cp_rank, cp, q.device)
        dq = torch.zeros(grouped, dtype=torch.float32, device=q.device)
        kv = torch.stack([k, v])
        dkv = None  # fp32 [2, B, Hk, S, Dh]: gradient of the block held now, summed over the ranks so far
        for hop in range(cp):
            reqs, nxt = [], None
            if hop < cp - 1:
                nxt = torch.empty_like(kv)
                reqs = _start_shift(kv, nxt, group, +1)
            mask = _ring_mask(q_pos, local_positions(seq_len, (cp_rank - hop) % cp, cp, q.device), causal=ctx.causal)
            p = torch.exp(_block_scores(q5, kv[0], mask, scale) - lse5)  # masked entries: exp(-inf) = 0
            dv = (p.transpose(-2, -1) @ do5).sum(dim=2)  # dV = P^T dO, summed over the query group
            ds = p * (do5 @ kv[1].float().unsqueeze(2).transpose(-2, -1) - delta) * scale  # P ∘ (dP - Δ)
            dq += ds @ kv[0].float().unsqueeze(2)
            dk = (ds.transpose(-2, -1) @ q5.float()).sum(dim=2)
            blk = torch.stack([dk, dv])
            dkv = blk if dkv is None else dkv + blk
            for req in reqs:
                req.wait()
            kv = nxt if nxt is not None else kv
            dkv = _shift(dkv, group, +1)  # travels with its block; after the last hop it reaches the owner
        dq = dq.view(q.shape).to(q.dtype)
        return dq, dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None, None


def ring_attention(q, k, v, causal: bool = True, *, group, cp_rank: int, cp: int) -> torch.Tensor:
    """Ring attention on head-tail shards: same signature and result as allgather_attention."""
    return _RingAttention.apply(q, k, v, causal, group, cp_rank, cp)


def attention_saved_bytes(
    variant: str, *, batch: int, heads: int, kv_heads: int, head_dim: int, seq_len: int, cp: int, act_bytes: int = 4
) -> int:
    """Bytes one rank's context-parallel attention call saves for backward (causal; CPU, torch 2.13).

    ring:      q, k, v (local rows, kv_heads), the output and the fp32 lse -- independent of cp.
    allgather: q, the output and lse; the gathered K/V repeated to `heads` (seq_len rows each); the
               causal mask, which SDPA saves as an fp32 additive [rows, seq_len] mask; the int64
               sequence-order index [seq_len].
    """
    rows = seq_len // cp
    q_out_lse = 2 * act_bytes * batch * heads * rows * head_dim + 4 * batch * heads * rows
    if variant == "ring":
        return q_out_lse + 2 * act_bytes * batch * kv_heads * rows * head_dim
    if variant == "allgather":
        return q_out_lse + 2 * act_bytes * batch * heads * seq_len * head_dim + 4 * rows * seq_len + 8 * seq_len
    raise ValueError(f"context-parallel variant {variant!r} unknown; use one of {VARIANTS}")


@dataclass(frozen=True, slots=True)
class CPShard:
    """What apply_cp leaves on the model (`model.scalelab_cp`): the cp group and this rank's place."""

    group: object
    rank: int
    size: int

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a [B, T, ...] batch (tokens or targets)."""
        return shard_sequence(x, self.rank, self.size)

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """A detached per-rank mean averaged over the cp group (every rank holds as many tokens)."""
        out = value.detach().float().reshape(()).clone().contiguous()
        dist.all_reduce(out, group=self.group)
        return out / self.size

    def token_mean(self, value: torch.Tensor, n_valid: torch.Tensor) -> torch.Tensor:
        """`token_weighted_mean` over this cp group."""
        return token_weighted_mean(value, n_valid, self.group)


def token_weighted_mean(value: torch.Tensor, n_valid: torch.Tensor, group) -> torch.Tensor:
    """The mean over every cp rank's target tokens of per-rank means over `n_valid` tokens each.

    Evaluation rows may hold their targets in one part of the sequence (a multiple-choice
    continuation, ignore_index elsewhere), so the cp ranks' token counts differ.
    """
    both = torch.stack([value.detach().float().reshape(()) * n_valid, n_valid.float()]).contiguous()
    dist.all_reduce(both, group=group)
    return both[0] / both[1].clamp(min=1)


def _default_positions(module: nn.Module, args: tuple, kwargs: dict):
    """Forward pre-hook: `positions` default to this cp rank's rows (a pipeline stage is called
    with its input alone); the local length T/cp is the input's dim 1 (its global length under SP)."""
    given = args[1] if len(args) > 1 else kwargs.get("positions")
    if given is not None or not args:
        return None
    shard = module.scalelab_cp
    x = args[0]
    positions = local_positions(x.shape[1] * shard.size, shard.rank, shard.size, x.device)
    return args[:1], {**kwargs, "positions": positions}


def apply_cp(model: nn.Module, cp_mesh, variant: str = "allgather") -> None:
    """Swap every Attention module's attention op for the context-parallel one (in place).

    The forward must then get this rank's rows (shard_sequence_batch); their `positions` default to
    this rank's head-tail positions when not given. `model.scalelab_cp` (a CPShard) records the group.
    """
    if variant not in VARIANTS:
        raise ValueError(f"context-parallel variant {variant!r} unknown; use one of {VARIANTS}")
    group = cp_mesh.get_group()
    cp, cp_rank = cp_mesh.size(), cp_mesh.get_local_rank()
    fn = allgather_attention if variant == "allgather" else ring_attention
    attention = partial(fn, group=group, cp_rank=cp_rank, cp=cp)
    for mod in model.modules():
        if isinstance(mod, Attention):
            override_ops(
                mod, lambda ops: SimpleNamespace(**{**vars(ops), "attention": attention, "name": f"cp-{variant}"})
            )
    model.scalelab_cp = CPShard(group=group, rank=cp_rank, size=cp)
    model.register_forward_pre_hook(_default_positions, with_kwargs=True)
