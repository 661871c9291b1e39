"""Tokenizers: raw UTF-8 bytes (the default), and any Hugging Face tokenizer.json.

    tok = load_tokenizer("byte")                    # 256 byte values + end-of-text 256, vocab 257
    tok = load_tokenizer("runs/tok4k.json")         # train_bpe / `scalelab data tokenizer`, GPT-2, Llama...
    ids = tok.encode("def f(x):\\n")                 # list[int]
    assert tok.decode(ids) == "def f(x):\\n"

`spec` is the string stored in configs (`data.tokenizer`): "byte" or the tokenizer.json path.
`fingerprint` hashes the vocabulary itself, so shard caches notice a retrained file at the same path.
`vocab_size` is one more than the largest id (added tokens included); the model pads it (train/config.py).
`token_byte_lengths()` gives the UTF-8 bytes each id stands for (0 for special tokens); summed over
validation targets it turns a loss in nats/token into bits per byte.

A tokenizer.json is read by the `tokenizers` library (Rust, JSON only: nothing in the file is
executed, and no tokenizer_config.json or Python code beside it is read). Two vocabularies are
understood, because bits per byte need each token's bytes:
  - byte-level BPE (GPT-2, Llama 3, Qwen, `train_bpe` here): every token character stands for one
    byte (the GPT-2 byte map), so the byte counts are exact;
  - SentencePiece-style (Llama 2, Mistral: `▁` for a space, `<0xNN>` byte-fallback tokens): a token
    is its UTF-8 with `▁` as one space byte, `<0xNN>` one byte. Such a tokenizer usually prepends `▁`
    to the text, so each document counts one byte (its phantom space) more than it has.
Anything else (WordPiece, no byte scheme) is refused at load with one line. The end-of-text id that
follows every document is the first of EOT_CANDIDATES the vocabulary has. Documents are encoded
without the tokenizer's own special tokens (no `<s>` a Llama post-processor would add): end-of-text
alone separates them, as with GPT-2. With GPT-2's scheme `decode(encode(s)) == s` for any string;
text that contains the literal end-of-text string encodes to its id.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from scalelab.errors import ConfigError
from scalelab.train.data.corpus import iter_documents

EOT_TEXT = "<|endoftext|>"  # the byte tokenizer's and train_bpe's end-of-text
# end-of-text tokens of the common families, in the order tried: GPT-2 (and ours), Llama 3,
# SentencePiece (Llama 2, Mistral), Gemma
EOT_CANDIDATES = (EOT_TEXT, "<|end_of_text|>", "</s>", "<eos>")
_BYTE_FALLBACK = re.compile(r"<0x[0-9A-Fa-f]{2}>")


class Tokenizer:
    """Interface every tokenizer implements (see ByteTokenizer and BPETokenizer)."""

    name: str  # short human name: "byte" or "bpe<vocab>"
    spec: str  # what goes into data.tokenizer: "byte" or the tokenizer.json path
    vocab_size: int  # number of ids, end-of-text included
    eot_id: int  # the end-of-text id appended after every document
    eot_text: str  # its token string (what a Hugging Face export names as eos_token)
    fingerprint: str  # hex hash of the vocabulary (cache keys, shard compatibility checks)

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError

    def encode_documents(self, docs: Sequence[bytes]) -> list[np.ndarray]:
        """Token arrays (int64, no end-of-text) for UTF-8 documents: the fast path used by prepare."""
        return [np.asarray(ids, dtype=np.int64) for ids in self.encode_batch([d.decode() for d in docs])]

    def token_byte_lengths(self) -> np.ndarray:
        """int64 [vocab_size]: how many UTF-8 bytes each id decodes to (0 for end-of-text)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(spec={self.spec!r}, vocab_size={self.vocab_size})"


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids 0..255, end-of-text 256: no training, no unknowns, exact byte counts."""

    def __init__(self) -> None:
        self.name = "byte"
        self.spec = "byte"
        self.vocab_size = 257
        self.eot_id = 256
        self.eot_text = EOT_TEXT
        self.fingerprint = "byte-v1"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Iterable[int]) -> str:
        # End-of-text is shown as <|endoftext|> so packed samples stay readable; other bytes are
        # decoded leniently because a window may start or end inside a multi-byte character.
        out, run = [], bytearray()
        for i in ids:
            i = int(i)
            if i == self.eot_id:
                out.append(run.decode("utf-8", errors="replace") + EOT_TEXT)
                run = bytearray()
            elif 0 <= i < 256:
                run.append(i)
            else:
                raise ValueError(f"id {i} is outside the byte vocabulary 0..256")
        out.append(run.decode("utf-8", errors="replace"))
        return "".join(out)

    def encode_documents(self, docs: Sequence[bytes]) -> list[np.ndarray]:
        # One numpy view per document: the whole stdlib (12 MB) tokenizes in milliseconds.
        return [np.frombuffer(d, dtype=np.uint8) for d in docs]

    def token_byte_lengths(self) -> np.ndarray:
        lengths = np.ones(self.vocab_size, dtype=np.int64)
        lengths[self.eot_id] = 0
        return lengths


def byte_level_alphabet() -> dict[str, int]:
    """The GPT-2 byte-level map, inverted: printable stand-in character -> byte value.

    Printable Latin-1 bytes stand for themselves; the other 68 bytes are shifted to code points
    256 + k in byte order, so every BPE token string is one character per byte.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    char_to_byte = {chr(b): b for b in printable}
    shifted = [b for b in range(256) if b not in set(printable)]
    char_to_byte.update({chr(256 + k): b for k, b in enumerate(shifted)})
    return char_to_byte


def _component_types(node) -> set[str]:
    """Every "type" named in a tokenizer.json component (normalizer, pre-tokenizer, decoder), nested too."""
    if isinstance(node, dict):
        found = {node["type"]} if isinstance(node.get("type"), str) else set()
        return found.union(*(_component_types(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_component_types(v) for v in node))
    return set()


def _byte_scheme(spec: dict) -> str | None:
    """ "byte-level", "sentencepiece" or None (module docstring), from the file's components."""
    parts = [spec.get(k) for k in ("normalizer", "pre_tokenizer", "decoder")]
    types = _component_types(parts)
    if "ByteLevel" in types:
        return "byte-level"
    model = spec.get("model") if isinstance(spec.get("model"), dict) else {}
    if "Metaspace" in types or model.get("byte_fallback") or "\u2581" in json.dumps(parts, ensure_ascii=False):
        return "sentencepiece"
    return None


class BPETokenizer(Tokenizer):
    """A Hugging Face tokenizer.json: byte-level or SentencePiece-style (module docstring)."""

    def __init__(self, path: str | os.PathLike) -> None:
        # Absolute, because Ray trials run in their own working directories.
        path = Path(path).expanduser().resolve()
        raw = path.read_bytes()
        try:
            self._tok = HFTokenizer.from_str(raw.decode("utf-8"))
            spec = json.loads(raw)
        except Exception as e:  # the library raises its own Exception subclass for bad JSON
            raise ConfigError("data.tokenizer", f"{str(path)!r} is not a tokenizer.json ({e})") from None
        self._scheme = _byte_scheme(spec) if isinstance(spec, dict) else None
        if self._scheme is None:
            raise ConfigError(
                "data.tokenizer",
                f"{str(path)!r} is neither a byte-level BPE (GPT-2, Llama 3) nor SentencePiece-style (Llama 2): "
                "its tokens' bytes are unknown, so bits per byte could not be counted",
                "use one of those, or train one with `scalelab data tokenizer`",
            )
        eot = next((t for t in EOT_CANDIDATES if self._tok.token_to_id(t) is not None), None)
        if eot is None:
            raise ConfigError(
                "data.tokenizer",
                f"{str(path)!r} has none of the end-of-text tokens {', '.join(EOT_CANDIDATES)}",
                "add one as a special token, or train one with `scalelab data tokenizer`",
            )
        self.eot_text = eot
        self.eot_id = int(self._tok.token_to_id(eot))
        ids = self._tok.get_vocab(with_added_tokens=True).values()
        self.vocab_size = max(int(self._tok.get_vocab_size(with_added_tokens=True)), max(ids, default=-1) + 1)
        self.spec = str(path)
        self.name = f"bpe{self.vocab_size}"
        self.fingerprint = hashlib.sha256(raw).hexdigest()[:16]

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # encode_batch_fast skips offset tracking (~2x faster); older tokenizers lack it.
        encode = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
        return [e.ids for e in encode(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def token_byte_lengths(self) -> np.ndarray:
        alphabet = byte_level_alphabet()
        special = set(self._tok.get_added_tokens_decoder())
        lengths = np.zeros(self.vocab_size, dtype=np.int64)
        for i in range(self.vocab_size):
            token = self._tok.id_to_token(i)
            if i in special or token is None:
                continue  # special tokens (end-of-text, <s>, <unk>) and unused ids stand for no input bytes
            if self._scheme == "sentencepiece":
                lengths[i] = 1 if _BYTE_FALLBACK.fullmatch(token) else len(token.replace("\u2581", " ").encode())
            elif any(c not in alphabet for c in token):
                raise ValueError(f"{self.spec}: token {i} ({token!r}) is not byte-level; retrain it")
            else:
                lengths[i] = len(token)
        return lengths


def train_bpe(
    files: Iterable[str | os.PathLike],
    vocab_size: int,
    out_path: str | os.PathLike,
    *,
    min_frequency: int = 2,
    patterns: Sequence[str] | None = None,
    text_field: str = "text",
) -> BPETokenizer:
    """Train a byte-level BPE on `files` (files, folders, JSONL, or "default") and save tokenizer.json.

    Documents are read exactly as `prepare` reads them (so JSONL trains on its text field, not on
    the JSON syntax). vocab_size counts the 256 byte symbols and <|endoftext|>; it must exceed 257.
    The file is written atomically (temp file + rename).
    """
    if vocab_size < 258:
        raise ConfigError("vocab_size", f"{vocab_size} leaves no room for merges", "use at least 258, e.g. 4096")
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOT_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    docs = (d.data.decode("utf-8") for d in iter_documents(list(files), patterns=patterns, text_field=text_field))
    tok.train_from_iterator(docs, trainer)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.tmp-{os.getpid()}")
    tok.save(str(tmp))
    os.replace(tmp, out_path)
    return BPETokenizer(out_path)


@lru_cache(maxsize=16)
def _load_bpe(path: str, mtime_ns: int, size: int) -> BPETokenizer:
    # Keyed on mtime and size so a retrained file at the same path is reloaded.
    return BPETokenizer(path)


def load_tokenizer(spec: str) -> Tokenizer:
    """ "byte" -> ByteTokenizer; a path to a Hugging Face tokenizer.json -> BPETokenizer; else ConfigError."""
    if not isinstance(spec, str) or not spec:
        raise ConfigError("data.tokenizer", f"{spec!r} is not a tokenizer spec", "use 'byte' or a tokenizer.json path")
    if spec == "byte":
        return ByteTokenizer()
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ConfigError(
            "data.tokenizer",
            f"{spec!r} is neither 'byte' nor an existing tokenizer.json",
            "use 'byte', or train one with `scalelab data tokenizer --vocab-size 4096 --out tok.json`",
        )
    st = path.stat()
    return _load_bpe(str(path), st.st_mtime_ns, st.st_size)
