"""Per-rank memory accounting for parameters, gradients and optimizer state under a layout.

    expected = expected_memory(model_cfg, dims, pcfg, coords, optimizer="adamw", seq_len=T)
    measured = measured_memory(model, optimizer)        # what this rank's tensors actually hold
    expected == measured                                  # exact, in bytes (tests check it)

The rules (fp32 state; FSDP2 keeps its sharded parameters in fp32 even under bf16 compute):
  - pipeline: a rank holds only its stages' blocks (+ embedding on stage 0, norm/output on the last);
  - tensor parallel: wq/wk/wv/w1/w3 and `output` split dim 0 by tp, wo/w2 split dim 1, the
    embedding splits its rows (vocabulary), routed experts their hidden dim; norms and routers are
    replicated; expert parallel splits the experts' dim 0 by ep;
  - FSDP2: then dim 0 of that local tensor is split over dp_shard × cp like torch.chunk (ceil-size
    chunks, the last ones shorter or empty; experts over dp_shard × cp / ep, see
    scalelab.parallel.planner_memory.local_shape); dp_replicate copies do not shrink anything;
  - gradients after backward have exactly the parameters' local shapes;
  - AdamW: exp_avg + exp_avg_sq (parameter-sized) + one fp32 `step` scalar per parameter tensor;
    SGD without momentum keeps nothing.
Counts are of the tensors a rank sees (DTensor local shards); FSDP2's communication buffers and
the transient gathered parameters of forward/backward are not state and are not counted.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

from scalelab.parallel.planner_memory import (
    Layout,
    StateBytes,
    param_shapes,
    params_of_pp_rank,
)
from scalelab.parallel.planner_memory import local_shape as planner_local_shape

_FP32_BYTES = 4


# One record type for expected and measured state bytes, shared with the planner.
MemoryReport = StateBytes


def full_param_shapes(model_cfg) -> dict[str, tuple[int, ...]]:
    """Every parameter of the single-device model with its full shape (single-device names).

    One table serves both this per-rank check and the planner (scalelab.parallel.planner_memory).
    """
    return param_shapes(model_cfg)


def local_shape(name: str, shape: tuple[int, ...], dims, coords: dict[str, int]) -> tuple[int, ...]:
    """The shape of parameter `name` on the rank at mesh coordinates `coords` (axis -> local rank);
    the one rule set, shared with the planner (scalelab.parallel.planner_memory.local_shape)."""
    return planner_local_shape(name, shape, dims, coords)


def params_on_pp_rank(model_cfg, dims, pcfg, pp_rank: int, seq_len: int) -> list[str]:
    """Names of the parameters held by pipeline rank `pp_rank` (all of them without pp)."""
    layout = Layout(pp=dims.pp, pp_schedule=pcfg.pp_schedule)
    return params_of_pp_rank(model_cfg, layout, pp_rank, seq_len)


def expected_memory(model_cfg, dims, pcfg, coords: dict[str, int], *, optimizer: str, seq_len: int) -> MemoryReport:
    """Bytes of parameters, gradients and optimizer state on the rank at `coords` (see module doc)."""
    shapes = full_param_shapes(model_cfg)
    names = params_on_pp_rank(model_cfg, dims, pcfg, coords.get("pp", 0), seq_len)
    numel = 0
    for n in names:
        count = 1
        for s in local_shape(n, shapes[n], dims, coords):
            count *= s
        numel += count
    param_bytes = numel * _FP32_BYTES
    if optimizer == "adamw":
        optim_bytes = 2 * param_bytes + len(names) * _FP32_BYTES
    elif optimizer == "sgd":
        optim_bytes = 0
    else:
        raise ValueError(f"unknown optimizer {optimizer!r}; use adamw or sgd")
    return MemoryReport(
        param_bytes=param_bytes, grad_bytes=param_bytes, optim_bytes=optim_bytes, num_param_tensors=len(names)
    )


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _nbytes(t: torch.Tensor) -> int:
    t = _local(t)
    return t.numel() * t.element_size()


def measured_memory(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> MemoryReport:
    """Bytes this rank's parameters, their gradients and the optimizer state actually hold."""
    params = {id(p): p for p in model.parameters()}.values()
    param_bytes = sum(_nbytes(p) for p in params)
    grad_bytes = sum(_nbytes(p.grad) for p in params if p.grad is not None)
    optim_bytes = 0
    if optimizer is not None:
        for state in optimizer.state.values():
            optim_bytes += sum(_nbytes(v) for v in state.values() if isinstance(v, torch.Tensor))
    return MemoryReport(
        param_bytes=param_bytes, grad_bytes=grad_bytes, optim_bytes=optim_bytes, num_param_tensors=len(params)
    )
