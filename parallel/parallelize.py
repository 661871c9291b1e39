"""parallelize(model, dims, parallel_cfg, *, seq_len, z_loss): apply a layout to a single-device model from outside.

Fixed order (torchtitan's): pipeline split → tensor + sequence parallel (+ loss parallel) →
context / expert parallel → activation checkpointing → torch.compile → FSDP2 (ZeRO-3 / ZeRO-2 /
HSDP / DDP, mixed precision, and gradient compression hooks when `parallel.grad_compression` is
set: scalelab.parallel.compression). Each pipeline chunk gets the same treatment. A world of 1 is a
layout like any other: activation checkpointing and compile apply there too, and its step runs the
same fused loss. The model code never sees a process group: it gets DTensor parameters and hooks,
and the returned `Parallelized` knows how to run a step.

    dims = ParallelDims.from_config(cfg.parallel)
    par = parallelize(build_model(cfg.model, "meta"), dims, cfg.parallel, seq_len=256, z_loss=0.0, device=device)
    par.materialize(seed)   # only this rank's shards are allocated and initialised
    par.model               # the module to give the optimizer and the checkpointer
    par.step.forward_backward(inputs, targets, scale)
    par.dp_rank, par.dp_size   # which slice of the global batch this rank reads
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from scalelab.models.moe import moe_modules
from scalelab.parallel.activation_checkpointing import apply_ac
from scalelab.parallel.compression import GradCompression
from scalelab.parallel.config import ParallelConfig
from scalelab.parallel.context_parallel import apply_cp
from scalelab.parallel.data_parallel import apply_fsdp, fsdp_options
from scalelab.parallel.dims import ParallelDims
from scalelab.parallel.expert_parallel import apply_ep, apply_ep_fsdp
from scalelab.parallel.pipeline_parallel import Pipeline
from scalelab.parallel.step import ParallelStep
from scalelab.parallel.tp import apply_tp


@dataclass(kw_only=True)
class Parallelized:
    """What parallelize returns: the module to train, its step operations and the layout."""

    model: nn.Module  # the whole model, or this rank's pipeline chunks as one ModelParts
    step: ParallelStep
    dims: ParallelDims  # with its meshes built (none for a world of 1)
    device: torch.device
    pipeline: Pipeline | None = None
    chunks: list[nn.Module]  # the Transformer (stages) that were parallelized

    @property
    def dp_rank(self) -> int:
        return self.dims.dp_coords()[0]

    @property
    def dp_size(self) -> int:
        return self.dims.dp_coords()[1]

    def materialize(self, seed: int | None) -> None:
        """Allocate this rank's shards of a model parallelized on the meta device and initialise them.

        Each parameter is drawn full-size from its own (seed, name) generator and sliced to the
        local shard (`Transformer.init_weights`), so the values equal the single-device model's
        while a rank never holds more than one full parameter at a time.
        """
        for chunk in self.chunks:
            chunk.to_empty(device=self.device)
            chunk.init_weights(seed)


def parallelize(
    model: nn.Module,
    dims: ParallelDims,
    parallel_cfg: ParallelConfig,
    *,
    seq_len: int,
    z_loss: float = 0.0,
    device: torch.device | None = None,
) -> Parallelized:
    """Apply `parallel_cfg` to `model` in place; see the module docstring.

    Args:
        model: a single-device Transformer (on the meta device, or already initialised).
        dims: the layout's dims; its mesh is built over the default process group when missing
            (a world of 1 needs none).
        parallel_cfg: the options the degrees do not say (schedules, AC, compile, FSDP, precision).
        seq_len: tokens per sequence (pipeline stage balance and micro-batch shapes).
        z_loss: weight of the log-partition penalty in the training loss.
        device: where the parameters live (default: where the model's are; meta → cpu).
    """
    if device is None:
        device = next(model.parameters()).device
        device = torch.device("cpu") if device.type == "meta" else device
    if dims.world_size > 1:
        dims.build_mesh(device.type)
    pipeline = None
    chunks = [model]
    if dims.pp > 1:
        pipeline = Pipeline(model, dims.mesh_for("pp"), parallel_cfg, device, model.cfg, seq_len)
        chunks = pipeline.stage_modules
        if dims.tp > 1 and parallel_cfg.sequence_parallel:
            pipeline._seq_divisor = dims.tp
    fsdp = fsdp_options(
        reshard_after_forward=parallel_cfg.fsdp_reshard_after_forward,
        mixed_precision=parallel_cfg.mixed_precision,
        device_type=device.type,
    )
    fsdp_mesh = dims.fsdp_mesh
    compression = GradCompression.build(dims, parallel_cfg)  # None unless parallel.grad_compression is set
    if compression is not None:
        fsdp, fsdp_mesh = compression.fsdp_options(fsdp), compression.fsdp_mesh(dims)
    for chunk in chunks:
        if dims.tp > 1:
            apply_tp(
                chunk,
                dims.mesh_for("tp"),
                sequence_parallel=parallel_cfg.sequence_parallel,
                loss_parallel=parallel_cfg.loss_parallel,
            )
        if dims.cp > 1:
            apply_cp(chunk, dims.mesh_for("cp"), parallel_cfg.cp_variant)
        if dims.ep > 1 or (dims.tp > 1 and moe_modules(chunk)):  # experts sharded over ep and/or tp
            apply_ep(chunk, dims.ep_mesh)
            apply_ep_fsdp(chunk, dims.ep_mesh, **fsdp)
        apply_ac(chunk, parallel_cfg.activation_checkpoint)
        if parallel_cfg.compile:
            for block in chunk.layers.values():
                block.compile()  # in place: parameter names stay the single-device ones
        if fsdp_mesh is not None:
            apply_fsdp(chunk, fsdp_mesh, **fsdp)
            if compression is not None:  # chunks[0] holds this rank's first stage: its root is reduced last
                compression.register(chunk, last_chunk=chunk is chunks[0])
    if pipeline is not None:
        model = pipeline.finalize()
    step = ParallelStep(model, dims, parallel_cfg, z_loss=z_loss, pipeline=pipeline)
    return Parallelized(model=model, step=step, dims=dims, device=device, pipeline=pipeline, chunks=chunks)
