"""Turn raw text (files, folders, JSONL, or the stdlib corpus) into token shards, atomically.

    prepare(["notes/", "wiki.jsonl"], "shards/mix", load_tokenizer("byte"), val_fraction=0.01)
    src = ensure_prepared("default", load_tokenizer("byte"))   # cached: prepared once, reused after

Each document is tokenized and followed by end-of-text; train.bin and val.bin are flat token
streams (uint16 when the vocabulary fits, else uint32), described by index.json (see shards.py).

Validation split, held out by whole documents: documents are ranked by sha256 of their key (the
path relative to the input, or file:line for JSONL) and taken in that order until the val split
holds at least `val_tokens` tokens (or `val_fraction` of all tokens), passing over any document
that would overshoot twice the target; at least one document always stays in train. When no
whole document fits (one big .txt, or only huge files), the document with the lowest key hash is
cut instead at the line break that leaves about the target in val (at most half of it).
The order of documents within each split is the input order. `train_exclude` (fnmatch patterns
over document keys) then leaves matching documents out of the train split only: the val split is
the one the whole input gives, so a filtered source is validated on the same documents.

Safety: everything is written into a temp dir next to `out_dir` and renamed into place after
index.json is written and fsynced, so a crash leaves either no `out_dir` or a complete one. When
several processes (e.g. Ray trials starting together) prepare the same dir, the first rename wins
and the others discard their copy and open the winner's; `ensure_prepared` additionally holds an
fcntl lock so the others wait instead of duplicating the work. A killed process can leave a
`.<name>.tmp-*` dir behind; it is never read and may be deleted.

Inputs are checked before anything is read (corpus.check_inputs: a corrupt Parquet footer, a missing
text column or field, an unknown compression is one UsageError naming the file and the fix).

Memory is flat in the input's size: documents are read as a stream (a Parquet record batch, a JSONL
line at a time), tokenized a few MB at a time into one token file, and copied from it into train.bin
and val.bin once the split is chosen; per document only its key hash and counts are kept
(token_stream.py; the disk holds the stream and the splits together at the peak). The byte
tokenizer takes numpy views of the raw bytes; a BPE tokenizer encodes through HF's encode_batch.
Preparation times: docs/benchmarks.md ("Data preparation") and docs/data.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from scalelab.errors import UsageError
from scalelab.train.data.corpus import check_inputs, inputs_fingerprint, iter_documents
from scalelab.train.data.formats import Document, OnRead
from scalelab.train.data.shards import FORMAT, PreparedSource, is_prepared_dir
from scalelab.train.data.token_stream import (
    StreamedDocs,
    copy_documents,
    tokenize,
    tokenize_to_file,
    unit_hash,
    with_eot,
)
from scalelab.train.data.tokenizer import Tokenizer, load_tokenizer

_VAL_RULE = "val-rule-2"  # bump when the val split rule changes, so caches are rebuilt


def data_cache_dir() -> Path:
    """Where ensure_prepared keeps shards: $SCALELAB_CACHE/data, default ~/.cache/scalelab/data."""
    return Path(os.environ.get("SCALELAB_CACHE", "~/.cache/scalelab")).expanduser() / "data"


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def select_val_documents(
    keys: Sequence[str], num_tokens: Sequence[int], val_fraction: float, val_tokens: int | None
) -> set[int]:
    """Indices of held-out documents: lowest key hashes first until the val target is reached.

    The target is `val_tokens`, else `val_fraction` of all tokens. A document that would carry the
    split past twice the target is passed over (one huge file must not become the whole val
    split), and at least one document always stays in train. May return an empty set; `prepare`
    then cuts the tail off one document instead.
    """
    hashes = np.array([unit_hash(k) for k in keys], dtype=np.float64)
    return _select_val(hashes, np.asarray(num_tokens, dtype=np.int64), val_fraction, val_tokens)


def _select_val(hashes: np.ndarray, num_tokens: np.ndarray, val_fraction: float, val_tokens: int | None) -> set[int]:
    """select_val_documents over the keys' unit hashes (what prepare keeps of each document)."""
    total = int(num_tokens.sum())
    target = val_tokens if val_tokens is not None else val_fraction * total
    if target <= 0 or len(hashes) < 2:
        return set()
    order = np.argsort(hashes, kind="stable")  # by hash, then input order
    chosen: set[int] = set()
    held = 0
    for i in order:  # element by element: the loop stops after the val split's share of the documents
        if held >= target or len(chosen) == len(hashes) - 1:
            break
        if held + int(num_tokens[i]) > 2 * target:
            continue
        chosen.add(int(i))
        held += int(num_tokens[i])
    return chosen


def _split_document(doc: Document, val_share: float) -> list[Document]:
    """Cut a document at the line break nearest (1 - val_share) of its bytes: [train, val] parts."""
    data = doc.data
    cut = int(round(len(data) * (1.0 - val_share)))
    # Line starts strictly inside the document (a final newline is not a cut point).
    before, after = data.rfind(b"\n", 0, min(cut, len(data) - 1)), data.find(b"\n", cut, len(data) - 1)
    candidates = [p + 1 for p in (before, after) if p >= 0]
    if candidates:
        cut = min(candidates, key=lambda p: abs(p - cut))
    else:  # no usable line break: cut at a UTF-8 character boundary
        while 0 < cut < len(data) and (data[cut] & 0xC0) == 0x80:
            cut += 1
    cut = min(max(cut, 1), len(data) - 1)
    return [Document(doc.key + "#train", data[:cut]), Document(doc.key + "#val", data[cut:])]


def _reread(inputs, patterns, text_field: str, *, key: str) -> Document:
    """Read one document again by key (only for the rare cut-a-document fallback)."""
    for doc in iter_documents(inputs, patterns=patterns, text_field=text_field):
        if doc.key == key:
            return doc
    raise UsageError(f"document {key!r} changed while it was being prepared; run again")


def _publish(tmp: Path, out_dir: Path, overwrite: bool) -> None:
    """Rename the finished temp dir into place; when another writer got there first, keep theirs."""
    if overwrite and out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old-{uuid.uuid4().hex[:8]}")
        os.rename(out_dir, old)
        shutil.rmtree(old, ignore_errors=True)
    try:
        os.rename(tmp, out_dir)
    except OSError:
        if not is_prepared_dir(out_dir):
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # lost the race: the winner's shards are identical
    with contextlib.suppress(OSError):  # make the rename durable
        fd = os.open(out_dir.parent, os.O_RDONLY)
        os.fsync(fd), os.close(fd)


def prepare(
    inputs: Sequence[str | os.PathLike] | str | os.PathLike,
    out_dir: str | os.PathLike,
    tokenizer: Tokenizer | str = "byte",
    *,
    val_fraction: float = 0.01,
    val_tokens: int | None = None,
    patterns: Sequence[str] | None = None,
    text_field: str = "text",
    name: str | None = None,
    overwrite: bool = False,
    exist_ok: bool = False,
    train_exclude: Sequence[str] = (),
    on_read: OnRead = None,
) -> PreparedSource:
    """Tokenize `inputs` into `out_dir` (train.bin, val.bin, index.json); return it opened.

    `train_exclude`: documents whose key matches one of these fnmatch patterns stay out of the train
    split (the val split is unchanged; module docstring). `on_read(n)`: told of every n bytes of input
    files read (a progress bar).

    exist_ok=True returns an already prepared `out_dir` as it is (made with the same tokenizer;
    the caller vouches for the inputs): for processes that race to prepare the same dir.
    Raises UsageError for a missing or unreadable input (a corrupt file, a missing text column or
    field, an unknown compression: before anything is tokenized when its header shows it), an empty
    corpus, a bad val_fraction, or an existing non-empty `out_dir` (unless overwrite=True, which
    replaces it, or exist_ok as above); nothing is left in `out_dir`'s parent then.
    """
    t0 = time.perf_counter()
    tok = load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
    if isinstance(inputs, str | os.PathLike):
        inputs = [inputs]
    if not 0.0 <= val_fraction < 1.0:
        raise UsageError(f"val_fraction={val_fraction} must be in [0, 1)")
    if val_tokens is not None and val_tokens < 0:
        raise UsageError(f"val_tokens={val_tokens} must be >= 0")
    out_dir = Path(out_dir).expanduser()
    check_inputs(inputs, patterns, text_field)
    if exist_ok and not overwrite and is_prepared_dir(out_dir):
        return _open_checked(out_dir, tok, name)
    if out_dir.exists() and not overwrite and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise UsageError(f"{out_dir} already exists; choose another output dir or pass --overwrite")
    dtype = token_dtype(tok.vocab_size)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        stream = tmp / "tokens.stream"
        docs = tokenize_to_file(
            iter_documents(inputs, patterns=patterns, text_field=text_field, on_read=on_read),
            tok,
            dtype,
            stream,
            lambda key: any(fnmatch.fnmatchcase(key, p) for p in train_exclude),
        )
        if not len(docs):
            raise UsageError(f"no documents found in {[str(i) for i in inputs]} (patterns {patterns or 'default'})")
        split = _choose_split(docs, val_fraction, val_tokens, tok, dtype, (inputs, patterns, text_field))
        if not split.train.any():
            raise UsageError(f"train_exclude {list(train_exclude)} leaves no document in the train split")
        h = hashlib.sha256(tok.fingerprint.encode())
        splits = _write_splits(stream, tmp, docs, split, dtype, h)
        stream.unlink()
        index = _index(out_dir, name, dtype, tok, len(docs) + (split.extra is not None), splits, h, t0)
        index |= _settings(val_fraction, val_tokens, inputs, patterns, text_field)
        index["train_exclude"] = {"patterns": list(train_exclude), "num_documents": split.num_excluded}
        _write_index(tmp / "index.json", index)
        _publish(tmp, out_dir, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _open_checked(out_dir, tok, name)


@dataclass(slots=True)
class _Split:
    """Which streamed documents go where: boolean masks over them, and the cut of one document."""

    train: np.ndarray  # bool [n]: written to train.bin (not val, not excluded)
    val: np.ndarray  # bool [n]: written to val.bin
    num_excluded: int  # documents a train_exclude pattern kept out of train
    replace: dict[int, np.ndarray] = field(default_factory=dict)  # the cut document's train tokens
    extra: np.ndarray | None = None  # the cut document's val tokens (with end-of-text), val.bin's last
    bytes_delta: dict[str, int] = field(default_factory=lambda: {"train": 0, "val": 0})  # the cut's bytes moved


def _choose_split(
    docs: StreamedDocs, val_fraction: float, val_tokens: int | None, tok: Tokenizer, dtype, reading: tuple
) -> _Split:
    """Whole documents by the val rule; else the tail of the lowest-hash document (module docstring)."""
    tokens = np.frombuffer(docs.tokens, dtype=np.int64)
    excluded = np.frombuffer(bytes(docs.excluded), dtype=np.bool_)
    val = np.zeros(len(docs), dtype=np.bool_)
    val[list(_select_val(np.frombuffer(docs.hashes, dtype=np.float64), tokens, val_fraction, val_tokens))] = True
    split = _Split(train=~val & ~excluded, val=val, num_excluded=int((excluded & ~val).sum()))
    target = val_tokens if val_tokens is not None else val_fraction * int(tokens.sum())
    if val.any() or target <= 0:
        return split
    i = int(np.argmin(np.frombuffer(docs.hashes, dtype=np.float64)))  # the lowest hash, earliest first
    doc = docs.first if docs.first is not None else _reread(*reading, key=docs.lowest_key)
    if len(doc.data) <= 1:
        return split  # too short to cut: no val split
    train_part, val_part = _split_document(doc, min(0.5, target / int(tokens[i])))
    train_tokens, val_tokens_ = tokenize([train_part, val_part], tok, dtype)
    split.extra = with_eot([val_tokens_], tok.eot_id, dtype)
    split.bytes_delta["val"] = len(val_part.data)
    if split.train[i]:
        split.replace[i] = with_eot([train_tokens], tok.eot_id, dtype)
        split.bytes_delta["train"] = len(train_part.data) - len(doc.data)
    return split


def _write_splits(stream: Path, tmp: Path, docs: StreamedDocs, split: _Split, dtype, h) -> dict:
    """train.bin then val.bin copied from the token stream (their bytes fed to `h` in that order);
    index.json's per-split counts."""
    offsets = docs.offsets()
    nbytes = np.frombuffer(docs.nbytes, dtype=np.int64)
    train_tokens = copy_documents(stream, tmp / "train.bin", offsets, split.train, dtype, h, split.replace)
    val_tokens = copy_documents(stream, tmp / "val.bin", offsets, split.val, dtype, h, extra=split.extra)
    return {
        "train": {
            "num_tokens": train_tokens,
            "num_bytes": int(nbytes[split.train].sum()) + split.bytes_delta["train"],
            "num_documents": int(split.train.sum()),
        },
        "val": {
            "num_tokens": val_tokens,
            "num_bytes": int(nbytes[split.val].sum()) + split.bytes_delta["val"],
            "num_documents": int(split.val.sum()) + (split.extra is not None),
        },
    }


def _settings(val_fraction, val_tokens, inputs, patterns, text_field) -> dict:
    """index.json's record of how the inputs were read and split."""
    return {
        "val_rule": {"val_fraction": val_fraction, "val_tokens": val_tokens, "by": "sha256(document key)"},
        "sources": [str(i) if str(i) == "default" else str(Path(i).expanduser().resolve()) for i in inputs],
        "patterns": list(patterns) if patterns else None,
        "text_field": text_field,
    }


def _index(out_dir, name, dtype, tok: Tokenizer, num_documents: int, splits, h, t0) -> dict:
    """index.json's content (beside _settings)."""
    return {
        "format": FORMAT,
        "name": name or out_dir.name,
        "dtype": dtype.name,
        "tokenizer": tok.spec,
        "tokenizer_fingerprint": tok.fingerprint,
        "vocab_size": tok.vocab_size,
        "eot_id": tok.eot_id,
        "num_documents": num_documents,
        "num_tokens": {s: splits[s]["num_tokens"] for s in splits},
        "num_bytes": {s: splits[s]["num_bytes"] for s in splits},
        "splits": splits,
        "content_hash": h.hexdigest(),
        "prepare_seconds": round(time.perf_counter() - t0, 3),
    }


def _open_checked(path: Path, tok: Tokenizer, name: str | None) -> PreparedSource:
    src = PreparedSource(path, name=name)
    if src.tokenizer_fingerprint != tok.fingerprint:
        raise UsageError(
            f"{path} was prepared with tokenizer {src.tokenizer_spec!r}, not {tok.spec!r}; "
            "re-prepare it with this tokenizer or point at the raw text"
        )
    return src


def _write_index(path: Path, index: dict) -> None:
    with open(path, "w") as fh:
        json.dump(index, fh, indent=2)
        fh.flush()
        os.fsync(fh.fileno())


@contextlib.contextmanager
def _locked(lock_path: Path):
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def cache_key(
    source: str | os.PathLike,
    tokenizer: Tokenizer,
    *,
    val_fraction: float = 0.01,
    patterns: Sequence[str] | None = None,
    text_field: str = "text",
    name: str | None = None,
    train_exclude: Sequence[str] = (),
) -> str:
    """`<name>-<16 hex>`: the hash covers the tokenizer vocabulary, the input files' paths, sizes and
    mtimes, the split settings and a train filter, so any change gives a fresh cache entry."""
    if name is None:
        name = "stdlib" if str(source) == "default" else Path(source).name.split(".")[0] or "data"
    fields = [FORMAT, _VAL_RULE, tokenizer.fingerprint, inputs_fingerprint([source], patterns, text_field)]
    split = [val_fraction, {"train_exclude": list(train_exclude)}] if train_exclude else [val_fraction]
    h = hashlib.sha256(json.dumps([*fields, *split]).encode())
    return f"{name}-{h.hexdigest()[:16]}"


def ensure_prepared(
    source: str | os.PathLike,
    tokenizer: Tokenizer | str = "byte",
    cache_dir: str | os.PathLike | None = None,
    *,
    val_fraction: float = 0.01,
    patterns: Sequence[str] | None = None,
    text_field: str = "text",
    name: str | None = None,
    train_exclude: Sequence[str] = (),
) -> PreparedSource:
    """Open `source` as shards: a prepared dir as is, or raw inputs / "default" prepared into the cache.

    A prepared dir must have been made with the same tokenizer (UsageError otherwise), and takes no
    `train_exclude` (its split is fixed: prepare it from the raw text instead).
    """
    tok = load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
    if str(source) != "default" and is_prepared_dir(source):
        if train_exclude:
            raise UsageError(f"{source} is prepared shards; train_exclude filters raw text: point at the raw text")
        return _open_checked(Path(source).expanduser(), tok, name)
    root = Path(cache_dir).expanduser() if cache_dir is not None else data_cache_dir()
    key = cache_key(
        source, tok, val_fraction=val_fraction, patterns=patterns, text_field=text_field, train_exclude=train_exclude
    )
    out_dir = root / key
    if not is_prepared_dir(out_dir):
        with _locked(root / f".{key}.lock"):
            if not is_prepared_dir(out_dir):  # another process may have finished while we waited
                prepare(
                    [source],
                    out_dir,
                    tok,
                    val_fraction=val_fraction,
                    patterns=patterns,
                    text_field=text_field,
                    name=key,
                    exist_ok=True,  # where flock is not honoured (some network filesystems)
                    train_exclude=train_exclude,
                )
    return PreparedSource(out_dir, name=name)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        src = ensure_prepared("default", "byte", cache_dir=d)
        seconds = time.perf_counter() - t0
        ix = src.index
        print(src)
        print(f"documents {ix['num_documents']}  tokens {ix['num_tokens']}  bytes {ix['num_bytes']}")
        print(f"prepared in {seconds:.2f} s (index says {ix['prepare_seconds']} s)")
