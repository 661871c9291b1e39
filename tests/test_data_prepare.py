"""Token shard preparation: inputs (text, folder, JSONL, stdlib), exact byte counts, the val split,
atomicity under a crash, concurrent preparers, and the cache."""

import json
import multiprocessing as mp
import os
import threading
import time

import numpy as np
import pytest
import torch

from scalelab.errors import UsageError
from scalelab.train.config import build_run_config
from scalelab.train.data import prepare as prep
from scalelab.train.data.bundle import build_data
from scalelab.train.data.corpus import default_corpus_files, iter_documents
from scalelab.train.data.prepare import (
    data_cache_dir,
    ensure_prepared,
    prepare,
    select_val_documents,
    token_dtype,
)
from scalelab.train.data.shards import PreparedSource
from scalelab.train.data.tokenizer import ByteTokenizer


def _folder(root):
    """A small mixed folder: 3 matching files, one ignored suffix, one hidden dir, one empty file."""
    (root / "pkg").mkdir(parents=True)
    (root / "a.py").write_text("import os\nprint('a')\n")
    (root / "pkg" / "b.md").write_text("# Título\nsome *markdown* ✓\n")
    (root / "pkg" / "c.txt").write_text("plain text\n" * 20)
    (root / "pkg" / "empty.txt").write_text("")
    (root / "data.bin").write_bytes(b"\x00\x01")
    (root / ".git").mkdir()
    (root / ".git" / "x.txt").write_text("hidden")
    return {"a.py", "pkg/b.md", "pkg/c.txt"}


def _split_docs(arr, eot):
    """Token stream -> list of documents (each followed by eot in the stream)."""
    assert arr.size == 0 or arr[-1] == eot
    cuts = np.flatnonzero(arr == eot)
    return [arr[s + 1 if i else 0 : e] for i, (s, e) in enumerate(zip(np.r_[-1, cuts[:-1]], cuts))]


def test_prepare_folder_exact_counts(tmp_path):
    expected = _folder(tmp_path / "in")
    src = prepare([tmp_path / "in"], tmp_path / "out", "byte", val_fraction=0.0)
    ix = src.index
    files = {f: (tmp_path / "in" / f).read_bytes() for f in expected}
    assert ix["num_documents"] == 3 and ix["dtype"] == "uint16" and ix["tokenizer"] == "byte"
    assert ix["splits"]["train"]["num_bytes"] == sum(len(b) for b in files.values())
    assert src.num_tokens("train") == ix["splits"]["train"]["num_bytes"] + 3
    assert src.num_tokens("val") == 0 and src.val.shape == (0,)
    docs = sorted(bytes(d.astype(np.uint8)) for d in _split_docs(np.asarray(src.train), 256))
    assert docs == sorted(files.values())
    assert src.bytes_per_token("train") == pytest.approx(ix["num_bytes"]["train"] / ix["num_tokens"]["train"])


def test_prepare_jsonl_and_text_field(tmp_path):
    rows = [{"text": "first doc"}, {"text": ""}, {"text": "dritte Zeile ü"}, {"body": "x", "text": "4"}]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    src = prepare([path], tmp_path / "out", ByteTokenizer(), val_fraction=0.0)
    got = [bytes(d.astype(np.uint8)).decode() for d in _split_docs(np.asarray(src.train), 256)]
    assert got == ["first doc", "dritte Zeile ü", "4"]  # empty documents are skipped
    assert src.num_bytes("train") == sum(len(t.encode()) for t in got)
    alt = tmp_path / "e.jsonl"
    alt.write_text(json.dumps({"content": "abc"}) + "\n")
    assert prepare([alt], tmp_path / "o2", "byte", text_field="content", val_fraction=0).num_tokens() == 4
    with pytest.raises(UsageError, match="e.jsonl:1.*'text'"):
        prepare([alt], tmp_path / "o3", "byte")
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{oops\n')
    with pytest.raises(UsageError, match="bad.jsonl:2"):
        prepare([tmp_path / "bad.jsonl"], tmp_path / "o4", "byte")


def test_lone_document_split_at_line(tmp_path):
    text = "".join(f"line {i:03d}\n" for i in range(200))
    (tmp_path / "one.txt").write_text(text)
    src = prepare([tmp_path / "one.txt"], tmp_path / "out", "byte", val_fraction=0.1)
    train = bytes(np.asarray(src.train[:-1]).astype(np.uint8)).decode()
    val = bytes(np.asarray(src.val[:-1]).astype(np.uint8)).decode()
    assert train + val == text and val.startswith("line ") and train.endswith("\n")
    assert abs(len(val) - 0.1 * len(text)) <= 9  # nearest line break (lines are 9 bytes)
    assert src.num_bytes("train") + src.num_bytes("val") == len(text)


def test_val_split_by_document_hash(tmp_path):
    (tmp_path / "in").mkdir()
    for i in range(200):
        (tmp_path / "in" / f"f{i:03d}.txt").write_text(f"document {i}\n" * (5 + i % 7))
    a = prepare([tmp_path / "in"], tmp_path / "a", "byte", val_fraction=0.1)
    b = prepare([tmp_path / "in"], tmp_path / "b", "byte", val_fraction=0.1)
    assert a.index["content_hash"] == b.index["content_hash"]
    assert np.array_equal(a.val, b.val)
    total = a.num_tokens("train") + a.num_tokens("val")
    assert 0.1 * total <= a.num_tokens("val") < 0.1 * total + 100  # overshoot < one document
    assert a.index["splits"]["val"]["num_documents"] + a.index["splits"]["train"]["num_documents"] == 200
    c = prepare([tmp_path / "in"], tmp_path / "c", "byte", val_tokens=500)
    assert 500 <= c.num_tokens("val") < 600
    # the rule: lowest key hash first; at least one document stays in train
    assert select_val_documents(["a", "b"], [10, 10], 0.99, None) in ({0}, {1})
    assert select_val_documents(["a"], [10], 0.5, None) == set()


def test_only_huge_documents_cut_one_instead(tmp_path):
    """Three big files and a 1% target: no whole file fits, so one file's tail becomes val."""
    (tmp_path / "in").mkdir()
    texts = {f"book{i}.txt": "".join(f"book {i} line {j:04d}\n" for j in range(400 + 200 * i)) for i in range(3)}
    for name, text in texts.items():
        (tmp_path / "in" / name).write_text(text)
    src = prepare([tmp_path / "in"], tmp_path / "out", "byte", val_fraction=0.01)
    total = sum(len(t) for t in texts.values())
    assert src.num_bytes("train") + src.num_bytes("val") == total
    assert src.index["splits"]["val"]["num_documents"] == 1
    assert abs(src.num_tokens("val") - 0.01 * (total + 3)) < 20  # nearest line break (~18-byte lines)
    val = bytes(np.asarray(src.val[:-1]).astype(np.uint8)).decode()
    owner = [t for t in texts.values() if t.endswith(val)]
    assert len(owner) == 1 and val.startswith("book ")  # the tail of one book, cut at a line start


class _WideTokenizer(ByteTokenizer):
    """Byte ids shifted above 2**16, to exercise the uint32 shard path."""

    def __init__(self):
        super().__init__()
        self.vocab_size, self.eot_id, self.spec, self.fingerprint = 70_000, 69_999, "wide", "wide-v1"

    def encode_documents(self, docs):
        return [np.frombuffer(d, dtype=np.uint8).astype(np.int64) + 66_000 for d in docs]


def test_uint32_when_vocab_is_large(tmp_path):
    assert token_dtype(257) == np.uint16 and token_dtype(65_536) == np.uint16 and token_dtype(65_537) == np.uint32
    (tmp_path / "t.txt").write_text("abc")
    src = prepare([tmp_path / "t.txt"], tmp_path / "out", _WideTokenizer(), val_fraction=0)
    assert src.index["dtype"] == "uint32" and src.train.dtype == np.uint32
    assert src.train.tolist() == [66_000 + 97, 66_000 + 98, 66_000 + 99, 69_999]


def test_crash_mid_write_leaves_nothing(tmp_path, monkeypatch):
    _folder(tmp_path / "in")

    def boom(path, index):
        raise RuntimeError("simulated crash after the .bin files were written")

    monkeypatch.setattr(prep, "_write_index", boom)
    with pytest.raises(RuntimeError, match="simulated crash"):
        prepare([tmp_path / "in"], tmp_path / "out" / "shards", "byte")
    assert not (tmp_path / "out" / "shards").exists()
    assert list((tmp_path / "out").iterdir()) == []  # the temp dir was removed too


def test_existing_dir_overwrite_and_exist_ok(tmp_path):
    _folder(tmp_path / "in")
    first = prepare([tmp_path / "in"], tmp_path / "out", "byte")
    with pytest.raises(UsageError, match="already exists"):
        prepare([tmp_path / "in"], tmp_path / "out", "byte")
    again = prepare([tmp_path / "in"], tmp_path / "out", "byte", exist_ok=True)
    assert again.index["content_hash"] == first.index["content_hash"]
    (tmp_path / "in" / "a.py").write_text("changed\n")
    changed = prepare([tmp_path / "in"], tmp_path / "out", "byte", overwrite=True)
    assert changed.index["content_hash"] != first.index["content_hash"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    with pytest.raises(UsageError, match="does not exist"):
        prepare([tmp_path / "missing"], tmp_path / "o2", "byte")


def test_racing_preparers_share_one_result(tmp_path):
    _folder(tmp_path / "in")
    results, errors = [], []

    def worker():
        try:
            results.append(prepare([tmp_path / "in"], tmp_path / "out", "byte", exist_ok=True))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors and len(results) == 4
    assert len({r.index["content_hash"] for r in results}) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out"]


def _ensure_in_subprocess(args):
    source, cache = args
    src = ensure_prepared(source, "byte", cache)
    return str(src.path), src.index["content_hash"]


def test_ensure_prepared_concurrent_processes(tmp_path):
    _folder(tmp_path / "in")
    ctx = mp.get_context("spawn")
    with ctx.Pool(3) as pool:
        # A timeout, not a hang, if a worker dies (Pool.map waits forever for a lost task).
        job = pool.map_async(_ensure_in_subprocess, [(str(tmp_path / "in"), str(tmp_path / "cache"))] * 3)
        got = job.get(timeout=120)
    assert len(set(got)) == 1
    entries = [p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")]
    assert entries == [os.path.basename(got[0][0])] and entries[0].startswith("in-")


def test_ensure_prepared_reuses_and_notices_changes(tmp_path):
    _folder(tmp_path / "in")
    a = ensure_prepared(tmp_path / "in", "byte", tmp_path / "cache")
    stamp = (a.path / "index.json").stat().st_mtime_ns
    b = ensure_prepared(tmp_path / "in", "byte", tmp_path / "cache")
    assert b.path == a.path and (b.path / "index.json").stat().st_mtime_ns == stamp
    time.sleep(0.01)
    (tmp_path / "in" / "a.py").write_text("print('edited')\n")
    c = ensure_prepared(tmp_path / "in", "byte", tmp_path / "cache")
    assert c.path != a.path
    # a prepared dir is used as is, but only with the tokenizer it was made with
    assert ensure_prepared(c.path, "byte").index == c.index
    with pytest.raises(UsageError, match="prepared with tokenizer"):
        ensure_prepared(c.path, _WideTokenizer())


def test_default_corpus_prepare():
    """The stdlib corpus, byte tokenizer, into the session cache (conftest sets SCALELAB_CACHE)."""
    assert str(data_cache_dir()).startswith(os.environ["SCALELAB_CACHE"])
    files = default_corpus_files()
    assert len(files) > 300 and all(f.suffix == ".py" for f in files)
    # generated near-duplicates (codec tables, rendered docs) stay out
    assert not any(p in ("site-packages", "encodings", "pydoc_data") for f in files for p in f.parts)
    t0 = time.perf_counter()
    src = ensure_prepared("default", "byte")
    seconds = time.perf_counter() - t0
    docs = list(iter_documents(["default"]))
    num_docs = len(docs)
    ix = src.index
    assert ix["num_documents"] == num_docs
    # document bytes: the files' UTF-8, malformed bytes of a few test files replaced by U+FFFD
    assert ix["num_bytes"]["train"] + ix["num_bytes"]["val"] == sum(len(d.data) for d in docs)
    assert (
        src.num_tokens("train") + src.num_tokens("val") == ix["num_bytes"]["train"] + ix["num_bytes"]["val"] + num_docs
    )
    assert 0.01 <= src.num_tokens("val") / (src.num_tokens("train") + src.num_tokens("val")) < 0.05
    assert seconds < 30, f"default corpus prepare took {seconds:.1f} s"
    assert isinstance(PreparedSource(src.path), PreparedSource)
    assert ensure_prepared("default", "byte").path == src.path


def _lib_and_tests(root):
    """60 library files (no "assert" in them) and 60 test files (each starts with "assert")."""
    (root / "tests").mkdir(parents=True)
    for i in range(60):
        (root / f"lib{i:02d}.py").write_text(f"def f{i}():\n    return {i}\n" * (3 + i % 5))
        (root / "tests" / f"test_{i:02d}.py").write_text(f"assert f{i}() == {i}\n" * (4 + i % 3))


def test_train_exclude_filters_train_only_and_keeps_the_val_split(tmp_path):
    _lib_and_tests(tmp_path / "in")
    whole = ensure_prepared(tmp_path / "in", "byte", tmp_path / "cache", val_fraction=0.1)
    lib = ensure_prepared(tmp_path / "in", "byte", tmp_path / "cache", val_fraction=0.1, train_exclude=["*/tests/*"])
    assert lib.path != whole.path  # its own cache entry; the unfiltered one keeps its key
    assert np.array_equal(lib.val, whole.val)  # the same held-out documents, tests included
    tok = ByteTokenizer()
    train_docs = [bytes(d.astype(np.uint8)) for d in _split_docs(np.asarray(lib.train), tok.eot_id)]
    assert train_docs and not any(d.startswith(b"assert") for d in train_docs)
    whole_docs = _split_docs(np.asarray(whole.train), tok.eot_id)
    assert lib.index["train_exclude"]["num_documents"] == len(whole_docs) - len(train_docs) > 0
    with pytest.raises(UsageError, match="leaves no document"):
        prepare([tmp_path / "in"], tmp_path / "none", "byte", val_fraction=0.1, train_exclude=["*"])


def test_train_exclude_reaches_a_runs_batches_and_leaves_its_val_batches_alone(tmp_path):
    """The config key through build_run_config and build_data (what a training run reads): no
    training window of a filtered source holds an excluded document's bytes, and its validation
    batches are token for token those of the unfiltered source (a data study's arms are validated
    on the same documents)."""
    _lib_and_tests(tmp_path / "in")
    source = {"name": "code", "path": str(tmp_path / "in"), "max_epochs": 1}
    data = {"seq_len": 32, "val_fraction": 0.1, "val_sequences": 16}

    def bundle(**extra):
        cfg = build_run_config({"model": {"preset": "debug"}, "data": {**data, "sources": [{**source, **extra}]}})
        return build_data(cfg.data, seed=0, cache_dir=tmp_path / "cache", val_batch_size=4)

    whole, lib = bundle(), bundle(train_exclude=["*/tests/*"])

    def train_rows(b):
        rows = b.sampler.next_batch(b.sampler.capacity_samples())  # every window of one epoch
        return [bytes(r.numpy().astype(np.uint8)) for r in rows]

    assert any(b"assert" in r for r in train_rows(whole))  # the filter has something to remove
    assert not any(b"assert" in r for r in train_rows(lib))
    assert lib.sources[0].num_tokens("train") < whole.sources[0].num_tokens("train")
    assert [len(v.batches) for v in lib.val_sets] == [len(v.batches) for v in whole.val_sets] == [4]
    for a, b in zip(lib.val_sets[0].batches, whole.val_sets[0].batches):
        assert torch.equal(a, b)
    assert any(b"assert" in bytes(r.numpy().astype(np.uint8)) for v in lib.val_sets for r in torch.cat(v.batches))
