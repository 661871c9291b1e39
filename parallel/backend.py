"""Process groups: starting N local processes joined in one, setup from the torchrun environment, the
one place that works around what gloo gets wrong, and shared collective ops.

    spawn(fn, world_size, args)   # run fn(*args) on N fresh processes joined in one process group
    serve_store_on_loopback()     # a rendezvous store listening on 127.0.0.1 only (TCPStore binds every interface)
    spawn(..., timeout_s=180)     # and end it, stacks dumped, if it has not finished by then
    init_distributed("auto")      # from torchrun-style env: RANK, WORLD_SIZE, MASTER_ADDR/PORT
    backend_for("auto", device)   # nccl on CUDA, gloo on CPU
    for_collective(t)             # a contiguous tensor for a collective (see below)
    SumOverGroup.apply(x, group)  # all-reduce forward, identity backward (vocab / expert tensor parallel)

gloo on torch 2.13 (docs/architecture.md, "Known platform facts"):
  - it silently corrupts a scatter into a non-contiguous tensor, so every tensor handed to a
    collective must be contiguous. Our own collectives (loss broadcast, pipeline eval P2P,
    grad-norm all-reduce) go through `for_collective`; DTensor/FSDP2 pack into contiguous buffers.
  - `split_group` fails: DeviceMesh only takes that path for a process group bound to an
    accelerator (NCCL with device_id), so on gloo it already builds sub-groups with new_group.
  - list-form all_gather/all_to_all with uneven sizes fail: nothing here uses them (FSDP2 pads
    shards to equal sizes; DTensor uses all_gather_into_tensor).
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import multiprocessing
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from scalelab.errors import UsageError


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


class SumOverGroup(torch.autograd.Function):
    """all_reduce(SUM) forward, identity backward (Megatron's vocab-parallel pattern).

    Every rank then computes the same (replicated) loss from the sum, so each partial's gradient
    is the sum's gradient as is; summing it over ranks in backward would count it tp times.
    """

    @staticmethod
    def forward(ctx, x, group):
        out = for_collective(x.clone())
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def serve_store_on_loopback(timeout_s: float = 600.0) -> tuple[dist.TCPStore, int]:
    """A TCPStore server listening on 127.0.0.1 only, and its port.

    torch's TCPStore server binds every interface (`:::PORT`, dual-stack) whatever host it is given;
    handed a socket already bound to loopback (`master_listen_fd`), it serves on that one instead.
    The store lives as long as the returned object."""
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
    return store, port


@contextlib.contextmanager
def loopback_store(timeout_s: float = 600.0) -> Iterator[int]:
    """Serve a TCPStore from this process on 127.0.0.1 while the block runs; yields its port."""
    store, port = serve_store_on_loopback(timeout_s)
    try:
        yield port
    finally:
        del store


def loopback_interface() -> str | None:
    """This machine's loopback interface name ("lo" on Linux, "lo0" on macOS), if there is one."""
    names = [name for _, name in socket.if_nameindex()]
    return next((n for n in names if n in ("lo", "lo0")), None)


def collectives_on_loopback() -> None:
    """gloo's and NCCL's own sockets on the loopback interface, for a group whose ranks are all on
    this machine (a user's GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME wins). Read when a group is made."""
    lo = loopback_interface()
    if lo:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", lo)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", lo)


def _entry(local_rank: int, fn, world_size: int, port: int, backend: str, args: tuple, env: dict, stacks: str) -> None:
    # A forkserver's child starts with the server's environment, not the caller's: restore the
    # caller's, as a spawned process would have it.
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(
        RANK=str(local_rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        TORCHELASTIC_USE_AGENT_STORE="True",  # the launcher serves the store; every rank is a client
    )
    # The caller's watchdog (spawn's timeout_s) sends SIGUSR1 before it kills a hung rank: every
    # thread's Python stack goes to this rank's file, which the watchdog's error then quotes (a
    # forkserver's child writes its stderr wherever the server's went, not to the caller's).
    stack_file = open(Path(stacks, f"rank{local_rank}.txt"), "w")  # noqa: SIM115 - open until the rank ends
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    collectives_on_loopback()
    use_cuda = torch.cuda.is_available() and backend != "gloo"
    if not use_cuda:
        torch.set_num_threads(1)
    init_distributed(backend, device="cuda" if use_cuda else "cpu")
    try:
        fn(*args)
    finally:
        destroy_distributed()
    # A normal interpreter exit runs C++ static destructors while gloo's or the store's threads can
    # still be joinable, which aborts the rank now and then ("terminate called without an active
    # exception") after its work succeeded. Leave without them; a failure above still propagates.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


_PRELOAD = ["torch", "torch.distributed", "scalelab.train.loop"]  # what every rank imports


SPAWN_TIMEOUT_ENV = "SCALELAB_SPAWN_TIMEOUT_S"


class SpawnHung(RuntimeError):
    """A process group that did not finish within spawn's timeout (its ranks were killed)."""


def spawn_timeout(timeout_s: float | None) -> float | None:
    """The watchdog's limit: the caller's, else $SCALELAB_SPAWN_TIMEOUT_S, else none."""
    if timeout_s is not None:
        return timeout_s
    raw = os.environ.get(SPAWN_TIMEOUT_ENV, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise UsageError(
            f"{SPAWN_TIMEOUT_ENV}={raw!r} is not a positive number of seconds; set one (e.g. 180) or unset it"
        )
    return value


def spawn(fn, world_size: int, args: tuple = (), backend: str = "auto", timeout_s: float | None = None) -> None:
    """Run `fn(*args)` in `world_size` new processes joined in one process group; raise if any fails.

    With a timeout (`timeout_s`, else $SCALELAB_SPAWN_TIMEOUT_S) a group still running when it
    expires is a hang: the ranks' Python stacks are dumped, the ranks are killed and `SpawnHung` is
    raised, quoting the stacks. Without one a hang lasts until a collective's own timeout (600 s on
    the default group; torch's 30 min on the sub-groups a DeviceMesh makes). Training runs pass
    none; the test suite sets the variable (tests/conftest.py), where a group finishes in under 30 s.
    """
    if torch.cuda.is_available() and backend != "gloo" and world_size > torch.cuda.device_count():
        raise UsageError(
            f"the layout needs {world_size} processes but only {torch.cuda.device_count()} GPUs "
            "are visible; use a smaller layout or parallel.backend=gloo"
        )
    limit = spawn_timeout(timeout_s)
    # Ranks are forked from a forkserver that imported torch and the training code once per
    # process (a fresh interpreter, not a fork of this one: no threads or CUDA state inherited);
    # a spawned rank re-imports torch, ~1-3 s per rank per launch on a small machine.
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    if method == "forkserver":
        multiprocessing.get_context(method).set_forkserver_preload(_PRELOAD)
    with loopback_store() as port, tempfile.TemporaryDirectory(prefix="scalelab-spawn-") as stacks:
        context = mp.start_processes(
            _entry,
            args=(fn, world_size, port, backend, args, dict(os.environ), stacks),
            nprocs=world_size,
            join=False,
            start_method=method,
        )
        deadline = None if limit is None else time.monotonic() + limit
        while not context.join(timeout=1.0):  # raises when a rank fails, after ending the others
            if deadline is not None and time.monotonic() > deadline:
                _end_hung(context, fn, world_size, limit, Path(stacks))


def _end_hung(context, fn, world_size: int, limit: float, stacks: Path) -> NoReturn:
    alive = [rank for rank, p in enumerate(context.processes) if p.is_alive()]
    for rank in alive:
        with contextlib.suppress(ProcessLookupError):  # it may have ended since
            os.kill(context.processes[rank].pid, signal.SIGUSR1)
    time.sleep(1.0)  # faulthandler writes the stacks from its signal handler, in milliseconds
    for p in context.processes:
        if p.is_alive():
            p.kill()
        p.join()
    where = "".join(f"\nrank {rank}:\n" + _read(stacks / f"rank{rank}.txt") for rank in alive)
    name = getattr(fn, "__qualname__", repr(fn))
    raise SpawnHung(
        f"hung process group: the {world_size}-process group running {name} was still running after "
        f"{limit:g} s; ranks {alive} were killed. Their Python stacks:{where}"
    )


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace").rstrip() or "(no stack written)"
    except FileNotFoundError:  # the rank hung before it got as far as opening its file
        return "(no stack file)"
