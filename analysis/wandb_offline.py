"""Read back what an offline W&B run holds, without W&B's servers: what `wandb sync` would upload.

    runs = read_offline_runs("results/iso")        # every offline run under a sweep (runs/*/wandb too)
    run = read_offline_run(".../wandb/offline-run-20250101_120000-abc123")
    run.group, run.tags, run.job_type, run.summary["N"], run.history[-1]["train/loss"]
    columns, rows = run.table("ledger")            # the last ledger table logged
    run.images()                                   # {"plots/isoflop": Path(...png), ...}

A run's `run-<id>.wandb` file is W&B's transaction log: a LevelDB-style log (a 7-byte header
":W&B", 0xBEE1, version 0; 32 KiB blocks; records of a 7-byte header — CRC32, length, type
full/first/middle/last — and their bytes), each record one protobuf `Record` of
wandb.proto.wandb_internal_pb2 (run, config, history, summary, exit, ...). Tables and images are
files beside it (files/media/...), referenced from the history. Resumed offline runs are separate
folders with the same id; read_offline_runs lists each.

wandb's service process writes the log behind the run: right after `run.finish()` returns the file
may hold only its header. `wait_s` polls until the log holds the run's exit record.
"""

from __future__ import annotations

import json
import struct
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalelab.errors import UsageError

_HEADER = struct.Struct("<4sHB")  # ident, magic, version
_RECORD = struct.Struct("<IHB")  # crc32, length, type
_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _records(path: Path) -> list[bytes]:
    """The records of a .wandb log, reassembled across blocks, up to the first record not yet whole.

    wandb's service appends to the log while a run trains, so the file's tail may hold a record
    header whose bytes are not all written, or bytes that are not yet final: a record that runs past
    the end of the file or fails its CRC (CRC32 of the type byte and the bytes) ends the read, and
    the caller polls again (`wait_s`)."""
    data = path.read_bytes()
    if len(data) < _HEADER.size:  # created, nothing written yet
        return []
    if _HEADER.unpack_from(data)[:2] != (b":W&B", 0xBEE1):
        raise UsageError(f"{path} is not a W&B transaction log (no :W&B header)")
    out, pending, pos = [], b"", _HEADER.size
    while pos + _RECORD.size <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _RECORD.size:  # the block's tail is padding
            pos += left
            continue
        crc, length, kind = _RECORD.unpack_from(data, pos)
        if kind == 0 and length == 0:  # zero padding to the block's end
            pos += left
            continue
        body = data[pos + _RECORD.size : pos + _RECORD.size + length]
        if len(body) < length or zlib.crc32(bytes([kind]) + body) != crc:
            break
        pos += _RECORD.size + length
        if kind == _FULL:
            out.append(body)
        elif kind == _FIRST:
            pending = body
        elif kind == _MIDDLE:
            pending += body
        elif kind == _LAST:
            out.append(pending + body)
            pending = b""
    return out


def _put(tree: dict[str, Any], item) -> None:
    keys = list(item.nested_key) or [item.key]
    for k in keys[:-1]:
        tree = tree.setdefault(k, {})
    tree[keys[-1]] = json.loads(item.value_json)


@dataclass(kw_only=True)
class OfflineRun:
    """One offline run folder, read back."""

    path: Path
    id: str = ""
    project: str = ""
    group: str = ""
    job_type: str = ""
    name: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)  # one row per logged step, keys nested
    summary: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None  # None: the run never finished

    def series(self, key: str) -> list[tuple[int, Any]]:
        """(step, value) of every history row that holds `key`."""
        return [(int(row["_step"]), row[key]) for row in self.history if key in row]

    def table(self, key: str) -> tuple[list[str], list[list[Any]]]:
        """(columns, rows) of the last table logged under `key`.

        Raises:
            UsageError: no table of that name in this run.
        """
        refs = [row[key] for row in self.history if isinstance(row.get(key), dict) and "path" in row[key]]
        if not refs:
            raise UsageError(f"{self.path}: no table {key!r} in the history")
        payload = json.loads((self.path / "files" / refs[-1]["path"]).read_text())
        return payload["columns"], payload["data"]

    def images(self) -> dict[str, Path]:
        """{history key: the PNG file} of every image logged (the last of each key)."""
        out = {}
        for row in self.history:
            for key, value in row.items():
                if isinstance(value, dict) and value.get("_type") == "image-file":
                    out[key] = self.path / "files" / value["path"]
        return out


def read_offline_run(path: str | Path, wait_s: float = 0.0) -> OfflineRun:
    """One offline run folder (`offline-run-<date>-<id>`, holding `run-<id>.wandb`); with `wait_s`,
    once its exit record is written (or after wait_s, as it is then).

    Raises:
        UsageError: no transaction log in the folder, or not a W&B log.
    """
    deadline = time.monotonic() + wait_s
    while True:
        run = _read(Path(path))
        if run.exit_code is not None or time.monotonic() >= deadline:
            return run
        time.sleep(0.2)


def _read(path: Path) -> OfflineRun:
    from wandb.proto import wandb_internal_pb2 as pb

    logs = sorted(path.glob("run-*.wandb"))
    if not logs:
        raise UsageError(f"{path} holds no run-<id>.wandb file; give an offline-run-* folder")
    run = OfflineRun(path=path)
    for raw in _records(logs[0]):
        rec = pb.Record()
        rec.ParseFromString(raw)
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            r = rec.run
            run.id, run.project, run.group, run.job_type = r.run_id, r.project, r.run_group, r.job_type
            run.name, run.tags = r.display_name, list(r.tags)
            for item in r.config.update:
                _put(run.config, item)
        elif kind == "config":
            for item in rec.config.update:
                _put(run.config, item)
        elif kind == "history":
            row: dict[str, Any] = {}
            for item in rec.history.item:
                _put(row, item)
            run.history.append(row)
        elif kind == "summary":
            for item in rec.summary.update:
                _put(run.summary, item)
        elif kind == "exit":
            run.exit_code = rec.exit.exit_code
    run.config = {k: v.get("value", v) if isinstance(v, dict) else v for k, v in run.config.items()}
    return run


def read_offline_runs(path: str | Path, wait_s: float = 0.0) -> list[OfflineRun]:
    """Every offline run under `path` (a sweep directory, a run directory or a wandb/ folder), by
    folder; `wait_s` as in read_offline_run, for each."""
    path = Path(path)
    found = [*path.glob("**/wandb/offline-run-*/run-*.wandb"), *path.glob("offline-run-*/run-*.wandb")]
    folders = sorted({p.parent.resolve() for p in found})  # a run linked into two sweeps: once
    return [read_offline_run(f, wait_s) for f in folders]
