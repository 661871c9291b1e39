"""A prepared token-shard directory, opened read-only.

    src = PreparedSource("~/.cache/scalelab/data/stdlib-1a2b3c4d5e6f7a8b")
    src.train[:10], src.val.shape          # np.memmap views (uint16 or uint32), never loaded whole
    src.bytes_per_token("val")             # UTF-8 bytes per token over the whole split

Layout written by `scalelab.train.data.prepare.prepare`:

    train.bin   flat token stream, every document followed by end-of-text
    val.bin     the same for held-out documents
    index.json  format, dtype, tokenizer spec/fingerprint, per-split num_tokens / num_bytes /
                num_documents, sources, content_hash

bits per byte from a mean loss in nats per token: bpb = loss * num_tokens / (num_bytes * ln 2),
where end-of-text tokens count as tokens that stand for zero bytes.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from scalelab.errors import UsageError

FORMAT = "scalelab-shards-v1"
SPLITS = ("train", "val")


def is_prepared_dir(path: str | os.PathLike) -> bool:
    """True when `path` is a directory holding a complete shard set (index.json is written last)."""
    p = Path(path).expanduser()
    return p.is_dir() and (p / "index.json").is_file()


TOKEN_DTYPES = ("uint16", "uint32")  # what prepare writes; anything else is not read (an "O" would
# make numpy read the file's bytes as object pointers)


def _token_dtype(name: Any, where: Path) -> np.dtype:
    if name not in TOKEN_DTYPES:
        raise UsageError(f"{where}: dtype {name!r} is not a token dtype ({' or '.join(TOKEN_DTYPES)}); re-prepare it")
    return np.dtype(name)


class PreparedSource:
    """Read-only view of one prepared dir; `name` is the mixture's name for it (seeds the order)."""

    def __init__(self, path: str | os.PathLike, name: str | None = None) -> None:
        self.path = Path(path).expanduser()
        if not is_prepared_dir(self.path):
            raise UsageError(f"{self.path} is not a prepared shard dir (no index.json); run `scalelab data prepare`")
        self.index: dict[str, Any] = json.loads((self.path / "index.json").read_text())
        if not isinstance(self.index, dict) or self.index.get("format") != FORMAT:
            found = self.index.get("format") if isinstance(self.index, dict) else None
            raise UsageError(f"{self.path}: shard format {found!r}, expected {FORMAT!r}")
        self.name = name or self.index.get("name") or self.path.name
        self.dtype = _token_dtype(self.index.get("dtype"), self.path / "index.json")
        self.train = self._open("train")
        self.val = self._open("val")

    def _open(self, split: str) -> np.ndarray:
        try:
            n = self.index["splits"][split]["num_tokens"]
        except (KeyError, TypeError):
            n = None
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise UsageError(f"{self.path}/index.json: splits.{split}.num_tokens {n!r} is not a count; re-prepare it")
        file = self.path / f"{split}.bin"
        size = file.stat().st_size
        if size != n * self.dtype.itemsize:
            raise UsageError(f"{file}: {size} bytes, index.json says {n} tokens of {self.dtype}; re-prepare it")
        if n == 0:
            return np.zeros(0, dtype=self.dtype)  # np.memmap cannot map an empty file
        return np.memmap(file, dtype=self.dtype, mode="r", shape=(n,))

    @property
    def tokenizer_spec(self) -> str:
        return self.index["tokenizer"]

    @property
    def tokenizer_fingerprint(self) -> str:
        return self.index["tokenizer_fingerprint"]

    def num_tokens(self, split: str = "train") -> int:
        return int(self.index["splits"][split]["num_tokens"])

    def num_bytes(self, split: str = "train") -> int:
        return int(self.index["splits"][split]["num_bytes"])

    def bytes_per_token(self, split: str = "train") -> float:
        """UTF-8 bytes per token over the split (end-of-text tokens count, with zero bytes)."""
        n = self.num_tokens(split)
        return self.num_bytes(split) / n if n else math.nan

    def __repr__(self) -> str:
        return (
            f"PreparedSource({self.name!r}, {self.path}, train={self.num_tokens('train'):,} tokens, "
            f"val={self.num_tokens('val'):,} tokens, {self.index['tokenizer']})"
        )
