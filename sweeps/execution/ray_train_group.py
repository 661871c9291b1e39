"""The process group of a sweep's multi-process run (a Ray Train worker group), on loopback when its cluster is.

    TorchTrainer(fn, torch_config=LoopbackTorchConfig(), ...)   # what scalelab.sweeps.execution.execute passes

Ray Train's torch backend has rank 0 serve the rendezvous store (torch's TCPStore) on every
interface (`:::PORT`, dual-stack) whatever address it hands the other ranks, and lets gloo pick
the interface of the host name. On a cluster whose nodes are all this machine (Ray's node address
is loopback: the private cluster a local sweep starts, see scalelab.sweeps.execution.ray_cluster) that is a
listener reachable from the network for the whole run. There this backend sets the group up
itself: rank 0 serves the store from a socket bound to 127.0.0.1
(scalelab.parallel.backend.serve_store_on_loopback), every rank connects to it there, and gloo and
NCCL bind to the loopback interface. On any other cluster the ranks are on other machines and Ray
Train's own setup runs unchanged.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import ray
import torch.distributed as dist
from ray.train._internal.utils import get_address_and_port
from ray.train._internal.worker_group import WorkerGroup as V1WorkerGroup

# Ray Train's torch backend, whose `on_start` (the group's setup) is replaced below; its shutdown and
# its per-run environment (RANK, LOCAL_RANK, ...) are kept. Private to Ray: pinned with Ray's version.
from ray.train.torch.config import TorchConfig, _set_torch_distributed_env_vars, _TorchBackend

from scalelab.parallel.backend import collectives_on_loopback, serve_store_on_loopback
from scalelab.sweeps.execution.ray_cluster import is_loopback_host

_served: list[dist.TCPStore] = []  # rank 0's store, held for as long as its worker process lives


def _serve(timeout_s: float) -> int:
    """In rank 0: serve the group's store on 127.0.0.1; its port."""
    store, port = serve_store_on_loopback(timeout_s)
    _served[:] = [store]  # a restarted group's new store replaces the old one
    return port


def _join(rank: int, world_size: int, port: int, backend: str, timeout_s: float) -> None:
    """In every rank: join the group through the store on 127.0.0.1:port, collectives on loopback."""
    collectives_on_loopback()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if backend == "nccl":  # as Ray's own setup: a timed-out NCCL collective raises instead of hanging
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    timeout = timedelta(seconds=timeout_s)
    store = _served[0] if rank == 0 else dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)


class _LoopbackTorchBackend(_TorchBackend):
    def on_start(self, worker_group, backend_config: TorchConfig) -> None:
        address, _ = worker_group.execute_single(0, get_address_and_port)
        if not is_loopback_host(address):
            super().on_start(worker_group, backend_config)
            return
        backend = backend_config.backend
        if backend is None:
            backend = "nccl" if worker_group.get_resources_per_worker().get("GPU", 0) > 0 else "gloo"
        timeout_s = backend_config.timeout_s
        port = worker_group.execute_single(0, _serve, timeout_s)
        if not isinstance(worker_group, V1WorkerGroup):  # as Ray's setup: torch's env before the group
            worker_group.execute(_set_torch_distributed_env_vars)
        world_size = len(worker_group)
        ray.get(
            [
                worker_group.execute_single_async(i, _join, i, world_size, port, backend, timeout_s)
                for i in range(world_size)
            ]
        )


@dataclass
class LoopbackTorchConfig(TorchConfig):
    """Ray Train's TorchConfig whose group listens on 127.0.0.1 only when the cluster is this machine."""

    @property
    def backend_cls(self):
        return _LoopbackTorchBackend
