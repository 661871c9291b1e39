"""The small-scale training recipe: batch, run length, warmup and learning rate of every run in a design.

A scaling law is fitted to final losses, so each run must measure its *size*, not its schedule
(Porian et al. 2024 trace the Kaplan/Chinchilla disagreement to warmup that is too long for small
budgets and to hyperparameters not tuned per size). A sweep spec opts in with a `recipe:` section:

    recipe:
      min_steps: 250                   # every run takes at least this many optimizer steps
      shape: {min_layers: 2, width_per_layer: 32, min_width: 32}   # options of the shape rule
      warmup: {fraction: 0.05, max_steps: 50}
      batch: {by: tokens, ref: 1.2e6, ref_tokens: 512, exponent: 0.5, min_sequences: 4, max_tokens: 0}
      lr: {ref_params: 5e4, ref_lr: 6e-3, exponent: -0.35}   # + ref_num_tokens, tokens_exponent: LR(N, D)
      weight_decay: {timescale: 0.5}   # optional: 1 / (lr wd) = half the run's steps
      beta2: {ref_batch_tokens: 8192, ref_beta2: 0.95}   # optional: beta2's length held in tokens

For a run of N parameters asked to train on about D tokens at FLOP budget C (the IsoFLOP label, or
6ND when the run has none):

  batch     B = ref_tokens * (x / ref)^exponent tokens, rounded to the nearest power-of-two number of
            sequences (in log2) and clamped to [min_sequences, max_tokens] (max_tokens 0: no cap),
            with x the run's tokens D (`by: tokens`, the default) or its budget C (`by: flops`: one
            batch per IsoFLOP slice). Tokens by default because the critical batch grows with the
            data a run sees, not with its size (Zhang et al. 2024, "How Does Critical Batch Size
            Scale in Pre-training?"); measured here (docs/closed-loop.md): at D ~ 0.3M
            tokens 4 sequences of 64 beat 8, at ~1M 8 beat 16 by 4%, at ~6M 16 beat 8 by 2%. So
            within a slice the large sizes (few tokens) get smaller batches. When a run would get
            fewer than `min_steps` steps, its batch is halved until it does (down to min_sequences);
            a run that still falls short is rejected, naming the run and the fix.
  length    the number of steps is round(D / B); the run's tokens are steps * B (whole steps).
  warmup    linear, in steps: clamp(round(fraction * steps), 1, max_steps). A fixed fraction makes
            warmup a large share of a small run's updates; the cap keeps long runs' warmup short.
  lr        peak LR = ref_lr * (N / ref_params)^exponent * (D / ref_num_tokens)^tokens_exponent
            (N total parameters, D the run's tokens after rounding to whole steps). Without
            `ref_num_tokens` the LR depends on N only (the per-size rule, fitted by `lr_law_from_runs`
            from an LR sweep at several sizes). With it the rule has a token-horizon term: the best
            LR falls as the run gets longer at a fixed size (Bjorck et al. 2024, "Scaling Optimal LR
            Across Token Horizons"), which a design spanning 2-500 tokens per parameter needs; fit
            both exponents with `scalelab sweep audit` (scalelab.sweeps.recipes.recipe_audit).
  weight    `weight_decay: {timescale: f}` holds AdamW's weight-decay timescale at a fixed fraction
  decay     of the run: torch's AdamW decays by lr x wd per step, an exponential moving average of
            the updates over 1 / (lr x wd) steps (Wang & Aitchison 2024, "How to set AdamW's weight
            decay as you scale model and dataset size"), so wd = 1 / (f x peak lr x steps). With a
            fixed wd that timescale is a different fraction of a short and of a long run, and the
            optimiser's regime changes with scale. Absent (or f = 0): the base config's weight_decay.
  beta2     `beta2: {ref_batch_tokens: B0, ref_beta2: b0}` keeps the second-moment average's length in
            tokens: beta2 = b0^(B / B0) for a batch of B tokens (Porian et al. 2024: beta2 = 0.95 is
            too short at small batches). Absent: the base config's beta2.

A point that sets `optim.lr` itself (an LR sweep's grid axis) keeps its LR, and the weight-decay
rule then uses that LR; a point that sets `optim.weight_decay` or `optim.beta2` keeps it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scalelab.config_tree import from_dict
from scalelab.errors import ConfigError


@dataclass(kw_only=True, slots=True)
class WarmupRule:
    fraction: float = 0.05  # of the run's steps
    max_steps: int = 50  # cap: warmup never exceeds this many steps


@dataclass(kw_only=True, slots=True)
class BatchRule:
    by: str = "tokens"  # tokens: B follows the run's D; flops: B follows its budget C
    ref: float = 1.2e6  # at this D (or C) the batch is ref_tokens
    ref_tokens: int = 512  # tokens per optimizer step at ref
    exponent: float = 0.5  # B ~ x^exponent (DeepSeek LLM 2024 fit B ~ C^0.33 at large scale)
    min_sequences: int = 4  # never fewer sequences per step
    max_tokens: int = 0  # cap on tokens per step; 0 = none


@dataclass(kw_only=True, slots=True)
class LRRule:
    ref_params: float = 5e4  # N (total parameters) where the peak LR is ref_lr
    ref_lr: float = 6e-3
    exponent: float = -0.35  # lr ~ N^exponent
    ref_num_tokens: float = 0.0  # D (tokens) where the horizon factor is 1; 0 = no horizon term (N only)
    tokens_exponent: float = 0.0  # lr ~ D^tokens_exponent at a fixed N (with ref_num_tokens)

    @property
    def has_horizon(self) -> bool:
        return self.ref_num_tokens > 0


@dataclass(kw_only=True, slots=True)
class WeightDecayRule:
    timescale: float = 0.0  # 1 / (peak lr x wd) as a fraction of the run's steps; 0 = the base's weight_decay


@dataclass(kw_only=True, slots=True)
class Beta2Rule:
    ref_batch_tokens: int = 0  # batch (tokens per step) at which beta2 = ref_beta2; 0 = the base's beta2
    ref_beta2: float = 0.95


@dataclass(kw_only=True, slots=True)
class ShapeRule:
    """Options of the shape rule (scalelab.models.shapes.shape_for_params) for generated sizes."""

    min_layers: int = 1
    width_per_layer: int = 64
    min_width: int = 32


@dataclass(kw_only=True, slots=True)
class Recipe:
    min_steps: int = 250
    shape: ShapeRule = field(default_factory=ShapeRule)
    warmup: WarmupRule = field(default_factory=WarmupRule)
    batch: BatchRule = field(default_factory=BatchRule)
    lr: LRRule = field(default_factory=LRRule)
    weight_decay: WeightDecayRule = field(default_factory=WeightDecayRule)
    beta2: Beta2Rule = field(default_factory=Beta2Rule)


@dataclass(kw_only=True, slots=True)
class RunRecipe:
    """What the recipe sets for one run."""

    batch_sequences: int
    tokens_per_step: int
    num_steps: int
    num_tokens: int
    warmup_steps: int
    lr: float  # the run's peak LR (4 significant digits, as the run config gets it)
    halvings: int  # times the rule's batch was halved to reach min_steps
    weight_decay: float | None = None  # by the timescale rule; None = the base's
    beta2: float | None = None  # by the beta2 rule; None = the base's

    def overrides(self, *, keep: frozenset[str] = frozenset()) -> dict[str, Any]:
        """The run-config keys the recipe sets, but those in `keep` (keys the point sets itself)."""
        out: dict[str, Any] = {
            "train.global_batch_tokens": self.tokens_per_step,
            "train.num_tokens": self.num_tokens,
            "schedule.warmup_tokens": self.warmup_steps * self.tokens_per_step,
            "optim.lr": self.lr,
        }
        if self.weight_decay is not None:
            out["optim.weight_decay"] = self.weight_decay
        if self.beta2 is not None:
            out["optim.beta2"] = self.beta2
        return {k: v for k, v in out.items() if k not in keep}


def parse_recipe(section: Any, key: str = "recipe") -> Recipe:
    """A Recipe from the spec's `recipe:` mapping (True or {} = the defaults); ConfigError names the key."""
    if section is True:
        section = {}
    if not isinstance(section, dict):
        raise ConfigError(key, f"expected a mapping, got {section!r}", "e.g. recipe: {min_steps: 250}")
    recipe = from_dict(Recipe, section, prefix=key)
    checks = [
        ("min_steps", recipe.min_steps >= 1, "an integer >= 1"),
        ("shape.min_layers", recipe.shape.min_layers >= 1, ">= 1"),
        ("shape.width_per_layer", recipe.shape.width_per_layer >= 8, ">= 8"),
        ("shape.min_width", recipe.shape.min_width >= 16 and recipe.shape.min_width % 16 == 0, "a multiple of 16"),
        ("warmup.fraction", 0 <= recipe.warmup.fraction < 1, "in [0, 1)"),
        ("warmup.max_steps", recipe.warmup.max_steps >= 1, ">= 1"),
        ("batch.by", recipe.batch.by in ("tokens", "flops"), "tokens or flops"),
        ("batch.ref", recipe.batch.ref > 0 and math.isfinite(recipe.batch.ref), "> 0"),
        ("batch.ref_tokens", recipe.batch.ref_tokens >= 1, ">= 1"),
        ("batch.exponent", math.isfinite(recipe.batch.exponent), "finite"),
        ("batch.min_sequences", recipe.batch.min_sequences >= 1, ">= 1"),
        ("batch.max_tokens", recipe.batch.max_tokens >= 0, ">= 0 (0 = no cap)"),
        ("lr.ref_params", recipe.lr.ref_params > 0, "> 0"),
        ("lr.ref_lr", 0 < recipe.lr.ref_lr < 1, "in (0, 1)"),
        ("lr.exponent", math.isfinite(recipe.lr.exponent), "finite"),
        ("lr.ref_num_tokens", recipe.lr.ref_num_tokens >= 0, ">= 0 (0 = no token-horizon term)"),
        ("lr.tokens_exponent", math.isfinite(recipe.lr.tokens_exponent), "finite"),
        (
            "lr.tokens_exponent",
            recipe.lr.has_horizon or recipe.lr.tokens_exponent == 0,
            "0 without lr.ref_num_tokens (set both for a token-horizon term)",
        ),
        ("weight_decay.timescale", 0 <= recipe.weight_decay.timescale < 100, "in [0, 100) (0 = the base's wd)"),
        ("beta2.ref_batch_tokens", recipe.beta2.ref_batch_tokens >= 0, ">= 0 (0 = the base's beta2)"),
        ("beta2.ref_beta2", 0 < recipe.beta2.ref_beta2 < 1, "in (0, 1)"),
    ]
    for name, ok, want in checks:
        if not ok:
            raise ConfigError(f"{key}.{name}", f"must be {want}", "fix the value")
    return recipe


def _pow2(x: float) -> int:
    """The power of two nearest to x in log2 (at least 1)."""
    return 1 << max(0, int(round(math.log2(max(x, 1.0)))))


def batch_sequences(recipe: Recipe, *, flops_budget: float, target_tokens: float, seq_len: int) -> int:
    """Sequences per step by the batch rule, before the min-steps rule (a power of two, clamped)."""
    b = recipe.batch
    x = target_tokens if b.by == "tokens" else flops_budget
    tokens = b.ref_tokens * (x / b.ref) ** b.exponent
    if b.max_tokens:
        tokens = min(tokens, b.max_tokens)
    return max(b.min_sequences, _pow2(tokens / seq_len))


def peak_lr(recipe: Recipe, params: float, num_tokens: float | None = None) -> float:
    """The LR rule at N = params (and D = num_tokens, which a rule with a token-horizon term needs)."""
    r = recipe.lr
    lr = r.ref_lr * (params / r.ref_params) ** r.exponent
    if r.has_horizon:
        if num_tokens is None:
            raise ConfigError("recipe.lr.ref_num_tokens", "the LR rule depends on the run's tokens", "give them")
        lr *= (num_tokens / r.ref_num_tokens) ** r.tokens_exponent
    return lr


def decay_for_timescale(timescale: float, lr: float, num_steps: int) -> float:
    """AdamW's weight decay whose timescale 1 / (lr x wd) is `timescale` x num_steps (module docstring)."""
    return 1.0 / (timescale * lr * num_steps)


def timescale_of(weight_decay: float, lr: float, num_steps: int) -> float:
    """AdamW's weight-decay timescale 1 / (lr x wd) as a fraction of the run (inf without decay)."""
    return math.inf if weight_decay <= 0 else 1.0 / (weight_decay * lr * num_steps)


def beta2_for_batch(recipe: Recipe, tokens_per_step: int) -> float | None:
    """beta2 = ref_beta2^(B / ref_batch_tokens), or None when the recipe has no beta2 rule."""
    b = recipe.beta2
    if not b.ref_batch_tokens:
        return None
    return min(b.ref_beta2 ** (tokens_per_step / b.ref_batch_tokens), 0.9999)


def warmup_steps(recipe: Recipe, num_steps: int) -> int:
    w = recipe.warmup
    return int(min(max(round(w.fraction * num_steps), 1), w.max_steps, max(num_steps - 1, 1)))


def recipe_for_run(
    recipe: Recipe,
    *,
    params: int,
    target_tokens: float,
    flops_budget: float,
    seq_len: int,
    where: str,
    lr: float | None = None,
) -> RunRecipe:
    """Batch, length, warmup, LR, weight decay and beta2 of one run (module docstring); ConfigError
    when min_steps fails. `lr`: the point's own LR (the weight-decay rule then uses it)."""
    seqs = batch_sequences(recipe, flops_budget=flops_budget, target_tokens=target_tokens, seq_len=seq_len)
    halvings = 0
    while round(target_tokens / (seqs * seq_len)) < recipe.min_steps and seqs > recipe.batch.min_sequences:
        seqs = max(recipe.batch.min_sequences, seqs // 2)
        halvings += 1
    tokens_per_step = seqs * seq_len
    steps = int(round(target_tokens / tokens_per_step))
    if steps < recipe.min_steps:
        raise ConfigError(
            where,
            f"{params:,} params on {target_tokens:,.0f} tokens gives {steps} steps of {tokens_per_step} tokens "
            f"(the smallest batch, {recipe.batch.min_sequences} sequences), below recipe.min_steps="
            f"{recipe.min_steps}",
            "raise the budget, drop the largest sizes, or lower recipe.min_steps / recipe.batch.min_sequences",
        )
    num_tokens = steps * tokens_per_step
    if lr is None:
        lr = float(f"{peak_lr(recipe, params, num_tokens):.4g}")
    wd = None
    if recipe.weight_decay.timescale:
        wd = float(f"{decay_for_timescale(recipe.weight_decay.timescale, lr, steps):.4g}")
    beta2 = beta2_for_batch(recipe, tokens_per_step)
    return RunRecipe(
        batch_sequences=seqs,
        tokens_per_step=tokens_per_step,
        num_steps=steps,
        num_tokens=num_tokens,
        warmup_steps=warmup_steps(recipe, steps),
        lr=lr,
        halvings=halvings,
        weight_decay=wd,
        beta2=None if beta2 is None else float(f"{beta2:.6g}"),
    )


@dataclass(kw_only=True, slots=True)
class LRSweepResult:
    """An LR sweep reduced to the best LR per size and the power law through them."""

    sizes: list[float]  # N, ascending
    best_lr: list[float]  # parabola vertex in log LR (or the best measured LR when at an edge)
    interior: list[bool]  # vertex inside the swept LRs
    rule: LRRule  # lr = ref_lr (N / ref_params)^exponent through the best LRs
    exponent_interval: tuple[float, float]


def lr_law_from_runs(params, lr, loss, *, ref_params: float | None = None) -> LRSweepResult:
    """Fit the recipe's LR law to an LR sweep (several LRs at each of >= 3 sizes).

    Per size the best LR is the vertex of a parabola of loss in log10 LR through the best run and
    its neighbours (scalelab.fitting.hp_laws.hyperparams.optimal_per_budget, grouping runs by N); the law
    is the OLS line of log10 best LR on log10 N (fit_hyperparam_law).
    """
    n, h, y = (np.asarray(a, dtype=float) for a in (params, lr, loss))
    # start-up time: fitting.hp_laws.hyperparams loads statsmodels (~1 s); every command reading a spec imports
    # this module
    from scalelab.fitting.hp_laws.hyperparams import fit_hyperparam_law, optimal_per_budget

    optima = optimal_per_budget(n, h, y, rel_tol=0.01)  # one "budget" per size
    if len(optima) < 3:
        raise ConfigError("recipe.lr", f"an LR sweep at {len(optima)} size(s)", "sweep the LR at 3 or more sizes")
    sizes = np.array([o.flops for o in optima])
    best = np.array([o.h_opt for o in optima])
    law = fit_hyperparam_law(sizes, best)
    ref = float(ref_params or math.exp(np.mean(np.log(sizes))))
    return LRSweepResult(
        sizes=sizes.tolist(),
        best_lr=best.tolist(),
        interior=[o.interior for o in optima],
        rule=LRRule(
            ref_params=ref, ref_lr=float(10 ** (law.intercept + law.slope * math.log10(ref))), exponent=law.slope
        ),
        exponent_interval=tuple(law.slope_interval),
    )
