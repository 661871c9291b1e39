"""One call from a `DataConfig` to everything a training run reads: tokenizer, shards, sampler, val sets.

    data = build_data(cfg.data, seed=cfg.data_order_seed, dp_rank=rank, dp_size=dp)
    data.sampler.check_budget(cfg.train.num_tokens)      # fail at config time, not at step 10,000
    x = data.sampler.next_batch(global_batch_sequences)  # this rank's rows
    for vs in data.val_sets: ... vs.bpb(mean_loss)

Sources whose path is raw text or "default" are prepared into the cache on first use (see
prepare.ensure_prepared; concurrent ranks/trials wait on a file lock and share the result).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from scalelab.errors import ConfigError, UsageError
from scalelab.train.data.config import DataConfig
from scalelab.train.data.prepare import ensure_prepared
from scalelab.train.data.sampler import MixtureSampler, ValSet, validation_batches
from scalelab.train.data.shards import PreparedSource
from scalelab.train.data.tokenizer import Tokenizer, load_tokenizer


@dataclass(slots=True)
class DataBundle:
    tokenizer: Tokenizer
    sources: list[PreparedSource]  # in data.sources order
    sampler: MixtureSampler
    val_sets: list[ValSet]  # one per source; empty when data.val_sequences == 0


def open_sources(
    cfg: DataConfig, tokenizer: Tokenizer, cache_dir: str | os.PathLike | None = None
) -> list[PreparedSource]:
    """Each data.sources[i] opened (prepared into the cache first when it is raw text)."""
    out = []
    for i, sc in enumerate(cfg.sources):
        try:
            out.append(
                ensure_prepared(
                    sc.path,
                    tokenizer,
                    cache_dir,
                    name=sc.name,
                    val_fraction=cfg.val_fraction,
                    train_exclude=sc.train_exclude,
                )
            )
        except ConfigError:
            raise
        except UsageError as e:
            raise ConfigError(f"data.sources[{i}].path", str(e)) from None
    return out


def build_data(
    cfg: DataConfig,
    seed: int,
    dp_rank: int = 0,
    dp_size: int = 1,
    cache_dir: str | os.PathLike | None = None,
    val_batch_size: int = 16,
) -> DataBundle:
    """Validate `cfg`, open its sources, and build the sampler and validation sets."""
    cfg.validate("data")
    tok = load_tokenizer(cfg.tokenizer)
    sources = open_sources(cfg, tok, cache_dir)
    sampler = MixtureSampler(
        sources,
        [s.weight for s in cfg.sources],
        [s.max_epochs for s in cfg.sources],
        cfg.seq_len,
        seed,
        dp_rank=dp_rank,
        dp_size=dp_size,
        unique_tokens=[s.unique_tokens for s in cfg.sources],
    )
    val_sets: list[ValSet] = []
    if cfg.val_sequences > 0:
        byte_lengths = tok.token_byte_lengths()
        for i, src in enumerate(sources):
            try:
                val_sets.append(validation_batches(src, cfg.seq_len, cfg.val_sequences, val_batch_size, byte_lengths))
            except UsageError as e:
                raise ConfigError(f"data.sources[{i}].path", str(e)) from None
    return DataBundle(tokenizer=tok, sources=sources, sampler=sampler, val_sets=val_sets)
