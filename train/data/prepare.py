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

Memory: token arrays are held until written (~2 bytes per token for the byte tokenizer), fine
for corpora up to a few GB. The byte tokenizer takes numpy views of the raw bytes; a BPE tokenizer
encodes through HF's encode_batch. Preparation times: docs/benchmarks.md ("Data preparation").
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
from pathlib import Path

import numpy as np

from scalelab.errors import UsageError
from scalelab.train.data.corpus import Document, inputs_fingerprint, iter_documents, resolve_inputs
from scalelab.train.data.shards import FORMAT, PreparedSource, is_prepared_dir
from scalelab.train.data.tokenizer import Tokenizer, load_tokenizer

_VAL_RULE = "val-rule-2"  # bump when the val split rule changes, so caches are rebuilt
_CHUNK_BYTES = 4 << 20  # tokenize this much text per encode_documents call (bounds peak memory)


def data_cache_dir() -> Path:
    """Where ensure_prepared keeps shards: $SCALELAB_CACHE/data, default ~/.cache/scalelab/data."""
    return Path(os.environ.get("SCALELAB_CACHE", "~/.cache/scalelab")).expanduser() / "data"


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def _unit_hash(key: str) -> float:
    """A document key's position in [0, 1): the first 8 bytes of its sha256."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2.0**64


def select_val_documents(
    keys: Sequence[str], num_tokens: Sequence[int], val_fraction: float, val_tokens: int | None
) -> set[int]:
    """Indices of held-out documents: lowest key hashes first until the val target is reached.

    The target is `val_tokens`, else `val_fraction` of all tokens. A document that would carry the
    split past twice the target is passed over (one huge file must not become the whole val
    split), and at least one document always stays in train. May return an empty set; `prepare`
    then cuts the tail off one document instead.
    """
    total = int(sum(num_tokens))
    target = val_tokens if val_tokens is not None else val_fraction * total
    if target <= 0 or len(keys) < 2:
        return set()
    order = sorted(range(len(keys)), key=lambda i: (_unit_hash(keys[i]), i))
    chosen: set[int] = set()
    held = 0
    for i in order:
        if held >= target or len(chosen) == len(keys) - 1:
            break
        if held + int(num_tokens[i]) > 2 * target:
            continue
        chosen.add(i)
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


def _reread(inputs, key: str, patterns, text_field: str) -> Document:
    """Read one document again by key (only for the rare cut-a-document fallback)."""
    for doc in iter_documents(inputs, patterns=patterns, text_field=text_field):
        if doc.key == key:
            return doc
    raise UsageError(f"document {key!r} changed while it was being prepared; run again")


def _tokenize(docs: list[Document], tokenizer: Tokenizer, dtype: np.dtype) -> list[np.ndarray]:
    arrays = tokenizer.encode_documents([d.data for d in docs])
    out = []
    for a in arrays:
        if a.dtype != np.uint8 and a.size and int(a.max()) >= tokenizer.vocab_size:
            raise ValueError(f"tokenizer {tokenizer.spec} produced id {int(a.max())} >= vocab_size")
        out.append(a if a.dtype == np.uint8 else a.astype(dtype))  # uint8 views are widened on write
    return out


def _write_split(path: Path, arrays: list[np.ndarray], eot: np.ndarray, dtype: np.dtype, h) -> int:
    """Write documents + end-of-text into `path`, feeding the bytes to hash `h`; returns tokens."""
    num_tokens = 0
    with open(path, "wb") as fh:
        buf: list[np.ndarray] = []
        buffered = 0
        for a in arrays:
            buf += [a, eot]
            buffered += a.size + 1
            if buffered >= _CHUNK_BYTES:
                block = np.concatenate(buf).astype(dtype, copy=False).tobytes()
                fh.write(block), h.update(block)
                num_tokens += buffered
                buf, buffered = [], 0
        if buf:
            block = np.concatenate(buf).astype(dtype, copy=False).tobytes()
            fh.write(block), h.update(block)
            num_tokens += buffered
        fh.flush()
        os.fsync(fh.fileno())
    return num_tokens


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
) -> PreparedSource:
    """Tokenize `inputs` into `out_dir` (train.bin, val.bin, index.json); return it opened.

    `train_exclude`: documents whose key matches one of these fnmatch patterns stay out of the train
    split (the val split is unchanged; module docstring).

    exist_ok=True returns an already prepared `out_dir` as it is (made with the same tokenizer;
    the caller vouches for the inputs): for processes that race to prepare the same dir.
    Raises UsageError for a missing input, an empty corpus, a bad val_fraction, or an existing
    non-empty `out_dir` (unless overwrite=True, which replaces it, or exist_ok as above).
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
    resolve_inputs(inputs, patterns)
    if exist_ok and not overwrite and is_prepared_dir(out_dir):
        return _open_checked(out_dir, tok, name)
    if out_dir.exists() and not overwrite and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise UsageError(f"{out_dir} already exists; choose another output dir or pass --overwrite")
    dtype = token_dtype(tok.vocab_size)

    keys, nbytes, arrays, first = _read_and_tokenize(inputs, patterns, text_field, tok, dtype)
    doc_tokens = [a.size + 1 for a in arrays]
    val_ids = select_val_documents(keys, doc_tokens, val_fraction, val_tokens)
    target = val_tokens if val_tokens is not None else val_fraction * sum(doc_tokens)
    if not val_ids and target > 0:
        val_ids = _cut_val_from_one_document(
            keys, nbytes, arrays, doc_tokens, target, first, tok, dtype, inputs, patterns, text_field
        )
    excluded = {
        i for i, k in enumerate(keys) if i not in val_ids and any(fnmatch.fnmatchcase(k, p) for p in train_exclude)
    }
    if excluded and len(excluded) + len(val_ids) == len(keys):
        raise UsageError(f"train_exclude {list(train_exclude)} leaves no document in the train split")

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        eot = np.array([tok.eot_id], dtype=dtype)
        h = hashlib.sha256(tok.fingerprint.encode())
        splits = {}
        for split, members in (("train", False), ("val", True)):
            idx = [i for i in range(len(keys)) if (i in val_ids) == members and i not in excluded]
            num_tokens = _write_split(tmp / f"{split}.bin", [arrays[i] for i in idx], eot, dtype, h)
            splits[split] = {
                "num_tokens": num_tokens,
                "num_bytes": int(sum(nbytes[i] for i in idx)),
                "num_documents": len(idx),
            }
        index = _index(
            out_dir, name, dtype, tok, keys, splits, val_fraction, val_tokens, inputs, patterns, text_field, h, t0
        )
        index["train_exclude"] = {"patterns": list(train_exclude), "num_documents": len(excluded)}
        _write_index(tmp / "index.json", index)
        _publish(tmp, out_dir, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _open_checked(out_dir, tok, name)


def _read_and_tokenize(
    inputs, patterns, text_field: str, tok: Tokenizer, dtype
) -> tuple[list, list, list, Document | None]:
    """Every document's key, byte count and tokens, tokenized in chunks of _CHUNK_BYTES; and the first
    document when it is the only one (kept for the validation cut)."""
    keys: list[str] = []
    nbytes: list[int] = []
    arrays: list[np.ndarray] = []
    first: Document | None = None
    pending: list[Document] = []
    pending_bytes = 0

    def flush() -> None:
        nonlocal pending, pending_bytes
        arrays.extend(_tokenize(pending, tok, dtype))
        pending, pending_bytes = [], 0

    for doc in iter_documents(inputs, patterns=patterns, text_field=text_field):
        first = doc if not keys else None  # kept only while it may be the lone document
        keys.append(doc.key)
        nbytes.append(len(doc.data))
        pending.append(doc)
        pending_bytes += len(doc.data)
        if pending_bytes >= _CHUNK_BYTES:
            flush()
    flush()
    if not keys:
        raise UsageError(f"no documents found in {[str(i) for i in inputs]} (patterns {patterns or 'default'})")
    return keys, nbytes, arrays, first


def _cut_val_from_one_document(
    keys, nbytes, arrays, doc_tokens, target: float, first, tok: Tokenizer, dtype, inputs, patterns, text_field: str
) -> set[int]:
    """No whole document fits the validation target (a lone document, or only huge ones): cut the
    tail off the document with the lowest key hash instead. Updates the lists in place; returns the
    validation ids (none when that document is too short to cut)."""
    i = min(range(len(keys)), key=lambda j: (_unit_hash(keys[j]), j))
    doc = first if first is not None else _reread(inputs, keys[i], patterns, text_field)
    if len(doc.data) > 1:
        train_part, val_part = _split_document(doc, min(0.5, target / doc_tokens[i]))
        keys[i], nbytes[i] = train_part.key, len(train_part.data)
        keys.append(val_part.key)
        nbytes.append(len(val_part.data))
        arrays[i], val_array = _tokenize([train_part, val_part], tok, dtype)
        arrays.append(val_array)
        return {len(keys) - 1}
    return set()


def _index(
    out_dir, name, dtype, tok: Tokenizer, keys, splits, val_fraction, val_tokens, inputs, patterns, text_field, h, t0
) -> dict:
    """index.json's content."""
    return {
        "format": FORMAT,
        "name": name or out_dir.name,
        "dtype": dtype.name,
        "tokenizer": tok.spec,
        "tokenizer_fingerprint": tok.fingerprint,
        "vocab_size": tok.vocab_size,
        "eot_id": tok.eot_id,
        "num_documents": len(keys),
        "num_tokens": {s: splits[s]["num_tokens"] for s in splits},
        "num_bytes": {s: splits[s]["num_bytes"] for s in splits},
        "splits": splits,
        "val_rule": {
            "val_fraction": val_fraction,
            "val_tokens": val_tokens,
            "by": "sha256(document key)",
        },
        "sources": [str(i) if str(i) == "default" else str(Path(i).expanduser().resolve()) for i in inputs],
        "patterns": list(patterns) if patterns else None,
        "text_field": text_field,
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
