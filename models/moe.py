"""Mixture-of-experts feed-forward block (family "moe"), written for ONE device.

    moe = MoE(cfg)                     # replaces TransformerBlock.feed_forward when family == "moe"
    y = moe(x)                         # x [B, T, D] -> [B, T, D]
    moe.last_stats                     # detached router statistics of the last forward

Module names (torchtitan-style, so `scalelab.parallel` can shard experts from outside):

    feed_forward.router.gate            nn.Linear [E, D], no bias: router logits
    feed_forward.experts.w1 / w3        [E, F, D]  per-expert SwiGLU gate / up  (F = moe_d_ff)
    feed_forward.experts.w2             [E, D, F]  per-expert down projection
    feed_forward.shared_experts.w1/2/3  one SwiGLU of width num_shared_experts * F (always active)

Routing (token choice, top-k): logits = gate(x) in fp32; scores = softmax(logits) or
sigmoid(logits) (`router_gating`); each token picks its k highest-scoring experts and weighs their
outputs by those scores (sigmoid scores are renormalised to sum to 1 over the k picks, as in
DeepSeek-V3; softmax scores are used as they are, as in torchtitan's default).

Dispatch: token copies are sorted by expert (stable) and each expert runs on its contiguous rows.
`capacity_factor == 0` is dropless (every copy is computed). With capacity_factor = c > 0 each
expert takes at most ceil(c * N * k / E) copies, first come first served in slot-major order (all
tokens' first choices before any second choice, GShard); the rest are dropped (their weight is 0;
the residual stream carries the token on).

Losses, added through autograd without touching the LM loss (Megatron's aux-loss trick: the block's
output passes through `_AttachAuxLoss`, whose backward also sends `loss_scale` into the aux term):
  aux (load balance, Switch/GShard): E * sum_e f_e * P_e, f_e = share of the N*k routed copies that
      chose e (before drops), P_e = mean over tokens of e's normalised score; 1.0 when balanced.
  z (router z-loss, ST-MoE): mean over tokens of logsumexp(logits)^2.
Total added = router_aux_loss_weight * aux + router_z_loss_weight * z, per forward (per micro-batch;
under data parallel each rank's tokens form their own batch, as in Megatron's default). The loop
must set `loss_scale` to the factor it multiplies the LM loss by (e.g. 1/accumulation steps):
`Transformer.set_moe_loss_scale`.

The expert computation takes rows already sorted by expert plus the counts per expert:
`experts(x_sorted [M, D], counts [E]) -> [M, D]`. Expert parallel replaces `experts` with a
module of the same signature that sends rows to the rank holding their expert
(`scalelab.parallel.expert_parallel`). `GroupedExperts.method` picks the computation:
"loop" (reference: one matmul per expert), "grouped" (padded batched GEMM on CPU, torch._grouped_mm
on CUDA in bf16); both give the same numbers on CPU (tests check it).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from scalelab.models.config import ModelConfig
from scalelab.models.feedforward import FeedForward


class _AttachAuxLoss(torch.autograd.Function):
    """Identity on `out`; backward also gives the scalar `aux` the gradient `scale` (d loss / d aux)."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, aux: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        ctx.aux_dtype = aux.dtype
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        return grad_out, torch.full((), ctx.scale, dtype=ctx.aux_dtype, device=grad_out.device), None


def swiglu_rows(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor) -> torch.Tensor:
    """One expert: w2 (silu(w1 x) * w3 x) on rows x [M, D]; w1/w3 [F, D], w2 [D, F]."""
    return (F.silu(x @ w1.t()) * (x @ w3.t())) @ w2.t()


def grouped_swiglu(
    x: torch.Tensor, counts: list[int], w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor, method: str
) -> torch.Tensor:
    """Rows x [M, D] sorted by expert with counts[e] rows for expert e -> [M, D].

    method "loop": one matmul chain per expert (the reference). "grouped": one batched GEMM over
    experts, rows padded to the largest count (CPU), or torch._grouped_mm on CUDA.
    """
    num_experts = w1.shape[0]
    if x.shape[0] == 0:
        # No rows: still an op of x and the weights, so that backward runs the same autograd nodes
        # (and collectives, e.g. expert parallel's all_to_all) on every rank and the weights get a
        # (zero) gradient rather than None (FSDP reduces the same gradients on every rank).
        return swiglu_rows(x, w1[0], w2[0], w3[0])
    if method == "loop":
        outs = [swiglu_rows(rows, w1[e], w2[e], w3[e]) for e, rows in enumerate(x.split(counts)) if counts[e]]
        return torch.cat(outs)
    if method != "grouped":
        raise ValueError(f"unknown expert method {method!r}; use 'loop' or 'grouped'")
    if x.is_cuda and hasattr(torch, "_grouped_mm"):
        offs = torch.tensor(counts, device=x.device).cumsum(0).to(torch.int32)
        h = F.silu(torch._grouped_mm(x, w1.transpose(-2, -1), offs=offs))
        h = h * torch._grouped_mm(x, w3.transpose(-2, -1), offs=offs)
        return torch._grouped_mm(h, w2.transpose(-2, -1), offs=offs)
    # Padded batched GEMM: scatter rows into [E, max_count, D], bmm, gather back.
    max_count = max(counts)
    counts_t = torch.tensor(counts, device=x.device)
    starts = torch.cumsum(counts_t, 0) - counts_t
    expert_of_row = torch.repeat_interleave(torch.arange(num_experts, device=x.device), counts_t)
    slot_of_row = torch.arange(x.shape[0], device=x.device) - starts[expert_of_row]
    flat_index = expert_of_row * max_count + slot_of_row
    padded = x.new_zeros(num_experts * max_count, x.shape[1]).index_copy(0, flat_index, x)
    padded = padded.view(num_experts, max_count, -1)
    h = F.silu(torch.bmm(padded, w1.transpose(1, 2))) * torch.bmm(padded, w3.transpose(1, 2))
    out = torch.bmm(h, w2.transpose(1, 2))
    return out.reshape(num_experts * max_count, -1).index_select(0, flat_index)


class GroupedExperts(nn.Module):
    """E SwiGLU experts stored as 3-D weights; forward(x_sorted, counts) (see module docstring)."""

    def __init__(self, num_experts: int, d_model: int, d_ff: int, method: str = "loop"):
        super().__init__()
        self.num_experts = num_experts
        self.w1 = nn.Parameter(torch.empty(num_experts, d_ff, d_model))
        self.w2 = nn.Parameter(torch.empty(num_experts, d_model, d_ff))
        self.w3 = nn.Parameter(torch.empty(num_experts, d_ff, d_model))
        self.method = method

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        return grouped_swiglu(x, counts, self.w1, self.w2, self.w3, self.method)


class Router(nn.Module):
    """Linear router: logits [N, E] (fp32) from tokens [N, D]."""

    def __init__(self, d_model: int, num_experts: int):
        super().__init__()
        self.gate = nn.Linear(d_model, num_experts, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(x).float()


class MoE(nn.Module):
    """Top-k token-choice MoE SwiGLU block with optional shared experts (see module docstring)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_experts = cfg.num_experts
        self.top_k = cfg.num_experts_per_tok
        self.gating = cfg.router_gating
        self.capacity_factor = cfg.capacity_factor
        self.aux_loss_weight = cfg.router_aux_loss_weight
        self.z_loss_weight = cfg.router_z_loss_weight
        d_ff = cfg.expert_d_ff
        self.router = Router(cfg.d_model, cfg.num_experts)
        self.experts = GroupedExperts(cfg.num_experts, cfg.d_model, d_ff, cfg.moe_expert_method)
        self.shared_experts = None
        if cfg.num_shared_experts:
            self.shared_experts = FeedForward(cfg.d_model, cfg.num_shared_experts * d_ff)
        self.loss_scale = 1.0  # d(total loss)/d(LM loss term) set by the loop; see module docstring
        self.last_stats: dict[str, torch.Tensor] = {}

    def capacity(self, num_tokens: int) -> int:
        """Most routed copies one expert takes (capacity mode), ceil(c * N * k / E)."""
        return math.ceil(self.capacity_factor * num_tokens * self.top_k / self.num_experts)

    def route(self, x_flat: torch.Tensor):
        """(weights [N, k], experts [N, k] long, aux, z, probs [N, E]) for tokens [N, D]."""
        logits = self.router(x_flat)
        if self.gating == "softmax":
            scores = torch.softmax(logits, dim=-1)
            probs = scores
        else:
            scores = torch.sigmoid(logits)
            probs = scores / scores.sum(dim=-1, keepdim=True)
        weights, experts = scores.topk(self.top_k, dim=-1)
        if self.gating == "sigmoid":
            weights = weights / weights.sum(dim=-1, keepdim=True)
        num_tokens = x_flat.shape[0]
        counts = torch.bincount(experts.flatten(), minlength=self.num_experts)
        share = counts.to(probs.dtype) / (num_tokens * self.top_k)
        aux = self.num_experts * (share * probs.mean(dim=0)).sum()
        z = torch.logsumexp(logits, dim=-1).pow(2).mean()
        return weights, experts, aux, z, counts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x_flat = x.reshape(-1, shape[-1])
        num_tokens = x_flat.shape[0]
        weights, experts, aux, z, routed = self.route(x_flat)
        # Slot-major order (all first choices, then all second choices ...): the capacity
        # priority; a stable sort by expert keeps it within each expert's rows.
        flat_experts = experts.t().reshape(-1)
        flat_weights = weights.t().reshape(-1)
        flat_tokens = torch.arange(num_tokens, device=x.device).repeat(self.top_k)
        keep = None
        if self.capacity_factor > 0:
            one_hot = F.one_hot(flat_experts, self.num_experts)
            position = (one_hot.cumsum(dim=0) * one_hot).sum(dim=-1) - 1  # rank within its expert
            keep = position < self.capacity(num_tokens)
            flat_experts, flat_weights, flat_tokens = flat_experts[keep], flat_weights[keep], flat_tokens[keep]
        order = torch.argsort(flat_experts, stable=True)
        token_idx = flat_tokens[order]
        counts = torch.bincount(flat_experts, minlength=self.num_experts)
        rows = self.experts(x_flat.index_select(0, token_idx), counts.tolist())
        rows = rows * flat_weights[order].unsqueeze(-1).to(rows.dtype)
        out = torch.zeros_like(x_flat).index_add_(0, token_idx, rows.to(x_flat.dtype))
        if self.shared_experts is not None:
            out = out + self.shared_experts(x_flat)
        self.last_stats = {
            "tokens_per_expert": routed.detach(),  # routed copies per expert, before drops
            "dropped_tokens": (keep.numel() - keep.sum()).detach() if keep is not None else routed.new_zeros(()),
            "aux_loss": aux.detach(),
            "z_loss": z.detach(),
            "num_tokens": routed.new_tensor(num_tokens),
        }
        total_aux = self.aux_loss_weight * aux + self.z_loss_weight * z
        if torch.is_grad_enabled() and total_aux.requires_grad:
            out = _AttachAuxLoss.apply(out, total_aux, self.loss_scale)
        return out.view(shape)


def moe_modules(module: nn.Module) -> list[MoE]:
    """The MoE blocks inside `module` (a model, a pipeline stage, ...), in module order."""
    return [m for m in module.modules() if isinstance(m, MoE)]


def imbalance(tokens_per_expert: torch.Tensor) -> float:
    """max / mean of the routed copies per expert (1.0 = perfectly balanced)."""
    counts = tokens_per_expert.double()
    return float(counts.max() / counts.mean().clamp(min=1e-12))


def summarize_stats(per_layer: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    """One flat row of router statistics over MoE layers (what run records store per step).

    Columns: moe_aux_loss / moe_z_loss (mean over layers), moe_imbalance (mean over layers of max/mean
    tokens per expert), moe_imbalance_max (worst layer), moe_dropped_frac (dropped / routed copies).
    """
    if not per_layer:
        return {}
    imb = [imbalance(s["tokens_per_expert"]) for s in per_layer]
    routed = sum(float(s["tokens_per_expert"].sum()) for s in per_layer)
    dropped = sum(float(s["dropped_tokens"]) for s in per_layer)
    return {
        "moe_aux_loss": sum(float(s["aux_loss"]) for s in per_layer) / len(per_layer),
        "moe_z_loss": sum(float(s["z_loss"]) for s in per_layer) / len(per_layer),
        "moe_imbalance": sum(imb) / len(imb),
        "moe_imbalance_max": max(imb),
        "moe_dropped_frac": dropped / max(routed, 1.0),
    }


def step_row(model) -> dict[str, float]:
    """Router columns for the run records from the model's last forward (empty for dense models)."""
    stats = model.moe_stats() if hasattr(model, "moe_stats") else []
    return summarize_stats(stats)
