"""The token stream of `prepare`: documents tokenized to one file on disk, then copied into its splits.

    docs = tokenize_to_file(documents, tok, dtype, tmp / "tokens.tmp", is_excluded)  # one pass over the input
    ...choose docs.val ids (prepare.select_val_documents' rule over docs.hashes, docs.tokens)...
    num_tokens = copy_documents(tmp / "tokens.tmp", tmp / "train.bin", docs, members, dtype, h)

Memory stays flat in the input's size: text is tokenized _CHUNK_BYTES at a time and written out at
once, and what is kept per document is a fixed 25 bytes (its key's hash, token and byte counts, and
whether a train filter drops it), so a 1 GB corpus of 3 KB documents holds ~8 MB of it. The price is
disk: the stream and the split files exist together until the stream is deleted (about twice the
shards' size at the peak). Copies go through a bounded buffer (no memory map, whose pages would count
as the process's memory).
"""

from __future__ import annotations

import hashlib
import os
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from scalelab.train.data.formats import Document
from scalelab.train.data.tokenizer import Tokenizer

_CHUNK_BYTES = 4 << 20  # text per encode_documents call, and bytes per copy block (bounds peak memory)


def unit_hash(key: str) -> float:
    """A document key's position in [0, 1): the first 8 bytes of its sha256."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2.0**64


@dataclass(slots=True)
class StreamedDocs:
    """What is known of each document once its tokens are on disk (in input order)."""

    hashes: array = field(default_factory=lambda: array("d"))  # unit_hash of the key
    tokens: array = field(default_factory=lambda: array("q"))  # tokens, end-of-text included
    nbytes: array = field(default_factory=lambda: array("q"))  # UTF-8 bytes of the text
    excluded: bytearray = field(default_factory=bytearray)  # 1: a train_exclude pattern matches the key
    first: Document | None = None  # the first document while it is the only one (for the val cut)
    lowest_key: str = ""  # the key with the lowest hash, earliest first (the document a val cut takes)

    def __len__(self) -> int:
        return len(self.tokens)

    def offsets(self) -> np.ndarray:
        """int64 [n + 1]: where each document's tokens start in the stream, and its end."""
        return np.concatenate([[0], np.cumsum(np.frombuffer(self.tokens, dtype=np.int64))])


def tokenize(docs: list[Document], tokenizer: Tokenizer, dtype: np.dtype) -> list[np.ndarray]:
    """Token arrays of `docs` (no end-of-text); ValueError for an id outside the vocabulary."""
    arrays = tokenizer.encode_documents([d.data for d in docs])
    out = []
    for a in arrays:
        if a.dtype != np.uint8 and a.size and int(a.max()) >= tokenizer.vocab_size:
            raise ValueError(f"tokenizer {tokenizer.spec} produced id {int(a.max())} >= vocab_size")
        out.append(a if a.dtype == np.uint8 else a.astype(dtype))  # uint8 views are widened on write
    return out


def with_eot(arrays: list[np.ndarray], eot_id: int, dtype: np.dtype) -> np.ndarray:
    """The documents one after another, each followed by end-of-text, as one `dtype` array."""
    out = np.empty(sum(a.size + 1 for a in arrays), dtype=dtype)
    at = 0
    for a in arrays:
        out[at : at + a.size] = a
        out[at + a.size] = eot_id
        at += a.size + 1
    return out


def tokenize_to_file(
    documents: Iterable[Document],
    tokenizer: Tokenizer,
    dtype: np.dtype,
    path: Path,
    is_excluded: Callable[[str], bool],
) -> StreamedDocs:
    """Tokenize `documents` into `path` (each followed by end-of-text); return their facts."""
    seen = StreamedDocs()
    pending: list[Document] = []
    pending_bytes = 0
    lowest = float("inf")
    with open(path, "wb") as fh:

        def flush() -> None:
            arrays = tokenize(pending, tokenizer, dtype)
            fh.write(memoryview(with_eot(arrays, tokenizer.eot_id, dtype)))
            seen.tokens.extend(a.size + 1 for a in arrays)

        for doc in documents:
            h = unit_hash(doc.key)
            seen.first = doc if not seen.hashes else None  # kept only while it may be the lone document
            if h < lowest:
                lowest, seen.lowest_key = h, doc.key
            seen.hashes.append(h)
            seen.nbytes.append(len(doc.data))
            seen.excluded.append(is_excluded(doc.key))
            pending.append(doc)
            pending_bytes += len(doc.data)
            if pending_bytes >= _CHUNK_BYTES:
                flush()
                pending, pending_bytes = [], 0
        flush()
    return seen


def _copy(src, dst, start: int, stop: int, h) -> int:
    """Bytes [start, stop) of file `src` appended to `dst` and fed to hash `h`, a block at a time."""
    src.seek(start)
    left = stop - start
    while left:
        block = src.read(min(left, _CHUNK_BYTES))
        if not block:
            raise OSError(f"{src.name} ended {left} bytes early")
        dst.write(block), h.update(block)
        left -= len(block)
    return stop - start


def copy_documents(
    stream: Path,
    out: Path,
    offsets: np.ndarray,
    members: np.ndarray,
    dtype: np.dtype,
    h,
    replace: dict[int, np.ndarray] | None = None,
    extra: np.ndarray | None = None,
) -> int:
    """Write the documents whose `members` flag is set, in stream order, into `out`; return tokens.

    Consecutive members are copied as one range. `replace[i]` (tokens with end-of-text) stands in for
    document i's stream tokens; `extra` is appended last. Everything written is fed to hash `h`.
    """
    replace = replace or {}
    itemsize = dtype.itemsize
    flags = members.astype(np.int8)
    for i in replace:
        flags[i] = 2 if members[i] else 0  # its own run, written from `replace`
    bounds = np.flatnonzero(np.diff(flags)) + 1
    starts = np.concatenate([[0], bounds])
    stops = np.concatenate([bounds, [len(flags)]])
    written = 0
    with open(stream, "rb") as src, open(out, "wb") as dst:
        for a, b in zip(starts.tolist(), stops.tolist()):
            if flags[a] == 1:
                written += _copy(src, dst, int(offsets[a]) * itemsize, int(offsets[b]) * itemsize, h)
            elif flags[a] == 2:
                for i in range(a, b):
                    block = replace[i].astype(dtype, copy=False).tobytes()
                    dst.write(block), h.update(block)
                    written += len(block)
        if extra is not None:
            block = extra.astype(dtype, copy=False).tobytes()
            dst.write(block), h.update(block)
            written += len(block)
        dst.flush()
        os.fsync(dst.fileno())
    return written // itemsize
