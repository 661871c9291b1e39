"""Per-rank memory accounting for parameters, gradients and optimizer state under a layout.

    expected = expected_memory(model_cfg, pcfg, coords, optimizer="adamw", seq_len=T)
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

from scalelab.parallel.config import ParallelConfig
from scalelab.parallel.planner_memory import StateBytes, local_shape, param_shapes, params_of_pp_rank

_FP32_BYTES = 4


def expected_memory(
    model_cfg, pcfg: ParallelConfig, coords: dict[str, int], *, optimizer: str, seq_len: int
) -> StateBytes:
    """Bytes of parameters, gradients and optimizer state on the rank at mesh `coords` (axis -> local
    rank; see the module doc)."""
    shapes = param_shapes(model_cfg)
    names = params_of_pp_rank(model_cfg, pcfg, coords.get("pp", 0), seq_len)
    numel = 0
    for n in names:
        count = 1
        for s in local_shape(n, shapes[n], pcfg, coords):
            count *= s
        numel += count
    param_bytes = numel * _FP32_BYTES
    if optimizer == "adamw":
        optim_bytes = 2 * param_bytes + len(names) * _FP32_BYTES
    elif optimizer == "sgd":
        optim_bytes = 0
    else:
        raise ValueError(f"unknown optimizer {optimizer!r}; use adamw or sgd")
    return StateBytes(
        param_bytes=param_bytes, grad_bytes=param_bytes, optim_bytes=optim_bytes, num_param_tensors=len(names)
    )


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _nbytes(t: torch.Tensor) -> int:
    t = _local(t)
    return t.numel() * t.element_size()


def measured_memory(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> StateBytes:
    """Bytes this rank's parameters, their gradients and the optimizer state actually hold."""
    params = {id(p): p for p in model.parameters()}.values()
    param_bytes = sum(_nbytes(p) for p in params)
    grad_bytes = sum(_nbytes(p.grad) for p in params if p.grad is not None)
    optim_bytes = 0
    if optimizer is not None:
        for state in optimizer.state.values():
            optim_bytes += sum(_nbytes(v) for v in state.values() if isinstance(v, torch.Tensor))
    return StateBytes(
        param_bytes=param_bytes, grad_bytes=grad_bytes, optim_bytes=optim_bytes, num_param_tensors=len(params)
    )
