"""Where a run executes: device, dtype and (when launched distributed) its ranks.

The single-process run has rank 0 of 1. When torch.distributed is initialised (torchrun,
`scalelab run` with a parallel section, or a Ray Train worker), the rank and world come from the
process group; the layout's meshes and data-parallel coordinates belong to `ParallelDims`.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from scalelab.errors import ConfigError


@dataclass(kw_only=True)
class Runtime:
    device: torch.device
    autocast_dtype: torch.dtype | None  # None = plain fp32
    rank: int = 0
    world_size: int = 1

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0


def pick_device(device: str) -> torch.device:
    if device == "auto":
        if torch.cuda.is_available():
            local = int(os.environ.get("LOCAL_RANK", 0))
            return torch.device("cuda", local)
        return torch.device("cpu")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("train.device", "cuda requested but no GPU is visible", "use auto or cpu")
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def make_runtime(cfg) -> Runtime:
    """Runtime for a RunConfig in this process (distributed if a process group exists)."""
    device = pick_device(cfg.train.device)
    if cfg.train.dtype == "bf16" or (cfg.train.dtype == "auto" and device.type == "cuda"):
        autocast = torch.bfloat16
    else:
        autocast = None
    if cfg.train.num_threads > 0:
        torch.set_num_threads(cfg.train.num_threads)
    if dist.is_available() and dist.is_initialized():
        return Runtime(
            device=device,
            autocast_dtype=autocast,
            rank=dist.get_rank(),
            world_size=dist.get_world_size(),
        )
    return Runtime(device=device, autocast_dtype=autocast)


def machine_type() -> str:
    """The machine type that exact float values depend on: architecture, CPU vendor and widest vector
    ISA, e.g. "x86_64/GenuineIntel/avx512". Libraries dispatch kernels by vendor (MKL) and by vector
    width (ATen, numpy, oneDNN), so values recorded to the bit on one type need not hold on another;
    an AMD EPYC and an Intel Xeon differ even with ATen's and MKL's portable paths pinned
    (tests/pinned.py). Architecture alone off Linux."""
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine()
    field = {line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip() for line in info if ":" in line}
    flags = set(field.get("flags", "").split())
    isa = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "base"
    return f"{platform.machine()}/{field.get('vendor_id', 'unknown')}/{isa}"
