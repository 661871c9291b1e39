"""One input file's documents, by its format: text, JSONL (plain, gzip or zstd), Parquet.

    fmt = file_format(path)                        # TEXT | JSONL | PARQUET, from the name
    check_file(path, text_field="text")            # one-line UsageError now for what would fail later
    for doc in read_file(path, "notes/a.md", "text", on_read=bar.update): ...

By the file's name:
  - `*.parquet`: one document per row of the string column `text_field`, decoded a record batch at
    a time (a row group is never loaded whole), keys `<file>:<row>` (0-based row index);
  - `*.jsonl`, and compressed `*.jsonl.gz`, `*.json.gz`, `*.jsonl.zst`, `*.json.zst`: one document
    per non-blank line, from its string field `text_field`, decompressed as a stream (concatenated
    gzip members and zstd frames too, as Dolma ships them), keys `<file>:<line>`;
  - anything else: the whole file is one document.
Empty texts (and null Parquet values) are skipped. A name that ends in another compression suffix
(`.bz2`, `.xz`, `.lz4`, `.zip`, ...), or a `.gz`/`.zst` that is not JSONL, is refused: its bytes would
otherwise be read as text. `check_file` opens what a reader would trip on first (a Parquet footer and
its column, a compressed file's magic bytes, the first JSONL record's field), so that `prepare`
refuses bad input with one line naming the file and the fix before it tokenizes anything; damage
further inside a file (a truncated gzip stream, a corrupt Parquet page) is the same one-line error
when the reader reaches it, and `prepare` still writes nothing then (its output is published whole).

`on_read(n)` is called with the number of bytes of the file (as stored, compressed) read since the
last call; over a whole file the calls add up to its size (the progress bar of `scalelab data prepare`).
Nothing here executes what a file brings: JSON is parsed, Parquet is decoded by pyarrow.
"""

from __future__ import annotations

import gzip
import io
import json
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scalelab.errors import UsageError

TEXT, JSONL, PARQUET = "text", "jsonl", "parquet"
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd"}  # suffix -> codec, for JSONL only
_MAGIC = {"gzip": b"\x1f\x8b", "zstd": b"\x28\xb5\x2f\xfd"}
_JSONL_INNER = (".jsonl", ".json")  # before .gz/.zst: Dolma names its JSONL shards *.json.gz
_OTHER_COMPRESSION = {".bz2", ".xz", ".lzma", ".lz4", ".br", ".zip", ".7z", ".tar", ".tgz", ".zstd", ".snappy", ".z"}
_FIX_COMPRESSION = "recompress it as .jsonl.zst or .jsonl.gz (or decompress it)"
_BATCH_ROWS = 1024  # Parquet rows decoded at a time
_REPORT_BYTES = 1 << 20  # on_read granularity for line-by-line readers
OnRead = Callable[[int], None] | None


@dataclass(frozen=True, slots=True)
class Document:
    key: str  # stable identity (relative path, or file:line for JSONL, file:row for Parquet); hashed for the val split
    data: bytes  # UTF-8 text


def file_format(path: Path) -> tuple[str, str | None]:
    """(format, compression codec or None) from the file name; UsageError for a compression not read."""
    suffixes = [s.lower() for s in path.suffixes[-2:]]
    last = suffixes[-1] if suffixes else ""
    if last == ".parquet":
        return PARQUET, None
    if last == ".jsonl":
        return JSONL, None
    if last in COMPRESSIONS:
        if len(suffixes) == 2 and suffixes[0] in _JSONL_INNER:
            return JSONL, COMPRESSIONS[last]
        raise UsageError(
            f"{path}: only JSONL is read compressed ({last} after {suffixes[0] if len(suffixes) == 2 else 'nothing'}); "
            "name it *.jsonl.gz / *.jsonl.zst if it is JSONL, else decompress it"
        )
    if last in _OTHER_COMPRESSION:
        raise UsageError(f"{path}: unknown compression {last} (gzip .gz and zstd .zst are read); {_FIX_COMPRESSION}")
    return TEXT, None


def _utf8(raw: bytes) -> bytes:
    try:
        raw.decode("utf-8")
        return raw
    except UnicodeDecodeError:
        return raw.decode("utf-8", errors="replace").encode("utf-8")


# --- JSONL --------------------------------------------------------------------------------------


def _open_binary(path: Path, codec: str | None):
    """(buffered stream of the file's decompressed bytes, the raw file under it, the errors a damaged
    stream raises while it is read)."""
    raw = open(path, "rb")  # noqa: SIM115 - closed by the caller
    if codec is None:
        return raw, raw, (OSError,)
    if codec == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb"), raw, (EOFError, OSError, zlib.error)
    # imported where a .zst file is opened: this module is on the import path of every run config
    import zstandard

    reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=False)
    return io.BufferedReader(reader, buffer_size=1 << 20), raw, (EOFError, OSError, zstandard.ZstdError)


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())  # pyarrow's messages span lines


def _corrupt(path: Path, what: str, where: str, e: Exception) -> UsageError:
    return UsageError(f"{path}: corrupt {what} {where} ({_one_line(e)}); re-download the file or recompress it")


def iter_jsonl(path: Path, on_read: OnRead = None) -> Iterator[tuple[int, object]]:
    """(line number, parsed record) for every non-blank line of a plain, .gz or .zst JSONL file;
    bad JSON or a damaged stream is a one-line UsageError naming the file and line."""
    path = Path(path)
    _, codec = file_format(path)
    stream, raw, errors = _open_binary(path, codec)
    reported, line_no = 0, 0
    try:
        with raw, stream:
            while True:
                try:
                    line = stream.readline()
                except errors as e:
                    raise _corrupt(path, f"{codec} data" if codec else "file", f"at line {line_no + 1}", e) from None
                if not line:
                    break
                line_no += 1
                if on_read is not None and raw.tell() - reported >= _REPORT_BYTES:
                    on_read(raw.tell() - reported)
                    reported = raw.tell()
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError) as e:
                    raise UsageError(f"{path}:{line_no}: not valid JSON ({getattr(e, 'msg', e)})") from None
                yield line_no, record
    finally:
        if on_read is not None:
            on_read(path.stat().st_size - reported)


def _text_of(path: Path, line_no: int, record: object, text_field: str) -> str:
    text = record.get(text_field) if isinstance(record, dict) else None
    if not isinstance(text, str):
        fields = f" (it has {', '.join(map(repr, list(record)[:6]))})" if isinstance(record, dict) else ""
        raise UsageError(
            f"{path}:{line_no}: no string field {text_field!r}{fields}; pass the right field name (--text-field)"
        )
    return text


def _jsonl_documents(path: Path, text_field: str, on_read: OnRead) -> Iterator[Document]:
    for line_no, record in iter_jsonl(path, on_read):
        text = _text_of(path, line_no, record, text_field)
        if text:
            yield Document(f"{path.name}:{line_no}", text.encode("utf-8", errors="replace"))


def _check_jsonl(path: Path, codec: str | None, text_field: str) -> None:
    if codec is not None:
        with open(path, "rb") as fh:
            head = fh.read(4)
        if not head.startswith(_MAGIC[codec]):
            raise UsageError(f"{path}: not {codec} data (it starts with {head!r}); {_FIX_COMPRESSION}")
    for line_no, record in iter_jsonl(path):  # the first record only: its field is what fails first
        _text_of(path, line_no, record, text_field)
        break


# --- Parquet ------------------------------------------------------------------------------------


def _open_parquet(path: Path, text_field: str):
    """A pyarrow ParquetFile whose `text_field` is a string column; one-line UsageError otherwise."""
    # imported here: pyarrow.parquet costs ~0.7 s, and this module is on every run config's import path
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        # buffer_size: column chunks are streamed in 1 MiB reads, not loaded whole with their row group
        pf = pq.ParquetFile(path, buffer_size=1 << 20, pre_buffer=False)
    except (pa.ArrowException, OSError) as e:
        raise UsageError(f"{path}: not a readable Parquet file ({_one_line(e)}); re-download it") from None
    names = pf.schema_arrow.names
    if text_field not in names:
        shown = ", ".join(map(repr, names[:8])) + (", ..." if len(names) > 8 else "")
        raise UsageError(f"{path}: no column {text_field!r} (columns: {shown}); pass the text column (--text-field)")
    kind = pf.schema_arrow.field(text_field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
        raise UsageError(f"{path}: column {text_field!r} is {kind}, not text; pass the text column (--text-field)")
    return pf


def _string_values(column) -> Iterator[bytes | None]:
    """Each value of an Arrow string array as UTF-8 bytes (None for null), sliced from its buffers."""
    import pyarrow as pa

    if not pa.types.is_large_string(column.type):
        column = column.cast(pa.large_string())  # string and string_view: one offset layout below
    _, offsets_buf, data_buf = column.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64)[column.offset : column.offset + len(column) + 1]
    data = memoryview(data_buf) if data_buf is not None else memoryview(b"")
    valid = column.is_valid().to_numpy(zero_copy_only=False) if column.null_count else None
    for i in range(len(column)):
        yield None if valid is not None and not valid[i] else bytes(data[offsets[i] : offsets[i + 1]])


def _parquet_documents(path: Path, text_field: str, on_read: OnRead) -> Iterator[Document]:
    import pyarrow as pa

    pf = _open_parquet(path, text_field)
    meta = pf.metadata
    row, reported = 0, 0
    try:
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            stored = sum(group.column(c).total_compressed_size for c in range(group.num_columns))
            rows_done, group_reported = 0, 0
            try:
                batches = pf.iter_batches(batch_size=_BATCH_ROWS, row_groups=[g], columns=[text_field])
                for batch in batches:
                    for data in _string_values(batch.column(0)):
                        if data:
                            yield Document(f"{path.name}:{row}", data)
                        row += 1
                    rows_done += batch.num_rows
                    if on_read is not None:  # the row group's stored bytes, in proportion to its rows read
                        now = stored * rows_done // max(group.num_rows, 1)
                        on_read(now - group_reported)
                        reported, group_reported = reported + now - group_reported, now
            except (pa.ArrowException, OSError) as e:
                raise _corrupt(path, "Parquet data", f"in row group {g}", e) from None
    finally:
        if on_read is not None:
            on_read(path.stat().st_size - reported)


# --- any file -----------------------------------------------------------------------------------


def check_file(path: Path, text_field: str) -> None:
    """Open what reading `path` would trip on first; one-line UsageError naming the file and the fix."""
    fmt, codec = file_format(path)
    if fmt == PARQUET:
        _open_parquet(path, text_field)
    elif fmt == JSONL:
        _check_jsonl(path, codec, text_field)


def read_file(path: Path, key: str, text_field: str, on_read: OnRead = None) -> Iterator[Document]:
    """The documents of one file (module docstring); `key` names a whole-file document."""
    fmt, _ = file_format(path)
    if fmt == PARQUET:
        yield from _parquet_documents(path, text_field, on_read)
    elif fmt == JSONL:
        yield from _jsonl_documents(path, text_field, on_read)
    else:
        data = _utf8(path.read_bytes())
        if on_read is not None:
            on_read(path.stat().st_size)
        if data:
            yield Document(key, data)
