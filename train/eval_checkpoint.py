"""Standalone evaluation of saved checkpoints (`scalelab eval`): validation loss/bpb and multiple-choice tasks.

    run_dir, ckpts = find_checkpoints("runs/r1")            # a run dir or one checkpoint dir
    rows = evaluate_checkpoint(ckpts[-1], load_tasks(["bundled:stdlib_nextline"]))
    merge_eval_rows(run_dir, rows)                         # into <run>/evals.parquet

The training loop scores the same tasks during training (scalelab.train.eval_tasks); this module
loads a checkpoint's model on its own, so any finished run can be scored afterwards.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import polars as pl
import torch

from scalelab.errors import UsageError
from scalelab.models.llama import build_model
from scalelab.models.loss import lm_loss
from scalelab.store.atomic import atomic_write_parquet
from scalelab.store.checkpoint_files import list_checkpoints
from scalelab.store.records import EVALS_SCHEMA
from scalelab.train.checkpoint import load_checkpoint
from scalelab.train.config import load_run_config
from scalelab.train.data.bundle import build_data
from scalelab.train.data.tokenizer import load_tokenizer
from scalelab.train.eval_tasks import MCTask, evaluate_tasks
from scalelab.train.evaluate import evaluate_sources
from scalelab.train.run_summary import run_summary_fields


def find_checkpoints(path: str | os.PathLike) -> tuple[Path, list[Path]]:
    """(run dir, checkpoint dirs oldest first) for a checkpoint dir or a run dir."""
    path = Path(path).expanduser()
    if (path / "train_state.json").is_file():
        return path.parent.parent, [path]
    if (path / "config.json").is_file():
        ckpts = [p for _, p in list_checkpoints(path / "checkpoints")]
        if not ckpts:
            raise UsageError(f"{path} holds no completed checkpoint (looked in {path / 'checkpoints'})")
        return path, ckpts
    raise UsageError(f"{path} is neither a checkpoint dir (train_state.json) nor a run dir (config.json)")


class _EvalRuntime:
    """The two fields evaluate_sources reads from a train Runtime."""

    def __init__(self, device: torch.device):
        self.device = device
        self.autocast_dtype = torch.bfloat16 if device.type == "cuda" else None


def load_checkpoint_model(checkpoint: Path, device: str | torch.device = "cpu", verified: bool = False):
    """(model in eval mode, run config, train_state) for one checkpoint of a run.

    The checkpoint is verified first unless `verified` (scalelab.train.checkpoint.load_checkpoint):
    a crafted or corrupt one raises CheckpointError and nothing in it runs."""
    run_dir = checkpoint.parent.parent
    cfg = load_run_config(str(run_dir / "config.json"))
    device = torch.device(device)
    model = build_model(cfg.model, device=device, seed=0)
    state = load_checkpoint(checkpoint, model, None, restore_rng=False, verified=verified)
    model.eval()
    return model, cfg, state


def validation_rows(model, cfg, device: torch.device) -> list[dict]:
    """Held-out loss/bpb per source, exactly as the training loop's evaluation computes them."""
    data = build_data(cfg.data, seed=cfg.train.seed, val_batch_size=cfg.eval.val_batch_sequences)
    loss_fn = lambda m, x, y: lm_loss(m, x, y, z_loss=0.0)
    return evaluate_sources(model, data.val_sets, loss_fn, _EvalRuntime(device))


def evaluate_checkpoint(
    checkpoint: str | os.PathLike,
    tasks: Sequence[MCTask],
    *,
    with_val: bool = True,
    device: str | torch.device = "cpu",
    batch_sequences: int = 16,
    verified: bool = False,
) -> list[dict]:
    """Evaluate one checkpoint: rows with step, tokens, flops, task, metric, value, stderr."""
    checkpoint = Path(checkpoint)
    model, cfg, state = load_checkpoint_model(checkpoint, device, verified=verified)
    tokenizer = load_tokenizer(cfg.data.tokenizer)
    rows = validation_rows(model, cfg, torch.device(device)) if with_val else []
    rows += evaluate_tasks(model, tokenizer, tasks, max_seq_len=cfg.model.max_seq_len, batch_sequences=batch_sequences)
    step = int(state["step"])
    tokens = int(state.get("tokens", step * cfg.tokens_per_step))
    flops = run_summary_fields(cfg)["flops_per_token_6n"] * tokens
    return [dict(r, step=step, tokens=tokens, flops=flops) for r in rows]


def merge_eval_rows(run_dir: str | os.PathLike, rows: Sequence[dict]) -> Path:
    """Add rows to <run>/evals.parquet, replacing earlier rows with the same (step, task, metric).

    Do not run this on a run that is still training: the loop rewrites evals.parquet from memory.
    """
    path = Path(run_dir) / "evals.parquet"
    new = pl.DataFrame([{k: r.get(k) for k in EVALS_SCHEMA} for r in rows], schema=EVALS_SCHEMA)
    if path.exists():
        old = pl.read_parquet(path).select(list(EVALS_SCHEMA)).cast(EVALS_SCHEMA)
        old = old.join(new.select("step", "task", "metric"), on=["step", "task", "metric"], how="anti")
        new = pl.concat([old, new]).sort("step", "task", "metric")
    atomic_write_parquet(path, new)
    return path
