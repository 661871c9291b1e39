"""The hooks through which `parallelize` and `ParallelStep` apply expert and context parallel.

    dp_mesh = fsdp_mesh(dims, mesh)               # FSDP over dp_shard × cp when cp > 1
    apply_ep_cp(chunk, dims, mesh, pcfg, device_type)   # CP attention, EP expert shards (+ their FSDP)
    inputs, targets, positions = shard_batch(inputs, targets, dims, mesh)   # this cp rank's rows
    ce = mean_over_cp(ce, dims, mesh)             # the loss of the whole sequence, on every cp rank

Every function is a no-op (or returns its input) when cp == ep == 1 and the model is dense, so the
dense path is unchanged. What is built: cp with FSDP/HSDP, TP (+SP) and pipeline stages, both
variants (all-gather KV by default; `parallel.cp_variant=ring`); MoE experts sharded over ep
(inside dp_shard × cp) and tp (their hidden width), with FSDP/HSDP of the expert shards over the
remaining data-parallel ranks; both inside pipeline stages too. What is not built is rejected with
a ConfigError before any process starts (`expert_parallel.check_ep_supported`, called by
`ParallelDims.check_supported`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def fsdp_mesh(dims, mesh):
    """The FSDP mesh when cp > 1 (dp_shard × cp, or cp alone; HSDP with dp_replicate); None otherwise."""
    if dims.cp == 1:
        return None
    from scalelab.parallel.context_parallel import cp_fsdp_mesh

    return cp_fsdp_mesh(dims, mesh)


def apply_ep_cp(chunk, dims, mesh, pcfg, device_type: str) -> None:
    """Swap in context-parallel attention and expert-parallel experts (call after TP, before FSDP)."""
    if dims.cp > 1:
        from scalelab.parallel.context_parallel import apply_cp

        apply_cp(chunk, mesh["cp"], getattr(pcfg, "cp_variant", "allgather"))
    from scalelab.models.moe import moe_modules
    from scalelab.parallel.expert_parallel import apply_ep, apply_ep_fsdp, build_ep_mesh

    if dims.ep > 1 or (dims.tp > 1 and moe_modules(chunk)):  # experts sharded over ep and/or tp
        from scalelab.parallel.data_parallel import fsdp_options

        emesh = build_ep_mesh(dims, mesh)
        apply_ep(chunk, emesh)
        options = fsdp_options(
            reshard_after_forward=pcfg.fsdp_reshard_after_forward,
            mixed_precision=pcfg.mixed_precision,
            device_type=device_type,
        )
        apply_ep_fsdp(chunk, emesh, **options)


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
