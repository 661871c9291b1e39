"""Tokenizers: byte round trip, BPE trained on a small local corpus, spec loading and errors."""

import json

import numpy as np
import pytest

from scalelab.errors import ConfigError
from scalelab.train.data.tokenizer import (
    EOT_TEXT,
    BPETokenizer,
    ByteTokenizer,
    load_tokenizer,
    train_bpe,
)

TEXTS = [
    "def f(x):\n    return x + 1\n",
    "héllo wörld — naïve café, 日本語のテキスト, emoji 💥🙂\n",
    "\ttabs\tand  double  spaces\r\nwindows line\n",
    "",
    "x" * 1000,
]


def test_byte_round_trip_and_ids():
    tok = load_tokenizer("byte")
    assert isinstance(tok, ByteTokenizer)
    assert (tok.vocab_size, tok.eot_id, tok.spec, tok.name) == (257, 256, "byte", "byte")
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == list(text.encode("utf-8"))
        assert tok.decode(ids) == text
    assert tok.encode_batch(TEXTS) == [tok.encode(t) for t in TEXTS]
    assert tok.decode([104, 105, 256, 33]) == "hi" + EOT_TEXT + "!"
    with pytest.raises(ValueError):
        tok.decode([300])


def test_byte_lengths_and_document_fast_path():
    tok = ByteTokenizer()
    lengths = tok.token_byte_lengths()
    assert lengths.shape == (257,) and lengths[256] == 0 and lengths[:256].sum() == 256
    docs = [t.encode("utf-8") for t in TEXTS]
    arrays = tok.encode_documents(docs)
    assert [a.tolist() for a in arrays] == [tok.encode(t) for t in TEXTS]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    root = tmp_path_factory.mktemp("bpe")
    corpus = root / "corpus"
    corpus.mkdir()
    # Enough repetition for merges to form; varied scripts so the byte fallback is exercised too.
    (corpus / "a.py").write_text("".join(f"def func_{i}(x):\n    return x * {i}\n\n" for i in range(200)))
    (corpus / "b.md").write_text("The quick brown fox jumps over the lazy dog. " * 100 + "\nnaïve café\n")
    with open(corpus / "c.jsonl", "w") as fh:
        for i in range(50):
            fh.write(json.dumps({"text": f"record number {i} says hello", "id": i}) + "\n")
    return train_bpe([corpus], 320, root / "tok.json")


def test_bpe_train_round_trip(bpe):
    assert isinstance(bpe, BPETokenizer)
    assert 258 <= bpe.vocab_size <= 320
    assert bpe.decode([bpe.eot_id]) == EOT_TEXT
    for text in TEXTS:
        ids = bpe.encode(text)
        assert all(0 <= i < bpe.vocab_size for i in ids)
        assert bpe.decode(ids) == text
    # merges were learnt: common corpus text compresses below one token per byte
    sample = "def func_7(x):\n    return x * 7\n"
    assert len(bpe.encode(sample)) < 0.6 * len(sample.encode())
    assert bpe.encode_batch(TEXTS) == [bpe.encode(t) for t in TEXTS]


def test_bpe_byte_lengths_exact(bpe):
    lengths = bpe.token_byte_lengths()
    assert lengths[bpe.eot_id] == 0
    for text in TEXTS:
        ids = np.array(bpe.encode(text), dtype=np.int64)
        assert int(lengths[ids].sum()) == len(text.encode("utf-8"))


def test_bpe_load_from_spec(bpe):
    again = load_tokenizer(bpe.spec)
    assert again.fingerprint == bpe.fingerprint and again.vocab_size == bpe.vocab_size
    assert again.encode("return x * 3") == bpe.encode("return x * 3")
    assert bpe.fingerprint != ByteTokenizer().fingerprint


def test_bad_specs(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_tokenizer("gpt2")
    assert e.value.key == "data.tokenizer" and "gpt2" in str(e.value)
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a tokenizer"}')
    with pytest.raises(ConfigError) as e:
        load_tokenizer(str(bad))
    assert e.value.key == "data.tokenizer"
    with pytest.raises(ConfigError):
        train_bpe([tmp_path], 100, tmp_path / "t.json")
