"""Data parallel over the dp axes with FSDP2 `fully_shard`: ZeRO-3, ZeRO-2, HSDP and plain DDP.

One mechanism covers the four: each block is its own FSDP unit and the root (embedding, final norm,
output) is the last one.
  - FSDP / ZeRO-3: mesh = dp_shard; parameters re-sharded after forward (all-gathered again in
    backward).
  - ZeRO-2: `reshard_after_forward=False` keeps the gathered parameters from forward to backward
    (more memory, one all-gather fewer); gradients and optimizer state stay sharded.
  - HSDP: a 2-D mesh (dp_replicate, dp_shard): sharded inside a group, replicated across groups
    (reduce-scatter, then all-reduce across replicas).
  - DDP: HSDP with a dp_shard axis of size 1: every rank holds full parameters and optimizer
    state, gradients are all-reduced. Same code path, so DDP composes with TP and PP like FSDP.
Parameters that tensor parallel already made DTensors get a 2-D (dp, tp) sharding from FSDP2.

Mixed precision (`parallel.mixed_precision`): auto = bf16 parameters/compute with fp32 gradient
reduction on CUDA and plain fp32 on CPU; fp32; bf16 (bf16 compute, fp32 reduce, anywhere).
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def mp_policy(mode: str, device_type: str) -> MixedPrecisionPolicy | None:
    """The FSDP2 mixed-precision policy for `parallel.mixed_precision` on `device_type`."""
    if mode == "bf16" or (mode == "auto" and device_type == "cuda"):
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return None  # fp32: parameters, compute and reductions all in fp32


def fsdp_options(*, reshard_after_forward: bool, mixed_precision: str, device_type: str) -> dict:
    """The fully_shard keyword arguments every FSDP unit of a layout shares (resharding, precision)."""
    kwargs: dict = dict(reshard_after_forward=reshard_after_forward)
    policy = mp_policy(mixed_precision, device_type)
    if policy is not None:
        kwargs["mp_policy"] = policy
    return kwargs


def apply_fsdp(model: nn.Module, dp_mesh, **options) -> None:
    """fully_shard every block, then the root, over `dp_mesh` (1-D: FSDP; 2-D: HSDP/DDP).

    options: `fsdp_options(...)` (resharding and mixed precision)."""
    kwargs = dict(options, mesh=dp_mesh)
    ignored = getattr(model, "fsdp_ignored_params", None)  # set by expert parallel (see there)
    if ignored:
        kwargs["ignored_params"] = ignored
    for block in model.layers.values():
        fully_shard(block, **kwargs)
    # The root unit holds the embedding, the final norm and the output projection (whichever of
    # them this pipeline stage has); its parameters are gathered at the model's forward.
    fully_shard(model, **kwargs)
