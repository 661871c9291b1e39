"""parallelize(model, dims, cfg, mesh): apply a layout to a single-device model from outside.

Fixed order (torchtitan's): pipeline split → tensor + sequence parallel (+ loss parallel) →
context / expert parallel (scalelab.parallel.ep_cp_hooks) → activation checkpointing →
torch.compile → FSDP2 (ZeRO-3 / ZeRO-2 / HSDP / DDP, mixed precision).
Each pipeline chunk gets the same treatment. The model code never sees a process group: it gets
DTensor parameters and hooks, and the returned `ParallelStep` knows how to run a step.

    par = parallelize(build_model(cfg.model, device, seed), dims, cfg, mesh)
    # or, never holding the whole model on a rank (what the training loop does):
    par = parallelize(build_model(cfg.model, "meta"), dims, cfg, mesh, device=device)
    par.materialize(device, seed)
    par.model          # the module to give the optimizer and the checkpointer
    par.step.forward_backward(inputs, targets, scale)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from scalelab.parallel.checkpointing import apply_ac
from scalelab.parallel.data_parallel import apply_fsdp
from scalelab.parallel.dims import ParallelDims
from scalelab.parallel.ep_cp_hooks import apply_ep_cp, fsdp_mesh
from scalelab.parallel.pipeline import Pipeline
from scalelab.parallel.step import ParallelStep
from scalelab.parallel.tp import apply_tp


@dataclass(kw_only=True)
class Parallelized:
    model: nn.Module  # the whole model, or this rank's pipeline chunks as one ModelParts
    step: ParallelStep
    dims: ParallelDims
    mesh: object
    pipeline: Pipeline | None = None
    chunks: list[nn.Module] | None = None  # the Transformer (stages) that were parallelized

    def materialize(self, device: torch.device, seed: int | None) -> None:
        """Allocate this rank's shards of a model parallelized on the meta device and initialise them.

        Each parameter is drawn full-size from its own (seed, name) generator and sliced to the
        local shard (`Transformer.init_weights`), so the values equal the single-device model's
        while a rank never holds more than one full parameter at a time.
        """
        for chunk in self.chunks:
            chunk.to_empty(device=device)
            chunk.init_weights(seed)


def dp_mesh_of(dims: ParallelDims, mesh):
    """The mesh FSDP2 shards/replicates over: (dp_replicate, dp_shard) for HSDP/DDP, dp_shard, or None."""
    if dims.dp_replicate > 1:
        return mesh[("dp_replicate", "dp_shard")]
    if dims.dp_shard > 1:
        return mesh["dp_shard"]
    return None


def parallelize(
    model: nn.Module, dims: ParallelDims, cfg, mesh=None, *, device: torch.device | None = None
) -> Parallelized:
    """Apply `cfg.parallel` (a RunConfig's section) to `model` in place; see the module docstring.

    mesh: the DeviceMesh of `dims` (built over the default process group when None).
    """
    pcfg = cfg.parallel
    device = device or next(model.parameters()).device
    if mesh is None:
        mesh = dims.build_mesh(device.type)
    pipeline = None
    chunks = [model]
    if dims.pp > 1:
        pipeline = Pipeline(model, mesh["pp"], pcfg, device, cfg.model, cfg.data.seq_len)
        chunks = pipeline.stage_modules
        if dims.tp > 1 and pcfg.sequence_parallel:
            pipeline._seq_divisor = dims.tp
    dp_mesh = fsdp_mesh(dims, mesh) or dp_mesh_of(dims, mesh)  # FSDP over dp_shard × cp under cp
    for chunk in chunks:
        if dims.tp > 1:
            apply_tp(chunk, mesh["tp"], sequence_parallel=pcfg.sequence_parallel, loss_parallel=pcfg.loss_parallel)
        apply_ep_cp(chunk, dims, mesh, pcfg, device.type)  # no-op unless cp > 1 or ep > 1
        apply_ac(chunk, pcfg.activation_checkpoint)
        if pcfg.compile:
            for block in chunk.layers.values():
                block.compile()  # in place: parameter names stay the single-device ones
        if dp_mesh is not None:
            apply_fsdp(
                chunk,
                dp_mesh,
                reshard_after_forward=pcfg.fsdp_reshard_after_forward,
                mixed_precision=pcfg.mixed_precision,
                device_type=device.type,
            )
    if pipeline is not None:
        model = pipeline.finalize()
    step = ParallelStep(model, dims, mesh, pcfg, z_loss=cfg.optim.z_loss, pipeline=pipeline)
    return Parallelized(model=model, step=step, dims=dims, mesh=mesh, pipeline=pipeline, chunks=chunks)
