"""Distributed checkpoints (torch.distributed.checkpoint), reshardable across layouts.

A checkpoint is a directory `<run>/checkpoints/step_<N>/` holding
  - the DCP files of {"model": ..., "optim": ...} from `get_state_dict` (DTensor/FSDP-aware, so a
    run saved under one layout loads under another);
  - train_state.json: step, tokens, the sampler position and anything else JSON-able;
  - rng_rank<r>.pt: each rank's torch RNG state (loaded with weights_only=True).
It is written under `step_<N>.tmp` and renamed when complete, so a crash mid-save never leaves a
directory that looks finished; `latest_checkpoint` only considers completed ones.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

_STEP_DIR = re.compile(r"^step_(\d+)$")


def _is_dist() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _is_dist() else 0


def _barrier() -> None:
    if _is_dist():
        dist.barrier()


@contextlib.contextmanager
def _single_process_ok():
    """DCP warns when no process group exists; a single-process run is a supported case here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def list_checkpoints(ckpt_root: str | Path) -> list[tuple[int, Path]]:
    """Completed checkpoints as (step, path), oldest first."""
    root = Path(ckpt_root)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir() and (p / "train_state.json").exists():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(ckpt_root: str | Path) -> Path | None:
    ckpts = list_checkpoints(ckpt_root)
    return ckpts[-1][1] if ckpts else None


def save_checkpoint(
    ckpt_root: str | Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    train_state: dict[str, Any],
    keep_last: int = 2,
) -> Path:
    """Save model+optimizer (DCP), train_state and RNG; collective over all ranks."""
    root = Path(ckpt_root)
    final = root / f"step_{step}"
    tmp = root / f"step_{step}.tmp"
    if _rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True, exist_ok=True)
    _barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    with _single_process_ok():
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    torch.save(rng, tmp / f"rng_rank{_rank()}.pt")
    _barrier()
    if _rank() == 0:
        (tmp / "train_state.json").write_text(json.dumps(train_state, indent=2, sort_keys=True))
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        for _, old in list_checkpoints(root)[:-keep_last] if keep_last > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return final


def load_checkpoint(
    path: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Load a checkpoint into (possibly differently parallelized) model/optimizer; returns train_state."""
    path = Path(path)
    optimizers = [optimizer] if optimizer is not None else []  # no optimizer: weights only (evaluation)
    model_sd, optim_sd = get_state_dict(model, optimizers)
    state = {"model": model_sd, "optim": optim_sd} if optimizers else {"model": model_sd}
    with _single_process_ok():
        dcp.load(state, checkpoint_id=str(path))
    set_state_dict(
        model,
        optimizers,
        model_state_dict=state["model"],
        optim_state_dict=state.get("optim", {}),
        options=StateDictOptions(strict=True),
    )
    rng_file = path / f"rng_rank{_rank()}.pt"
    if restore_rng and rng_file.exists():
        rng = torch.load(rng_file, weights_only=True)
        torch.set_rng_state(rng["cpu"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])
    return json.loads((path / "train_state.json").read_text())
