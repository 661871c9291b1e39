"""The `audit:` generator of a sweep spec: the runs of a recipe audit (scalelab.sweeps.recipes.recipe_audit).

    recipe: {...}                            # the recipe under audit (required)
    audit:
      sizes: [1.85e4, 4.7e4, 1.14e5, 3.7e5]  # target parameter counts (the shape rule picks each shape)
      tokens_per_param: [2.4, 8, 27, 90, 300, 460]   # token horizons, D = tpp x N
      max_flops: 2.5e12                      # cells whose 6ND exceeds it are left out (the costly corner)
      lr_multipliers: [0.5, 0.71, 1, 1.41, 2]   # x the recipe's LR at each cell (default)
      weight_decay: {cells: [[4.7e4, 27], [1.14e5, 8]], timescales: [0.1, 0.3, 1, 3]}
      beta2: {cells: [[1.85e4, 90]], values: [0.95, 0.99, 0.999]}
      shape: {cells: [[1.14e5, 27]], layers: [1, 2, 4, 8]}

Cells are (size, horizon) pairs; at each cell of the LR grid every run is the recipe's run (its
batch, whole-step length, warmup) at LR = multiplier x the recipe's LR there, so each cell's grid is
centred on what the recipe does and the audit measures how far that is from the cell's best. A cell
too short for the recipe's min_steps is left out with a warning. `weight_decay` sets AdamW's decay
from its timescale 1 / (lr x wd) as a fraction of the run (scalelab.sweeps.recipes.recipe), at the recipe's
LR; `beta2` sets beta2 at the recipe's LR (small batches are where 0.95 is too short: give cells
with the design's smallest batches); `shape` trains each depth at the width that puts the model
nearest the cell's size, on the cell's token count (tpp x the target size), at the recipe's LR for
its size. Every run is labelled (`audit`: lr,
weight_decay, beta2 or shape; `target_params`, `tokens_per_param`, and its value) for the analysis.
"""

from __future__ import annotations

import math
from typing import Any

from scalelab.errors import ConfigError
from scalelab.models.accounting import num_params
from scalelab.models.config import ModelConfig
from scalelab.models.shapes import head_dim_for_width, shape_for_width, width_step
from scalelab.sweeps.recipes.recipe import RunRecipe, decay_for_timescale, recipe_for_run
from scalelab.sweeps.specs.design_context import SHAPE_KEYS, SHAPE_PASSTHROUGH, DesignContext, Point
from scalelab.sweeps.specs.spec_checks import as_list, check_keys, number

AUDIT_KEYS = ("sizes", "tokens_per_param", "max_flops", "lr_multipliers", "weight_decay", "beta2", "shape")
DEFAULT_MULTIPLIERS = (0.5, 0.71, 1.0, 1.41, 2.0)


def _numbers(section: dict, name: str, key: str, *, positive: bool = True) -> list[float]:
    return [
        number(v, f"{key}.{name}[{i}]", positive=positive)
        for i, v in enumerate(as_list(section.get(name), f"{key}.{name}"))
    ]


def _cells(section: Any, key: str) -> list[tuple[float, float]]:
    out = []
    for i, cell in enumerate(as_list(section, key)):
        if not isinstance(cell, list) or len(cell) != 2:
            raise ConfigError(f"{key}[{i}]", f"{cell!r} is not [size, tokens_per_param]", "e.g. [4.7e4, 27]")
        out.append((number(cell[0], f"{key}[{i}][0]"), number(cell[1], f"{key}[{i}][1]")))
    return out


def audit_points(section: Any, ctx: DesignContext, key: str) -> list[Point]:
    """The audit's runs (module docstring); ConfigError names the key."""
    check_keys(section, AUDIT_KEYS, key)
    if ctx.recipe is None:
        raise ConfigError(key, "an audit measures a recipe, and the spec has none", "add a recipe: section")
    sizes = _numbers(section, "sizes", key)
    horizons = _numbers(section, "tokens_per_param", key)
    max_flops = number(section.get("max_flops", math.inf), f"{key}.max_flops") if "max_flops" in section else math.inf
    mults = [
        number(v, f"{key}.lr_multipliers[{i}]")
        for i, v in enumerate(
            as_list(section.get("lr_multipliers", list(DEFAULT_MULTIPLIERS)), f"{key}.lr_multipliers")
        )
    ]
    if len(mults) < 3 or sorted(mults) != mults:
        raise ConfigError(
            f"{key}.lr_multipliers", f"{mults}: fewer than 3 or not ascending", "e.g. [0.5, 0.71, 1, 1.41, 2]"
        )
    out: list[Point] = []
    for i, size in enumerate(sizes):
        shape = ctx.shape(size, f"{key}.sizes[{i}]")
        for tpp in horizons:
            cell = _cell(ctx, shape, size, tpp, f"{key}.sizes[{i}]")
            if cell is None or 6 * cell[1] * cell[2].num_tokens > max_flops:
                continue
            over, n, plan = cell
            for m in mults:
                lr = float(f"{m * plan.lr:.4g}")
                labels = _labels("lr", size, tpp, lr_multiplier=m)
                out.append((over | {"optim.lr": lr}, labels))
    out += _weight_decay_points(section.get("weight_decay"), ctx, f"{key}.weight_decay")
    out += _beta2_points(section.get("beta2"), ctx, f"{key}.beta2")
    out += _shape_points(section.get("shape"), ctx, f"{key}.shape")
    if not any(labels["audit"] == "lr" for _, labels in out):
        raise ConfigError(f"{key}.max_flops", "every cell of the LR grid is left out", "raise it or add smaller cells")
    return out


def _labels(kind: str, size: float, tpp: float, **values: Any) -> dict[str, Any]:
    return {"audit": kind, "target_params": round(size), "tokens_per_param": tpp, **values}


def _cell(ctx: DesignContext, shape: dict, size: float, tpp: float, key: str, *, per_target: bool = False):
    """(overrides, N, the recipe's plan) of a run of `shape` at tpp tokens per parameter of its own
    size (of the target size with per_target), or None when the recipe cannot give it min_steps
    steps (ctx.warnings says so)."""
    n = num_params(ModelConfig(**shape))
    tokens = ctx.round_tokens(tpp * (size if per_target else n))
    try:
        plan = _plan(ctx, n, tokens, key)
    except ConfigError:
        ctx.warnings.append(f"{key}: {n:,} params at {tpp:g} tokens/param is below recipe.min_steps; left out")
        return None
    over = {f"model.{k}": v for k, v in shape.items()} | {"train.num_tokens": tokens}
    return over, n, plan


def _plan(ctx: DesignContext, n: int, tokens: float, key: str) -> RunRecipe:
    return recipe_for_run(ctx.recipe, params=n, target_tokens=tokens, flops_budget=6.0 * n * tokens,
                          seq_len=ctx.seq_len, where=key)  # fmt: skip


def _section_cells(section: Any, key: str, values_key: str) -> tuple[list[tuple[float, float]], list[float]]:
    check_keys(section, ("cells", values_key), key)
    return _cells(section.get("cells"), f"{key}.cells"), _numbers(section, values_key, key)


def _required_cell(ctx: DesignContext, shape: dict, size: float, tpp: float, key: str, *, per_target: bool = False):
    """_cell of a cell the spec names, which must be trainable: a cell too short is the spec's error."""
    cell = _cell(ctx, shape, size, tpp, key, per_target=per_target)
    if cell is None:
        raise ConfigError(key, "too short for recipe.min_steps", "pick a longer cell")
    return cell


def _weight_decay_points(section: Any, ctx: DesignContext, key: str) -> list[Point]:
    if section is None:
        return []
    cells, timescales = _section_cells(section, key, "timescales")
    out = []
    for i, (size, tpp) in enumerate(cells):
        over, _, plan = _required_cell(ctx, ctx.shape(size, f"{key}.cells[{i}]"), size, tpp, f"{key}.cells[{i}]")
        for t in timescales:
            wd = float(f"{decay_for_timescale(t, plan.lr, plan.num_steps):.4g}")
            out.append(
                (
                    over | {"optim.lr": plan.lr, "optim.weight_decay": wd},
                    _labels("weight_decay", size, tpp, wd_timescale=t),
                )
            )
    return out


def _beta2_points(section: Any, ctx: DesignContext, key: str) -> list[Point]:
    if section is None:
        return []
    cells, values = _section_cells(section, key, "values")
    if any(not 0 < v < 1 for v in values):
        raise ConfigError(f"{key}.values", f"{values} must be in (0, 1)", "e.g. [0.95, 0.99, 0.999]")
    out = []
    for i, (size, tpp) in enumerate(cells):
        over, _, plan = _required_cell(ctx, ctx.shape(size, f"{key}.cells[{i}]"), size, tpp, f"{key}.cells[{i}]")
        out += [(over | {"optim.lr": plan.lr, "optim.beta2": v}, _labels("beta2", size, tpp, beta2=v)) for v in values]
    return out


def _shape_points(section: Any, ctx: DesignContext, key: str) -> list[Point]:
    if section is None:
        return []
    cells, layers = _section_cells(section, key, "layers")
    if any(not float(v).is_integer() for v in layers):
        raise ConfigError(f"{key}.layers", f"{layers} must be whole numbers", "e.g. [1, 2, 4, 8]")
    out = []
    for i, (size, tpp) in enumerate(cells):
        for depth in sorted({int(v) for v in layers}):
            shape = shape_at_depth(ctx, size, depth, f"{key}.layers")
            # one token count for every depth: only N moves with the shape (the analysis corrects for it)
            cell = _required_cell(ctx, shape, size, tpp, f"{key}.cells[{i}]", per_target=True)
            out.append((cell[0], _labels("shape", size, tpp, layers=depth)))
    return out


def shape_at_depth(ctx: DesignContext, target: float, depth: int, key: str) -> dict[str, Any]:
    """Model fields of `depth` layers at the width whose model is nearest `target` parameters."""
    model = ctx.base.get("model") or {}
    extra = {k: model[k] for k in SHAPE_PASSTHROUGH if k in model}
    extra.setdefault("max_seq_len", max(ctx.seq_len, 128))
    best = None
    for width in range(8, 4097, 8):
        if width % width_step(width) or width % head_dim_for_width(width):
            continue
        cfg = shape_for_width(depth, width, ctx.vocab_size, **extra)
        miss = abs(math.log(num_params(cfg) / target))
        if best is None or miss < best[0]:
            best = (miss, cfg)
    if best is None or best[0] > math.log(1.3):
        raise ConfigError(key, f"{depth} layer(s) cannot reach {target:.3g} params within 30%", "change the depths")
    cfg = best[1]
    return {k: getattr(cfg, k) for k in (*SHAPE_KEYS, "vocab_size", "max_seq_len", "mlp")}
