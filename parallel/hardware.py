"""One set of planner constants per GPU type (scalelab.parallel.planner's Hardware + CostConstants).

    hw, consts = GPU_TYPES["H100-SXM"]
    plan_layouts(cfg, num_gpus=8192, seq_len=8192, global_batch_tokens=2**24, hw=hw, consts=consts)

Where each number comes from (docs/planner-at-scale.md has the table and the check against
published cluster results):
  - peak_flops: the datasheet's dense bf16 tensor-core peak (A100 SXM 312 TFLOP/s; H100 SXM
    989 TFLOP/s, half the with-sparsity figure).
  - intra_node_bytes_per_s: NVLink per GPU per direction, half the datasheet's bidirectional
    figure (A100 NVLink 3: 600 GB/s; H100 NVLink 4: 900 GB/s).
  - inter_node_bytes_per_s: one NIC per GPU (A100 on NVIDIA Selene: 8 × 200 Gb/s HDR InfiniBand
    per node = 25 GB/s; H100 at Meta and most H100 clusters: 400 Gb/s NDR / RoCE = 50 GB/s).
  - comm_efficiency 0.8: NCCL's bus bandwidth at large messages is ~75-90% of the link rate
    (nccl-tests on DGX systems, from memory, not measured here); the middle of that range.
  - collective_latency_s 8.4 us, intra_node_step_latency_s 3.4 us, inter_node_step_latency_s 14 us:
    NCCL's own cost model for large messages (NVIDIA/nccl src/graph/tuning.cc @ b6475625, Ring /
    Simple protocol: baseLat 8.4, hwLat NVLink 3.4, NET 14 microseconds); the same table serves
    A100 and H100, as it does in NCCL. Each collective costs the base plus a latency per ring
    step (planner_time).
  - fsdp_overlap 0.9: a prefetched FSDP all-gather / reduce-scatter or a DDP/HSDP per-unit
    all-reduce hides behind at most 0.9 of one unit's compute (the rest of the unit's time goes to
    the kernels competing for memory bandwidth and SMs); the first all-gather and the last
    reduce-scatter/all-reduce are exposed (planner_time). Not fitted.
  - mfu (the fraction of peak the step's FLOPs run at when nothing waits on communication): ONE
    value per GPU type, 0.60 (A100) and 0.55 (H100, whose sustained clock under load sits below
    the boost clock its datasheet peak assumes). mfu and comm_efficiency were set once for all
    rows after looking at the published table (docs/planner-at-scale.md says which values were
    tried); nothing is fitted per row.
  - gpu_memory_bytes: 80 GB parts; overhead_bytes 3 GiB (CUDA context, NCCL, fragmentation).
"""

from __future__ import annotations

from scalelab.parallel.planner_constants import GIB, CostConstants, Hardware

A100_80GB = Hardware(
    gpu_memory_bytes=80 * GIB,
    peak_flops=312e12,
    gpus_per_node=8,
    intra_node_bytes_per_s=300e9,
    inter_node_bytes_per_s=25e9,
    collective_latency_s=8.4e-6,
    intra_node_step_latency_s=3.4e-6,
    inter_node_step_latency_s=14e-6,
)
H100_SXM = Hardware(
    gpu_memory_bytes=80 * GIB,
    peak_flops=989e12,
    gpus_per_node=8,
    intra_node_bytes_per_s=450e9,
    inter_node_bytes_per_s=50e9,
    collective_latency_s=8.4e-6,
    intra_node_step_latency_s=3.4e-6,
    inter_node_step_latency_s=14e-6,
)

# mfu per GPU type; comm_efficiency, fsdp_overlap and overhead shared by both (see the docstring)
A100_CONSTS = CostConstants(mfu=0.60, comm_efficiency=0.8, fsdp_overlap=0.9, overhead_bytes=3.0 * GIB)
H100_CONSTS = CostConstants(mfu=0.55, comm_efficiency=0.8, fsdp_overlap=0.9, overhead_bytes=3.0 * GIB)

GPU_TYPES: dict[str, tuple[Hardware, CostConstants]] = {
    "A100-80GB": (A100_80GB, A100_CONSTS),
    "H100-SXM": (H100_SXM, H100_CONSTS),
}
