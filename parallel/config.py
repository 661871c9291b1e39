"""The `parallel:` section of a run config: the layout of one run over devices.

`dp_replicate × dp_shard × tp × pp × cp` must equal the world size; `ep` divides `dp_shard × cp`.
A world of 1 (all ones) is the single-device run. Validation against the model shape and the world
size lives in `scalelab.parallel.dims.ParallelDims`.
"""

from __future__ import annotations

from dataclasses import dataclass

# Activation checkpointing of each block (parallel/activation_checkpointing.py): every mode, in the
# order the layout planner searches them (least recomputed first), with its modifier in a layout name
# (parallel/layouts.py). The one list of modes: the checks, the planner and the grammar read it.
AC_MODES = {"none": "", "selective": "+sac", "full": "+ac"}


@dataclass(kw_only=True, slots=True)
class ParallelConfig:
    dp_replicate: int = 1  # DDP/HSDP replicas (gradients all-reduced across them)
    dp_shard: int = 1  # FSDP2 shard group size (ZeRO-3 by default)
    tp: int = 1  # tensor parallel (+ sequence parallel when sequence_parallel)
    pp: int = 1  # pipeline stages
    cp: int = 1  # context parallel (sequence sharded)
    cp_variant: str = "allgather"  # context-parallel attention: allgather (K/V all-gathered) | ring (send/recv)
    ep: int = 1  # expert parallel (MoE only)
    sequence_parallel: bool = True  # with tp > 1: shard norms/residual over the sequence
    loss_parallel: bool = True  # with tp > 1: cross-entropy on vocab-sharded logits
    pp_schedule: str = "1f1b"  # gpipe | 1f1b | interleaved-1f1b | zero-bubble
    pp_microbatches: int = 0  # micro-batches per pipeline step; 0 = one per stage (pp × chunks per rank)
    activation_checkpoint: str = "none"  # a key of AC_MODES: none | selective | full
    compile: bool = False  # torch.compile each block
    fsdp_reshard_after_forward: bool = True  # False = ZeRO-2 (keep params gathered until backward)
    backend: str = "auto"  # auto (nccl on GPU, gloo on CPU) | gloo | nccl
    # FSDP2 mixed precision: auto = bf16 params/compute with fp32 gradient reduce on GPU, fp32 on CPU
    mixed_precision: str = "auto"  # auto | fp32 | bf16
    # gradient reduction compression (scalelab.parallel.compression): none | bf16 | powersgd
    grad_compression: str = "none"
    powersgd_rank: int = 1  # P/Q factor rank per gradient matrix under powersgd

    @property
    def world_size(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp * self.pp * self.cp

    @property
    def dp_size(self) -> int:
        """Data-parallel degree: how many different slices of the global batch are processed."""
        return self.dp_replicate * self.dp_shard
