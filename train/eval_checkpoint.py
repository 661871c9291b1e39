"""Evaluating a saved checkpoint on one device or under a layout (`scalelab eval`, `sweep eval`, eval-parity).

    run_dir, ckpts = find_checkpoints("runs/r1")            # a run dir or one checkpoint dir
    ev = evaluate_checkpoint(ckpts[-1], load_tasks(["bundled:stdlib_nextline"]))
    ev = evaluate_checkpoint(ckpts[-1], tasks, layout=parse_layout("fsdp2xtp2"))   # spawns 4 ranks
    merge_eval_rows(run_dir, ev.rows)                      # into <run>/evals.parquet

The checkpoint's model is built on the meta device under the layout (one device is a layout too),
and the checkpoint loaded into its shards by DCP: no rank holds the whole model, whatever layout
wrote the checkpoint. Then the one evaluation (`scalelab.train.eval_model.evaluate`) scores it as the
training loop does, and the rows are stamped with the checkpoint's step, tokens and FLOPs. Under a
layout the results equal the single-device evaluation within float rounding (tests: 1e-5 relative).

`load_checkpoint_model` loads a plain single-device model instead, for the consumers that need the
module itself (the Hugging Face export, the lm-eval adapter).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import polars as pl
import torch

from scalelab.errors import UsageError
from scalelab.models.llama import build_model
from scalelab.parallel.backend import spawn
from scalelab.parallel.config import ParallelConfig
from scalelab.parallel.parallelize import Parallelized
from scalelab.store.atomic import atomic_write_parquet
from scalelab.store.checkpoint_files import list_checkpoints
from scalelab.store.records import EVALS_SCHEMA
from scalelab.train.checkpoint import load_checkpoint, verify
from scalelab.train.checkpoint_verify import TRAIN_STATE
from scalelab.train.config import RunConfig, build_run_config, load_run_config
from scalelab.train.data.bundle import build_data
from scalelab.train.data.tokenizer import load_tokenizer
from scalelab.train.eval_model import Evaluation, evaluate
from scalelab.train.eval_tasks import MCTask
from scalelab.train.parallel_model import parallel_model
from scalelab.train.run_summary import run_summary_fields
from scalelab.train.runtime import Runtime, make_runtime


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


def load_checkpoint_model(checkpoint: Path, device: str | torch.device = "cpu", verified: bool = False):
    """(plain single-device model in eval mode, run config, train_state) for one checkpoint of a run.

    The checkpoint is verified first unless `verified` (scalelab.train.checkpoint.load_checkpoint):
    a crafted or corrupt one raises CheckpointError and nothing in it runs."""
    run_dir = checkpoint.parent.parent
    cfg = load_run_config(str(run_dir / "config.json"))
    device = torch.device(device)
    model = build_model(cfg.model, device=device, seed=0)
    state = load_checkpoint(checkpoint, model, None, restore_rng=False, verified=verified)
    model.eval()
    return model, cfg, state


def load_for_evaluation(
    checkpoint: str | os.PathLike, cfg: RunConfig, runtime: Runtime, layout: ParallelConfig, *, verified: bool = False
) -> Parallelized:
    """`cfg`'s model under `layout` on this process (a rank of it), the checkpoint loaded into its shards."""
    par = parallel_model(cfg, runtime, layout, seed=None, z_loss=0.0)  # the checkpoint overwrites the values
    load_checkpoint(checkpoint, par.model, None, restore_rng=False, verified=verified)
    par.model.eval()
    return par


def load_on_one_device(
    checkpoint: str | os.PathLike,
    *,
    device: str | torch.device = "cpu",
    layout: ParallelConfig | None = None,
    verified: bool = False,
) -> tuple[Parallelized, RunConfig, Runtime]:
    """(the checkpoint's model on this process, its run config, the runtime: `device`, bf16 autocast on
    CUDA) under a one-process `layout` (default: plain one device)."""
    ckpt = Path(checkpoint)
    cfg = load_run_config(str(ckpt.parent.parent / "config.json"))
    device = torch.device(device)
    runtime = Runtime(device=device, autocast_dtype=torch.bfloat16 if device.type == "cuda" else None)
    return load_for_evaluation(ckpt, cfg, runtime, layout or ParallelConfig(), verified=verified), cfg, runtime


def _evaluate_loaded(
    par: Parallelized, cfg: RunConfig, runtime: Runtime, tasks: Sequence[MCTask], with_val: bool, batch_sequences: int
) -> Evaluation:
    """The one evaluation of a loaded checkpoint: its run's held-out sets (with_val) and the tasks."""
    val_sets = []
    if with_val:
        val_sets = build_data(cfg.data, seed=cfg.data_order_seed, val_batch_size=cfg.eval.val_batch_sequences).val_sets
    return evaluate(
        par,
        tokenizer=load_tokenizer(cfg.data.tokenizer),
        tasks=tasks,
        val_sets=val_sets,
        max_seq_len=cfg.model.max_seq_len,
        autocast_dtype=runtime.autocast_dtype,
        batch_sequences=batch_sequences,
    )


def _rank(tree: dict, ckpt: str, tasks: list[MCTask], with_val: bool, batch_sequences: int, out: str) -> None:
    """One rank of a layout: its shards of the checkpoint, evaluated collectively; rank 0 writes the result."""
    cfg = build_run_config(tree)
    runtime = make_runtime(cfg)
    par = load_for_evaluation(ckpt, cfg, runtime, cfg.parallel, verified=True)  # verified by the caller
    ev = _evaluate_loaded(par, cfg, runtime, tasks, with_val, batch_sequences)
    if runtime.is_rank0:
        Path(out).write_text(json.dumps({"rows": ev.rows, "examples": ev.examples}))


def _evaluate_under_layout(
    ckpt: Path, layout: ParallelConfig, tasks: Sequence[MCTask], with_val: bool, batch_sequences: int
) -> tuple[RunConfig, Evaluation]:
    """(the run config under `layout`, rank 0's evaluation) from the layout's processes on this machine."""
    tree = json.loads((ckpt.parent.parent / "config.json").read_text())
    tree["parallel"] = dataclasses.asdict(layout)
    cfg = build_run_config(tree)  # validates the layout against this model (heads, layers, experts)
    with tempfile.TemporaryDirectory(prefix="scalelab-eval-") as tmp:
        out = Path(tmp) / "result.json"
        args = (tree, str(ckpt), list(tasks), with_val, batch_sequences, str(out))
        spawn(_rank, cfg.parallel.world_size, args, backend=cfg.parallel.backend)
        return cfg, Evaluation(**json.loads(out.read_text()))


def evaluate_checkpoint(
    checkpoint: str | os.PathLike,
    tasks: Sequence[MCTask],
    *,
    layout: ParallelConfig | None = None,
    with_val: bool = True,
    device: str | torch.device = "cpu",
    batch_sequences: int = 16,
    verified: bool = False,
) -> Evaluation:
    """Evaluate one checkpoint; the rows carry step, tokens and flops besides task, metric, value, stderr.

    Args:
        layout: None (or a world of 1): this process on `device` (bf16 autocast on CUDA). Otherwise
            that many local processes load their shards and score through the layout's step
            (autocast as the run trained); the layout is validated against the run's model and
            batch before any process starts (ConfigError).
        with_val: also the held-out loss/bpb of the run's data sources.
        batch_sequences: sequences per forward pass on one device (a layout scores one per row).
        verified: the caller verified the checkpoint already (otherwise CheckpointError here).
    """
    ckpt = Path(checkpoint)
    state = json.loads((ckpt / TRAIN_STATE).read_text()) if verified else verify(ckpt)
    if layout is None or layout.world_size == 1:
        par, cfg, runtime = load_on_one_device(ckpt, device=device, layout=layout, verified=True)
        ev = _evaluate_loaded(par, cfg, runtime, tasks, with_val, batch_sequences)
    else:
        cfg, ev = _evaluate_under_layout(ckpt, layout, tasks, with_val, batch_sequences)
    step = int(state["step"])
    tokens = int(state.get("tokens", step * cfg.tokens_per_step))  # the layout changes neither
    flops = run_summary_fields(cfg)["flops_per_token_6n"] * tokens
    return Evaluation(rows=ev.stamped(step=step, tokens=tokens, flops=flops), examples=ev.examples)


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
