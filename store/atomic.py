"""Whole-file writes: a reader sees the previous file or the new one, never part of one.

    from scalelab.store.atomic import atomic_write_json
    atomic_write_json(run_dir / "status.json", {"status": "running"})

A local or shared POSIX path is written to a temporary name in the same directory, fsynced, renamed
over the target, and the directory fsynced: after a power loss the file is the old one or the new
one, never empty or cut (`fsync_dir` makes any rename durable, e.g. a checkpoint's). On object
storage (an `s3://` URL, scalelab.store.objects) there is no rename: each file is one object put
whole, which gives readers the same guarantee.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import polars as pl

from scalelab.store import objects


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    if objects.is_url(path):
        objects.write_bytes(path, data)
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


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
