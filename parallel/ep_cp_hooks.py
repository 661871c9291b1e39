"""The hooks through which `parallelize` and `ParallelStep` apply expert and context parallel.

    check_supported(dims, model_cfg)              # ConfigError for combinations not built yet
    dp_mesh = fsdp_mesh(dims, mesh)               # FSDP over dp_shard × cp when cp > 1
    apply_ep_cp(chunk, dims, mesh, pcfg, device_type)   # CP attention, EP expert shards (+ their FSDP)
    inputs, targets, positions = shard_batch(inputs, targets, dims, mesh)   # this cp rank's rows
    ce = mean_over_cp(ce, dims, mesh)             # the loss of the whole sequence, on every cp rank
    norm = clip_grad_norm_ep(params, max_norm, dims, mesh, pp_group)        # expert shards summed over ep

Every function is a no-op (or returns its input) when cp == ep == 1, so the dense path is unchanged.
What is built: cp with FSDP (dp_shard) and TP (without sequence parallel), both variants (all-gather
KV by default; `parallel.cp_variant` selects "ring" when the config has it); ep over dp_shard × cp
with FSDP of the experts over the rest. Not built: cp with pipeline parallel, cp with sequence
parallel, cp with dp_replicate, ep with tp or pp (ConfigError before any process starts).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from scalelab.errors import ConfigError


def check_supported(dims, model_cfg=None) -> None:
    """ConfigError for ep/cp combinations that parallelize does not build (each family's rules live
    with its implementation)."""
    from scalelab.parallel.context_parallel import check_cp_supported
    from scalelab.parallel.expert_parallel import check_ep_supported

    check_cp_supported(dims)
    check_ep_supported(dims, model_cfg)


def fsdp_mesh(dims, mesh):
    """The FSDP mesh when cp > 1 (dp_shard × cp, or cp alone); None otherwise (the caller's default)."""
    if dims.cp == 1:
        return None
    names = mesh.mesh_dim_names or ()
    return mesh["dp_shard_cp"] if "dp_shard" in names else mesh["cp"]


def apply_ep_cp(chunk, dims, mesh, pcfg, device_type: str) -> None:
    """Swap in context-parallel attention and expert-parallel experts (call after TP, before FSDP)."""
    if dims.cp > 1:
        from scalelab.parallel.context_parallel import apply_cp

        if dims.tp > 1 and getattr(pcfg, "sequence_parallel", False):
            raise ConfigError(
                "parallel.sequence_parallel", "context parallel with sequence parallel is not built", "set it false"
            )
        apply_cp(chunk, mesh["cp"], getattr(pcfg, "cp_variant", "allgather"))
    if dims.ep > 1:
        from scalelab.parallel.data_parallel import mp_policy
        from scalelab.parallel.expert_parallel import apply_ep, apply_ep_fsdp, build_ep_mesh

        emesh = build_ep_mesh(dims, mesh)
        apply_ep(chunk, emesh["ep"])
        kwargs = dict(reshard_after_forward=pcfg.fsdp_reshard_after_forward)
        policy = mp_policy(pcfg.mixed_precision, device_type)
        if policy is not None:
            kwargs["mp_policy"] = policy
        apply_ep_fsdp(chunk, emesh["dp_mod_ep"], **kwargs)
        chunk._scalelab_ep_group = emesh["ep"].get_group()  # for the gradient norm


def shard_batch(inputs: torch.Tensor, targets: torch.Tensor, dims, mesh):
    """(inputs, targets, positions) of this cp rank (head-tail chunks); positions None without cp."""
    if dims.cp == 1:
        return inputs, targets, None
    from scalelab.parallel.context_parallel import shard_sequence_batch

    return shard_sequence_batch(inputs, targets, mesh["cp"].get_local_rank(), dims.cp)


def mean_over_cp(value: torch.Tensor, dims, mesh) -> torch.Tensor:
    """Average a detached per-rank mean over the cp group (equal token counts per rank)."""
    if dims.cp == 1:
        return value
    out = value.detach().float().reshape(()).clone().contiguous()
    dist.all_reduce(out, group=mesh["cp"].get_group())
    return out / dims.cp


def clip_grad_norm_ep(model, params, max_norm: float, pp_group=None) -> float:
    """Global grad-norm clipping when experts are sharded over ep: the squared norm of the expert
    gradients (complete over each expert's FSDP group) is summed over the ep group, the rest is
    handled as by `scalelab.parallel.step.global_grad_norm`."""
    from scalelab.parallel.expert_parallel import expert_params
    from scalelab.parallel.step import global_grad_norm

    experts = {id(p) for p in expert_params(model)}
    dense = [p for p in params if id(p) not in experts]
    expert = [p for p in params if id(p) in experts]
    dense_sq = global_grad_norm(dense, pp_group).pow(2) if dense else torch.zeros(())
    expert_sq = global_grad_norm(expert).pow(2).reshape(()).contiguous() if expert else torch.zeros(())
    dist.all_reduce(expert_sq, group=model._scalelab_ep_group)
    norm = (dense_sq + expert_sq).sqrt()
    if max_norm > 0:
        coef = float(torch.clamp(max_norm / (norm + 1e-6), max=1.0))
        for p in params:
            if p.grad is not None:
                p.grad.mul_(coef)
    return float(norm)
