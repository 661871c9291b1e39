"""Expert parallel (and expert tensor parallel): MoE experts sharded over `ep` (and `tp`) mesh axes.

    emesh = dims.ep_mesh                 # axes (pp, dp_replicate, dp_mod_ep, ep, tp) over the same ranks
    apply_ep(model, emesh)               # experts -> ShardedExperts: DTensors on emesh[(ep[, tp])]
    apply_ep_fsdp(model, emesh)          # FSDP2 (HSDP) of the expert shards over (dp_replicate,) dp_mod_ep
    apply_fsdp(model, dp_mesh, ...)      # then the usual FSDP of blocks and root (dense params)

Sharding: the weights w1/w3 [E, F, D] and w2 [E, D, F] are DTensors on the (ep, tp) sub-mesh with
placements (Shard(0), Shard(F dim)): ep rank r keeps experts [r*E/ep, (r+1)*E/ep), and within a tp
group each rank keeps F/tp of every local expert's hidden width (Megatron's expert tensor parallel
with ETP = TP). Because they are DTensors with the single-device global shapes, checkpoints (DCP)
hold each expert once and reshard to any other layout, FSDP2 composes its dp_mod_ep sharding on
top (2-D EP+TP), and the gradient norm of the sharded weights is complete without special cases.

A step (module `ShardedExperts`, a drop-in for `models.moe.GroupedExperts`): the MoE block sorts
its token copies by global expert id and hands (rows, counts[E]) to `experts`; counts are exchanged
with one all_to_all_single ([ep × E/ep] ints), rows go to the rank owning their expert with
all_to_all_single with uneven splits (gloo supports it; the list form does not), are regrouped by
local expert, computed, un-permuted and sent back with the reverse all_to_all. Both all_to_alls are
autograd functions whose backward is the reverse exchange.

Under TP the MoE block runs on the full (replicated, or all-gathered under SP) tokens of the tp
group, so routing, router statistics and aux losses are those of one device. Each tp rank computes
its F/tp slice of every routed copy; the partial outputs are summed over tp (all-reduce forward,
identity backward) before the router weights multiply them, and the rows entering the experts go
through the conjugate (identity forward, all-reduce of their gradient backward). The sum happens on
the k routed copies per token rather than once on the combined output (as Megatron does): it costs
k× the volume but keeps the router weights' gradient complete on every tp rank, so the model code
stays single-device. Shared experts and the router are handled by `scalelab.parallel.tp`.

Gradient scaling: each rank backpropagates the mean loss of its own tokens; dense parameters are
averaged over dp by FSDP. An expert's gradient, however, already sums the contributions of the
tokens of all ep ranks (they came through the all_to_all), so it is scaled by 1/ep in backward;
FSDP over dp_mod_ep (and dp_replicate) then averages the rest. The result is the gradient of the
mean loss over the global batch, as for every other parameter.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard

from scalelab.models.moe import grouped_swiglu, moe_modules, summarize_stats
from scalelab.parallel.backend import SumOverGroup, for_collective


def all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    """Differentiable all_to_all_single with uneven splits: rows x[in_splits[r] block] go to rank r;
    returns the received rows. Backward is the reverse exchange. A functional collective (an op of
    its own, `_c10d_functional.all_to_all_single`), so that selective activation checkpointing can
    save its output instead of communicating again in recompute (scalelab.parallel.activation_checkpointing)."""
    out = funcol.all_to_all_single_autograd(x.contiguous(), out_splits, in_splits, group)
    return funcol.wait_tensor(out)


class _CopyToGroup(torch.autograd.Function):
    """Identity forward; all-reduce (sum) of the gradient over `group` backward (Megatron's f)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = for_collective(grad.clone())
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; multiplies the gradient by `scale` in backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.scale, None


_F_DIM = {"w1": 1, "w2": 2, "w3": 1}  # the hidden (F) dim of each expert weight, split over tp


class ShardedExperts(nn.Module):
    """The experts of one MoE block as DTensors on the (ep[, tp]) mesh, behind GroupedExperts' interface."""

    def __init__(self, experts: nn.Module, mesh):
        super().__init__()
        names = mesh.mesh_dim_names
        self.num_experts = experts.num_experts
        self.method = experts.method
        self.ep_size, self.ep_rank = mesh["ep"].size(), mesh["ep"].get_local_rank()
        self.ep_group = mesh["ep"].get_group()
        self.tp_group = mesh["tp"].get_group() if "tp" in names and mesh["tp"].size() > 1 else None
        tp, tp_rank = (mesh["tp"].size(), mesh["tp"].get_local_rank()) if "tp" in names else (1, 0)
        num_local = self.num_experts // self.ep_size
        for name in ("w1", "w2", "w3"):
            full = getattr(experts, name).detach()
            local = full[self.ep_rank * num_local : (self.ep_rank + 1) * num_local]
            placements = [Shard(0)]
            if "tp" in names:
                local = local.chunk(tp, dim=_F_DIM[name])[tp_rank]
                placements.append(Shard(_F_DIM[name]))
            weight = DTensor.from_local(local.clone(), mesh, placements, run_check=False)
            setattr(self, name, nn.Parameter(weight))

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        ep, num_local = self.ep_size, self.num_experts // self.ep_size
        # to_local: its backward hands the gradient back as a DTensor with the weight's placements;
        # the 1/ep is the gradient scaling of the module docstring.
        # .to(x.dtype): weights outside FSDP (see apply_ep_fsdp) get no mixed-precision cast from it
        w1, w2, w3 = (_ScaleGrad.apply(getattr(self, n).to_local().to(x.dtype), 1.0 / ep) for n in ("w1", "w2", "w3"))
        if self.tp_group is not None:
            x = _CopyToGroup.apply(x, self.tp_group)
        if ep == 1:
            out = grouped_swiglu(x, counts, w1, w2, w3, self.method)
        else:
            out = self._dispatch_compute_combine(x, counts, w1, w2, w3, ep, num_local)
        if self.tp_group is not None:
            out = SumOverGroup.apply(out, self.tp_group)  # partial over F/tp slices -> full rows
        return out

    def _dispatch_compute_combine(self, x, counts, w1, w2, w3, ep: int, num_local: int) -> torch.Tensor:
        send_counts = torch.tensor(counts, dtype=torch.int64, device=x.device)  # NCCL wants device tensors
        recv_counts = funcol.wait_tensor(funcol.all_to_all_single(send_counts, None, None, self.ep_group))
        recv_counts = recv_counts.view(ep, num_local).cpu()  # [source rank, local expert], host integers
        send_counts = send_counts.cpu()
        in_splits = send_counts.view(ep, num_local).sum(1).tolist()
        out_splits = recv_counts.sum(1).tolist()
        rows = all_to_all(x, out_splits, in_splits, self.ep_group)
        # Received rows are ordered (source rank, local expert); the experts want (local expert, source):
        # a stable sort of every row's (expert, source) key.
        group = torch.repeat_interleave(torch.arange(ep * num_local), recv_counts.flatten())  # s*L + e
        perm = torch.argsort((group % num_local) * ep + group // num_local, stable=True).to(x.device)
        local_counts = recv_counts.sum(0).tolist()
        out = grouped_swiglu(rows.index_select(0, perm), local_counts, w1, w2, w3, self.method)
        out = out.index_select(0, torch.argsort(perm))  # back to (source rank, local expert) order
        return all_to_all(out, in_splits, out_splits, self.ep_group)


def apply_ep(model: nn.Module, emesh) -> None:
    """Replace the experts of every MoE block by this rank's shard (call after init, before FSDP).

    `emesh` is `ParallelDims.ep_mesh`; the experts are sharded over its ep axis and, when it has
    one, its tp axis."""
    names = emesh.mesh_dim_names
    mesh = emesh[("ep", "tp")] if "tp" in names else emesh["ep"]
    ep = emesh["ep"].size()
    for moe in moe_modules(model):
        if moe.num_experts % ep:
            raise ValueError(f"ep={ep} does not divide num_experts={moe.num_experts}")
        moe.experts = ShardedExperts(moe.experts, mesh)


def expert_shard_dim(local_shape: tuple[int, ...], fsdp_size: int) -> int:
    """The dim FSDP shards an expert weight's local shard [E_local, a, b] on: 0 (experts) unless
    there are fewer local experts than FSDP ranks, then 1 (so every rank holds a slice)."""
    return 0 if local_shape[0] >= fsdp_size else 1


def expert_fsdp_mesh(emesh):
    """The mesh FSDP2 uses for expert shards: dp_mod_ep, or (dp_replicate, dp_mod_ep) for HSDP."""
    if "dp_replicate" in emesh.mesh_dim_names:
        return emesh[("dp_replicate", "dp_mod_ep")]
    return emesh["dp_mod_ep"]


def apply_ep_fsdp(model: nn.Module, emesh, **fsdp_kwargs) -> None:
    """fully_shard each expert shard over the ranks holding the same experts.

    When no other rank holds this rank's experts (dp_mod_ep of size 1, no replicas) there is
    nothing to shard or reduce: the expert weights are left out of FSDP altogether
    (`model.fsdp_ignored_params`, which the blocks' FSDP honours). A 1-rank FSDP unit nested in a
    checkpointed block would also make selective activation checkpointing fail (its profiler
    records differ between forward and recompute)."""
    size = emesh["dp_mod_ep"].size()
    if size == 1 and "dp_replicate" not in emesh.mesh_dim_names:
        model.fsdp_ignored_params = {p for moe in moe_modules(model) for p in moe.experts.parameters()}
        return

    def placement(p):
        local = p.to_local() if isinstance(p, DTensor) else p
        return Shard(expert_shard_dim(tuple(local.shape), size))

    for moe in moe_modules(model):
        fully_shard(moe.experts, mesh=expert_fsdp_mesh(emesh), shard_placement_fn=placement, **fsdp_kwargs)


def global_router_row(model: nn.Module, dims) -> dict[str, float]:
    """Router columns for the run records over the whole global batch (every rank calls it).

    Every rank holds the statistics of all MoE layers for its tokens (pipeline stages gather them
    after each step; tp ranks see the same tokens): one all-reduce over the world sums them, the
    tp × pp copies are divided out, so tokens per expert and dropped copies are the global batch's
    (their imbalance is the global one) and the aux/z losses the mean over data-parallel ranks.
    """
    stats = model.moe_stats() if hasattr(model, "moe_stats") else []
    if not stats:
        return {}
    counts = torch.stack([s["tokens_per_expert"].double().cpu() for s in stats])  # [layers, E]
    scalars = torch.stack(
        [
            torch.stack([s[k].double().cpu() for k in ("dropped_tokens", "aux_loss", "z_loss", "num_tokens")])
            for s in stats
        ]
    )
    packed = for_collective(torch.cat([counts, scalars], dim=1))
    dist.all_reduce(packed)
    world, copies = dist.get_world_size(), dims.tp * dims.pp
    counts, scalars = packed[:, : counts.shape[1]] / copies, packed[:, counts.shape[1] :]
    summed = [
        {
            "tokens_per_expert": counts[i],
            "dropped_tokens": scalars[i, 0] / copies,
            "aux_loss": scalars[i, 1] / world,
            "z_loss": scalars[i, 2] / world,
            "num_tokens": scalars[i, 3] / copies,
        }
        for i in range(len(stats))
    ]
    return summarize_stats(summed)


def gather_full_experts(module: ShardedExperts) -> dict[str, torch.Tensor]:
    """The full [E, ...] weights (and grads when present) of one sharded-experts module, on every rank."""
    out = {}
    for name in ("w1", "w2", "w3"):
        p = getattr(module, name)
        for key, t in ((name, p), (name + ".grad", p.grad)):
            if t is not None:
                out[key] = t.full_tensor().detach().clone()
    return out
