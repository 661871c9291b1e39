"""Whole-file writes: a reader sees the previous file or the new one, never part of one.

    from scalelab.store.atomic import atomic_write_json
    atomic_write_json(run_dir / "status.json", {"status": "running"})

A local or shared POSIX path is written to a temporary name in the same directory, fsynced, renamed
over the target, and the directory fsynced: after a power loss the file is the old one or the new
one, never empty or cut (`fsync_dir` makes any rename durable, e.g. a checkpoint's). On object
storage (an `s3://` URL, scalelab.store.objects) there is no rename: each file is one object put
whole, which gives readers the same guarantee.

Read-modify-write without lost updates (the ledger, sweep.resolved.json on object storage, a new
round's fit): `read_versioned` returns a file's bytes with a version (its ETag on object storage, the
sha256 of its bytes locally), and `replace_if` writes only while the file is still that version
(`If-Match: <etag>`; `If-None-Match: *` for a file that must not exist yet; locally the same check
under an fcntl lock, and a new file linked into place, which fails if one is there). `update_json`
retries the read, the change and the conditional write until it lands, so of two writers neither
loses the other's update.

    update_json(sweep_dir / "ledger.json", add_fit, default=dict)
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl

from scalelab.store import objects


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    if objects.is_url(path):
        objects.write_bytes(path, data)
        return
    path = Path(path)
    tmp = _durable_temp(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def _durable_temp(path: Path, data: bytes) -> str:
    """data in a new fsynced temporary file beside path, for a rename or link into place (removed
    again if the write fails)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def atomic_write_parquet(path: str | Path, df: pl.DataFrame) -> None:
    if objects.is_url(path):
        buf = io.BytesIO()
        df.write_parquet(buf)
        objects.write_bytes(path, buf.getvalue())
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        df.write_parquet(tmp)
        fsync_file(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def fsync_file(path: Path) -> None:
    """Flush a file's data to the disk (a file another writer, DCP or torch.save, wrote)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make the names in a directory (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# Conditional writes: read, change, write only if nobody wrote meanwhile
# ---------------------------------------------------------------------------------------------

UPDATE_ATTEMPTS = 50  # a read-modify-write that lost this many races in a row gives up (RuntimeError)


def read_versioned(path: str | Path) -> tuple[bytes | None, str | None]:
    """(bytes, version) of a file, (None, None) when there is none. The version is what replace_if
    compares: the object's ETag on object storage, the sha256 of the bytes locally."""
    if objects.is_url(path):
        got = objects.read(path)
        return (None, None) if got is None else got
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return None, None
    return data, hashlib.sha256(data).hexdigest()


def replace_if(path: str | Path, data: bytes, seen: str | None) -> bool:
    """Write `data` whole only if the file is still the version `seen` (None: only if there is no
    file); False, with nothing written, when another writer changed (or created) it meanwhile."""
    if objects.is_url(path):
        cond = {"if_match": seen} if seen is not None else {"if_none_match": True}
        try:
            objects.write_bytes(path, data, **cond)
        except Exception as e:  # noqa: BLE001 - botocore's ClientError, sorted below
            if objects.is_precondition_failure(e) or objects.is_not_found(e):
                return False
            raise
        return True
    path = Path(path)
    if seen is None:
        return _create(path, data)
    with _file_lock(path):
        if read_versioned(path)[1] != seen:
            return False
        atomic_write_bytes(path, data)
    return True


def update_json(path: str | Path, change: Callable[[Any], tuple[Any, bool]], *, default: Callable[[], Any]) -> Any:
    """Read-modify-write a JSON file without losing another writer's update (module docstring).

    change(obj) edits the parsed file (default() when there is none) and returns (result, changed);
    it may run more than once (after a lost race it sees the other writer's version), so it reads
    the file's content afresh each time and has no other side effect. Returns the last result."""
    for attempt in range(UPDATE_ATTEMPTS):
        data, seen = read_versioned(path)
        obj = json.loads(data) if data else default()
        result, changed = change(obj)
        if not changed:
            return result
        body = (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()
        if replace_if(path, body, seen):
            return result
        time.sleep(random.uniform(0.0, 0.05 * (attempt + 1)))  # another writer won: read its version
    raise RuntimeError(f"{path}: {UPDATE_ATTEMPTS} writers in a row changed it under this one; try again")


def _create(path: Path, data: bytes) -> bool:
    """A new file written whole, linked into place only if no file is there (os.link fails then)."""
    tmp = _durable_temp(path, data)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        Path(tmp).unlink(missing_ok=True)
    fsync_dir(path.parent)
    return True


@contextlib.contextmanager
def _file_lock(path: Path):
    """An exclusive fcntl lock beside `path` (`.<name>.lock`) for a local compare-and-replace."""
    fd = os.open(path.parent / f".{path.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
