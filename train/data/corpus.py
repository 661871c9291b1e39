"""Reading raw corpora into documents, and the default corpus: the Python standard library's source.

Inputs may be mixed freely:
  - "default": the installed stdlib's *.py files (see below);
  - a folder: files matching glob patterns (default: DEFAULT_PATTERNS, text, JSONL plain and
    compressed, Parquet), recursively, in sorted order, skipping hidden folders and __pycache__;
  - a file: read by its format (formats.py): Parquet (one document per row of a text column),
    JSONL plain, .gz or .zst (one per non-blank line, from a string field, default "text"), or any
    other file as one document.
Every document is yielded as UTF-8 bytes (undecodable bytes become U+FFFD) with a stable key —
its path relative to the input (`<folder name>/<rel path>`, `<file name>`, `<file name>:<line>`,
`<file name>:<row>`) — which decides the validation split. Empty documents are skipped.
`check_inputs` opens every file's header before anything is read (bad input is one line, exit 2).

The default corpus is chosen because it is on every machine with Python: `sysconfig`'s stdlib
folder, *.py files only, test suites included, excluding site-packages/dist-packages and the
generated encodings/ tables and pydoc_data/ (see _STDLIB_SKIP_DIRS). `python -m
scalelab.train.data.corpus` prints its files, bytes, documents and tokens (a few test files hold
deliberately malformed bytes, decoded as U+FFFD); they vary with the Python version, and each
prepared shard's index.json records its own. One count: docs/benchmarks.md ("Data preparation").
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import sysconfig
from collections.abc import Iterator, Sequence
from pathlib import Path

from scalelab.errors import UsageError
from scalelab.train.data.formats import Document, OnRead, check_file, read_file

DEFAULT_PATTERNS: tuple[str, ...] = (
    *("*.py", "*.txt", "*.md", "*.rst"),
    *("*.jsonl", "*.jsonl.gz", "*.json.gz", "*.jsonl.zst", "*.json.zst", "*.parquet"),
)
# Generated files are left out: encodings/ holds ~120 near-identical charmap tables written by
# gencodec.py, and pydoc_data/topics.py is the rendered documentation. Near-duplicates are what an LM
# data pipeline dedupes; here they also took most of the 1% validation split (5 of its 12 documents
# were codec tables), so validation loss measured table copying more than language modelling.
# The test suites stay in: they triple the corpus (29 M tokens), so a CPU sweep's compute-optimal
# runs (up to ~10 M tokens) see every token once; their few malformed files decode with U+FFFD.
_STDLIB_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__", "encodings", "pydoc_data"}


def default_corpus_root() -> Path:
    """The installed standard library folder (the default corpus lives here)."""
    return Path(sysconfig.get_paths()["stdlib"])


def default_corpus_files() -> list[Path]:
    """The stdlib *.py files, sorted; site-packages and test suites excluded (see module docstring)."""
    root = default_corpus_root()
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _STDLIB_SKIP_DIRS and not d.startswith("."))
        files.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    return files


def _walk(folder: Path, patterns: Sequence[str]) -> list[Path]:
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
        for f in sorted(filenames):
            if any(fnmatch.fnmatch(f, p) for p in patterns):
                out.append(Path(dirpath) / f)
    return out


def resolve_inputs(inputs: Sequence[str | os.PathLike], patterns: Sequence[str] | None = None) -> list[Path]:
    """The concrete files behind `inputs`, in reading order; UsageError for a missing path."""
    if isinstance(inputs, str | os.PathLike):
        inputs = [inputs]
    if not inputs:
        raise UsageError("no data inputs given")
    files: list[Path] = []
    for item in inputs:
        if str(item) == "default":
            files.extend(default_corpus_files())
            continue
        path = Path(item).expanduser()
        if path.is_dir():
            files.extend(_walk(path, patterns or DEFAULT_PATTERNS))
        elif path.is_file():
            files.append(path)
        else:
            raise UsageError(f"data input {str(item)!r} does not exist")
    return files


def check_inputs(
    inputs: Sequence[str | os.PathLike], patterns: Sequence[str] | None = None, text_field: str = "text"
) -> list[Path]:
    """resolve_inputs, then every file opened as its reader would first open it (formats.check_file):
    a missing path, a corrupt header, a missing text column or field, an unknown compression is one
    UsageError naming the file and the fix, before any document is read."""
    files = resolve_inputs(inputs, patterns)
    for f in files:
        check_file(f, text_field)
    return files


def iter_documents(
    inputs: Sequence[str | os.PathLike],
    patterns: Sequence[str] | None = None,
    text_field: str = "text",
    on_read: OnRead = None,
) -> Iterator[Document]:
    """Yield every document of `inputs` in a fixed order (see module docstring for the rules);
    `on_read(n)` hears of each n bytes of input files read (formats.py)."""
    if isinstance(inputs, str | os.PathLike):
        inputs = [inputs]
    resolve_inputs(inputs, patterns)  # fail on a missing path before reading anything
    for item in inputs:
        if str(item) == "default":
            root = default_corpus_root()
            for f in default_corpus_files():
                yield from read_file(f, "stdlib/" + f.relative_to(root).as_posix(), text_field, on_read)
            continue
        path = Path(item).expanduser()
        if path.is_dir():
            for f in _walk(path, patterns or DEFAULT_PATTERNS):
                yield from read_file(f, f"{path.name}/{f.relative_to(path).as_posix()}", text_field, on_read)
        else:
            yield from read_file(path, path.name, text_field, on_read)


def inputs_fingerprint(
    inputs: Sequence[str | os.PathLike], patterns: Sequence[str] | None = None, text_field: str = "text"
) -> str:
    """Hash of the inputs' file paths, sizes and mtimes (cheap: stat only) for cache keys."""
    h = hashlib.sha256(json.dumps([list(patterns or DEFAULT_PATTERNS), text_field]).encode())
    for f in resolve_inputs(inputs, patterns):
        st = f.stat()
        h.update(f"{f.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


if __name__ == "__main__":
    import time

    import numpy as np

    t0 = time.perf_counter()
    files = default_corpus_files()
    num_bytes = sum(f.stat().st_size for f in files)
    docs = list(iter_documents(["default"]))
    doc_bytes = int(np.sum([len(d.data) for d in docs]))
    print(f"stdlib root: {default_corpus_root()}")
    print(f"files: {len(files)}  file bytes: {num_bytes:,}  documents (non-empty): {len(docs)}")
    print(f"document bytes (UTF-8): {doc_bytes:,}  byte-tokenizer tokens: {doc_bytes + len(docs):,}")
    print(f"read in {time.perf_counter() - t0:.2f} s")
