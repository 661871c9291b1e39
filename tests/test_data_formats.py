"""Corpora as pretraining teams ship them: Parquet (a text column, read by record batch) and gzip / zstd
JSONL (concatenated members and frames), their documents, the val split, progress, bad input as one line
before anything is written, and memory that does not grow with the input."""

import gzip
import json
import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from scalelab.cli.main import main
from scalelab.errors import UsageError
from scalelab.train.data import token_stream
from scalelab.train.data.corpus import check_inputs, iter_documents
from scalelab.train.data.formats import _string_values, file_format
from scalelab.train.data.prepare import prepare

TEXTS = [f"document {i}: " + "naïve wörds " * (i % 9) + "\n" for i in range(300)]
ROWS = [*TEXTS[:150], "", None, *TEXTS[150:]]  # an empty text and a null are skipped


def _jsonl(rows) -> bytes:
    return "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(rows) if t is not None).encode()


def _write_all_formats(root):
    """The same documents as Parquet (row groups of 37 rows), JSONL, and four compressed JSONL names;
    the compressed ones are two gzip members / zstd frames back to back, as Dolma's shards are."""
    root.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": list(range(len(ROWS))), "text": ROWS}), root / "c.parquet", row_group_size=37)
    data = _jsonl(ROWS)
    cut = data.index(b"\n", len(data) // 2) + 1
    (root / "c.jsonl").write_bytes(data)
    zstd = zstandard.ZstdCompressor()
    for name, pack in ((".jsonl.gz", gzip.compress), (".json.gz", gzip.compress), (".jsonl.zst", zstd.compress)):
        (root / f"c{name}").write_bytes(pack(data[:cut]) + pack(data[cut:]))
    (root / "c.json.zst").write_bytes(zstd.compress(data))
    return ["c.parquet", "c.jsonl", "c.jsonl.gz", "c.json.gz", "c.jsonl.zst", "c.json.zst"]


def _docs(arr, eot=256):
    cuts = np.flatnonzero(np.asarray(arr) == eot)
    starts = np.r_[0, cuts[:-1] + 1]
    return [bytes(np.asarray(arr[s:e]).astype(np.uint8)).decode() for s, e in zip(starts, cuts)]


def test_every_format_gives_the_same_documents_and_the_same_shards(tmp_path):
    names = _write_all_formats(tmp_path / "in")
    hashes = set()
    for name in names:
        src = prepare([tmp_path / "in" / name], tmp_path / f"out-{name}", "byte", val_fraction=0.0)
        assert _docs(src.train) == TEXTS, name
        assert src.num_bytes("train") == sum(len(t.encode()) for t in TEXTS)
        hashes.add(src.index["content_hash"])
    assert len(hashes) == 1  # token for token the same stream
    keys = [d.key for d in iter_documents([tmp_path / "in" / "c.parquet"])]
    assert keys[:2] == ["c.parquet:0", "c.parquet:1"] and keys[150] == "c.parquet:152"  # row index, 2 skipped
    # a folder picks every format up by default
    assert len(list(iter_documents([tmp_path / "in"]))) == len(names) * len(TEXTS)


def test_the_val_split_holds_whole_documents_of_parquet_and_zstd(tmp_path):
    _write_all_formats(tmp_path / "in")
    for name in ("c.parquet", "c.jsonl.zst"):
        src = prepare([tmp_path / "in" / name], tmp_path / f"o-{name}", "byte", val_fraction=0.1)
        train, val = _docs(src.train), _docs(src.val)
        assert sorted(train + val) == sorted(TEXTS) and len(val) > 5  # documents are never cut
        total = src.num_tokens("train") + src.num_tokens("val")
        assert 0.1 * total <= src.num_tokens("val") < 0.1 * total + 200
        again = prepare([tmp_path / "in" / name], tmp_path / f"again-{name}", "byte", val_fraction=0.1)
        assert np.array_equal(again.val, src.val)  # by key hash: the same split every time


def test_parquet_text_column_types_and_sliced_arrays(tmp_path):
    for kind in (pa.string(), pa.large_string(), pa.string_view()):
        table = pa.table({"body": pa.array(["a", None, "", "béta"], type=kind)})
        pq.write_table(table, tmp_path / "t.parquet")
        src = prepare([tmp_path / "t.parquet"], tmp_path / f"o-{kind}", "byte", text_field="body", val_fraction=0)
        assert _docs(src.train) == ["a", "béta"], kind
    sliced = pa.array(["x", "yy", None, "zzz", "w"]).slice(1, 3)  # an offset into shared buffers
    assert list(_string_values(sliced)) == [b"yy", None, b"zzz"]


def test_on_read_adds_up_to_each_files_size(tmp_path):
    names = _write_all_formats(tmp_path / "in")
    for name in names:
        path = tmp_path / "in" / name
        seen = []
        prepare([path], tmp_path / f"o-{name}", "byte", on_read=seen.append)
        assert sum(seen) == path.stat().st_size and min(seen) >= 0, name


def _bad_inputs(root):
    """name -> (what to pass, a phrase of the one-line error)."""
    _write_all_formats(root)
    (root / "cut.parquet").write_bytes((root / "c.parquet").read_bytes()[:500])
    full = (root / "c.parquet").read_bytes()
    at = pq.ParquetFile(root / "c.parquet").metadata.row_group(1).column(1).data_page_offset + 2
    (root / "page.parquet").write_bytes(full[:at] + b"\xff" * 8 + full[at + 8 :])  # a page header, not the footer
    (root / "cut.jsonl.gz").write_bytes((root / "c.jsonl.gz").read_bytes()[:-300])
    z = (root / "c.json.zst").read_bytes()
    (root / "bad.jsonl.zst").write_bytes(z[: len(z) // 2] + b"\x00" * 32 + z[len(z) // 2 + 32 :])
    (root / "plain.jsonl.gz").write_bytes(_jsonl(ROWS))
    (root / "c.jsonl.bz2").write_bytes(b"BZh9")
    (root / "notes.txt.gz").write_bytes(gzip.compress(b"text"))
    return {
        "no column": (["c.parquet", "--text-field", "content"], "no column 'content' (columns: 'id', 'text')"),
        "not text": (["c.parquet", "--text-field", "id"], "column 'id' is int64, not text"),
        "cut footer": (["cut.parquet"], "not a readable Parquet file"),
        "bad page": (["page.parquet"], "page.parquet: corrupt Parquet data in row group 1"),
        "cut gzip": (["cut.jsonl.gz"], "cut.jsonl.gz: corrupt gzip data at line"),
        "bad zstd": (["bad.jsonl.zst"], "bad.jsonl.zst: corrupt zstd data at line"),
        "not gzip": (["plain.jsonl.gz"], "plain.jsonl.gz: not gzip data"),
        "bz2": (["c.jsonl.bz2"], "unknown compression .bz2"),
        "gz text": (["notes.txt.gz"], "only JSONL is read compressed"),
        "jsonl field": (["c.json.zst", "--text-field", "body"], "c.json.zst:1: no string field 'body' (it has 'id',"),
    }  # fmt: skip


def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, capsys):
    cases = _bad_inputs(tmp_path / "in")
    for case, (argv, phrase) in cases.items():
        files, rest = argv[:1], argv[1:]
        out = tmp_path / "out" / case.replace(" ", "-")
        capsys.readouterr()
        assert main(["data", "prepare", *[str(tmp_path / "in" / f) for f in files], "--out", str(out), *rest]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("scalelab data: error:") and "\n" not in err, (case, err)
        assert phrase in err, (case, err)
        assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir()), case  # no shard, no temp dir


def test_header_damage_is_caught_before_reading(tmp_path):
    """check_inputs (what prepare runs first) refuses a bad file named after a good one, reading neither."""
    cases = _bad_inputs(tmp_path / "in")
    for case in ("no column", "not text", "cut footer", "not gzip", "bz2", "gz text", "jsonl field"):
        argv, phrase = cases[case]
        with pytest.raises(UsageError) as e:
            check_inputs([tmp_path / "in" / "c.jsonl.gz", tmp_path / "in" / argv[0]], text_field="text")
            check_inputs([tmp_path / "in" / argv[0]], text_field=argv[2])  # the cases that need their field
        assert phrase in str(e.value), case
    assert file_format(tmp_path / "shard.00001.json.gz") == ("jsonl", "gzip")


def test_progress_lines_not_a_bar_when_stderr_is_not_a_terminal(tmp_path, capsys):
    _write_all_formats(tmp_path / "in")
    assert main(["data", "prepare", str(tmp_path / "in" / "c.parquet"), "--out", str(tmp_path / "o")]) == 0
    captured = capsys.readouterr()
    assert "\r" not in captured.err and "tokens/s" in captured.out
    argv = ["data", "prepare", str(tmp_path / "in" / "c.jsonl.zst"), "--out", str(tmp_path / "o2"), "--progress", "on"]
    assert main(argv) == 0
    assert "100%" in capsys.readouterr().err  # the bar, asked for


def _peak_traced_bytes(path, out) -> int:
    tracemalloc.start()
    try:
        prepare([path], out, "byte", val_fraction=0.01)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_does_not_grow_with_the_input(tmp_path, monkeypatch):
    """numpy's and Python's allocations (tracemalloc sees both) peak alike for an input 4x larger: text
    is tokenized and written a chunk at a time (256 KB here) and copied into its split through a
    buffer of that size (holding every document's tokens took ~2 bytes per token)."""
    monkeypatch.setattr(token_stream, "_CHUNK_BYTES", 256 << 10)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    peaks = {}
    for n in (1500, 6000):  # ~1.5 MB and ~6 MB of ~1 KB documents
        path = tmp_path / f"c{n}.parquet"
        texts = [" ".join(words[(i * 7 + j) % 8] for j in range(i % 50, i % 50 + 160)) for i in range(n)]
        pq.write_table(pa.table({"text": texts}), path, row_group_size=500)
        peaks[n] = _peak_traced_bytes(path, tmp_path / f"o{n}")
    assert peaks[6000] < 1.3 * peaks[1500], peaks
