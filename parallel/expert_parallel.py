"""Expert parallel: MoE experts sharded over an `ep` mesh axis, tokens moved with all_to_all_single.

    emesh = build_ep_mesh(dims, mesh)       # axes (..., "dp_mod_ep", "ep") over the dp_shard×cp ranks
    apply_ep(model, emesh["ep"])            # each rank keeps experts [r*E/ep, (r+1)*E/ep)
    apply_ep_fsdp(model, emesh["dp_mod_ep"])   # FSDP2 over the ranks that hold the same experts
    apply_fsdp(model, dp_mesh, ...)         # then the usual FSDP of blocks and root (dense params)

How a step flows (module `ExpertParallelExperts`, a drop-in for `models.moe.GroupedExperts`):
  the MoE block sorts its local token copies by global expert id and hands (rows, counts[E]) to
  `experts`; counts are exchanged with one all_to_all_single ([ep × E/ep] ints), rows are sent to
  the rank owning their expert with all_to_all_single with uneven splits (gloo supports it; the
  list form does not), regrouped by local expert, computed, un-permuted and sent back with the
  reverse all_to_all. Both all_to_alls are autograd functions whose backward is the reverse
  exchange, so input gradients return to the tokens' ranks.

Gradient scaling: each rank backpropagates the mean loss of its own tokens; dense parameters are
averaged over dp by FSDP. An expert's gradient, however, already sums the contributions of the
tokens of all ep ranks (they came through the all_to_all), so it is scaled by 1/ep in backward
(`_ScaleGrad` on the weight in forward); FSDP over `dp_mod_ep` then averages the rest. The result
is the gradient of the mean loss over the global batch, as for every other parameter.

Gradient norm: ranks of one ep group hold different experts, so the squared norms of expert
gradients are summed over `ep` (`scalelab.parallel.ep_cp_hooks.clip_grad_norm_ep`).
The model code stays single-device: only `feed_forward.experts` is swapped from outside.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from scalelab.models.moe import MoE, grouped_swiglu


def check_ep_supported(dims, model_cfg=None) -> None:
    """ConfigError for the layouts with ep > 1 that parallelize does not build."""
    from scalelab.errors import ConfigError

    if dims.ep == 1:
        return
    if model_cfg is not None and getattr(model_cfg, "family", None) != "moe":
        raise ConfigError(
            "parallel.ep",
            "expert parallel needs an MoE model; the dense family has no experts",
            "set parallel.ep=1 or model.family=moe",
        )
    if model_cfg is not None and model_cfg.num_experts % dims.ep:
        raise ConfigError(
            "parallel.ep",
            f"{dims.ep} does not divide model.num_experts={model_cfg.num_experts}",
            "pick ep dividing num_experts",
        )
    for axis in ("tp", "pp"):
        if getattr(dims, axis) > 1:
            raise ConfigError("parallel.ep", f"expert parallel with {axis}>1 is not built", f"set parallel.{axis}=1")


class _AllToAll(torch.autograd.Function):
    """all_to_all_single with uneven splits; backward is the reverse exchange."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
        ctx.splits = (out_splits, in_splits)
        ctx.group = group
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits),) + tuple(grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


def all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    """Differentiable all_to_all_single: rows x[in_splits[r] block] go to rank r; returns received rows."""
    return _AllToAll.apply(x, out_splits, in_splits, group)


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; multiplies the gradient by `scale` in backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.scale, None


class ExpertParallelExperts(nn.Module):
    """This rank's E/ep experts (w1/w2/w3 [E/ep, ...]) behind the GroupedExperts interface."""

    def __init__(self, w1, w2, w3, *, num_experts: int, ep_rank: int, group, method: str = "loop"):
        super().__init__()
        self.w1, self.w2, self.w3 = nn.Parameter(w1), nn.Parameter(w2), nn.Parameter(w3)
        self.num_experts = num_experts
        self.ep_size = dist.get_world_size(group)
        self.ep_rank = ep_rank
        self.group = group
        self.method = method

    @classmethod
    def from_full(cls, experts: nn.Module, group) -> ExpertParallelExperts:
        """Slice a full GroupedExperts: rank r keeps experts [r*E/ep, (r+1)*E/ep)."""
        ep, rank = dist.get_world_size(group), dist.get_rank(group)
        num_local = experts.num_experts // ep
        sl = slice(rank * num_local, (rank + 1) * num_local)
        w = [getattr(experts, n).detach()[sl].clone() for n in ("w1", "w2", "w3")]
        return cls(*w, num_experts=experts.num_experts, ep_rank=rank, group=group, method=experts.method)

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        ep, num_local = self.ep_size, self.num_experts // self.ep_size
        send_counts = torch.tensor(counts, dtype=torch.int64, device=x.device)  # NCCL wants device tensors
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)  # [source rank, local expert]
        recv_counts = recv_counts.view(ep, num_local).cpu()  # the split sizes are host integers anyway
        send_counts = send_counts.cpu()
        in_splits = send_counts.view(ep, num_local).sum(1).tolist()
        out_splits = recv_counts.sum(1).tolist()
        rows = all_to_all(x, out_splits, in_splits, self.group)
        # Received rows are ordered (source rank, local expert); the experts want (local expert, source).
        starts = (recv_counts.flatten().cumsum(0) - recv_counts.flatten()).view(ep, num_local)
        perm = [
            torch.arange(int(starts[s, e]), int(starts[s, e] + recv_counts[s, e]))
            for e in range(num_local)
            for s in range(ep)
        ]
        perm = torch.cat(perm).to(x.device) if perm else torch.zeros(0, dtype=torch.long, device=x.device)
        local_counts = recv_counts.sum(0).tolist()
        scale = 1.0 / ep
        w1, w2, w3 = (_ScaleGrad.apply(w, scale) for w in (self.w1, self.w2, self.w3))
        out = grouped_swiglu(rows.index_select(0, perm), local_counts, w1, w2, w3, self.method)
        out = out.index_select(0, torch.argsort(perm))  # back to (source rank, local expert) order
        return all_to_all(out, in_splits, out_splits, self.group)


def build_ep_mesh(dims, mesh):
    """A DeviceMesh over all ranks whose last two axes split dp_shard×cp into (dp_mod_ep, ep).

    ep is the inner (adjacent-rank) factor. Other axes of `mesh` (pp, dp_replicate, tp) stay in
    front, so every (pp, dp_replicate, tp) coordinate gets its own ep and dp_mod_ep groups.
    """
    from torch.distributed.device_mesh import DeviceMesh

    names = list(mesh.mesh_dim_names or ())
    ranks = mesh.mesh
    shard_axes = [n for n in ("dp_shard", "cp") if n in names]
    other = [n for n in names if n not in shard_axes]
    order = [names.index(n) for n in other + shard_axes]
    ranks = ranks.permute(*order) if order else ranks
    shard = dims.dp_shard * dims.cp
    if shard % dims.ep:
        raise ValueError(f"ep={dims.ep} does not divide dp_shard*cp={shard}")
    lead = [ranks.shape[i] for i in range(len(other))]
    ranks = ranks.reshape(*lead, shard // dims.ep, dims.ep)
    return DeviceMesh(mesh.device_type, ranks, mesh_dim_names=(*other, "dp_mod_ep", "ep"))


def apply_ep(model: nn.Module, ep_mesh) -> None:
    """Replace the experts of every MoE block by this rank's shard (call after init, before FSDP)."""
    group = ep_mesh.get_group()
    ep = ep_mesh.size()
    for moe in [m for m in model.modules() if isinstance(m, MoE)]:
        if moe.num_experts % ep:
            raise ValueError(f"ep={ep} does not divide num_experts={moe.num_experts}")
        moe.experts = ExpertParallelExperts.from_full(moe.experts, group)


def expert_shard_dim(shape: tuple[int, ...], fsdp_size: int) -> int:
    """The dim FSDP shards an expert weight [E_local, a, b] on: 0 (experts) unless there are fewer
    local experts than FSDP ranks, then 1 (so every rank holds a slice, not some ranks nothing)."""
    return 0 if shape[0] >= fsdp_size else 1


def apply_ep_fsdp(model: nn.Module, dp_mod_ep_mesh, **fsdp_kwargs) -> None:
    """fully_shard each expert shard over the ranks holding the same experts (size 1 is fine: it
    only marks the parameters as managed, so the blocks' FSDP over the whole dp mesh skips them)."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    size = dp_mod_ep_mesh.size()
    for moe in [m for m in model.modules() if isinstance(m, MoE)]:
        fully_shard(
            moe.experts,
            mesh=dp_mod_ep_mesh,
            shard_placement_fn=lambda p: Shard(expert_shard_dim(tuple(p.shape), size)),
            **fsdp_kwargs,
        )


def expert_params(model: nn.Module) -> list[nn.Parameter]:
    return [p for m in model.modules() if isinstance(m, ExpertParallelExperts) for p in m.parameters()]


def gather_full_experts(module: ExpertParallelExperts) -> dict[str, torch.Tensor]:
    """The full [E, ...] weights (and grads when present) of one expert-parallel module, on every rank."""
    out = {}
    for name in ("w1", "w2", "w3"):
        p = getattr(module, name)
        for key, t in ((name, p), (name + ".grad", p.grad)):
            if t is None:
                continue
            full = t.full_tensor() if hasattr(t, "full_tensor") else t
            full = full.detach().contiguous()
            buf = full.new_empty((module.ep_size * full.shape[0],) + tuple(full.shape[1:]))
            dist.all_gather_into_tensor(buf, full, group=module.group)
            out[key] = buf
    return out
