"""Any Hugging Face tokenizer.json gives a run its vocabulary: GPT-2-style, Llama-3-style and
Llama-2-style (SentencePiece BPE with byte fallback) tokenizers, each trained here with the `tokenizers`
library on a tiny corpus, encode documents without the file's own special tokens, separate them with
their end-of-text, count bytes exactly for bits per byte, size the model's embedding and train it."""

import json

import numpy as np
import polars as pl
import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from scalelab.errors import ConfigError
from scalelab.train.config import build_run_config, padded_vocab_size
from scalelab.train.data.prepare import prepare
from scalelab.train.data.tokenizer import load_tokenizer
from scalelab.train.export_hf import write_tokenizer
from scalelab.train.loop import train_run

CORPUS = [
    f"def handler_{i}(request):\n    return {{'status': {200 + i % 5}, 'body': 'naïve café {i}'}}\n" for i in range(60)
] + ["The quick brown fox jumps over the lazy dog.\n" * 3] * 20
TEXTS = ["def f(x):\n    return x + 1\n", "héllo wörld, 日本語 💥 (unseen bytes)\n", "  two leading spaces\n"]
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)


def _gpt2(vocab: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def _llama3(vocab: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)]
    )
    return tok


def _llama2(vocab: int) -> Tokenizer:
    """Llama 2's layout: `▁` for spaces prepended by the normalizer, no pre-tokenizer, `<0xNN>` byte
    fallback tokens in the model's vocabulary (not added tokens), `<s>` added by the post-processor."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    spec = json.loads(tok.to_str())
    ids = spec["model"]["vocab"]
    for b in range(256):
        ids.setdefault(f"<0x{b:02X}>", len(ids))
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tok


FAMILIES = {  # builder, end-of-text, the file's own begin-of-text, bytes counted beyond the text per encode
    "gpt2": (_gpt2, "<|endoftext|>", None, 0),
    "llama3": (_llama3, "<|end_of_text|>", "<|begin_of_text|>", 0),
    "llama2": (_llama2, "</s>", "<s>", 1),  # the prepended `▁` counts as one byte
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    build, eot, bos, extra = FAMILIES[request.param]
    path = tmp_path_factory.mktemp(request.param) / "tokenizer.json"
    hf = build(400)
    hf.save(str(path))
    return request.param, path, hf, eot, bos, extra


def test_vocabulary_eot_and_encoding_without_the_files_special_tokens(family):
    name, path, hf, eot, bos, extra = family
    tok = load_tokenizer(str(path))
    assert tok.vocab_size == hf.get_vocab_size(with_added_tokens=True)
    assert (tok.eot_text, tok.eot_id) == (eot, hf.token_to_id(eot))
    if bos is not None:
        assert hf.encode("hi").ids[0] == hf.token_to_id(bos)  # the file itself would add it...
    lengths = tok.token_byte_lengths()
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == hf.encode(text, add_special_tokens=False).ids  # ...documents are encoded without it
        assert tok.decode(ids) == text
        assert int(lengths[ids].sum()) == len(text.encode()) + extra, name  # exact bytes for bits per byte
    assert lengths[tok.eot_id] == 0
    if name == "llama2":
        assert any(t.startswith("<0x") for t in hf.encode("💥").tokens)  # the byte fallback was exercised


def test_prepared_shards_hold_documents_and_end_of_text_only(family, tmp_path):
    name, path, hf, eot, bos, extra = family
    tok = load_tokenizer(str(path))
    rows = tmp_path / "docs.jsonl"
    rows.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS * 4))
    src = prepare([rows], tmp_path / "shards", str(path), val_fraction=0.0)
    stream = np.asarray(src.train).tolist()
    assert src.index["vocab_size"] == tok.vocab_size and max(stream) < tok.vocab_size
    cuts = [i for i, t in enumerate(stream) if t == tok.eot_id]
    docs = [tok.decode(stream[a + 1 : b]) for a, b in zip([-1, *cuts[:-1]], cuts)]
    assert docs == TEXTS * 4
    if bos is not None:
        assert hf.token_to_id(bos) not in stream


def test_a_run_takes_its_vocabulary_from_the_tokenizer_and_trains(family, tmp_path):
    name, path, hf, eot, bos, extra = family
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in CORPUS))
    source = {"path": str(tmp_path / "corpus.jsonl")}
    data = {"tokenizer": str(path), "sources": [source], "seq_len": 16, "val_sequences": 4, "val_fraction": 0.2}
    base = {
        "model": {"preset": "debug", "d_model": 32, "kernels": "torch"},
        "data": data,
        "train": {"num_tokens": 3 * 64, "global_batch_tokens": 64},
        "eval": {"interval_steps": 0, "val_batch_sequences": 4},
        "checkpoint": {"interval_steps": 0, "final": False},
        "logging": {"wandb": "disabled", "progress": "off"},
    }
    cfg = build_run_config(base)
    vocab = load_tokenizer(str(path)).vocab_size
    assert cfg.model.vocab_size == padded_vocab_size(vocab) >= vocab  # the embedding, padded to 64
    torch.set_num_threads(1)
    train_run(cfg, tmp_path / "run")
    assert pl.read_parquet(tmp_path / "run" / "metrics.parquet").height == 3
    evals = pl.read_parquet(tmp_path / "run" / "evals.parquet")
    bpb = evals.filter(pl.col("metric") == "bpb")["value"]
    assert bpb.len() > 0 and bool((bpb > 0).all()) and bool(bpb.is_finite().all())
    with pytest.raises(ConfigError, match="model.vocab_size"):
        build_run_config({**base, "model": {**base["model"], "vocab_size": vocab - 1}})


def test_export_encodes_like_training(family, tmp_path):
    """The exported folder's tokenizer (what AutoTokenizer, lm-eval and vLLM load, and readers of the bare
    tokenizer.json) gives the ids the run trained on: no `<s>` from the file's post-processor, and its
    end-of-text as eos_token."""
    from transformers import PreTrainedTokenizerFast

    name, path, hf, eot, bos, extra = family
    cfg = build_run_config({"model": {"preset": "debug"}, "data": {"tokenizer": str(path), "seq_len": 64}})
    write_tokenizer(cfg, tmp_path)
    exported = PreTrainedTokenizerFast(
        tokenizer_file=str(tmp_path / "tokenizer.json"),
        **json.loads((tmp_path / "tokenizer_config.json").read_text()),
    )
    tok = load_tokenizer(str(path))
    assert exported.eos_token == eot and exported.eos_token_id == tok.eot_id
    raw = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))  # what tokenizer.json-only readers see
    for text in TEXTS:
        assert exported(text)["input_ids"] == tok.encode(text) == raw.encode(text).ids


def test_a_tokenizer_without_a_byte_scheme_or_an_end_of_text_is_refused(tmp_path):
    wordpiece = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wordpiece.pre_tokenizer = pre_tokenizers.Whitespace()
    wordpiece.train_from_iterator(CORPUS, trainers.WordPieceTrainer(vocab_size=200, special_tokens=["[UNK]"]))
    wordpiece.save(str(tmp_path / "wp.json"))
    with pytest.raises(ConfigError, match="neither a byte-level BPE"):
        load_tokenizer(str(tmp_path / "wp.json"))
    no_eot = Tokenizer(models.BPE())
    no_eot.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    no_eot.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, show_progress=False))
    no_eot.save(str(tmp_path / "no_eot.json"))
    with pytest.raises(ConfigError, match="none of the end-of-text tokens"):
        load_tokenizer(str(tmp_path / "no_eot.json"))
