"""Reading a checkpoint without trusting it: the restricted metadata reader, the manifest, verification.

A checkpoint directory may come from another team or a download, so nothing in it gets to run code:

- DCP's `.metadata` is a pickle. `read_metadata` unpickles it with `MetadataUnpickler`, which admits
  only the classes a DCP metadata file is made of (the dataclasses of
  torch.distributed.checkpoint.metadata, its `_StorageInfo`, torch.Size, torch dtypes and layouts,
  paths) and refuses any other global: a crafted `__reduce__` that names `os.system` stops there.
- Non-tensor entries of the state dict (optimizer hyperparameters) are stored as bytes that DCP's
  default planner loads with `torch.load(weights_only=False)`; `SafeLoadPlanner` loads them with
  `weights_only=True`. `SafeReader` is DCP's FileSystemReader with the restricted metadata reader.
- The manifest (`manifest.json`, written last by `save_checkpoint`) lists every file with its size
  and sha256; `verify_checkpoint` checks it, then checks the metadata against the shard sizes, so
  a truncated shard, an empty `.metadata`, an empty `train_state.json` or a truncated RNG file is
  found before any load starts. A checkpoint written before manifests existed gets the structural
  checks (metadata, shard extents, train_state, RNG files) without checksums.

Every refusal is a `CheckpointError` (a UsageError: one line, exit 2 on the command line) naming
the checkpoint and the reason.
"""

from __future__ import annotations

import hashlib
import io
import json
import pathlib
import pickle
import re
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.planner import ReadItem

from scalelab.errors import UsageError
from scalelab.store.atomic import atomic_write_bytes
from scalelab.store.checkpoint_files import MANIFEST

METADATA = ".metadata"
TRAIN_STATE = "train_state.json"
MANIFEST_FORMAT = 1


def is_read_error(e: BaseException) -> bool:
    """An OSError that is not about the file's content or absence (EIO, a network file system's
    timeout): transient, so a verification it interrupts is retried instead of calling the
    checkpoint corrupt."""
    return isinstance(e, OSError) and not isinstance(e, FileNotFoundError | IsADirectoryError | NotADirectoryError)


class CheckpointError(UsageError):
    """A checkpoint that cannot be used: missing, incomplete, corrupt, or refused as unsafe."""

    def __init__(self, path: str | Path, reason: str):
        self.path, self.reason = Path(path), reason
        super().__init__(f"checkpoint {path}: {reason}")


# (module, name) pairs a DCP .metadata pickle may reference; everything else is refused.
_ALLOWED_GLOBALS = {
    *(
        ("torch.distributed.checkpoint.metadata", name)
        for name in (
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "_MEM_FORMAT_ENCODING",
        )
    ),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # looks a torch.layout up by name
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "PureWindowsPath"),
}


class MetadataUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals of DCP checkpoint metadata."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype | torch.layout):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"it references {module}.{name}, which is not a checkpoint metadata type")


def read_metadata(path: str | Path) -> dcp_metadata.Metadata:
    """Unpickle a DCP `.metadata` file with MetadataUnpickler; CheckpointError if it is anything else."""
    path = Path(path)
    where = path.parent
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(where, f"{METADATA} is missing") from None
    if not data:
        raise CheckpointError(where, f"{METADATA} is empty")
    try:
        meta = MetadataUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as e:
        raise CheckpointError(where, f"{METADATA} refused: {e}") from None
    except Exception as e:  # noqa: BLE001 - a truncated or garbled pickle fails in many ways
        raise CheckpointError(where, f"{METADATA} is unreadable ({type(e).__name__}: {e})") from None
    if not isinstance(meta, dcp_metadata.Metadata) or not isinstance(meta.storage_data, dict):
        raise CheckpointError(where, f"{METADATA} does not hold DCP checkpoint metadata")
    return meta


class SafeReader(FileSystemReader):
    """DCP's file-system reader with the restricted metadata unpickler."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_metadata.Metadata:
        meta = read_metadata(Path(self._get_metadata_path(kwargs.get("rank"))))
        if getattr(meta, "storage_meta", None) is None:
            meta.storage_meta = dcp_metadata.StorageMeta()
        meta.storage_meta.load_id = self.load_id
        return meta


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, with non-tensor entries loaded by torch.load(weights_only=True)."""

    def __init__(self, ckpt_dir: str | Path, **kwargs: Any):
        super().__init__(**kwargs)
        self.ckpt_dir = Path(ckpt_dir)

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        obj = load_entry(value, self.ckpt_dir, read_item.dest_index.fqn)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


# ---------------------------------------------------------------------------------------------
# The manifest
# ---------------------------------------------------------------------------------------------


def file_entry(path: Path) -> dict[str, Any]:
    """{"bytes": size, "sha256": hex digest} of one file."""
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    return {"bytes": path.stat().st_size, "sha256": digest}


def write_manifest(ckpt_dir: Path, step: int, entries: dict[str, dict[str, Any]]) -> None:
    """manifest.json listing `entries` ({relative name: file_entry}); written last, by one rank."""
    manifest = {"format": MANIFEST_FORMAT, "step": step, "files": dict(sorted(entries.items()))}
    atomic_write_bytes(ckpt_dir / MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode())  # fsynced


def _check_manifest(ckpt_dir: Path) -> None:
    try:
        manifest = json.loads((ckpt_dir / MANIFEST).read_text())
        files = manifest["files"]
        assert isinstance(files, dict) and files
    except (FileNotFoundError, IsADirectoryError):
        raise CheckpointError(ckpt_dir, f"{MANIFEST} is unreadable") from None
    except OSError:
        raise  # the disk or network failed, the file did not (is_read_error): the caller retries
    except Exception:  # noqa: BLE001 - empty, cut or hand-edited
        raise CheckpointError(ckpt_dir, f"{MANIFEST} is unreadable") from None
    for name, want in files.items():
        path = ckpt_dir / name
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise CheckpointError(ckpt_dir, f"{MANIFEST} names a file outside the checkpoint: {name!r}")
        if not path.is_file():
            raise CheckpointError(ckpt_dir, f"{name} is missing")
        size = path.stat().st_size
        if size != want.get("bytes"):
            raise CheckpointError(ckpt_dir, f"{name} has {size} bytes, the manifest says {want.get('bytes')}")
        if file_entry(path)["sha256"] != want.get("sha256"):
            raise CheckpointError(ckpt_dir, f"{name} does not match its sha256 in the manifest")


def _check_structure(ckpt_dir: Path, legacy: bool) -> dict[str, Any]:
    """train_state.json, the metadata and the shards it points into; RNG files for legacy checkpoints."""
    try:
        state = json.loads((ckpt_dir / TRAIN_STATE).read_text())
        assert isinstance(state, dict) and "step" in state
    except FileNotFoundError:
        raise CheckpointError(ckpt_dir, f"{TRAIN_STATE} is missing") from None
    except IsADirectoryError:
        raise CheckpointError(ckpt_dir, f"{TRAIN_STATE} is empty or unreadable") from None
    except OSError:
        raise  # a read error (is_read_error): the caller retries
    except Exception:  # noqa: BLE001
        raise CheckpointError(ckpt_dir, f"{TRAIN_STATE} is empty or unreadable") from None
    meta = read_metadata(ckpt_dir / METADATA)
    extent: dict[str, int] = {}
    for info in meta.storage_data.values():
        if not isinstance(info, _StorageInfo):
            raise CheckpointError(ckpt_dir, f"{METADATA} does not hold DCP file-system storage entries")
        rel = str(info.relative_path)
        if pathlib.PurePath(rel).is_absolute() or ".." in pathlib.PurePath(rel).parts:
            raise CheckpointError(ckpt_dir, f"{METADATA} points outside the checkpoint: {rel!r}")
        extent[rel] = max(extent.get(rel, 0), int(info.offset) + int(info.length))
    for rel, need in extent.items():
        path = ckpt_dir / rel
        if not path.is_file():
            raise CheckpointError(ckpt_dir, f"shard {rel} is missing")
        if path.stat().st_size < need:
            raise CheckpointError(ckpt_dir, f"shard {rel} is truncated ({path.stat().st_size} of {need} bytes)")
    _check_byte_entries(ckpt_dir, meta)
    if legacy:
        for rng in sorted(ckpt_dir.glob("rng_rank*.pt")):
            try:
                torch.load(rng, weights_only=True)
            except (FileNotFoundError, IsADirectoryError):
                raise CheckpointError(ckpt_dir, f"{rng.name} is unreadable") from None
            except OSError:
                raise  # a read error (is_read_error): the caller retries
            except Exception:  # noqa: BLE001
                raise CheckpointError(ckpt_dir, f"{rng.name} is unreadable") from None
    return state


def _check_byte_entries(ckpt_dir: Path, meta: dcp_metadata.Metadata) -> None:
    """The non-tensor entries (a few small pickles) load with weights_only=True, as SafeLoadPlanner will."""
    for index, info in meta.storage_data.items():
        entry = meta.state_dict_metadata.get(getattr(index, "fqn", None))
        if not isinstance(entry, dcp_metadata.BytesStorageMetadata) or info.transform_descriptors:
            continue
        with open(ckpt_dir / info.relative_path, "rb") as f:
            f.seek(int(info.offset))
            load_entry(io.BytesIO(f.read(int(info.length))), ckpt_dir, index.fqn)


def load_entry(blob: io.BytesIO, ckpt_dir: Path, fqn: str) -> Any:
    """torch.load(weights_only=True) of one non-tensor state-dict entry; CheckpointError on refusal."""
    try:
        return torch.load(blob, weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"unsupported GLOBAL (\S+)", str(e))
        why = f"it references {found.group(1)}, which is not a plain data type" if found else "not plain data"
        raise CheckpointError(ckpt_dir, f"entry {fqn} refused: {why}") from None
    except Exception as e:  # noqa: BLE001 - cut or garbled bytes
        raise CheckpointError(ckpt_dir, f"entry {fqn} is unreadable ({type(e).__name__})") from None


def verify_checkpoint(ckpt_dir: str | Path) -> dict[str, Any]:
    """Check a checkpoint directory before loading it; returns its train_state.

    Raises:
        CheckpointError: not a checkpoint, a file missing or changed since the manifest was written,
            metadata that is empty, garbled or refers to anything but checkpoint metadata types,
            a shard shorter than the metadata says, an unreadable train_state or RNG file.
    """
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        raise CheckpointError(ckpt_dir, "no such checkpoint directory")
    has_manifest = (ckpt_dir / MANIFEST).exists()
    if has_manifest:
        _check_manifest(ckpt_dir)
    return _check_structure(ckpt_dir, legacy=not has_manifest)
