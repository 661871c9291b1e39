"""Gradient compression for data-parallel layouts (`parallel.grad_compression`: none | bf16 | powersgd).

    comp = GradCompression.build(dims, parallel_cfg)   # None for "none": parallelize is unchanged
    mesh = comp.fsdp_mesh(dims)                        # what fully_shard shards over
    comp.register(chunk, is_last=...)                   # after apply_fsdp: hooks on every FSDP unit
    with count_collective_bytes() as counted: ...       # bytes per collective (bench/tests)

scalelab's data parallelism is FSDP2 everywhere (DDP = HSDP with a shard axis of 1, see
data_parallel.py), so torch's DDP communication hooks (`bf16_compress_hook`, `powerSGD_hook`) cannot
be registered on a DistributedDataParallel. They are run instead on the replicate all-reduce of
HSDP: with compression on, fully_shard gets only the shard axis (dp_shard, or dp_shard×cp) and each
FSDP unit's all-reduce hook (`FSDPModule.set_all_reduce_hook`, called on the reduce-scatter output
of the unit) hands that flat buffer to the torch hook over the dp_replicate group, through a small
adapter that looks like DDP's GradBucket (the flat buffer, one view per parameter shard, an index,
is_last). The hook averages over the replicas; FSDP then divides by the shard size as it always
does, so the gradient is the dp mean as without compression.

  - bf16: the replicate all-reduce through `bf16_compress_hook` (cast, all-reduce in bf16, cast back),
    and FSDP's reduce-scatter in bf16 (`MixedPrecisionPolicy(reduce_dtype=bfloat16)`): the sharded
    counterpart. Every gradient reduction moves half the fp32 bytes.
  - powersgd: the replicate all-reduce through `powerSGD_hook` (rank `parallel.powersgd_rank`
    P/Q factors per matrix, error feedback, warm start; vectors and matrices that rank would not
    shrink 2× are all-reduced whole). Needs dp_replicate > 1: a reduce-scatter cannot be low-rank
    compressed. The first `POWERSGD_START_STEP` backward passes use the plain all-reduce (torch
    needs ≥ 2 with error feedback); torch's default of 1000 is meant for long runs. The
    orthogonalisation gets epsilon 1e-8: under HSDP a rank's shard of the embedding gradient is
    all zero when none of its rows' tokens occurred, and torch's default of 0 turns that into NaN.

gloo on torch 2.13 all-reduces and reduce-scatters bf16 tensors (checked by the tests). Expert
shards of an MoE model keep their own HSDP mesh and are reduced uncompressed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy

from scalelab.parallel.dims import ParallelDims

POWERSGD_START_STEP = 2  # plain all-reduce for the first backward passes (torch's minimum with error feedback)


class _UnitBucket:
    """The part of DDP's GradBucket that torch's comm hooks read, over one FSDP unit's reduce output."""

    def __init__(self, buffer: torch.Tensor, params, index: int, is_last: bool):
        self._buffer, self._params, self._index, self._is_last = buffer, params, index, is_last

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def set_buffer(self, tensor: torch.Tensor) -> None:
        self._buffer.copy_(tensor)

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return self._is_last

    def gradients(self) -> list[torch.Tensor]:
        """One view per parameter shard, laid out as FSDP2's foreach_reduce reads them back."""
        views, offset = [], 0
        for p in self._params:
            views.append(torch.as_strided(self._buffer, p.sharded_size, p.contiguous_sharded_stride, offset))
            offset += p.padded_sharded_param_size.numel()
        return views

    def parameters(self) -> list[torch.Tensor]:
        return [p.sharded_param for p in self._params]


def _fsdp_params(module: FSDPModule) -> list:
    # FSDP2 has no public accessor for a unit's shard layout; this is the list its foreach_reduce
    # packs (and unpacks) the reduce-scatter output by, in that order
    group = module._get_fsdp_state()._fsdp_param_group
    return list(group.fsdp_params) if group is not None else []


@dataclass(kw_only=True)
class GradCompression:
    """One layout's gradient compression: the method, the replicate group and the hook state."""

    method: str  # bf16 | powersgd
    replicate_group: object | None  # the dp_replicate process group (None: no replicas)
    powersgd: PowerSGDState | None = None
    _units: int = field(default=0, repr=False)

    @classmethod
    def build(cls, dims: ParallelDims, pcfg) -> GradCompression | None:
        """None when compression is off (`parallelize` then runs exactly as without this module)."""
        method = getattr(pcfg, "grad_compression", "none")
        if method == "none":
            return None
        group = dims.mesh_for("dp_replicate").get_group() if dims.dp_replicate > 1 else None
        state = None
        if method == "powersgd":
            state = PowerSGDState(
                process_group=group,
                matrix_approximation_rank=pcfg.powersgd_rank,
                start_powerSGD_iter=POWERSGD_START_STEP,
                # a shard whose gradient is all zero (embedding rows of tokens no rank saw) would
                # otherwise be normalised by 0 in the orthogonalisation: NaN everywhere after
                orthogonalization_epsilon=1e-8,
            )
        return cls(method=method, replicate_group=group, powersgd=state)

    def fsdp_mesh(self, dims: ParallelDims):
        """The shard axis alone (size 1 for DDP): the replicate all-reduce is the hook's."""
        mesh = dims.fsdp_mesh
        if mesh is None or self.replicate_group is None:
            return mesh
        return mesh[mesh.mesh_dim_names[1]]  # (dp_replicate, shard axis) -> shard axis

    def fsdp_options(self, options: dict) -> dict:
        """`data_parallel.fsdp_options` with the reduce-scatter in bf16 under bf16 compression."""
        if self.method != "bf16":
            return options
        policy = options.get("mp_policy")
        param_dtype = policy.param_dtype if policy is not None else None
        return dict(options, mp_policy=MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.bfloat16))

    def register(self, chunk: nn.Module, *, last_chunk: bool) -> None:
        """Hook every FSDP unit of `chunk` (blocks, then the root, which is reduced last in backward).

        `last_chunk`: whether this chunk's root finishes a backward pass on this rank (PowerSGD
        counts iterations there)."""
        if self.replicate_group is None:
            return  # pure FSDP: only the bf16 reduce-scatter (fsdp_options)
        units = [m for m in chunk.modules() if isinstance(m, FSDPModule)]
        for m in units:
            m.set_all_reduce_hook(self._hook(m, self._units, last_chunk and m is chunk))
            self._units += 1

    def _hook(self, module: FSDPModule, index: int, is_last: bool):
        def all_reduce(reduce_output: torch.Tensor) -> None:
            bucket = _UnitBucket(reduce_output, _fsdp_params(module), index, is_last)
            if self.method == "bf16":
                fut = bf16_compress_hook(self.replicate_group, bucket)
            else:
                fut = powerSGD_hook(self.powersgd, bucket)
            out = fut.wait()
            out = out[0] if isinstance(out, list) else out
            if out.data_ptr() != reduce_output.data_ptr():
                reduce_output.copy_(out)

        return all_reduce


@dataclass
class CollectiveBytes:
    """Payload bytes this rank handed to each collective (the tensor it sends; a ring all-reduce
    puts 2(n-1)/n of it on the wire, a reduce-scatter (n-1)/n of its input)."""

    by_op: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.by_op.values())

    def add(self, op: str, t: torch.Tensor) -> None:
        self.by_op[op] = self.by_op.get(op, 0) + t.numel() * t.element_size()


# op -> (positional index, keyword) of the tensor whose bytes are counted: what a rank contributes
# (all-reduce: its tensor; reduce-scatter: its full input; all-gather: the gathered output).
_COUNTED = {
    "all_reduce": (0, "tensor"),
    "reduce_scatter_tensor": (1, "input"),
    "reduce_scatter_single": (1, "input"),
    "all_gather_into_tensor": (0, "output_tensor"),
    "all_gather_single": (0, "output_tensor"),
}


@contextlib.contextmanager
def count_collective_bytes() -> Iterator[CollectiveBytes]:
    """Count the bytes passed to torch.distributed collectives inside the block (FSDP2 and the comm
    hooks call them through the `torch.distributed` module, so wrapping its attributes sees them).
    Reduce-scatters count their input, all-gathers their output, all-reduces their tensor."""
    counted = CollectiveBytes()
    originals = {op: getattr(dist, op) for op in _COUNTED if hasattr(dist, op)}

    def wrap(op, fn):
        index, key = _COUNTED[op]

        def counted_op(*args, **kwargs):
            t = kwargs.get(key, args[index] if len(args) > index else None)
            if isinstance(t, torch.Tensor):
                counted.add(op.split("_single")[0].split("_tensor")[0], t)
            return fn(*args, **kwargs)

        return counted_op

    for op, fn in originals.items():
        setattr(dist, op, wrap(op, fn))
    try:
        yield counted
    finally:
        for op, fn in originals.items():
            setattr(dist, op, fn)
