"""Activation checkpointing per transformer block: none | full | selective.

full: each block's activations are recomputed in backward (only its input is kept).
selective: op-level selective checkpointing: matmul and attention outputs (and, under tensor
parallel, the results of reduce-scatters) are saved, cheap pointwise ops (norms, SiLU, RoPE)
are recomputed. It saves most of the activation memory of the pointwise chain at ~no FLOP cost.

The wrapper inserts `_checkpoint_wrapped_module` into parameter names; torch's
`get_state_dict` strips it, so checkpoints stay loadable with and without AC.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn as nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

SAVE_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    # expert parallel's token exchange (and its counts): kept, not sent again in recompute
    torch.ops._c10d_functional.all_to_all_single.default,
}


def _policy(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def apply_ac(model: nn.Module, mode: str) -> None:
    """Wrap each block of `model.layers` in place (mode 'none' does nothing)."""
    if mode == "none":
        return
    for name, block in list(model.layers.named_children()):
        if mode == "full":
            wrapped = checkpoint_wrapper(block, preserve_rng_state=True)
        else:
            wrapped = checkpoint_wrapper(
                block,
                preserve_rng_state=True,
                context_fn=partial(create_selective_checkpoint_contexts, _policy),
            )
        model.layers.register_module(name, wrapped)
