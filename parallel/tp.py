"""Tensor parallel (+ sequence parallel, + loss parallel) for the dense Llama model, as DTensor plans.

Megatron-style: in each block wq/wk/wv and w1/w3 are column-sharded (heads and the SwiGLU width
split over the tp axis) and wo/w2 row-sharded, so each block needs one all-reduce (TP) or one
all-gather + one reduce-scatter (TP+SP) forward, and the same backward.

Sequence parallel (`sequence_parallel=True`): the residual stream between blocks is a DTensor
sharded over the sequence (Shard(1)); RMSNorms run on their sequence shard; the all-gather happens
on entry to attention/MLP and the reduce-scatter on exit. The stream stays a DTensor (not a local
tensor) so that the model sees the global sequence length (RoPE tables are sliced by it).

Loss parallel (`loss_parallel=True`): the output projection is column-sharded over the vocabulary
and its logits stay a Shard(-1) DTensor; cross-entropy then runs under
`torch.distributed.tensor.parallel.loss_parallel()` without gathering [B, T, V] logits. Without it
the logits are all-gathered into a Replicate DTensor, and the model returns that DTensor: its local
tensor is a view, and a view returned by an FSDP2 module's forward would lose FSDP's pre-backward
hook to any in-place op on it, so the caller takes the local tensor (`step.loss_from_logits`).

MoE blocks (family "moe"): see `_moe_plan`; the routed experts' own split over tp lives with
expert parallel (`scalelab.parallel.expert_parallel`).

Kernels: on DTensor activations (norms under SP) the torch reference ops are used, since a fused
Triton kernel cannot take a DTensor; attention and SwiGLU see local tensors and keep their kernels.
"""

from __future__ import annotations

import torch.nn as nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from scalelab.kernels import get_ops
from scalelab.models.llama import override_ops
from scalelab.models.moe import MoE


def apply_tp(model: nn.Module, tp_mesh, *, sequence_parallel: bool, loss_parallel: bool) -> None:
    """Shard `model` (a Transformer or one pipeline stage of it) in place over `tp_mesh`."""
    sp = sequence_parallel
    top: dict = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Shard(1) if sp else Replicate(), use_local_output=not sp
        )
    if model.norm is not None and sp:
        top["norm"] = SequenceParallel(use_local_output=False)
    if model.output is not None:
        top["output"] = ColwiseParallel(
            input_layouts=Shard(1) if sp else Replicate(),
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=False,
        )
    if top:
        parallelize_module(model, tp_mesh, top)
    if model.tok_embeddings is not None:
        # DTensor's embedding backward yields a Replicate (full-vocabulary) gradient for the
        # row-sharded table; keep only this rank's rows, like the parameter (FSDP2 does the same).
        model.tok_embeddings.weight.register_post_accumulate_grad_hook(_grad_like_param)

    if sp and model.tok_embeddings is None:
        # A pipeline stage without the embedding receives a plain tensor from the previous stage:
        # under SP, this rank's sequence shard, re-wrapped as a Shard(1) DTensor on entry.
        parallelize_module(
            model,
            tp_mesh,
            PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Shard(1),), use_local_output=False),
        )
    if sp and model.output is None:
        # ... and a stage without the output sends its local sequence shard on (P2P takes no DTensor).
        parallelize_module(
            model,
            tp_mesh,
            PrepareModuleOutput(output_layouts=(Shard(1),), desired_output_layouts=(Shard(1),), use_local_output=True),
        )
    for block in model.layers.values():
        plan = {
            "attention": PrepareModuleInput(
                input_layouts=(Shard(1) if sp else Replicate(), None, None),
                desired_input_layouts=(Replicate(), None, None),
            ),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1) if sp else Replicate(), use_local_output=not sp),
        }
        if isinstance(block.feed_forward, MoE):
            plan.update(_moe_plan(block.feed_forward, sp))
        else:
            plan.update(
                {
                    "feed_forward": PrepareModuleInput(
                        input_layouts=(Shard(1) if sp else Replicate(),), desired_input_layouts=(Replicate(),)
                    ),
                    "feed_forward.w1": ColwiseParallel(),
                    "feed_forward.w2": RowwiseParallel(
                        output_layouts=Shard(1) if sp else Replicate(), use_local_output=not sp
                    ),
                }
            )
            if block.feed_forward.w3 is not None:  # SwiGLU's up projection; a GELU MLP has none
                plan["feed_forward.w3"] = ColwiseParallel()
        if sp:
            plan["attention_norm"] = SequenceParallel(use_local_output=False)
            plan["ffn_norm"] = SequenceParallel(use_local_output=False)
        parallelize_module(block, tp_mesh, plan)
        if sp:
            override_ops(block.attention_norm, _torch_ops)
            override_ops(block.ffn_norm, _torch_ops)
    if sp and model.norm is not None:
        override_ops(model.norm, _torch_ops)


def _torch_ops(_base):
    return get_ops("torch")  # a fused Triton kernel cannot take the DTensor activations under SP


def _moe_plan(moe: MoE, sp: bool) -> dict:
    """TP of an MoE block: it runs on the tp group's full tokens as local tensors (all-gathered under
    SP), so routing and router statistics are those of one device; the router is replicated, the
    shared experts are column/row-parallel with a replicated output, and the routed experts are split
    over tp by `scalelab.parallel.expert_parallel.ShardedExperts` (applied next). The block's output
    is complete on every tp rank; under SP each rank keeps its sequence shard of it."""
    plan = {
        "feed_forward": PrepareModuleInputOutput(
            input_layouts=(Shard(1) if sp else Replicate(),),
            desired_input_layouts=(Replicate(),),
            use_local_input=True,
            output_layouts=(Replicate(),),
            desired_output_layouts=(Shard(1) if sp else Replicate(),),
            use_local_output=not sp,
        )
    }
    if moe.shared_experts is not None:
        plan["feed_forward.shared_experts.w1"] = ColwiseParallel()
        plan["feed_forward.shared_experts.w3"] = ColwiseParallel()
        plan["feed_forward.shared_experts.w2"] = RowwiseParallel()
    return plan


def _grad_like_param(param) -> None:
    if param.grad is not None and param.grad.placements != param.placements:
        param.grad = param.grad.redistribute(placements=param.placements)
