"""Start the processes of one multi-process job on this machine (torchrun-compatible environment).

    launch_local(cfg, run_dir, resume)   # `scalelab run` with a parallel: section: N processes, rank 0 records
    spawn(fn, world_size, args)          # run fn(*args) on N fresh processes with a process group
    ray_train_fn({"config": ..., "run_dir": ...})   # the same train function inside a Ray Train worker

Each process gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT
exactly as torchrun sets them, so `torchrun -m scalelab.parallel.launch` style entry points and this
launcher run the same code. gloo on CPU (one intra-op thread per process: more oversubscribes the
cores), NCCL on GPU (one device per local rank).

Nothing a local job opens listens beyond this machine: as torchrun's agent does, the launcher
serves the rendezvous TCPStore itself (TORCHELASTIC_USE_AGENT_STORE: the ranks connect as clients)
on a socket bound to 127.0.0.1 before its port is published, and gloo/NCCL bind the loopback
interface. (A rank-0 store would listen on every interface, and a port picked free and bound
later can be taken by another process in between.)
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from scalelab.parallel.backend import destroy_distributed, init_distributed


@contextlib.contextmanager
def loopback_store(timeout_s: float = 600.0) -> Iterator[int]:
    """Serve a TCPStore from this process on 127.0.0.1 while the block runs; yields its port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        port = sock.getsockname()[1]
        store = dist.TCPStore(
            "127.0.0.1",
            port,
            is_master=True,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
            master_listen_fd=sock.fileno(),
        )
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store owns (and closes) the listening socket now
    try:
        yield port
    finally:
        del store


def loopback_interface() -> str | None:
    """This machine's loopback interface name ("lo" on Linux, "lo0" on macOS), if there is one."""
    names = [name for _, name in socket.if_nameindex()]
    return next((n for n in names if n in ("lo", "lo0")), None)


def _entry(local_rank: int, fn, world_size: int, port: int, backend: str, args: tuple) -> None:
    os.environ.update(
        RANK=str(local_rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        TORCHELASTIC_USE_AGENT_STORE="True",  # the launcher serves the store; every rank is a client
    )
    lo = loopback_interface()
    if lo:  # gloo's and NCCL's own sockets on loopback too (a user's setting wins)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", lo)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", lo)
    use_cuda = torch.cuda.is_available() and backend != "gloo"
    if not use_cuda:
        torch.set_num_threads(1)
    init_distributed(backend, device="cuda" if use_cuda else "cpu")
    try:
        fn(*args)
    finally:
        destroy_distributed()


def spawn(fn, world_size: int, args: tuple = (), backend: str = "auto") -> None:
    """Run `fn(*args)` in `world_size` new processes joined in one process group; raise if any fails."""
    if torch.cuda.is_available() and backend != "gloo" and world_size > torch.cuda.device_count():
        from scalelab.errors import UsageError

        raise UsageError(
            f"the layout needs {world_size} processes but only {torch.cuda.device_count()} GPUs "
            "are visible; use a smaller layout or parallel.backend=gloo"
        )
    with loopback_store() as port:
        mp.start_processes(
            _entry, args=(fn, world_size, port, backend, args), nprocs=world_size, join=True, start_method="spawn"
        )


def train_worker(cfg, run_dir: str, resume: bool = False, stop_after_steps: int | None = None) -> None:
    """What every process of a local job runs (also used by tests to stop a job midway)."""
    from scalelab.train.loop import train_run

    train_run(cfg, run_dir, resume=resume, stop_after_steps=stop_after_steps)


def launch_local(cfg, out_dir: str | Path, resume: bool = False) -> int:
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
            from scalelab.errors import ConfigError

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
    from scalelab.train.records import read_status

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


def ray_train_fn(config: dict[str, Any]) -> None:
    """Entry point for a Ray Train `TorchTrainer` worker: {"config": RunConfig dict, "run_dir", "resume"}.

    Ray has already created the process group; the same `train_run` as everywhere else runs,
    and rank 0 writes the records.
    """
    from scalelab.train.config import build_run_config
    from scalelab.train.loop import train_run

    cfg = config["config"]
    if isinstance(cfg, dict):
        cfg = build_run_config(cfg)
    if cfg.parallel.world_size > 1:
        init_distributed(cfg.parallel.backend)  # no-op when Ray already initialised it
    train_run(cfg, config["run_dir"], resume=bool(config.get("resume", False)))
