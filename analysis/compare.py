"""Architecture (or recipe) comparison: how much compute does A need to match B?

    cmp = compare_sweeps(runs_a, runs_b, law="chinchilla", target_flops=1e21, n_boot=200)
    cmp.multiplier_at_target, cmp.target_interval, cmp.slope, cmp.slope_interval, cmp.verdict

Each side is fitted separately through the one fit entry (scalelab.fitting.fit_runs: the robust fit
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
import math
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from scalelab.errors import UsageError
from scalelab.fitting.approaches import group_budgets
from scalelab.fitting.fit_options import FitOptions
from scalelab.fitting.fit_runs import fit_runs
from scalelab.fitting.io import read_runs
from scalelab.fitting.laws import get_law
from scalelab.fitting.multiplier import (  # noqa: F401  (frontier_loss, flops_to_reach: this module's API)
    flops_to_reach,
    frontier_loss,
    interval,
    log_slope,
    multiplier,
    paired_multipliers,
)

LEVEL = 0.95


@dataclass(kw_only=True, slots=True)
class SideFit:
    name: str
    law: str
    params: dict[str, float]
    draws: np.ndarray  # (n_boot, P) natural params
    n_runs: int
    flops_range: tuple[float, float]
    warnings: list[str] = field(default_factory=list)


@dataclass(kw_only=True, slots=True)
class Comparison:
    a: SideFit
    b: SideFit
    budgets: list[float]
    multipliers: list[float]  # point estimate per budget
    intervals: list[tuple[float, float]]
    target_flops: float
    multiplier_at_target: float
    target_interval: tuple[float, float]
    slope: float  # d ln m / d ln C over the observed range
    slope_interval: tuple[float, float]
    level: float
    verdict: str
    draws_at_target: np.ndarray  # per bootstrap pair, for plots

    def to_dict(self) -> dict:
        side = lambda s: {
            "name": s.name,
            "law": s.law,
            "params": s.params,
            "n_runs": s.n_runs,  # noqa: E731
            "flops_range": list(s.flops_range),
            "warnings": s.warnings,
        }
        return {
            "a": side(self.a),
            "b": side(self.b),
            "level": self.level,
            "budgets": [
                {"flops": c, "multiplier": m, "interval": list(iv)}
                for c, m, iv in zip(self.budgets, self.multipliers, self.intervals)
            ],
            "target": {
                "flops": self.target_flops,
                "multiplier": self.multiplier_at_target,
                "interval": list(self.target_interval),
            },
            "slope": {"value": self.slope, "interval": list(self.slope_interval)},
            "verdict": self.verdict,
        }


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
    """The multiplier of B over A at each budget and at the target, with intervals and the slope."""
    law_a, law_b = get_law(a.law), get_law(b.law)
    lo = max(a.flops_range[0], b.flops_range[0])
    hi = min(a.flops_range[1], b.flops_range[1])
    if not hi > lo:
        lo, hi = min(a.flops_range[0], b.flops_range[0]), max(a.flops_range[1], b.flops_range[1])
    if budgets is None:
        budgets = np.geomspace(lo, hi, 6)
    budgets = np.asarray(sorted(float(x) for x in budgets))
    target = float(target_flops) if target_flops else float(hi * 10.0)
    m_point = np.array([multiplier(law_a, a.params, law_b, b.params, c) for c in budgets])
    m_target = multiplier(law_a, a.params, law_b, b.params, target)
    slope_grid = np.geomspace(lo, hi, 5)
    slope = log_slope(slope_grid, np.array([multiplier(law_a, a.params, law_b, b.params, c) for c in slope_grid]))
    k = min(len(a.draws), len(b.draws))
    paired = paired_multipliers(
        law_a,
        [dict(zip(law_a.param_names, row)) for row in a.draws[:k]],
        law_b,
        [dict(zip(law_b.param_names, row)) for row in b.draws[:k]],
        budgets=budgets,
        target=target,
        slope_grid=slope_grid,
    )
    at_target = paired.at_target
    intervals = (
        [interval(paired.per_budget[:, j], level) for j in range(budgets.size)]
        if k
        else [(math.nan, math.nan)] * budgets.size
    )
    t_iv = interval(at_target, level) if k else (math.nan, math.nan)
    s_iv = interval(paired.slopes, level) if k else (math.nan, math.nan)
    verdict = _verdict(a.name, b.name, target, m_target, t_iv, slope, s_iv, level, hi)
    return Comparison(
        a=a,
        b=b,
        budgets=budgets.tolist(),
        multipliers=m_point.tolist(),
        intervals=intervals,
        target_flops=target,
        multiplier_at_target=float(m_target),
        target_interval=t_iv,
        slope=slope,
        slope_interval=s_iv,
        level=level,
        verdict=verdict,
        draws_at_target=at_target,
    )


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


def _verdict(a: str, b: str, target: float, m: float, iv, slope: float, s_iv, level: float, hi: float) -> str:
    pct = f"{100 * level:.0f}%"
    extrap = target / hi
    where = f"at C = {target:.3g} FLOPs ({extrap:.3g}x the largest shared budget)"
    if math.isnan(iv[0]):
        head = f"{b} vs {a} {where}: multiplier {m:.3g} (no bootstrap, no interval: cannot decide)"
    elif iv[0] > 1:
        head = (
            f"The data support '{b} is better' {where}: {a} needs {m:.3g}x the compute to reach {b}'s loss "
            f"({pct} interval {_fmt_iv(iv)}, above 1)."
        )
    elif iv[1] < 1:
        head = (
            f"The data support '{a} is better' {where}: {a} needs only {m:.3g}x {b}'s compute "
            f"({pct} interval {_fmt_iv(iv)}, below 1)."
        )
    else:
        head = (
            f"The data do NOT support '{b} is better' {where}: multiplier {m:.3g}, {pct} interval "
            f"{_fmt_iv(iv)} contains 1."
        )
    if math.isnan(s_iv[0]):
        trend = ""
    elif s_iv[0] > 0 or s_iv[1] < 0:
        trend = (
            f" The multiplier changes with scale: d ln m / d ln C = {slope:.3f} ({pct} interval "
            f"{_fmt_iv(s_iv)} excludes 0), so the advantage {'grows' if slope > 0 else 'shrinks'} with compute."
        )
    else:
        trend = (
            f" No evidence that the multiplier changes with scale: slope {slope:.3f}, {pct} interval "
            f"{_fmt_iv(s_iv)} contains 0."
        )
    caveat = " Intervals cover fit uncertainty only (bootstrap over runs), not a change of law beyond the data."
    return head + trend + (caveat if extrap > 1.5 else "")


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
