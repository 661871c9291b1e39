"""The `data:` section of a run config: tokenizer, sources with mixture weights, sequence length.

    data:
      tokenizer: byte                  # or a Hugging Face tokenizer.json (scalelab data tokenizer, GPT-2, Llama)
      seq_len: 256
      val_sequences: 64
      val_fraction: 0.01               # share of raw sources' documents held out for validation
      sources:
        - {name: stdlib, path: default, weight: 1.0, max_epochs: 4}
        - {name: lib, path: default, train_exclude: ["*/test/*", "*/tests/*"]}   # library code only

`DataConfig.validate("data")` raises `ConfigError` naming the offending key (e.g.
`data.sources[0].path`) and the fix; it touches no shard files, so it is cheap enough to run
before any process starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from scalelab.errors import ConfigError
from scalelab.train.data.tokenizer import load_tokenizer


@dataclass(kw_only=True, slots=True)
class SourceConfig:
    name: str = "stdlib"
    # a prepared shard dir, a raw text file/folder/JSONL/Parquet (prepared into the cache on first use),
    # or "default" (the Python stdlib corpus, see scalelab.train.data.corpus)
    path: str = "default"
    weight: float = 1.0  # mixture weight (normalised over sources)
    max_epochs: float = 4.0  # cap on repeated passes over this source's train split
    # > 0: train on only the first this-many tokens of the train split (whole windows), so a run of
    # num_tokens repeats them num_tokens / unique_tokens times: the data-constrained axis of a sweep.
    unique_tokens: int = 0
    # Documents left out of the train split: fnmatch patterns over document keys (the path under the
    # input, e.g. "stdlib/test/*", "*/tests/*"). The val split is chosen from every document first
    # and kept whole, so runs with and without a filter are validated on the same documents (a data
    # study's arms: scalelab.sweeps.study).
    train_exclude: list[str] = field(default_factory=list)


@dataclass(kw_only=True, slots=True)
class DataConfig:
    tokenizer: str = "byte"
    sources: list[SourceConfig] = field(default_factory=lambda: [SourceConfig()])
    seq_len: int = 256  # tokens per training sequence (the model sees seq_len inputs and targets)
    val_sequences: int = 64  # held-out sequences per source used for validation loss/bpb
    # share of a raw source's documents held out for validation when it is prepared (a prepared
    # shard dir keeps its own split); more documents make a less idiosyncratic validation loss
    val_fraction: float = 0.01

    def validate(self, prefix: str = "data") -> None:
        """Check every field; raise ConfigError(key, problem, fix) on the first bad one."""
        try:
            load_tokenizer(self.tokenizer)
        except ConfigError as e:
            raise ConfigError(f"{prefix}.tokenizer", str(e).split(": ", 1)[-1]) from None
        if not isinstance(self.seq_len, int) or self.seq_len < 1:
            raise ConfigError(f"{prefix}.seq_len", f"{self.seq_len!r} must be an integer >= 1", "e.g. 256")
        if not isinstance(self.val_sequences, int) or self.val_sequences < 0:
            raise ConfigError(
                f"{prefix}.val_sequences",
                f"{self.val_sequences!r} must be an integer >= 0",
                "e.g. 64, or 0 to skip validation",
            )
        if not isinstance(self.val_fraction, float | int) or not 0.0 < self.val_fraction < 0.5:
            raise ConfigError(f"{prefix}.val_fraction", f"{self.val_fraction!r} must be in (0, 0.5)", "e.g. 0.01")
        if not self.sources:
            raise ConfigError(f"{prefix}.sources", "is empty", "add at least one source, e.g. {path: default}")
        seen: dict[str, int] = {}
        for i, src in enumerate(self.sources):
            key = f"{prefix}.sources[{i}]"
            if not src.name or not isinstance(src.name, str):
                raise ConfigError(f"{key}.name", f"{src.name!r} is not a non-empty string", "name the source")
            if src.name in seen:
                raise ConfigError(
                    f"{key}.name",
                    f"{src.name!r} duplicates {prefix}.sources[{seen[src.name]}].name",
                    "give every source a distinct name",
                )
            seen[src.name] = i
            if src.path != "default" and not Path(src.path).expanduser().exists():
                raise ConfigError(
                    f"{key}.path",
                    f"{src.path!r} does not exist",
                    "give a prepared shard dir, a text file/folder/JSONL/Parquet, or 'default'",
                )
            if not isinstance(src.unique_tokens, int) or src.unique_tokens < 0:
                raise ConfigError(
                    f"{key}.unique_tokens", f"{src.unique_tokens!r} must be an integer >= 0", "0 = the whole split"
                )
            if not (isinstance(src.weight, int | float) and math.isfinite(src.weight) and src.weight > 0):
                raise ConfigError(f"{key}.weight", f"{src.weight!r} must be a finite number > 0", "e.g. 1.0")
            if not isinstance(src.train_exclude, list) or not all(isinstance(p, str) and p for p in src.train_exclude):
                raise ConfigError(
                    f"{key}.train_exclude",
                    f"{src.train_exclude!r} is not a list of patterns",
                    'e.g. ["*/test/*", "*/tests/*"]',
                )
            if not (isinstance(src.max_epochs, int | float) and src.max_epochs > 0):
                raise ConfigError(f"{key}.max_epochs", f"{src.max_epochs!r} must be > 0", "e.g. 4.0")
