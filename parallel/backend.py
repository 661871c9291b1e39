"""Process-group setup, and the one place that works around what gloo gets wrong.

    init_distributed("auto")      # from torchrun-style env: RANK, WORLD_SIZE, MASTER_ADDR/PORT
    backend_for("auto", device)   # nccl on CUDA, gloo on CPU

gloo on torch 2.13 (see ARCHITECTURE.md, "Known platform facts"):
  - it silently corrupts a scatter into a non-contiguous tensor, so every tensor handed to a
    collective must be contiguous. Our own collectives (loss broadcast, pipeline eval P2P,
    grad-norm all-reduce) go through `for_collective`; DTensor/FSDP2 pack into contiguous buffers.
  - `split_group` fails: DeviceMesh only takes that path for a process group bound to an
    accelerator (NCCL with device_id), so on gloo it already builds sub-groups with new_group.
  - list-form all_gather/all_to_all with uneven sizes fail: nothing here uses them (FSDP2 pads
    shards to equal sizes; DTensor uses all_gather_into_tensor).
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta

import torch
import torch.distributed as dist


def backend_for(backend: str, device: torch.device | str) -> str:
    device_type = torch.device(device).type
    if backend == "auto":
        return "nccl" if device_type == "cuda" else "gloo"
    return backend


def init_distributed(backend: str = "auto", device: torch.device | str | None = None, timeout_s: float = 600.0) -> None:
    """Initialise the default process group from the torchrun environment (no-op if already done)."""
    if dist.is_initialized():
        return
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    name = backend_for(backend, device)
    kwargs = {}
    if name == "nccl":
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        kwargs["device_id"] = torch.device("cuda", local)
    dist.init_process_group(backend=name, timeout=timedelta(seconds=timeout_s), **kwargs)
    # DTensor warns (once per rank and pattern, at WARNING) that reducing a scalar norm over a 2-3-D
    # mesh takes sequential all-reduces; for one scalar per step that costs nothing worth a warning.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)


def for_collective(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor to hand to a collective (gloo corrupts non-contiguous ones silently).

    Returns `t` itself when already contiguous, so in-place collectives still write into it.
    """
    return t if t.is_contiguous() else t.contiguous()


def destroy_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
