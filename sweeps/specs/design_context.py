"""The design context of a sweep: what every generator (and `sweep next`'s proposals) needs to turn a
target size and a token count into a run of this spec.

    ctx = DesignContext.from_base(raw["base"], cpus_per_run=1, recipe=raw.get("recipe"))
    shape = ctx.shape(2e5, "isoflop.budgets[0]")        # model fields by the shape rule
    tokens = ctx.round_tokens(3e6)                       # whole optimizer steps of the base's batch

Built once per spec from its base run config (vocabulary, sequence length, batch) and its `recipe:`
(scalelab.sweeps.recipes.recipe). The generators (scalelab.sweeps.specs.spec, scalelab.sweeps.specs.isoflop_grid) and
the proposer (scalelab.sweeps.closed_loop.propose) all size runs through it, so a proposed run is shaped
exactly as the sweep's own runs were.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

from scalelab.config_tree import to_dict
from scalelab.errors import ConfigError
from scalelab.models.accounting import num_params, num_params_nonembedding
from scalelab.models.shapes import shape_for_params
from scalelab.sweeps.recipes.recipe import Recipe, parse_recipe
from scalelab.train.config import DataConfig, TrainLoopConfig, padded_vocab_size
from scalelab.train.data.tokenizer import load_tokenizer

SHAPE_KEYS = ("num_layers", "d_model", "num_heads", "num_kv_heads", "d_ff")
# model keys the shape rule passes through unchanged when a generator picks the size
SHAPE_PASSTHROUGH = (
    "max_seq_len",
    "tied_embeddings",
    "qk_norm",
    "mlp",
    "rope_theta",
    "norm_eps",
    "init_std",
    "kernels",
)
Point = tuple[dict[str, Any], dict[str, Any]]  # a generated run before resolution: (dotted overrides, labels)


@dataclass(kw_only=True, slots=True)
class DesignContext:
    base: dict[str, Any]  # the spec's base run config (train.num_threads set to the trial's CPUs)
    vocab_size: int
    seq_len: int
    tokens_per_step: int  # the base's global batch in whole sequences
    recipe: Recipe | None = None  # the spec's `recipe:` (scalelab.sweeps.recipes.recipe), None = base config as is
    warnings: list[str] = field(default_factory=list)  # what a generator left out, for the sweep's warnings

    @classmethod
    def from_base(cls, base: dict[str, Any], *, cpus_per_run: int, recipe: Any = None) -> DesignContext:
        base = copy.deepcopy(base)
        model = base.get("model") or {}
        data = base.get("data") or {}
        train = base.get("train") or {}
        for section in ("model", "data", "train"):
            if not isinstance(base.get(section) or {}, dict):
                raise ConfigError(f"base.{section}", "expected a mapping", "write it as a YAML mapping")
        vocab = model.get("vocab_size") or padded_vocab_size(load_tokenizer(data.get("tokenizer", "byte")).vocab_size)
        seq_len = int(data.get("seq_len", DataConfig().seq_len))
        batch = int(float(train.get("global_batch_tokens", TrainLoopConfig().global_batch_tokens)))
        if seq_len < 1 or batch < seq_len:
            raise ConfigError("base.train.global_batch_tokens", f"{batch} < data.seq_len={seq_len}", "raise it")
        # Threads follow the trial's CPUs so concurrent trials do not oversubscribe the cores.
        base.setdefault("train", {}).setdefault("num_threads", cpus_per_run)
        return cls(
            base=base,
            vocab_size=int(vocab),
            seq_len=seq_len,
            tokens_per_step=(batch // seq_len) * seq_len,
            recipe=None if recipe is None else parse_recipe(recipe),
        )

    def round_tokens(self, target_tokens: float) -> int:
        """Tokens of a generated run: the target as is under a recipe (it picks the batch and rounds
        to whole steps itself), else rounded to whole steps of the base's batch."""
        if self.recipe is not None:
            return int(round(target_tokens))
        return max(int(round(target_tokens / self.tokens_per_step)), 0) * self.tokens_per_step

    def shape(
        self, target_params: float, key: str, exclude: frozenset = frozenset(), count: str = "total"
    ) -> dict[str, Any]:
        """Model fields for a target size by the shape rule, keeping the base's pass-through keys.

        `exclude`: (num_layers, d_model) pairs already used, so a design's sizes stay distinct.
        `count`: "total" or "nonembedding": which parameter count the target is."""
        model = self.base.get("model") or {}
        extra = {k: model[k] for k in SHAPE_PASSTHROUGH if k in model}
        extra.setdefault("max_seq_len", max(self.seq_len, 128))
        if self.recipe is not None:
            r = self.recipe.shape
            extra |= dict(min_layers=r.min_layers, width_per_layer=r.width_per_layer, min_width=r.min_width)
        extra["exclude"] = exclude
        counter = num_params if count == "total" else num_params_nonembedding

        # Tiny sizes are coarse (one layer or 16 channels is a big step): when the rule cannot meet
        # a target within its tolerance, take the buildable shape nearest to it (within ~35%).
        found, error = [], None
        for factor in (1.0, 1.15, 1 / 1.15, 1.3, 1 / 1.3):
            try:
                cfg = shape_for_params(target_params * factor, vocab_size=self.vocab_size, count=count, **extra)
            except ConfigError as e:
                error = e
                continue
            found.append((abs(math.log(counter(cfg) / target_params)), cfg))
            if factor == 1.0:
                break
        if not found:
            raise ConfigError(key, f"size {target_params:.3g}: {str(error).split(': ', 1)[-1]}") from None
        cfg = min(found, key=lambda t: t[0])[1]
        # mlp travels with the shape: it decides what d_ff means for the count and the FLOPs
        return {k: v for k, v in to_dict(cfg).items() if k in SHAPE_KEYS or k in ("vocab_size", "max_seq_len", "mlp")}
