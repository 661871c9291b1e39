"""`scalelab sweep audit DIR`: what a recipe audit (a sweep with the `audit:` generator,
scalelab.sweeps.recipes.audit_grid) measured, and the recipe it recommends.

    result = audit_store("results/audit")          # reads the store; fits; nothing is trained
    print(format_audit(result))
    save_audit("results/audit", result)             # audit.json (the gate reads it), audit.txt, recipe.yaml

From the store's finished runs (a diverged run counts as an infinite loss at its setting):
- **LR**: per (N, D) cell the best LR (a parabola of ln loss in ln LR, scalelab.fitting.hp_laws.lr_law), the
  recipe's LR there and the loss it costs (from the cell's own parabola), the law
  ln lr* = a + b ln N + c ln D with its bootstrap intervals, and the per-size law (N only) beside it:
  their scatter about the cells says whether the horizon term is needed.
- **Weight decay**: per cell the best AdamW timescale 1 / (lr x wd) as a fraction of the run, the
  recipe's timescale there and its cost, and one constant best timescale over the cells (the rule
  of Wang & Aitchison 2024; scalelab.sweeps.recipes.recipe `weight_decay.timescale`).
- **beta2**: per cell the loss at each beta2 and the cost of the recipe's against the best.
- **Shape**: per cell the loss against the aspect ratio d_model / layers, each run's loss moved to
  the cell's target size by the frontier's d ln L / d ln N (the depths' widths cannot all hit it),
  the best aspect and the curvature: what `sweep plan` charges a design's shapes.
- **Frontier**: a Chinchilla law through the cells' best-LR losses, saved as a fit (`law`, `params`)
  so that an IsoFLOP design can be centred on its N*(C) (`isoflop.center: {fit: AUDIT_DIR}`).

The audited recipe (recipe.yaml) is the store's recipe with the fitted LR(N, D) rule, the best
weight-decay timescale and, where beta2 was checked, the best beta2 held in tokens at the checked
batch. Every figure comes with its interval; a cell whose optimum the grid does not bracket is
shown and left out of the laws.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import yaml

from scalelab import store
from scalelab.config_tree import from_dict, load_yaml
from scalelab.errors import UsageError
from scalelab.fitting.entry.fit_options import fit_options
from scalelab.fitting.estimate.fit import fit_law
from scalelab.fitting.hp_laws.lr_law import CellOptimum, OptimumLaw, cell_optima, fit_optimum_law
from scalelab.store.atomic import atomic_write_bytes
from scalelab.sweeps.recipes.recipe import Recipe, parse_recipe, peak_lr, timescale_of
from scalelab.train.config import OptimConfig

AUDIT_FILE = "audit.json"
LEVEL = 0.9
REL = 2e-3  # LRs within this relative distance are one (the 4 significant digits runs are given)


@dataclass(kw_only=True, slots=True)
class Beta2Check:
    params: float
    tokens: float
    batch_tokens: int
    losses: dict[float, float]  # beta2 -> final loss
    current: float  # the recipe's beta2 at this cell
    best: float

    @property
    def cost(self) -> float:
        """Relative loss of the recipe's beta2 over the best one measured here."""
        return self.losses[self.current] / self.losses[self.best] - 1 if self.current in self.losses else math.nan


@dataclass(kw_only=True)
class AuditResult:
    recipe: dict[str, Any]  # the recipe audited, as the spec gives it
    loss: str
    lr_cells: list[CellOptimum]
    recipe_lr: list[float]  # the recipe's LR at each LR cell
    lr_law: OptimumLaw | None  # ln lr* of ln N and ln D
    lr_law_size: OptimumLaw | None  # ln lr* of ln N alone (the per-size rule)
    wd_cells: list[CellOptimum] = field(default_factory=list)  # values: timescales (fractions of the run)
    recipe_timescale: list[float] = field(default_factory=list)
    wd_law: OptimumLaw | None = None  # a constant best timescale
    beta2: list[Beta2Check] = field(default_factory=list)
    shape_cells: list[CellOptimum] = field(default_factory=list)  # values: d_model / layers
    frontier: dict[str, Any] | None = None  # {"law": "chinchilla", "params": {...}}
    warnings: list[str] = field(default_factory=list)

    def shape_cost(self, aspect: float) -> float | None:
        """Relative loss of a model of aspect d_model / layers against the best aspect measured
        (the mean over the bracketed shape cells), or None when no shape cell is bracketed."""
        good = [c for c in self.shape_cells if c.bracketed]
        if not good:
            return None
        return float(np.mean([c.cost(aspect) for c in good]))

    def to_dict(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe,
            "loss": self.loss,
            "lr_cells": [_cell_dict(c) for c in self.lr_cells],
            "recipe_lr": self.recipe_lr,
            "lr_law": self.lr_law.to_dict() if self.lr_law else None,
            "lr_law_size": self.lr_law_size.to_dict() if self.lr_law_size else None,
            "wd_cells": [_cell_dict(c) for c in self.wd_cells],
            "recipe_timescale": [_num(t) for t in self.recipe_timescale],  # None: no decay (infinite)
            "wd_law": self.wd_law.to_dict() if self.wd_law else None,
            "beta2": [
                {
                    "params": b.params,
                    "tokens": b.tokens,
                    "batch_tokens": b.batch_tokens,
                    "current": b.current,
                    "best": b.best,
                    "losses": [[k, _num(v)] for k, v in b.losses.items()],
                }
                for b in self.beta2
            ],
            "shape_cells": [_cell_dict(c) for c in self.shape_cells],
            "frontier": self.frontier,
            "warnings": self.warnings,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AuditResult:
        """The result as save_audit wrote it (plain JSON; nothing is executed)."""
        try:
            law = {
                k: OptimumLaw.from_dict(data[k]) if data.get(k) else None for k in ("lr_law", "lr_law_size", "wd_law")
            }
            return cls(
                recipe=dict(data["recipe"]),
                loss=str(data["loss"]),
                lr_cells=[_cell_from(c) for c in data["lr_cells"]],
                recipe_lr=[float(x) for x in data["recipe_lr"]],
                wd_cells=[_cell_from(c) for c in data.get("wd_cells", [])],
                recipe_timescale=[_back(x, math.inf) for x in data.get("recipe_timescale", [])],
                beta2=[
                    Beta2Check(
                        params=float(b["params"]),
                        tokens=float(b["tokens"]),
                        batch_tokens=int(b["batch_tokens"]),
                        losses={float(k): _back(v, math.inf) for k, v in b["losses"]},
                        current=float(b["current"]),
                        best=float(b["best"]),
                    )
                    for b in data.get("beta2", [])
                ],
                shape_cells=[_cell_from(c) for c in data.get("shape_cells", [])],
                frontier=data.get("frontier"),
                warnings=[str(w) for w in data.get("warnings", [])],
                **law,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise UsageError(f"not a saved recipe audit ({e}); run `scalelab sweep audit DIR` again") from None


def _num(x: float) -> float | None:
    """A number for JSON: None for nan and infinities (what was not measured, or diverged)."""
    return float(x) if math.isfinite(x) else None


def _cell_dict(c: CellOptimum) -> dict[str, Any]:
    return {"params": c.params, "tokens": c.tokens, "x_opt": c.x_opt, "interval": [_num(v) for v in c.interval],
            "curvature": _num(c.curvature), "loss_opt": _num(c.loss_opt), "bracketed": c.bracketed, "grid": c.grid,
            "mean_loss": [_num(v) for v in c.mean_loss], "resid_sd": _num(c.resid_sd)}  # fmt: skip


def _back(x, missing: float = math.nan) -> float:
    return missing if x is None else float(x)


def _cell_from(d: dict[str, Any]) -> CellOptimum:
    return CellOptimum(
        params=float(d["params"]), tokens=float(d["tokens"]), x_opt=float(d["x_opt"]),
        interval=(_back(d["interval"][0]), _back(d["interval"][1])), curvature=_back(d["curvature"]),
        loss_opt=_back(d["loss_opt"], math.inf), bracketed=bool(d["bracketed"]), grid=[float(g) for g in d["grid"]],
        mean_loss=[_back(v, math.inf) for v in d["mean_loss"]], resid_sd=_back(d["resid_sd"]),
    )  # fmt: skip


# --------------------------------------------------------------------------------------------------
# Reading the store
# --------------------------------------------------------------------------------------------------


def _runs(sweep_dir: Path, loss: str) -> pl.DataFrame:
    """Finished and diverged runs with their audit labels, steps and loss (inf when diverged)."""
    df = store.load_runs(sweep_dir).filter(pl.col("status").is_in(["done", "diverged"]))
    if df.is_empty():
        raise UsageError(f"{sweep_dir}: no finished run yet; launch the audit's spec first")
    labels = [json.loads(t or "{}") for t in df["tags"].to_list()]
    value = [
        float(v) if s == "done" and v is not None and math.isfinite(v) else math.inf
        for v, s in zip(df[loss], df["status"])
    ]  # fmt: skip
    return df.with_columns(
        pl.Series("audit", [lab.get("audit", "") for lab in labels]),
        pl.Series("target", [float(lab.get("target_params", 0)) for lab in labels]),
        pl.Series("horizon", [float(lab.get("tokens_per_param", 0)) for lab in labels]),
        pl.Series("value", value),
        (pl.col("tokens") // pl.col("global_batch_tokens")).alias("steps"),
    )


def _same(a: float, b: float) -> bool:
    return abs(a / b - 1) <= REL


def audit_store(sweep_dir: str | Path, *, n_boot: int = 400, seed: int = 0) -> AuditResult:
    """Fit everything a recipe audit measured (module docstring); UsageError when it is not one."""
    sweep_dir = Path(sweep_dir)
    if not store.is_sweep_dir(sweep_dir):
        raise UsageError(f"{sweep_dir} is not a sweep directory (no sweep.yaml)")
    raw = load_yaml(str(store.SweepLayout(sweep_dir).spec))
    if "audit" not in raw or "recipe" not in raw:
        raise UsageError(f"{sweep_dir}: its spec has no audit: section (and recipe:); it is not a recipe audit")
    recipe = parse_recipe(raw["recipe"])
    loss = fit_options(raw.get("fit") or {}).loss
    runs = _runs(sweep_dir, loss)
    optim = from_dict(OptimConfig, ((raw.get("base") or {}).get("optim")) or {}, prefix="base.optim")
    lr = runs.filter(pl.col("audit") == "lr")
    cells = cell_optima(lr["params"], lr["tokens"], lr["lr"], lr["value"], n_boot=n_boot, level=LEVEL, seed=seed)
    result = AuditResult(
        recipe=raw["recipe"],
        loss=loss,
        lr_cells=cells,
        recipe_lr=[_recipe_lr(recipe, c.params, c.tokens) for c in cells],
        lr_law=_law(cells, ("params", "tokens"), n_boot, seed),
        lr_law_size=_law(cells, ("params",), n_boot, seed),
    )
    result.warnings += _law_warnings(cells)
    result.frontier = _frontier(cells, result.warnings)
    _weight_decay(result, runs, recipe, optim.weight_decay, n_boot, seed)
    _beta2(result, runs, recipe, optim.beta2)
    _shape(result, runs, recipe, n_boot, seed)
    return result


def _recipe_lr(recipe: Recipe, n: float, d: float) -> float:
    return float(f"{peak_lr(recipe, n, d):.4g}")


def _law(cells, terms, n_boot, seed) -> OptimumLaw | None:
    try:
        return fit_optimum_law(cells, terms=terms, n_boot=n_boot, level=LEVEL, seed=seed)
    except UsageError:
        return None


def _law_warnings(cells: list[CellOptimum]) -> list[str]:
    return [
        f"LR cell N={c.params:,.0f} D={c.tokens:,.0f}: best LR at the grid's edge ({c.x_opt:.3g}), not bracketed: "
        "left out of the law (widen audit.lr_multipliers)"
        for c in cells
        if not c.bracketed
    ]


def _frontier(cells: list[CellOptimum], warnings: list[str]) -> dict[str, Any] | None:
    """Chinchilla through the bracketed cells' best-LR losses (the pilot of an IsoFLOP centre)."""
    good = [c for c in cells if c.bracketed]
    if len(good) < 6:
        warnings.append(f"{len(good)} bracketed LR cells: too few for a frontier law (6 needed); no pilot N*(C)")
        return None
    data = {
        "params": np.array([c.params for c in good]),
        "tokens": np.array([c.tokens for c in good]),
        "loss": np.array([c.loss_opt for c in good]),
    }
    fit = fit_law("chinchilla", data)
    return {"law": "chinchilla", "params": {k: float(v) for k, v in fit.params.items()}, "n_points": len(good)}


def _weight_decay(result: AuditResult, runs: pl.DataFrame, recipe: Recipe, base_wd: float, n_boot, seed) -> None:
    """Cells of the weight-decay audit: every run at the cell's (N, D) and the recipe's LR and beta2,
    its value the timescale 1 / (lr wd) over the run's steps."""
    wd_rows = runs.filter(pl.col("audit") == "weight_decay")
    keys = sorted({(n, d) for n, d in zip(wd_rows["params"], wd_rows["tokens"])})
    ns, ds, xs, ys, current = [], [], [], [], {}
    for n, d in keys:
        want = _recipe_lr(recipe, n, d)
        beta2 = float(wd_rows.filter((pl.col("params") == n) & (pl.col("tokens") == d))["beta2"][0])
        at = runs.filter((pl.col("params") == n) & (pl.col("tokens") == d) & (pl.col("beta2") == beta2))
        for row in at.iter_rows(named=True):
            if _same(row["lr"], want):
                ns.append(n), ds.append(d), ys.append(row["value"])
                xs.append(timescale_of(row["weight_decay"], row["lr"], row["steps"]))
        steps = int(at["steps"][0])
        rule = recipe.weight_decay.timescale
        current[(n, d)] = rule if rule else timescale_of(base_wd, want, steps)
    if not keys:
        return
    result.wd_cells = cell_optima(ns, ds, xs, ys, n_boot=n_boot, level=LEVEL, seed=seed)
    result.recipe_timescale = [current[(c.params, c.tokens)] for c in result.wd_cells]
    result.wd_law = _law(result.wd_cells, (), n_boot, seed)
    result.warnings += [
        f"weight-decay cell N={c.params:,.0f} D={c.tokens:,.0f}: best timescale at the grid's edge ({c.x_opt:.3g})"
        for c in result.wd_cells
        if not c.bracketed
    ]


def _beta2(result: AuditResult, runs: pl.DataFrame, recipe: Recipe, base_beta2: float) -> None:
    rows = runs.filter(pl.col("audit") == "beta2")
    for n, d in sorted({(n, d) for n, d in zip(rows["params"], rows["tokens"])}):
        want = _recipe_lr(recipe, n, d)
        at = runs.filter((pl.col("params") == n) & (pl.col("tokens") == d) & (pl.col("audit").is_in(["lr", "beta2"])))
        losses = {float(r["beta2"]): r["value"] for r in at.iter_rows(named=True) if _same(r["lr"], want)}
        batch = int(at["global_batch_tokens"][0])
        rule = recipe.beta2
        current = (
            float(f"{min(rule.ref_beta2 ** (batch / rule.ref_batch_tokens), 0.9999):.6g}")
            if rule.ref_batch_tokens
            else base_beta2
        )
        result.beta2.append(Beta2Check(params=n, tokens=d, batch_tokens=batch, losses=dict(sorted(losses.items())),
                                       current=current, best=min(losses, key=losses.get)))  # fmt: skip


def _shape(result: AuditResult, runs: pl.DataFrame, recipe: Recipe, n_boot, seed) -> None:
    """Shape cells: loss against d_model / layers, moved to the target size by the frontier's slope."""
    rows = runs.filter(pl.col("audit") == "shape")
    for target, horizon in sorted({(t, h) for t, h in zip(rows["target"], rows["horizon"])}):
        tokens = float(rows.filter((pl.col("target") == target) & (pl.col("horizon") == horizon))["tokens"][0])
        at = runs.filter(
            (pl.col("tokens") == tokens) & (pl.col("target") == target) & (pl.col("horizon") == horizon)
            & pl.col("audit").is_in(["lr", "shape"])
        )  # fmt: skip
        # the recipe's own run at this cell (an LR-grid run at multiplier 1) is one of the depths
        keep = [
            a == "shape" or _same(lr, _recipe_lr(recipe, n, tokens))
            for a, lr, n in zip(at["audit"], at["lr"], at["params"])
        ]
        at = at.filter(pl.Series(keep))
        slope = _frontier_slope(result.frontier, target, tokens)
        if slope is None:
            result.warnings.append("shape cells: no frontier law, so the losses are not moved to one size")
            slope = 0.0
        aspect = (at["d_model"] / at["num_layers"]).to_numpy()
        moved = [v * (target / n) ** slope for v, n in zip(at["value"], at["params"])]
        cell = cell_optima([target] * len(moved), [tokens] * len(moved), aspect, moved, window=3, n_boot=n_boot,
                           level=LEVEL, seed=seed)  # fmt: skip
        result.shape_cells += cell


def _frontier_slope(frontier: dict[str, Any] | None, n: float, d: float) -> float | None:
    """d ln L / d ln N of the frontier's Chinchilla law at (N, D), or None without one."""
    if not frontier:
        return None
    p = frontier["params"]
    term = p["A"] * n ** -p["alpha"]
    return -p["alpha"] * term / (p["E"] + term + p["B"] * d ** -p["beta"])


# --------------------------------------------------------------------------------------------------
# The audited recipe, the files and the table
# --------------------------------------------------------------------------------------------------


def audited_recipe(result: AuditResult) -> dict[str, Any]:
    """The audited recipe: the audit's recipe with the fitted LR(N, D), the best weight-decay
    timescale and the best beta2 held in tokens (each only where the audit measured it)."""
    out = copy.deepcopy(result.recipe)
    law = result.lr_law
    if law is not None:
        out["lr"] = {
            "ref_params": float(f"{law.ref_params:.4g}"),
            "ref_lr": float(f"{math.exp(law.coef[0]):.4g}"),
            "exponent": round(float(law.coef[1]), 3),
            "ref_num_tokens": float(f"{law.ref_tokens:.4g}"),
            "tokens_exponent": round(float(law.coef[2]), 3),
        }
    if result.wd_law is not None:
        out["weight_decay"] = {"timescale": float(f"{math.exp(result.wd_law.coef[0]):.3g}")}
    if result.beta2:
        check = min(result.beta2, key=lambda b: b.batch_tokens)  # the smallest batch: where beta2 matters
        out["beta2"] = {"ref_batch_tokens": check.batch_tokens, "ref_beta2": check.best}
    return out


def save_audit(sweep_dir: str | Path, result: AuditResult, text: str | None = None) -> Path:
    """audit.json (what the recipe gate and an IsoFLOP centre read), audit.txt and recipe.yaml."""
    sweep_dir = Path(sweep_dir)
    body = json.dumps(result.to_dict(), indent=1, allow_nan=False)  # standard JSON: other tools read it too
    atomic_write_bytes(sweep_dir / AUDIT_FILE, (body + "\n").encode())
    atomic_write_bytes(sweep_dir / "audit.txt", ((text or format_audit(result)) + "\n").encode())
    recipe = yaml.safe_dump({"recipe": audited_recipe(result)}, sort_keys=False, default_flow_style=None)
    atomic_write_bytes(sweep_dir / "recipe.yaml", recipe.encode())
    return sweep_dir / AUDIT_FILE


def load_audit(path: str | Path) -> AuditResult:
    """A saved audit: an audit store's directory (its audit.json) or the file itself."""
    path = Path(path)
    if path.is_dir():
        path = path / AUDIT_FILE
    if not path.is_file():
        raise UsageError(f"{path}: no recipe audit here; run `scalelab sweep audit DIR` on the audit's store first")
    try:
        data = json.loads(path.read_text())
    except ValueError:
        raise UsageError(f"{path}: not JSON; run `scalelab sweep audit DIR` again") from None
    return AuditResult.from_dict(data)


def _interval(c: CellOptimum) -> str:
    if not c.bracketed:
        return "not bracketed"
    return f"[{c.interval[0]:.3g}, {c.interval[1]:.3g}]" if math.isfinite(c.interval[0]) else "3 points: none"


def _cost(c: CellOptimum, x: float) -> str:
    return f"{c.cost(x):+.2%}" if c.bracketed else "-"


def _law_line(law: OptimumLaw | None, unit: str) -> str:
    if law is None:
        return "not fitted (too few bracketed cells)"
    parts = [f"{math.exp(law.coef[0]):.3g}"]
    for j, t in enumerate(law.terms, 1):
        ref = law.ref_params if t == "params" else law.ref_tokens
        lo, hi = law.slope_interval(t)
        parts.append(f"({'N' if t == 'params' else 'D'} / {ref:.3g})^{law.coef[j]:.3f} [{lo:.3f}, {hi:.3f}]")
    return f"{unit} = " + " ".join(parts) + f"; the cells' scatter about it {law.resid_sd:.3f} in ln"


def format_audit(result: AuditResult) -> str:
    """The audit's table (what `scalelab sweep audit` prints)."""
    pct = f"{LEVEL:.0%}"
    lines = [
        f"Recipe audit (loss: {result.loss}; intervals: {pct} bootstrap; cost = relative loss of the recipe's "
        "setting over the best, from the cell's parabola in ln(setting))",
        "best LR by size and horizon",
        f"{'N':>9} {'D':>11} {'D/N':>6} {'recipe LR':>9} {'best LR':>9} {'interval':>20} {'recipe/best':>11} "
        f"{'cost':>7} {'noise':>6}",
    ]
    for c, lr in zip(result.lr_cells, result.recipe_lr):
        lines.append(
            f"{c.params:>9,.0f} {c.tokens:>11,.0f} {c.tokens / c.params:>6.1f} {lr:>9.3g} {c.x_opt:>9.3g} "
            f"{_interval(c):>20} {lr / c.x_opt:>11.2f} {_cost(c, lr):>7} "
            + (f"{c.resid_sd:>6.2%}" if math.isfinite(c.resid_sd) else f"{'':>6}")
        )
    lines += [
        "fitted LR(N, D): " + _law_line(result.lr_law, "lr*"),
        "per-size law (N only): " + _law_line(result.lr_law_size, "lr*"),
    ]
    lines += _wd_lines(result) + _beta2_lines(result) + _shape_lines(result)
    if result.frontier:
        p = result.frontier["params"]
        lines.append(
            f"frontier (Chinchilla through {result.frontier['n_points']} cells' best-LR losses): E {p['E']:.3g}, "
            f"A {p['A']:.3g}, B {p['B']:.3g}, alpha {p['alpha']:.3f}, beta {p['beta']:.3f}"
        )
    lines.append("audited recipe: " + json.dumps(audited_recipe(result)))
    lines += [f"warning: {w}" for w in result.warnings]
    return "\n".join(lines)


def _wd_lines(result: AuditResult) -> list[str]:
    if not result.wd_cells:
        return []
    out = [
        "weight decay: AdamW timescale 1 / (lr wd) as a fraction of the run",
        f"{'N':>9} {'D':>11} {'D/N':>6} {'recipe':>9} {'best':>9} {'interval':>20} {'cost':>7}",
    ]
    for c, t in zip(result.wd_cells, result.recipe_timescale):
        out.append(
            f"{c.params:>9,.0f} {c.tokens:>11,.0f} {c.tokens / c.params:>6.1f} {t:>9.3g} {c.x_opt:>9.3g} "
            f"{_interval(c):>20} {_cost(c, t):>7}"
        )
    law = result.wd_law
    if law is None:
        out.append("best timescale: not fitted (fewer than 2 bracketed cells)")
    else:
        best, lo, hi = law.predict()
        out.append(f"best timescale over the cells: {best:.3g} [{lo:.3g}, {hi:.3g}] of the run (Wang & Aitchison 2024)")
    return out


def _beta2_lines(result: AuditResult) -> list[str]:
    if not result.beta2:
        return []
    out = ["beta2 at small batches (final loss per beta2)"]
    for b in result.beta2:
        cells = ", ".join(f"{k:g}: {v:.4f}" for k, v in b.losses.items())
        out.append(
            f"  N={b.params:,.0f} D/N={b.tokens / b.params:.1f} batch {b.batch_tokens} tokens: {cells}; "
            f"best {b.best:g}; the recipe's {b.current:g} costs {b.cost:+.2%}"
        )
    return out


def _shape_lines(result: AuditResult) -> list[str]:
    out = []
    for c in result.shape_cells:
        cells = ", ".join(f"{g:.3g}: {v:.4f}" for g, v in zip(c.grid, c.mean_loss))
        best = (
            f"best aspect {c.x_opt:.3g} {_interval(c)}, curvature {c.curvature:.3g}" if c.bracketed else "not bracketed"
        )
        out.append(
            f"shape at N={c.params:,.0f} D={c.tokens:,.0f} (loss by d_model/layers, moved to N): {cells}; {best}"
        )
    return out
