"""Distributed checkpoints (torch.distributed.checkpoint), reshardable across layouts.

A checkpoint is a directory `<run>/checkpoints/step_<N>/` holding
  - the DCP files of {"model": ..., "optim": ...} from `get_state_dict` (DTensor/FSDP-aware, so a
    run saved under one layout loads under another);
  - train_state.json: step, tokens, the sampler position and anything else JSON-able;
  - rng_rank<r>.pt: each rank's torch RNG state (loaded with weights_only=True);
  - manifest.json, written last: every file's size and sha256 (scalelab.train.checkpoint_verify).
It is written under `step_<N>.tmp` and renamed when complete, so a crash mid-save never leaves a
directory that looks finished; `list_checkpoints` (scalelab.store.checkpoint_files) only considers
completed ones.

Loading never trusts the files: every load verifies the checkpoint first (manifest, metadata read
by a restricted unpickler, shard sizes) and reads it through checkpoint_verify's SafeReader and
SafeLoadPlanner. `select_resume_checkpoint` picks the newest checkpoint that verifies, moves the
ones that do not aside (`step_<N>.corrupt`, kept for inspection, never considered again) and says why.

On object storage (a run of an `s3://` store, scalelab.store.lease) a checkpoint is saved here
as always and the store uploads the directory (scalelab.store.checkpoint_files). The ranks of a
multi-process run there each save into a directory of their own node and upload what they wrote
themselves (`publish`, scalelab.store.rank_copy): every rank its shards, then, once a collective
says every upload succeeded, rank 0 the rest with manifest.json last.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from scalelab.store.atomic import atomic_write_json, fsync_dir, fsync_file
from scalelab.store.checkpoint_files import list_checkpoints
from scalelab.train.checkpoint_verify import (
    METADATA,
    TRAIN_STATE,
    CheckpointError,
    SafeLoadPlanner,
    SafeReader,
    file_entry,
    is_read_error,
    verify_checkpoint,
    write_manifest,
)


def _is_dist() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _is_dist() else 0


def _barrier() -> None:
    if _is_dist():
        dist.barrier()


@contextlib.contextmanager
def single_process_ok():
    """DCP warns when no process group exists; a single-process run is a supported case here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


class Publisher(Protocol):
    """Where each rank's checkpoint files go besides its directory (scalelab.store.rank_copy.RankMirror)."""

    def published(self, step: int) -> bool: ...  # rank 0: the store holds checkpoint `step` complete

    def upload_shards(self, step: int, files: list[Path]) -> dict[str, str]: ...  # every rank: its files

    def publish(self, step: int, ckpt: Path, shards: dict[str, str]) -> None: ...  # rank 0: the rest, manifest last

    def records(self) -> None: ...  # rank 0: upload the records and status.json now


def save_checkpoint(
    ckpt_root: str | Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    train_state: dict[str, Any],
    keep_last: int = 2,
    publish: Publisher | None = None,
) -> Path:
    """Save model+optimizer (DCP), train_state and RNG; collective over all ranks.

    publish: every rank's directory is its own (object storage, scalelab.store.rank_copy); each
    rank uploads the files it wrote, and rank 0 the rest, manifest last, once all succeeded."""
    root = Path(ckpt_root)
    final = root / f"step_{step}"
    tmp = root / f"step_{step}.tmp"
    if _rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True, exist_ok=True)
    _barrier()
    if publish is not None:  # each rank's own directory (on a shared one rank 0 made it above)
        if _rank():
            shutil.rmtree(tmp, ignore_errors=True)  # a save of this step cut short on this node
        tmp.mkdir(parents=True, exist_ok=True)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    with single_process_ok():
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    torch.save(rng, tmp / f"rng_rank{_rank()}.pt")
    for f in _own_files(tmp) + ([tmp / METADATA] if _rank() == 0 else []):
        fsync_file(f)  # durable before the manifest that vouches for them
    _barrier()
    entries = _gather_entries(_own_files(tmp))  # each rank hashes the files it wrote
    shards = _upload_shards(publish, step, tmp) if publish is not None else None
    if _rank() == 0:
        atomic_write_json(tmp / TRAIN_STATE, train_state)
        entries.update({name: file_entry(tmp / name) for name in (METADATA, TRAIN_STATE)})
        write_manifest(tmp, step, entries)  # last: a checkpoint without it is incomplete or legacy
        fsync_dir(tmp)
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        fsync_dir(root)  # the new checkpoint is durable: only now may older ones go
        if shards is not None:  # every rank's shards are up: the rest, manifest last (None: already there)
            publish.publish(step, final, shards)
        for _, old in list_checkpoints(root)[:-keep_last] if keep_last > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    _barrier()
    if publish is not None and _rank():
        shutil.rmtree(tmp, ignore_errors=True)  # uploaded; a resume downloads the whole checkpoint
    return final


def _upload_shards(publish: Publisher, step: int, tmp: Path) -> dict[str, str] | None:
    """Every rank uploads the files it wrote; {key: ETag} of all ranks' (rank 0), or None when the
    store already has the checkpoint complete. Raises on every rank if any rank's upload failed,
    so that rank 0 never writes a manifest over a missing shard."""
    if _on_rank0(lambda: publish.published(step)):
        return None  # never rewritten: an earlier attempt of this deterministic run saved it
    mine: dict[str, str] = {}
    error: BaseException | None = None
    try:
        mine = publish.upload_shards(step, _own_files(tmp))
    except Exception as e:  # noqa: BLE001 - every rank must learn of it before anyone goes on
        error = e
    parts: list[Any] = [(mine, None if error is None else f"{type(error).__name__}: {error}")]
    if _is_dist():
        parts = [None] * dist.get_world_size()
        dist.all_gather_object(parts, (mine, None if error is None else f"{type(error).__name__}: {error}"))
    if error is not None:
        raise error
    failed = [f"rank {r}: {why}" for r, (_, why) in enumerate(parts) if why]
    if failed:
        raise RuntimeError(f"checkpoint step_{step} not published: {'; '.join(failed)}")
    return {k: v for done, _ in parts for k, v in done.items()}


def _own_files(tmp: Path) -> list[Path]:
    """The files this rank wrote into a checkpoint being saved (DCP names shards __<rank>_<i>.distcp)."""
    rank = _rank()
    return sorted(tmp.glob(f"__{rank}_*.distcp")) + [tmp / f"rng_rank{rank}.pt"]


def _gather_entries(files: list[Path]) -> dict[str, dict[str, Any]]:
    entries = {p.name: file_entry(p) for p in files}
    if not _is_dist():
        return entries
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, entries)
    return {k: v for part in gathered for k, v in part.items()}


def _on_rank0(fn: Callable[[], Any]) -> Any:
    """fn() on rank 0, its result (or its CheckpointError) on every rank."""
    result: list[Any] = [None]
    if _rank() == 0:
        try:
            result[0] = ("ok", fn())
        except CheckpointError as e:
            result[0] = ("error", (str(e.path), e.reason))
        except OSError as e:  # a read error that outlasted its retries: every rank fails alike
            result[0] = ("oserror", (e.errno, e.strerror or str(e), e.filename))
    if _is_dist():
        dist.broadcast_object_list(result, src=0)
    kind, value = result[0]
    if kind == "error":
        raise CheckpointError(*value)
    if kind == "oserror":
        raise OSError(*value)
    return value


READ_ATTEMPTS = 3  # a verification interrupted by a read error (is_read_error) is tried this often
READ_RETRY_S = 1.0  # after the first failure; doubled each time


def select_resume_checkpoint(
    ckpt_root: str | Path, log: Callable[[str], None] = print, *, start_over: bool = False
) -> tuple[Path | None, list[tuple[str, str]]]:
    """The newest checkpoint under ckpt_root that verifies, and the (name, reason) of those skipped.

    Collective under a process group (rank 0 verifies, every rank gets the answer). Checkpoints
    newer than the one chosen that fail verification are renamed `step_<N>.corrupt`, so that no
    later resume or keep_last pruning counts them. Every checkpoint is looked at once, newest
    first: a resume never loops. A read error (EIO, a network file system's timeout) is retried,
    never taken for corruption.

    start_over: when none verifies, move them all aside and return None (train from step 0).

    Raises:
        CheckpointError: checkpoints exist (or were moved aside before) but none verifies, and
            start_over is off. They are left as they are: starting over would discard the run's
            progress, so it takes the explicit flag.
        OSError: a read error that outlasted the retries (the run fails; nothing is moved).
    """

    def pick() -> tuple[str | None, list[tuple[str, str]]]:
        failed: list[tuple[Path, str]] = []
        for _, path in reversed(list_checkpoints(ckpt_root)):
            reason = _verify_retrying(path, log)
            if reason is None:
                return str(path), [(_move_aside(p).name, why) for p, why in failed]
            failed.append((path, reason))
        earlier = sorted(p.name for p in Path(ckpt_root).glob("step_*.corrupt*")) if Path(ckpt_root).is_dir() else []
        if not failed and not earlier:
            return None, []
        if start_over:
            return None, [(_move_aside(p).name, why) for p, why in failed]
        reasons = "; ".join(f"{p.name}: {why}" for p, why in failed) or f"only {', '.join(earlier)} left"
        raise CheckpointError(
            ckpt_root,
            f"no checkpoint verifies ({reasons}); they are kept as they are; to train from step 0 "
            "anyway, resume with --start-over",
        )

    chosen, skipped = _on_rank0(pick)
    if _rank() == 0:
        for name, why in skipped:
            log(f"resume: skipped {name.split('.')[0]} ({why}); moved to {name}")
        if chosen:
            log(f"resume: from {chosen}")
        elif skipped:
            log("resume: --start-over: from step 0; the checkpoints that did not verify are kept aside")
    # by name: a rank whose directory is its own (object storage) loads its own copy of that step
    return (Path(ckpt_root) / Path(chosen).name if chosen else None), skipped


def _verify_retrying(path: Path, log: Callable[[str], None]) -> str | None:
    """None when `path` verifies, else why not; read errors retried (READ_ATTEMPTS), then raised."""
    for attempt in range(READ_ATTEMPTS):
        try:
            verify_checkpoint(path)
            return None
        except CheckpointError as e:
            return e.reason
        except OSError as e:
            if not is_read_error(e) or attempt == READ_ATTEMPTS - 1:
                raise
            log(f"resume: reading {path.name} failed ({e}); retrying")
            time.sleep(READ_RETRY_S * 2**attempt)
    return None


def _move_aside(path: Path) -> Path:
    target, n = path.with_name(path.name + ".corrupt"), 1
    while target.exists():
        target, n = path.with_name(f"{path.name}.corrupt{n}"), n + 1
    path.rename(target)
    return target


def verify(path: str | Path) -> dict[str, Any]:
    """verify_checkpoint on rank 0, its answer on every rank (collective under a process group)."""
    return _on_rank0(lambda: verify_checkpoint(path))


def load_checkpoint(
    path: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    restore_rng: bool = True,
    verified: bool = False,
) -> dict[str, Any]:
    """Load a checkpoint into (possibly differently parallelized) model/optimizer; returns train_state.

    The checkpoint is verified first (skipped with verified=True when select_resume_checkpoint
    just did) and read through the restricted reader: loading never executes what a file brings.

    Raises:
        CheckpointError: the checkpoint is missing, corrupt or refused (see verify_checkpoint).
    """
    path = Path(path)
    train_state = None if verified else verify(path)
    optimizers = [optimizer] if optimizer is not None else []  # no optimizer: weights only (evaluation)
    model_sd, optim_sd = get_state_dict(model, optimizers)
    state = {"model": model_sd, "optim": optim_sd} if optimizers else {"model": model_sd}
    with single_process_ok():
        dcp.load(state, storage_reader=SafeReader(path), planner=SafeLoadPlanner(path))
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
    if train_state is None:  # verified by the caller
        train_state = json.loads((path / TRAIN_STATE).read_text())
    return train_state
