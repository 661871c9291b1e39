"""The LR-transfer gate: before a ladder spends its compute, check that its best LR transfers across width.

A sweep spec opts in with a `transfer:` section:

    base: {model: {parametrization: mup}, ...}
    ladder: {sizes: [3e4, 1e5, 4e5], tokens_per_param: [20]}
    transfer:
      check: true
      widths: [32, 256]          # d_model values to compare (default: the ladder's smallest and largest)
      depths: [2]                # num_layers of the check's models (default: the ladder's smallest depth)
      lrs: [2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2]   # the LR grid (ascending; x2 apart is the usual step)
      tolerance: 1               # grid steps the best LR may move from the base (smallest) size
      tokens_per_param: 20       # every check model trains on this many tokens per parameter
      seeds: 1                   # inits per (size, LR): train.seed = base seed + k; best_lr fits every seed

`scalelab sweep launch` then first trains the LR grid at every (width, depth) of the check, models of
the shape rule (scalelab.models.shapes.shape_for_width) at the same tokens per parameter and with
the spec's base config and recipe, into the sibling sweep directory `<out>-transfer` (ordinary
runs of the store: deduplicated, resumable, listed by `sweep status`). Per size the best LR is
the vertex of a parabola of the final loss (the spec's `fit.loss`) in log LR around the grid's
minimum, with a bootstrap interval (scalelab.fitting.hp_laws.hyperparams.best_lr, the estimator
experiments/lr_transfer.py uses too); the drift of a size is the distance in grid steps (fractional)
between its best LR and the base size's. When any drift exceeds the tolerance, or a size's
minimum is not bracketed (its best grid LR on the grid's edge, or no interior vertex: then the
drift is not measured), launch refuses with exit 2 and the table, unless `--force`. Otherwise the
ladder's runs all take the base size's best LR (3 significant digits; `optim.lr`, overriding a
recipe's LR rule) with the check's base shape
(model.base_d_model / base_num_layers / base_head_dim / base_d_ff = the smallest width and depth), which is
exactly the LR transfer µP (width) and CompleteP (width and depth) promise.

Under `sp` no such transfer exists; the check shows it (the best LR falls as the width grows).
The SP alternative is a fitted LR law per size (sweeps/recipes/recipe.py `lr:` rule, fitted by
`lr_law_from_runs`; see docs/hp-transfer.md).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from scalelab.errors import ConfigError
from scalelab.fitting.hp_laws.hyperparams import best_lr, grid_position
from scalelab.models.accounting import num_params
from scalelab.models.shapes import base_shape, shape_for_width
from scalelab.store import objects
from scalelab.sweeps.specs.spec import Sweep, expand_sweep
from scalelab.sweeps.specs.spec_checks import as_list, check_keys, number

TRANSFER_KEYS = ("check", "widths", "depths", "lrs", "tolerance", "tokens_per_param", "seeds")


@dataclass(kw_only=True, slots=True)
class TransferSpec:
    widths: list[int]
    depths: list[int]
    lrs: list[float]  # ascending
    tolerance: int  # grid steps
    tokens_per_param: float
    seeds: int = 1  # runs per (size, LR), train.seed = base seed + k

    @property
    def base_width(self) -> int:
        return min(self.widths)

    @property
    def base_depth(self) -> int:
        return min(self.depths)


@dataclass(kw_only=True, slots=True)
class TransferPlan:
    """The check (a sweep of its own) and what the ladder takes from it."""

    spec: TransferSpec
    sweep: Sweep  # the LR grid at every (width, depth)
    parametrization: str
    raw: dict[str, Any]  # the ladder's spec, `transfer` section included
    warnings: list[str]


@dataclass(kw_only=True, slots=True)
class GateResult:
    # per size: width, depth, params, losses per LR (mean over seeds; inf when any diverged),
    # best_index (the grid's minimum), best_lr (the vertex), interval, drift (grid steps from the
    # base's best LR, fractional)
    rows: list[dict[str, Any]]
    base_lr: float  # best LR of the base size (3 significant digits): what the ladder takes
    max_drift: float
    edge: list[str]  # sizes whose minimum is not bracketed by the grid
    tolerance: int
    parametrization: str
    seeds: int = 1

    @property
    def ok(self) -> bool:
        return self.max_drift <= self.tolerance + 1e-6 and not self.edge


def _int_list(value: Any, key: str) -> list[int]:
    out = []
    for i, v in enumerate(as_list(value, key)):
        x = number(v, f"{key}[{i}]", example="64")
        if not x.is_integer():
            raise ConfigError(f"{key}[{i}]", f"{v!r} is not a whole number", "e.g. 64")
        out.append(int(x))
    return out


def parse_transfer(section: Any, ladder: Sweep) -> TransferSpec | None:
    """The `transfer:` section checked (None when absent or `check: false`); ConfigError names the key."""
    if section is None:
        return None
    check_keys(section, TRANSFER_KEYS, "transfer")
    check = section.get("check", True)
    if not isinstance(check, bool):
        raise ConfigError("transfer.check", f"{check!r} is not true or false", "write check: true")
    if not check:
        return None
    models = [r.config["model"] for r in ladder.runs]
    if "widths" in section:
        widths = _int_list(section["widths"], "transfer.widths")
    else:
        widths = sorted({min(m["d_model"] for m in models), max(m["d_model"] for m in models)})
    if len(set(widths)) < 2 and "depths" not in section:
        raise ConfigError("transfer.widths", f"{widths} is one width: nothing to transfer to", "give two widths")
    depths = (
        _int_list(section["depths"], "transfer.depths")
        if "depths" in section
        else [min(m["num_layers"] for m in models)]
    )
    if "lrs" not in section:
        raise ConfigError("transfer.lrs", "missing", "give the LR grid, e.g. lrs: [2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2]")
    lrs = [
        number(v, f"transfer.lrs[{i}]", example="4e-3") for i, v in enumerate(as_list(section["lrs"], "transfer.lrs"))
    ]
    if len(lrs) < 3:
        raise ConfigError("transfer.lrs", f"{len(lrs)} LR(s) cannot bracket a best LR", "give 5-7 LRs x2 apart")
    if any(b <= a for a, b in zip(lrs, lrs[1:])) or lrs[-1] >= 1:
        raise ConfigError("transfer.lrs", f"{lrs} must be ascending and below 1", "e.g. [2e-3, 4e-3, 8e-3, 1.6e-2]")
    tol = number(section.get("tolerance", 1), "transfer.tolerance", positive=False, example="1")
    if tol < 0 or not tol.is_integer():
        raise ConfigError("transfer.tolerance", f"{tol!r} must be a whole number of grid steps >= 0", "e.g. 1")
    tpp = number(section.get("tokens_per_param", 20), "transfer.tokens_per_param", example="20")
    seeds = number(section.get("seeds", 1), "transfer.seeds", example="2")
    if not seeds.is_integer():
        raise ConfigError("transfer.seeds", f"{seeds!r} is not a whole number of seeds", "e.g. seeds: 2")
    return TransferSpec(
        widths=widths, depths=depths, lrs=lrs, tolerance=int(tol), tokens_per_param=tpp, seeds=int(seeds)
    )


def _base_shape(spec: TransferSpec) -> dict[str, int]:
    return base_shape(spec.base_width, spec.base_depth)


def plan_transfer(raw: dict[str, Any], ladder: Sweep) -> TransferPlan | None:
    """The check's sweep for a spec with `transfer:` (validated, nothing written), or None."""
    spec = parse_transfer(raw.get("transfer"), ladder)
    if spec is None:
        return None
    axes = raw.get("axes") or {}
    if "optim.lr" in axes:
        raise ConfigError("axes.optim.lr", "the transfer check sets the ladder's LR", "remove axes.optim.lr")
    models = [r.config["model"] for r in ladder.runs]
    model0 = models[0]
    vocab, max_seq = model0["vocab_size"], model0["max_seq_len"]
    base = copy.deepcopy(raw.get("base") or {})
    base.setdefault("model", {}).update(_base_shape(spec))
    for k in ("preset", "target_params"):
        base["model"].pop(k, None)
    points = []
    keys = ("num_layers", "d_model", "num_heads", "num_kv_heads", "d_ff")
    for depth in spec.depths:
        for width in spec.widths:
            try:
                shape = shape_for_width(depth, width, vocab, max_seq_len=max_seq)
            except ConfigError as e:
                raise ConfigError(
                    "transfer.widths", f"{width}: {str(e).split(': ', 1)[-1]}", "use multiples of 16"
                ) from None
            tokens = int(round(spec.tokens_per_param * num_params(shape)))
            for lr in spec.lrs:
                point = {f"model.{k}": getattr(shape, k) for k in keys} | {"model.max_seq_len": max_seq}
                point |= {"train.num_tokens": tokens, "optim.lr": lr}
                point["labels"] = {"transfer": True, "d_model": width, "num_layers": depth, "lr": lr}
                points.append(point)
    name = str(raw.get("name") or "sweep")
    # the spec's own seeds axis: every point k times, train.seed = base seed + k
    check_raw = {"name": f"{name}-transfer", "base": base, "points": points, "seeds": spec.seeds}
    for k in ("recipe", "execution", "fit"):
        if k in raw:
            check_raw[k] = raw[k]
    try:
        sweep = expand_sweep(check_raw, default_name=f"{name}-transfer")
    except ConfigError as e:
        raise ConfigError(f"transfer: {e.key}", str(e).split(": ", 1)[-1]) from None
    parametrization = model0.get("parametrization", "sp")
    warnings = []
    widest, deepest = max(m["d_model"] for m in models), max(m["num_layers"] for m in models)
    if widest > max(spec.widths):
        warnings.append(f"the ladder reaches d_model {widest}; transfer.widths only checks up to {max(spec.widths)}")
    if deepest > max(spec.depths):
        warnings.append(
            f"the ladder reaches {deepest} layers; the check's models have at most {max(spec.depths)} "
            "(mup transfers across width only: use completep with transfer.depths to check depth)"
        )
    return TransferPlan(spec=spec, sweep=sweep, parametrization=parametrization, raw=raw, warnings=warnings)


def transfer_dir(out: str | Path) -> str | Path:
    """Where the check's runs go: a sibling sweep of `out` in the same store root (a sibling prefix
    on object storage)."""
    if objects.is_url(out):
        return f"{out.rstrip('/')}-transfer"
    out = Path(out)
    return out.parent / f"{out.name}-transfer"


def evaluate_gate(plan: TransferPlan, df) -> GateResult:
    """Best LR per size from the check's run table (scalelab.store.load_runs) and the drifts."""
    loss_col = plan.sweep.fit.loss
    spec = plan.spec
    rows = []
    for depth in spec.depths:
        for width in spec.widths:
            sub = df.filter((pl.col("d_model") == width) & (pl.col("num_layers") == depth))
            losses, xs, ys = {}, [], []
            for lr in spec.lrs:
                hit = sub.filter((pl.col("lr") - lr).abs() <= 1e-9 * lr)
                values = [
                    float(v) if v is not None and math.isfinite(v) and status == "done" else math.inf
                    for v, status in zip(hit[loss_col], hit["status"])
                ] or [math.inf]
                # a seed that diverged (or has not run) makes its LR unusable: never the best
                losses[lr] = sum(values) / len(values)
                xs += [lr] * len(values)
                ys += values
            best = min(range(len(spec.lrs)), key=lambda i: losses[spec.lrs[i]])
            opt = best_lr(xs, ys) if math.isfinite(losses[spec.lrs[best]]) else None
            params = int(sub["params"][0]) if sub.height else 0
            rows.append(dict(width=width, depth=depth, params=params, losses=losses, best_index=best,
                             best_lr=opt.lr if opt else math.nan, interval=opt.interval if opt else (math.nan,) * 2,
                             interior=bool(opt and opt.interior),
                             position=grid_position(opt.lr, spec.lrs) if opt else math.nan))  # fmt: skip
    base = next(r for r in rows if r["width"] == spec.base_width and r["depth"] == spec.base_depth)
    for r in rows:
        r["drift"] = r["position"] - base["position"]
    edge = [f"d_model {r['width']} x {r['depth']} layers" for r in rows if not r["interior"]]
    drifts = [abs(r["drift"]) for r in rows]
    return GateResult(
        rows=rows,
        base_lr=float(f"{base['best_lr']:.3g}"),
        max_drift=max(drifts) if all(math.isfinite(d) for d in drifts) else math.inf,
        edge=edge,
        tolerance=spec.tolerance,
        parametrization=plan.parametrization,
        seeds=spec.seeds,
    )


def format_gate(gate: GateResult, lrs: list[float], loss_col: str = "final_val_loss") -> str:
    """The table of the check: loss per LR and size, the best LR (*), its drift in grid steps."""
    head = (
        f"{'d_model':>7} {'layers':>6} {'N':>9} "
        + " ".join(f"{lr:>8.3g}" for lr in lrs)
        + f" {'best LR':>8} {'interval':>17} {'drift':>6}"
    )
    lines = [
        f"LR transfer check ({gate.parametrization}; {loss_col}"
        + (f", mean of {gate.seeds} seeds" if gate.seeds > 1 else "")
        + "; * = grid minimum; best LR = parabola vertex in log LR over every seed, 90% bootstrap "
        "interval; drift in grid steps)",
        head,
    ]
    for r in gate.rows:
        cells = " ".join(
            f"{'diverged' if not math.isfinite(r['losses'][lr]) else format(r['losses'][lr], '.4f')}"
            f"{'*' if i == r['best_index'] else ' '}".rjust(9)
            for i, lr in enumerate(lrs)
        )
        lo, hi = r["interval"]
        lines.append(
            f"{r['width']:>7} {r['depth']:>6} {r['params']:>9,} {cells} {r['best_lr']:>8.3g} "
            f"{f'[{lo:.3g}, {hi:.3g}]':>17} {r['drift']:>+6.2f}"
        )
    verdict = "passes" if gate.ok else "FAILS"
    lines.append(
        f"max drift {gate.max_drift:.2f} grid step(s), tolerance {gate.tolerance}: {verdict}"
        + (f"; no bracketed minimum for {', '.join(gate.edge)} (widen transfer.lrs)" if gate.edge else "")
        + (f"; the ladder takes lr {gate.base_lr:.3g}" if gate.ok else "")
    )
    return "\n".join(lines)


def ladder_with_lr(plan: TransferPlan, lr: float) -> Sweep:
    """The ladder re-expanded with every run at `lr` and the check's base shape."""
    raw = copy.deepcopy(plan.raw)
    raw.pop("transfer", None)
    base = raw.setdefault("base", {})
    base.setdefault("model", {}).update(_base_shape(plan.spec))
    raw.setdefault("axes", {})["optim.lr"] = [float(f"{lr:.6g}")]
    return expand_sweep(raw, default_name=str(raw.get("name") or "sweep"))
