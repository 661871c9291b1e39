"""The hook the training loop calls for a multi-process layout: mesh, parallelize, step functions.

    model = apply_parallelism(model, cfg, runtime)

Builds the DeviceMesh for cfg.parallel over the existing process group, parallelizes the model,
sets runtime.dp_rank / dp_size (which slice of the global batch this rank reads) and puts the
layout's step functions into runtime.extra: "forward_backward", "loss_fn" (validation),
"clip_grad_norm", plus "mesh", "dims" and "parallelized" (and, for MoE models, "router_row": the
global batch's router statistics, a collective every rank calls at logging steps).
"""

from __future__ import annotations

from scalelab.parallel.dims import ParallelDims
from scalelab.parallel.parallelize import parallelize


def apply_parallelism(model, cfg, runtime):
    """Parallelize `model` per cfg.parallel for this process; returns the module to optimize/checkpoint."""
    dims = ParallelDims.from_config(
        cfg.parallel,
        world_size=runtime.world_size,
        model=cfg.model,
        seq_len=cfg.data.seq_len,
        global_batch_sequences=cfg.global_batch_sequences,
        micro_batch_sequences=cfg.train.micro_batch_sequences,
    )
    mesh = dims.build_mesh(runtime.device.type)
    par = parallelize(model, dims, cfg, mesh, device=runtime.device)
    runtime.dp_rank, runtime.dp_size = dims.dp_coords(mesh)
    if getattr(cfg.model, "family", "dense") == "moe":
        from functools import partial

        from scalelab.parallel.expert_parallel import global_router_row

        runtime.extra["router_row"] = partial(global_router_row, dims=dims)  # a collective
    runtime.extra.update(
        mesh=mesh,
        dims=dims,
        parallelized=par,
        forward_backward=par.step.forward_backward,
        loss_fn=par.step.eval_loss,
        clip_grad_norm=par.step.clip_grad_norm,
    )
    return par.model
