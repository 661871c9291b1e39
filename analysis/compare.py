"""Architecture (or recipe) comparison: how much compute does A need to match B?

    cmp = compare_sweeps(runs_a, runs_b, law="chinchilla", target_flops=1e21, n_boot=200)
    cmp.multiplier_at_target, cmp.target_interval, cmp.slope, cmp.slope_interval, cmp.verdict

Each side is fitted separately through the one fit entry (scalelab.fitting.entry.fit_runs: the robust fit
from the law's whole start grid and its bootstrap; no backtests, the comparison does not use them). With
L*_X(C) the compute-optimal frontier of side X (the minimum over N of the fitted L(N, C/6N); the
law itself for laws of compute), the compute-efficiency multiplier of B over A at budget C is

    m(C) = C_A(L*_B(C)) / C,     C_A(L) = the compute A needs to reach loss L on its frontier,

so m = 1.5 means A needs 1.5x the FLOPs to reach what B reaches with C. m is reported at each
budget of the sweeps and extrapolated to a target budget; intervals pair the i-th bootstrap draw of
A with the i-th of B (independent resamples of independent sweeps). "Does the multiplier change
with scale" is the slope d ln m / d ln C fitted over the observed budget range (per draw too, for
its interval). A's frontier may never reach B's loss (B's loss below A's irreducible term): m is
then +inf for that draw, which the percentile interval handles (upper end inf).
"""

from __future__ import annotations

import json

import numpy as np
import polars as pl

from scalelab.errors import UsageError
from scalelab.fitting.comparisons.comparison import Comparison, SideFit, compare_laws_at, verdict
from scalelab.fitting.comparisons.multiplier import (  # noqa: F401  (frontier_loss, flops_to_reach, multiplier: this module's API)
    flops_to_reach,
    frontier_loss,
    multiplier,
)
from scalelab.fitting.entry.fit_options import FitOptions
from scalelab.fitting.entry.fit_runs import fit_runs
from scalelab.fitting.estimate.approaches import group_budgets
from scalelab.fitting.estimate.io import read_runs
from scalelab.fitting.forms.laws import get_law

LEVEL = 0.95


def _side_table(runs: pl.DataFrame, law, loss_col: str) -> pl.DataFrame:
    """The runs a side is fitted on: params, tokens, flops (6ND where the table has none) and loss.
    A law of compute describes the frontier: only the best run of each compute budget is kept."""
    for col in ("params", "tokens", loss_col):
        if col not in runs.columns:
            raise UsageError(f"the run table has no '{col}' column")
    df = runs.filter(pl.col(loss_col).is_not_null() & pl.col("params").is_not_null() & pl.col("tokens").is_not_null())
    flops = pl.col("flops") if "flops" in df.columns else 6 * pl.col("params") * pl.col("tokens")
    df = df.select(
        pl.col("params").cast(pl.Float64),
        pl.col("tokens").cast(pl.Float64),
        flops.cast(pl.Float64).alias("flops"),
        pl.col(loss_col).cast(pl.Float64).alias("loss"),
    )
    if law.inputs == ("flops",):
        c, loss = df["flops"].to_numpy(), df["loss"].to_numpy()
        groups = group_budgets(c)
        best = [int(np.flatnonzero(groups == g)[np.argmin(loss[groups == g])]) for g in np.unique(groups)]
        df = df[best]
    return df


def fit_side(
    name: str, runs: pl.DataFrame, law_name: str, *, n_boot: int, seed: int, loss_col: str = "loss"
) -> SideFit:
    """One side's law, through the one fit entry, with `n_boot` bootstrap draws (none: no intervals)."""
    law = get_law(law_name)
    table = read_runs(_side_table(runs, law, loss_col))
    options = FitOptions(law=law.name, bootstrap=n_boot, seed=seed, backtest=False)
    fit = fit_runs(table, options)
    draws = np.array([[p[k] for k in law.param_names] for p in fit.draws], dtype=float)
    return SideFit(
        name=name,
        law=law.name,
        params=dict(fit.params),
        draws=draws.reshape(-1, law.n_params),
        n_runs=fit.n_points,
        flops_range=(float(np.min(table.flops)), float(np.max(table.flops))),
        warnings=list(fit.warnings),
    )


def compare_fits(
    a: SideFit, b: SideFit, *, budgets=None, target_flops: float | None = None, level: float = LEVEL
) -> Comparison:
    """The multiplier of B over A at each budget and at the target, with intervals and the slope,
    over the budgets both sides' runs share (scalelab.fitting.comparisons.comparison), and its verdict."""
    lo = max(a.flops_range[0], b.flops_range[0])
    hi = min(a.flops_range[1], b.flops_range[1])
    if not hi > lo:
        lo, hi = min(a.flops_range[0], b.flops_range[0]), max(a.flops_range[1], b.flops_range[1])
    if budgets is None:
        budgets = np.geomspace(lo, hi, 6)
    law_a, law_b = get_law(a.law), get_law(b.law)
    cmp = compare_laws_at(
        a.name,
        law_a,
        a.params,
        [dict(zip(law_a.param_names, row)) for row in a.draws],
        b.name,
        law_b,
        b.params,
        [dict(zip(law_b.param_names, row)) for row in b.draws],
        budgets=np.asarray(sorted(float(x) for x in budgets)),
        target=float(target_flops) if target_flops else float(hi * 10.0),
        slope_grid=np.geomspace(lo, hi, 5),
        largest=hi,
        level=level,
        sides=(a, b),
    )
    cmp.verdict = verdict(cmp)
    return cmp


def compare_sweeps(
    runs_a: pl.DataFrame,
    runs_b: pl.DataFrame,
    *,
    names=("A", "B"),
    law: str = "chinchilla",
    budgets=None,
    target_flops: float | None = None,
    n_boot: int = 200,
    seed: int = 0,
    level: float = LEVEL,
    loss_col: str = "loss",
) -> Comparison:
    """Fit both sides and compare them (module docstring)."""
    a = fit_side(names[0], runs_a, law, n_boot=n_boot, seed=seed, loss_col=loss_col)
    b = fit_side(names[1], runs_b, law, n_boot=n_boot, seed=seed + 1, loss_col=loss_col)
    return compare_fits(a, b, budgets=budgets, target_flops=target_flops, level=level)


def _fmt_iv(iv: tuple[float, float]) -> str:
    return f"[{iv[0]:.3g}, {iv[1]:.3g}]"


def split_by_tag(runs: pl.DataFrame, tag: str) -> dict[str, pl.DataFrame]:
    """Runs of one store grouped by the value of a tag (the JSON `tags` column, or a column)."""
    if tag in runs.columns:
        values = runs[tag].cast(pl.Utf8).to_list()
    else:
        values = [json.loads(t or "{}").get(tag) for t in runs["tags"]]
    groups: dict[str, list[int]] = {}
    for i, v in enumerate(values):
        if v is not None:
            groups.setdefault(str(v), []).append(i)
    if len(groups) < 2:
        raise UsageError(f"tag '{tag}' takes {len(groups)} value(s) in this store; a comparison needs 2")
    return {k: runs[idx] for k, idx in sorted(groups.items())}


def format_comparison(cmp: Comparison) -> str:
    pct = f"{100 * cmp.level:.0f}%"
    lines = [
        f"{cmp.b.name} vs {cmp.a.name}: law {cmp.a.law}, {cmp.a.n_runs} + {cmp.b.n_runs} runs, "
        f"{len(cmp.a.draws)} bootstrap draws per side",
        f"{'budget (FLOPs)':>16} {'multiplier':>11} {pct + ' interval':>22}",
    ]
    for c, m, iv in zip(cmp.budgets, cmp.multipliers, cmp.intervals):
        lines.append(f"{c:>16.3g} {m:>11.3f} {_fmt_iv(iv):>22}")
    lines.append(
        f"{cmp.target_flops:>16.3g} {cmp.multiplier_at_target:>11.3f} {_fmt_iv(cmp.target_interval):>22}  (target)"
    )
    lines.append(f"slope d ln m / d ln C: {cmp.slope:.4f} {_fmt_iv(cmp.slope_interval)}")
    lines.append(cmp.verdict)
    return "\n".join(lines)
