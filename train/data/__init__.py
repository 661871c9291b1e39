"""Tokenizers, token shards, data mixtures and the resumable sampler.

    from scalelab.train.data import build_data, DataConfig
    data = build_data(DataConfig(), seed=0)          # byte tokenizer on the Python stdlib corpus

Modules: tokenizer (byte / BPE), corpus (reading raw text; the default stdlib corpus), prepare
(raw text -> token shards, cached), shards (PreparedSource), sampler (MixtureSampler,
validation_batches), config (DataConfig, SourceConfig), bundle (build_data).
Names are imported lazily so that reading a config does not import torch. The `prepare`
function is `scalelab.train.data.prepare.prepare` (the package attribute is the module).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "DataConfig": "config",
    "SourceConfig": "config",
    "Tokenizer": "tokenizer",
    "ByteTokenizer": "tokenizer",
    "BPETokenizer": "tokenizer",
    "load_tokenizer": "tokenizer",
    "train_bpe": "tokenizer",
    "default_corpus_files": "corpus",
    "prepare": "prepare",
    "ensure_prepared": "prepare",
    "data_cache_dir": "prepare",
    "PreparedSource": "shards",
    "MixtureSampler": "sampler",
    "ValSet": "sampler",
    "validation_batches": "sampler",
    "DataBundle": "bundle",
    "build_data": "bundle",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"scalelab.train.data.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'scalelab.train.data' has no attribute {name!r}")
