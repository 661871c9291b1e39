"""The planner's hardware description and free cost constants (one object each), shared by its memory and time models.

`Hardware` is what a GPU type and its cluster are (datasheet peaks, link bandwidths, NCCL's latencies);
`CostConstants` are the efficiencies `planner.calibrate` refits from measured runs. Per-GPU values
with their sources are in parallel/hardware.py.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30


@dataclass(kw_only=True, slots=True)
class Hardware:
    gpu_memory_bytes: int = 80 * GIB
    peak_flops: float = 989e12  # bf16 dense matmul peak of one GPU (H100 SXM)
    gpus_per_node: int = 8
    intra_node_bytes_per_s: float = 450e9  # NVLink, per GPU, one direction
    inter_node_bytes_per_s: float = 50e9  # 400 Gb/s InfiniBand per GPU
    # per-collective latency (planner_time's alpha-beta model), NCCL's own figures for large messages
    # (src/graph/tuning.cc, Ring/Simple): a base per collective and a latency per ring step by link
    collective_latency_s: float = 8.4e-6
    intra_node_step_latency_s: float = 3.4e-6  # NVLink
    inter_node_step_latency_s: float = 14e-6  # network (InfiniBand / RoCE)
    compute_dtype_bytes: int = 2  # activations and gathered parameters on the wire: bf16 (CPU runs fp32: 4)
    host_runs_ahead: bool = True  # the host queues work ahead of the device, so FSDP prefetches forward (not on CPU)


@dataclass(kw_only=True, slots=True)
class CostConstants:
    """The model's free constants; `calibrate` refits them from measured runs."""

    mfu: float = 0.45  # fraction of peak FLOPs the matmuls reach
    comm_efficiency: float = 0.7  # fraction of link bandwidth collectives reach
    fsdp_overlap: float = 0.9  # a prefetched FSDP/DDP collective hides behind this fraction of one unit's compute
    activation_scale: float = 1.0  # measured / formula activation bytes
    overhead_bytes: float = 3.0 * GIB  # CUDA context, allocator fragmentation, NCCL buffers
