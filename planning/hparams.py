"""Learning rate and batch of a planned run, each with its interval and what being off costs in loss.

    hp = recipe_hparams(lr=3.6e-3, batch_tokens=1024, params=1e6, recipe=recipe, sweep=table)
    hp = table_hparams(read_hp_table("gpt3_recipe.csv"), params=7e10, sweep=table)
    hp.lr.value, hp.lr.interval, hp.lr.edge_cost()      # log-loss cost at the interval's edge

Where the values come from (the plan names the source of each):
  - a sweep with a recipe (scalelab.sweeps.recipes.recipe): the recipe's LR and batch for the planned run,
    exactly as its runs were built (the law's losses were measured at the recipe's choices). The
    LR's interval is where the best LR may lie: the recipe's LR times [1/r, r], r the largest
    ratio between the recipe's LR and the best LR measured by an LR sweep (`--hp-sweep`: the
    parabola vertex in log LR per size, scalelab.fitting.hp_laws.hyperparams.best_lr). Without an LR sweep
    the interval is unknown and the plan says so. The batch is the recipe's rule, as the sweep's.
  - a table of a family's recipe (`--hp-table`: params, lr, batch_tokens per model, e.g. GPT-3's
    Table 2.1): lines of log LR and log batch against log N (scalelab.fitting.hp_laws.hyperparams
    .fit_hyperparam_law), the planned N's value with its 95% prediction interval (a new size's
    choice scatters around the line as the family's did).
  - a µP / CompleteP sweep with an LR-transfer check (scalelab.sweeps.recipes.transfer): every run takes the
    base size's best LR; its interval is the check's bootstrap interval of that best LR (90%, as the
    gate reports it), the curvature the parabola of the base size's losses over the check's LR grid.
  - neither: DeepSeek LLM's fitted laws against compute, lr = 0.3118 C^-0.125 and
    B = 0.2920 C^0.3271 tokens (Bi et al. 2024, C in non-embedding FLOPs), without an interval.

What being off costs: near its optimum the loss is a parabola in log2 of a hyperparameter,
log L = log L* + k (log2(h / h*))^2, with k per hyperparameter the median of the curvatures an HP
sweep measured (`--hp-sweep`: a CSV of params, lr, loss[, batch_tokens]; per size, the rows that vary
one hyperparameter with the other fixed, a parabola of log loss in log2 h over the best value and up
to two neighbours on each side, k its leading coefficient when positive). The cost at an interval's
edge is k (log2 r)^2 in log loss, r the edge's ratio to the value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from scalelab.errors import UsageError
from scalelab.sweeps.recipes.recipe import Recipe, peak_lr

DEEPSEEK_LR = (0.3118, -0.1250)  # lr = 0.3118 C^-0.125 (DeepSeek LLM 2024, Bi et al., section 3.1)
DEEPSEEK_BATCH = (0.2920, 0.3271)  # B = 0.2920 C^0.3271 tokens
WINDOW = 2  # grid values on each side of the best that a curvature parabola is fitted to


@dataclass(kw_only=True, slots=True)
class HParam:
    value: float
    interval: tuple[float, float] | None  # where the best value may lie (None: unknown)
    source: str
    curvature: float | None = None  # k: log-loss per (log2 ratio)^2 around the optimum (None: unknown)
    curvature_source: str = ""

    def edge_ratio(self) -> float | None:
        if self.interval is None:
            return None
        lo, hi = self.interval
        return max(hi / self.value, self.value / lo, 1.0)

    def edge_cost(self) -> float | None:
        """Log-loss cost of training at the interval's farther edge (None when either is unknown)."""
        r = self.edge_ratio()
        if r is None or self.curvature is None:
            return None
        return self.curvature * math.log2(r) ** 2

    def to_dict(self) -> dict:
        return {
            "value": self.value,
            "interval": list(self.interval) if self.interval else None,
            "source": self.source,
            "curvature": self.curvature,
            "curvature_source": self.curvature_source,
            "edge_ratio": self.edge_ratio(),
            "edge_cost": self.edge_cost(),
        }


@dataclass(kw_only=True, slots=True)
class HyperParams:
    lr: HParam
    batch_tokens: HParam
    warmup_tokens: int | None  # None: the design's own rule (a sweep's recipe) sets it
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "lr": self.lr.to_dict(),
            "batch_tokens": self.batch_tokens.to_dict(),
            "warmup_tokens": self.warmup_tokens,
            "notes": list(self.notes),
        }


# --- HP sweeps: curvature and best values --------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class HPSweep:
    """An HP sweep reduced per size: the best LR (vertex) and the curvature of each hyperparameter."""

    path: str
    best_lr: dict[float, float]  # params -> best LR (interior vertices only)
    curvature: dict[str, list[tuple[float, float]]]  # "lr" / "batch_tokens" -> [(params, k)]

    def k(self, name: str) -> float | None:
        values = [k for _, k in self.curvature.get(name, [])]
        return float(np.median(values)) if values else None

    def sizes(self) -> tuple[float, float] | None:
        sizes = [n for n, _ in self.curvature.get("lr", [])] or list(self.best_lr)
        return (min(sizes), max(sizes)) if sizes else None

    def describe(self, name: str) -> str:
        per = self.curvature.get(name, [])
        if not per:
            return f"no {name} sweep in {self.path}"
        each = ", ".join(f"{k:.3g} at {n:,.0f}" for n, k in per)
        return f"median of {len(per)} parabola(s) of log loss in log2 {name} ({each}; {Path(self.path).name})"


def _parabola(h: np.ndarray, loss: np.ndarray) -> float | None:
    """k of log loss = k u^2 + ... , u = log2 h, over the best value and WINDOW neighbours each side."""
    grid = np.unique(h)
    if grid.size < 3:
        return None
    mean = np.array([np.mean(np.log(loss[h == v])) for v in grid])
    best = int(np.argmin(mean))
    lo, hi = max(best - WINDOW, 0), min(best + WINDOW, grid.size - 1)
    if hi - lo < 2:
        return None
    sel = (h >= grid[lo]) & (h <= grid[hi])
    k = float(np.polyfit(np.log2(h[sel]), np.log(loss[sel]), 2)[0])
    return k if k > 0 else None


def read_hp_sweep(path: str | Path) -> HPSweep:
    """An HP sweep table (CSV or Parquet: params, lr, loss, optional batch_tokens); see the module docstring."""
    # start-up time: fitting.hp_laws.hyperparams loads statsmodels (~1 s), which a plan without HP tables never needs
    from scalelab.fitting.hp_laws.hyperparams import best_lr

    df = _read(path, ("params", "lr", "loss"), "--hp-sweep")
    if "batch_tokens" not in df.columns:
        df = df.with_columns(batch_tokens=pl.lit(0.0))
    curv: dict[str, list[tuple[float, float]]] = {"lr": [], "batch_tokens": []}
    best: dict[float, float] = {}
    for name, other in (("lr", "batch_tokens"), ("batch_tokens", "lr")):
        for (n, _), g in df.group_by(["params", other], maintain_order=True):
            h, y = g[name].to_numpy().astype(float), g["loss"].to_numpy().astype(float)
            if np.unique(h).size < 3 or np.any(h <= 0):
                continue
            k = _parabola(h, y)
            if k is not None:
                curv[name].append((float(n), k))
            if name == "lr":
                opt = best_lr(h, y, n_boot=0)
                if opt.interior:
                    best[float(n)] = opt.lr
    if not curv["lr"] and not curv["batch_tokens"]:
        raise UsageError(
            f"--hp-sweep {path}: no size with 3 or more values of lr (or batch_tokens) at a fixed other; "
            "give an LR sweep: several lr per params"
        )
    return HPSweep(path=str(path), best_lr=best, curvature=curv)


def _read(path: str | Path, required: tuple[str, ...], flag: str) -> pl.DataFrame:
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"{flag} {path} does not exist; give a CSV or Parquet table")
    try:
        df = pl.read_parquet(path) if path.suffix.lower() in (".parquet", ".pq") else pl.read_csv(path)
    except (pl.exceptions.PolarsError, OSError) as e:
        raise UsageError(f"{flag} {path}: cannot read it ({str(e).splitlines()[0]})") from None
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise UsageError(f"{flag} {path}: missing column(s) {missing} (has {df.columns})")
    for c in required:
        try:
            values = df[c].cast(pl.Float64, strict=True)
        except pl.exceptions.PolarsError:
            raise UsageError(f"{flag} {path}: column {c!r} is not numeric") from None
        if values.is_null().any() or (values <= 0).any():
            raise UsageError(f"{flag} {path}: column {c!r} holds missing or non-positive values")
    return df


def _curvature(sweep: HPSweep | None, name: str) -> tuple[float | None, str]:
    if sweep is None:
        return None, "unknown: no HP sweep given (--hp-sweep)"
    k = sweep.k(name)
    return k, sweep.describe(name)


# --- the sources ---------------------------------------------------------------------------------


def recipe_hparams(
    *, lr: float, batch_tokens: int, params: float, recipe: Recipe, sweep: HPSweep | None
) -> HyperParams:
    """The recipe's LR and batch for a run of `params` (module docstring)."""
    notes = []
    interval = None
    source = f"the sweep's recipe: {recipe.lr.ref_lr:g} (N / {recipe.lr.ref_params:g})^{recipe.lr.exponent:g}"
    if recipe.lr.has_horizon:
        source += f" (D / {recipe.lr.ref_num_tokens:g})^{recipe.lr.tokens_exponent:g}"
    if sweep is not None and sweep.best_lr and recipe.lr.has_horizon:
        notes.append("the LR's interval is unknown: the recipe's LR follows the run's tokens, the HP sweep's "
                     "per-size best LRs do not (a recipe audit prices it: docs/recipe-audit.md)")  # fmt: skip
    elif sweep is not None and sweep.best_lr:
        ratios = {n: peak_lr(recipe, n) / b for n, b in sweep.best_lr.items()}
        r = max(max(x, 1 / x) for x in ratios.values())
        interval = (lr / r, lr * r)
        each = ", ".join(f"x{x:.2f} at {n:,.0f}" for n, x in sorted(ratios.items()))
        source += f"; interval x/÷{r:.2f}: the recipe vs the best LR of the HP sweep ({each})"
        lo, hi = min(sweep.best_lr), max(sweep.best_lr)
        if not lo <= params <= hi:
            far = math.log10(max(params / hi, lo / params))
            notes.append(
                f"the LR interval is measured at {lo:,.0f}..{hi:,.0f} parameters; the planned {params:,.0f} lies "
                f"{far:.2f} decades outside, where the recipe's exponent is extrapolated"
            )
    else:
        notes.append("the LR's interval is unknown: no LR sweep given (--hp-sweep)")
    k_lr, k_lr_src = _curvature(sweep, "lr")
    k_b, k_b_src = _curvature(sweep, "batch_tokens")
    return HyperParams(
        lr=HParam(value=lr, interval=interval, source=source, curvature=k_lr, curvature_source=k_lr_src),
        batch_tokens=HParam(
            value=float(batch_tokens),
            interval=None,
            source=f"the sweep's recipe: batch by {recipe.batch.by}, {recipe.batch.ref_tokens} tokens at "
            f"{recipe.batch.ref:g} (x^{recipe.batch.exponent:g}), power-of-two sequences",
            curvature=k_b,
            curvature_source=k_b_src,
        ),
        warmup_tokens=None,
        notes=notes,
    )


def fixed_hparams(*, lr: float, batch_tokens: int, source: str, sweep: HPSweep | None) -> HyperParams:
    """A design's fixed LR and batch (a sweep without a recipe): values without intervals."""
    k_lr, k_lr_src = _curvature(sweep, "lr")
    k_b, k_b_src = _curvature(sweep, "batch_tokens")
    return HyperParams(
        lr=HParam(value=lr, interval=None, source=source, curvature=k_lr, curvature_source=k_lr_src),
        batch_tokens=HParam(
            value=float(batch_tokens), interval=None, source=source, curvature=k_b, curvature_source=k_b_src
        ),
        warmup_tokens=None,
        notes=["the LR's interval is unknown: the design fixes the LR (no law of it to compare with an LR sweep)"],
    )


def transfer_hparams(gate, *, lr: float, batch_tokens: int, sweep: HPSweep | None) -> HyperParams:
    """The transferred LR of a µP / CompleteP sweep (`gate`: scalelab.sweeps.recipes.transfer.GateResult of its
    check) with the base size's interval and curvature; the batch is the design's (module docstring)."""
    base = gate.rows[0] if len(gate.rows) == 1 else min(gate.rows, key=lambda r: (r["depth"], r["width"]))
    lrs = np.array(sorted(base["losses"]), dtype=float)
    losses = np.array([base["losses"][x] for x in lrs], dtype=float)
    ok = np.isfinite(losses)
    k = _parabola(lrs[ok], losses[ok]) if ok.sum() >= 3 else None
    lo, hi = base["interval"]
    interval = (float(lo), float(hi)) if base["interior"] and math.isfinite(lo) and math.isfinite(hi) else None
    k_b, k_b_src = _curvature(sweep, "batch_tokens")
    notes = (
        [] if gate.ok else [f"the sweep's LR-transfer check did not pass (max drift {gate.max_drift:.2f} grid steps)"]
    )
    return HyperParams(
        lr=HParam(
            value=lr,
            interval=interval,
            source=f"{gate.parametrization} transfer: the base size's best LR (d_model {base['width']} x "
            f"{base['depth']} layers), its 90% bootstrap interval from the transfer check",
            curvature=k,
            curvature_source=f"the parabola of the base size's losses over the check's {lrs.size} LRs",
        ),
        batch_tokens=HParam(
            value=float(batch_tokens),
            interval=None,
            source="the sweep's design (as every run of it)",
            curvature=k_b,
            curvature_source=k_b_src,
        ),
        warmup_tokens=None,
        notes=notes,
    )


def read_hp_table(path: str | Path) -> pl.DataFrame:
    """A family's recipe: one row per model with params, lr, batch_tokens (optional warmup_tokens)."""
    df = _read(path, ("params", "lr", "batch_tokens"), "--hp-table")
    if df["params"].n_unique() < 3:
        raise UsageError(f"--hp-table {path}: {df['params'].n_unique()} sizes; the laws need 3 or more")
    return df


def table_hparams(table: pl.DataFrame, *, params: float, source: str, sweep: HPSweep | None) -> HyperParams:
    """LR and batch from a family's recipe table as power laws of N (module docstring)."""
    from scalelab.fitting.hp_laws.hyperparams import fit_hyperparam_law  # start-up time: as read_hp_sweep

    n = table["params"].to_numpy().astype(float)
    out = {}
    for name in ("lr", "batch_tokens"):
        law = fit_hyperparam_law(n, table[name].to_numpy().astype(float))
        value, lo, hi = law.predict(params, kind="prediction")
        k, k_src = _curvature(sweep, name)
        out[name] = HParam(
            value=value,
            interval=(lo, hi),
            source=f"{source}: {name} = {10**law.intercept:.3g} N^{law.slope:.3f} over {law.n_points} models, "
            "95% prediction interval",
            curvature=k,
            curvature_source=k_src,
        )
    notes = []
    if not n.min() <= params <= n.max():
        far = math.log10(max(params / n.max(), n.min() / params))
        notes.append(
            f"the recipe table covers {n.min():.3g}..{n.max():.3g} parameters; {params:.3g} is {far:.2f} decades out"
        )
    warmup = int(table["warmup_tokens"].to_numpy()[np.argmax(n)]) if "warmup_tokens" in table.columns else None
    return HyperParams(lr=out["lr"], batch_tokens=out["batch_tokens"], warmup_tokens=warmup, notes=notes)


def deepseek_hparams(*, nonembedding_flops: float, sweep: HPSweep | None) -> HyperParams:
    """DeepSeek LLM's LR and batch laws at a budget of non-embedding FLOPs (no interval: none read here)."""
    c = nonembedding_flops
    k_lr, k_lr_src = _curvature(sweep, "lr")
    k_b, k_b_src = _curvature(sweep, "batch_tokens")
    src = "DeepSeek LLM (Bi et al. 2024) fitted on their data"
    return HyperParams(
        lr=HParam(
            value=DEEPSEEK_LR[0] * c ** DEEPSEEK_LR[1],
            interval=None,
            source=f"{src}: lr = 0.3118 C^-0.125; no interval",
            curvature=k_lr,
            curvature_source=k_lr_src,
        ),
        batch_tokens=HParam(
            value=DEEPSEEK_BATCH[0] * c ** DEEPSEEK_BATCH[1],
            interval=None,
            source=f"{src}: B = 0.2920 C^0.3271 tokens; no interval",
            curvature=k_b,
            curvature_source=k_b_src,
        ),
        warmup_tokens=None,
        notes=["LR and batch from DeepSeek's published laws: their intervals are unknown here (give --hp-table)"],
    )
