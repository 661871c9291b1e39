"""The `isoflop:` generator of a sweep spec: per FLOP budget, distinct model sizes around a centre.

Each budget C gets `num_sizes` target sizes (from `center` and `span`, or a `params` /
`tokens_per_param` range), each target the shape rule's pick among shapes not yet used at that
budget, and D = C / FLOPs-per-token rounded to whole optimizer steps. `tolerance` bounds how far a
run's FLOPs may fall from its budget after that rounding.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from scalelab.errors import ConfigError, UsageError
from scalelab.fitting.allocation.allocate import optimum_for_law
from scalelab.fitting.entry.saved_fit import load_saved_fit
from scalelab.fitting.forms.laws import get_law
from scalelab.models.accounting import flops_per_token
from scalelab.models.config import ModelConfig
from scalelab.store.paths import SweepLayout
from scalelab.sweeps.recipes.recipe_audit import AUDIT_FILE, load_audit
from scalelab.sweeps.specs.design_context import DesignContext, Point
from scalelab.sweeps.specs.runspec import RunSpec
from scalelab.sweeps.specs.spec_checks import as_list, check_keys, number


def _isoflop_targets(section: dict, budgets: list[float], num_sizes: int, key: str) -> list[list[float]]:
    """Target sizes per budget from exactly one of `center`, `params` or `tokens_per_param`."""
    given = [k for k in ("center", "params", "tokens_per_param") if k in section]
    if len(given) != 1:
        raise ConfigError(
            f"{key}.center",
            "give exactly one of center: {tokens_per_param: T} | {params: [...]} | {fit: SWEEP_DIR}, "
            "params: [lo, hi] or "
            "tokens_per_param: [lo, hi]",
            "e.g. center: {tokens_per_param: 20} with span: 3",
        )
    if given[0] == "center":
        center, ckey = section["center"], f"{key}.center"
        check_keys(center, ("tokens_per_param", "params", "fit"), ckey)
        span = number(section.get("span", 3.0), f"{key}.span")
        if span <= 1:
            raise ConfigError(f"{key}.span", f"{span:g} must be > 1", "e.g. 3 (sizes from N*/3 to 3 N*)")
        if len(center) != 1:
            raise ConfigError(
                ckey, "give one of tokens_per_param, params or fit", "e.g. center: {tokens_per_param: 20}"
            )
        if "fit" in center:
            centers = _fit_centers(center["fit"], budgets, f"{ckey}.fit")
        elif "tokens_per_param" in center:
            tpp = number(center["tokens_per_param"], f"{ckey}.tokens_per_param")
            centers = [math.sqrt(c / (6 * tpp)) for c in budgets]  # C = 6 N (tpp N)
        else:
            raw = as_list(center["params"], f"{ckey}.params", min_len=len(budgets))
            if len(raw) != len(budgets):
                raise ConfigError(f"{ckey}.params", f"{len(raw)} centres for {len(budgets)} budgets", "one per budget")
            centers = [number(v, f"{ckey}.params[{i}]") for i, v in enumerate(raw)]
        offsets = np.linspace(-1.0, 1.0, num_sizes) if num_sizes > 1 else np.zeros(1)
        return [[float(n * span**o) for o in offsets] for n in centers]
    if "span" in section:
        raise ConfigError(f"{key}.span", "only applies with center", "remove it or use center: {...}")
    range_key = given[0]
    lo, hi = (number(v, f"{key}.{range_key}") for v in as_list(section[range_key], f"{key}.{range_key}", min_len=2)[:2])
    if hi < lo:
        raise ConfigError(f"{key}.{range_key}", f"[{lo:g}, {hi:g}] is reversed", "give [low, high]")
    if range_key == "tokens_per_param":  # C = 6 N (t N)  =>  N = sqrt(C / 6t); high t = small N
        return [[math.sqrt(c / (6 * t)) for t in np.geomspace(hi, lo, num_sizes)] for c in budgets]
    return [list(np.geomspace(lo, hi, num_sizes)) for _ in budgets]


def read_frontier(source: Any, key: str) -> dict[str, Any]:
    """A fitted law of (N, D) to allocate with ({"law", "params"}): a sweep's latest `sweep next` fit
    (a sweep dir), a recipe audit's frontier (an audit store: its audit.json, written by
    `scalelab sweep audit`) or a fit JSON file; ConfigError naming `key` otherwise."""
    path = Path(str(source)).expanduser()
    if path.is_dir():
        fits = SweepLayout(path).round_fits()
        if not fits and not (path / AUDIT_FILE).is_file():
            raise ConfigError(
                key,
                f"{path} has no fits/round_*.json nor {AUDIT_FILE}",
                "run `scalelab sweep next` (or `sweep audit`) on it",
            )
        path = fits[-1] if fits else path / AUDIT_FILE
    if not path.is_file():
        raise ConfigError(key, f"{source!r} is neither a sweep directory nor a fit file", "give a sweep directory")
    try:
        if path.name == AUDIT_FILE:
            fit = load_saved_fit(load_audit(path).frontier or {}, name=f"{path} frontier")
        else:
            fit = load_saved_fit(path)
        optimum_for_law(get_law(fit.law))
    except (ValueError, KeyError, TypeError, AttributeError, UsageError) as e:
        raise ConfigError(key, f"not a fit of (N, D) to allocate with: {e}", "give a sweep directory") from None
    return {"law": fit.law, "params": {k: float(v) for k, v in fit.params.items()}, "source": str(path)}


def _fit_centers(source: Any, budgets: list[float], key: str) -> list[float]:
    """N*(C) at each budget of the law read_frontier reads from `source`."""
    fit = read_frontier(source, key)
    optimum = optimum_for_law(get_law(fit["law"]))
    return [float(optimum(fit["params"], c)[0]) for c in budgets]


def distinct_shapes(ctx: DesignContext, targets: list[float], key: str) -> list[dict[str, Any]]:
    """One shape per target, all distinct: each target takes the shape rule's pick among the shapes
    not yet used (so two nearby targets get neighbouring shapes instead of one)."""
    used: set[tuple[int, int]] = set()
    shapes = []
    for target in sorted(targets):
        shape = ctx.shape(target, key, exclude=frozenset(used))
        used.add((shape["num_layers"], shape["d_model"]))
        shapes.append(shape)
    return shapes


def isoflop_points(section: Any, ctx: DesignContext, key: str) -> list[Point]:
    check_keys(
        section,
        ("budgets", "num_sizes", "tokens_per_param", "params", "center", "span", "flops", "tolerance", "min_steps"),
        key,
    )
    given = as_list(section.get("budgets"), f"{key}.budgets")
    budgets = [number(v, f"{key}.budgets[{i}]") for i, v in enumerate(given)]
    num_sizes = int(number(section.get("num_sizes", 5), f"{key}.num_sizes"))
    flops_kind = section.get("flops", "6n")
    if flops_kind not in ("6n", "exact"):
        raise ConfigError(f"{key}.flops", f"{flops_kind!r} unknown", "use 6n or exact")
    if ctx.recipe is not None and "min_steps" in section:
        raise ConfigError(f"{key}.min_steps", "the spec has a recipe", "set recipe.min_steps instead")
    min_steps = int(number(section.get("min_steps", 4), f"{key}.min_steps"))
    targets_per_budget = _isoflop_targets(section, budgets, num_sizes, key)
    out = []
    for b, (budget, targets) in enumerate(zip(budgets, targets_per_budget)):
        bkey = f"{key}.budgets[{b}]"
        try:
            shapes = distinct_shapes(ctx, targets, bkey)
        except ConfigError as e:
            why = str(e).split(": ", 2)[-1].split(";")[0]
            if "params" in section:
                raise ConfigError(f"{key}.params", why, "narrow the size range") from None
            raise ConfigError(
                bkey,
                f"budget {budget:.3g} is too small for the smallest size ({why})",
                "raise the budget or lower the tokens_per_param range",
            ) from None
        for s, (target, shape) in enumerate(zip(sorted(targets), shapes)):
            fpt = flops_per_token(ModelConfig(**shape), ctx.seq_len)
            per_token = fpt.six_n if flops_kind == "6n" else fpt.exact
            tokens = ctx.round_tokens(budget / per_token)
            if ctx.recipe is None and tokens // ctx.tokens_per_step < min_steps:
                raise ConfigError(
                    bkey,
                    f"budget {budget:.3g} is too small for size {fpt.six_n / 6:,.0f}: "
                    f"{tokens // ctx.tokens_per_step} step(s) of {ctx.tokens_per_step} tokens (min_steps={min_steps})",
                    "raise the budget, narrow the size range or lower train.global_batch_tokens",
                )
            over = {f"model.{k}": v for k, v in shape.items()} | {"train.num_tokens": tokens}
            out.append((over, {"flops_budget": budget, "target_params": round(target), "size_index": s}))
    return out


def check_isoflop_tolerance(section: dict, runs: list[RunSpec]) -> None:
    tol = number(section.get("tolerance", 0.05), "isoflop.tolerance")
    kind = section.get("flops", "6n")
    for run in runs:
        budget = run.labels.get("flops_budget")
        if budget is None or run.labels.get("branch_of"):
            continue
        flops = run.flops_6n if kind == "6n" else run.flops_exact
        if abs(flops / budget - 1) > tol:
            raise ConfigError(
                "isoflop.tolerance",
                f"run {run.run_id} ({run.params:,} params, {run.num_tokens:,} tokens) "
                f"uses {flops:.4g} FLOPs, {flops / budget - 1:+.1%} off budget {budget:.3g}",
                "raise the budget, lower train.global_batch_tokens, or loosen the tolerance",
            )
