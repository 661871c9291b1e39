"""Launching one run: N local processes (`scalelab run`), a torchrun rank, or a Ray Train worker.

    launch_local(cfg, run_dir, resume)     # `scalelab run` with a multi-process layout; rank 0 records
    train_worker(cfg, run_dir, resume)     # what every local process runs (tests stop it midway)
    ray_train_fn({"config": ..., "run_dir": ..., "resume": ..., "hang": {...}})   # a Ray Train worker

A Ray Train worker group smaller than the layout (an elastic TorchTrainer after losing a node) trains
the same run at a smaller dp with the same global batch (scalelab.train.elastic); each attempt records
its layout and its ranks' nodes in status.json (`layouts`).

Every path ends in the same `scalelab.train.loop.train_run`; the processes and their process group
come from `scalelab.parallel.backend` (spawn: torchrun's environment, a loopback rendezvous store).
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from scalelab.errors import ConfigError
from scalelab.parallel.backend import destroy_distributed, init_distributed, spawn
from scalelab.store.records import read_status
from scalelab.train.config import RunConfig, build_run_config
from scalelab.train.elastic import WorkerLayout, shrink_layout
from scalelab.train.loop import train_run
from scalelab.train.rank_copy import rank_copy
from scalelab.train.watchdog import HangPolicy


def train_worker(cfg: RunConfig, run_dir: str, resume: bool = False, stop_after_steps: int | None = None) -> None:
    """What every process of a local job runs (also used by tests to stop a job midway)."""
    train_run(cfg, run_dir, resume=resume, stop_after_steps=stop_after_steps)


def launch_local(cfg: RunConfig, out_dir: str | Path, resume: bool = False) -> int:
    """Train `cfg` with cfg.parallel.world_size processes on this machine; exit code 0 when done.

    The layout was validated with the rest of the config (scalelab.train.config.build_run_config),
    before any process starts.

    Under torchrun (WORLD_SIZE already set for this process) nothing is spawned: this process
    joins the group torchrun described and trains as its rank.
    """
    env_world = int(os.environ.get("WORLD_SIZE", "1"))
    crash = None
    if env_world > 1:
        if env_world != cfg.parallel.world_size:
            raise ConfigError(
                "parallel",
                f"the layout needs {cfg.parallel.world_size} processes but torchrun started {env_world}",
                f"run torchrun with --nproc_per_node={cfg.parallel.world_size} (or change the layout)",
            )
        init_distributed(cfg.parallel.backend)
        try:
            train_worker(cfg, str(out_dir), resume)
        finally:
            rank0 = int(os.environ.get("RANK", "0")) == 0
            destroy_distributed()
        if not rank0:
            return 0
    else:
        try:
            spawn(train_worker, cfg.parallel.world_size, (cfg, str(out_dir), resume), backend=cfg.parallel.backend)
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
            crash = e
    status = read_status(Path(out_dir)) or {}
    state = status.get("status")
    if crash is not None and state != "failed":  # not recorded by rank 0: the ranks' own report
        print(str(crash), file=sys.stderr)
    if state == "done":
        loss = status.get("final_train_loss")
        print(f"done  world={cfg.parallel.world_size}  train_loss={loss:.4f}  -> {out_dir}")
        return 0
    print(f"run {state}: {status.get('reason') or status.get('error', '')}  ({out_dir})")
    return 1


def ray_train_fn(config: dict[str, Any], callbacks: list | None = None) -> None:
    """Entry point for a Ray Train `TorchTrainer` worker.

    config: {"config": RunConfig dict, "run_dir", "resume", "hang": HangPolicy fields or None,
    "wandb": a WandbRun or None, "object_store": None, or the run's address on object storage and
    the trial's lease (scalelab.train.rank_copy): each rank then trains in a copy on its own node}.
    callbacks: train_run's (rank 0 calls them). The process group exists already (Ray Train's, or
    a sweep's own on loopback); the worker group's size picks the layout (the
    configured one, or a smaller dp when an elastic trainer got fewer workers); the same `train_run`
    as everywhere else runs, and rank 0 writes the records.
    """
    import ray  # start-up time: only a Ray Train worker needs Ray, and it takes seconds to import
    from ray import train

    cfg = config["config"]
    if isinstance(cfg, dict):
        cfg = build_run_config(cfg)
    world = train.get_context().get_world_size()
    parallel = shrink_layout(
        cfg.parallel,
        world,
        global_batch_sequences=cfg.global_batch_sequences,
        micro_batch_sequences=cfg.train.micro_batch_sequences,
    )
    if world > 1:
        init_distributed(cfg.parallel.backend)  # no-op when Ray already initialised it
    nodes = _gather_node_ids(ray.get_runtime_context().get_node_id(), world)
    hang = HangPolicy(**config["hang"]) if config.get("hang") else None
    with contextlib.ExitStack() as stack:
        run_dir, publish = config["run_dir"], None
        if config.get("object_store"):  # no shared file system: a copy on this node, uploads to the store
            run_dir, publish = stack.enter_context(rank_copy(config["object_store"]))
        train_run(
            cfg,
            run_dir,
            resume=bool(config.get("resume", False)),
            layout=WorkerLayout(parallel=parallel, nodes=nodes),
            hang=hang,
            wandb=config.get("wandb"),  # a sweep's WandbRun (scalelab.train.loggers); rank 0 uses it
            publish=publish,
            callbacks=callbacks,
        )


def _gather_node_ids(node_id: str, world: int) -> list[str]:
    """Every rank's node id (hex), in rank order, through one all-gather of their bytes."""
    if world == 1 or not dist.is_initialized():
        return [node_id]
    mine = torch.tensor(list(bytes.fromhex(node_id)), dtype=torch.int64)
    out = torch.empty(world * mine.numel(), dtype=torch.int64)
    dist.all_gather_into_tensor(out, mine)
    return [bytes(row.tolist()).hex() for row in out.view(world, -1)]
