"""Architecture (or recipe) comparison: how much compute does A need to match B?

    cmp = compare_sweeps(runs_a, runs_b, law="chinchilla", target_flops=1e21, n_boot=200)
    cmp.multiplier_at_target, cmp.target_interval, cmp.slope, cmp.slope_interval, cmp.verdict

Each side is fitted separately (scalelab.fitting's robust fit, analysis.lawfit's bootstrap). With
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

import math
from dataclasses import dataclass, field

import numpy as np
import polars as pl
from scipy import optimize

from scalelab.analysis.lawfit import bootstrap_params, fit_point
from scalelab.errors import UsageError
from scalelab.fitting.intervals import percentile_interval

LEVEL = 0.95


def frontier_loss(law, params: dict[str, float], flops: float) -> float:
    """L*(C): the law's compute-optimal loss at `flops` (C = 6 N D)."""
    from scalelab.fitting import allocate as alloc

    if law.inputs == ("flops",):
        return float(law.predict(params, flops=np.asarray(flops)))
    if law.name == "chinchilla":
        return alloc.chinchilla_optimum(params, flops)[2]
    if set(law.inputs) != {"params", "tokens"}:
        raise UsageError(f"law {law.name} has inputs {law.inputs}; comparison needs a law of (N, D) or of C")
    return alloc.numeric_optimum(lambda n, d: law.predict(params, params=n, tokens=d), flops)[2]


def flops_to_reach(law, params: dict[str, float], loss: float, lo: float = 1e3, hi: float = 1e40) -> float:
    """The smallest C with L*(C) <= loss (bisection in ln C); inf if the frontier never gets there."""
    f = lambda x: frontier_loss(law, params, math.exp(x)) - loss  # noqa: E731
    a, b = math.log(lo), math.log(hi)
    if f(b) > 0:
        return math.inf
    if f(a) <= 0:
        return lo
    return math.exp(optimize.brentq(f, a, b, xtol=1e-10))


def multiplier(law_a, params_a, law_b, params_b, flops: float) -> float:
    """m(C) = C_A(L*_B(C)) / C (module docstring)."""
    return flops_to_reach(law_a, params_a, frontier_loss(law_b, params_b, flops)) / flops


def _slope(budgets: np.ndarray, mults: np.ndarray) -> float:
    ok = np.isfinite(mults) & (mults > 0)
    if ok.sum() < 2:
        return math.nan
    return float(np.polyfit(np.log(budgets[ok]), np.log(mults[ok]), 1)[0])


def _interval(values: np.ndarray, level: float) -> tuple[float, float]:
    v = np.asarray(values, dtype=float)
    # +inf (A never reaches B's loss) must survive the quantile, which drops non-finite values:
    # clip it to a huge finite value and map it back
    big = 1e300
    lo, hi = percentile_interval(np.minimum(v, big), level)
    return (math.inf if lo >= big else lo), (math.inf if hi >= big else hi)


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


def _side_data(runs: pl.DataFrame, law, loss_col: str) -> dict[str, np.ndarray]:
    for col in ("params", "tokens", loss_col):
        if col not in runs.columns:
            raise UsageError(f"the run table has no '{col}' column")
    df = runs.filter(pl.col(loss_col).is_not_null() & pl.col("params").is_not_null() & pl.col("tokens").is_not_null())
    n = np.array(df["params"].cast(pl.Float64).to_numpy())  # copies: polars gives read-only views
    d = np.array(df["tokens"].cast(pl.Float64).to_numpy())
    loss = np.array(df[loss_col].cast(pl.Float64).to_numpy())
    c = np.array(df["flops"].cast(pl.Float64).to_numpy()) if "flops" in df.columns else 6 * n * d
    if law.inputs == ("flops",):
        # a law of compute describes the frontier: keep the best run of each compute budget
        from scalelab.fitting.approaches import group_budgets

        groups = group_budgets(c)
        best = [np.flatnonzero(groups == g)[np.argmin(loss[groups == g])] for g in np.unique(groups)]
        return {"flops": c[best], "loss": loss[best]}
    return {"params": n, "tokens": d, "loss": loss, "_flops": c}


def fit_side(
    name: str, runs: pl.DataFrame, law_name: str, *, n_boot: int, seed: int, loss_col: str = "loss"
) -> SideFit:
    from scalelab.fitting.laws import get_law

    law = get_law(law_name)
    data = _side_data(runs, law, loss_col)
    flops = data.pop("_flops", data.get("flops"))
    point = fit_point(law, data)
    draws = bootstrap_params(point, n_boot=n_boot, seed=seed) if n_boot > 0 else np.empty((0, law.n_params))
    return SideFit(
        name=name,
        law=law.name,
        params=dict(point.params),
        draws=draws,
        n_runs=int(point.n_points),
        flops_range=(float(np.min(flops)), float(np.max(flops))),
        warnings=list(point.warnings),
    )


def compare_fits(
    a: SideFit, b: SideFit, *, budgets=None, target_flops: float | None = None, level: float = LEVEL
) -> Comparison:
    """The multiplier of B over A at each budget and at the target, with intervals and the slope."""
    from scalelab.fitting.laws import get_law

    law_a, law_b = get_law(a.law), get_law(b.law)
    lo = max(a.flops_range[0], b.flops_range[0])
    hi = min(a.flops_range[1], b.flops_range[1])
    if not hi > lo:
        lo, hi = min(a.flops_range[0], b.flops_range[0]), max(a.flops_range[1], b.flops_range[1])
    if budgets is None:
        budgets = np.geomspace(lo, hi, 6)
    budgets = np.asarray(sorted(float(x) for x in budgets))
    target = float(target_flops) if target_flops else float(hi * 10.0)
    names_a, names_b = law_a.param_names, law_b.param_names
    m_point = np.array([multiplier(law_a, a.params, law_b, b.params, c) for c in budgets])
    m_target = multiplier(law_a, a.params, law_b, b.params, target)
    slope_grid = np.geomspace(lo, hi, 5)
    slope = _slope(slope_grid, np.array([multiplier(law_a, a.params, law_b, b.params, c) for c in slope_grid]))
    k = min(len(a.draws), len(b.draws))
    per_budget = np.full((k, budgets.size), np.nan)
    at_target = np.full(k, np.nan)
    slopes = np.full(k, np.nan)
    for i in range(k):
        pa = dict(zip(names_a, a.draws[i]))
        pb = dict(zip(names_b, b.draws[i]))
        try:
            per_budget[i] = [multiplier(law_a, pa, law_b, pb, c) for c in budgets]
            at_target[i] = multiplier(law_a, pa, law_b, pb, target)
            slopes[i] = _slope(slope_grid, np.array([multiplier(law_a, pa, law_b, pb, c) for c in slope_grid]))
        except (UsageError, ValueError):
            continue  # a degenerate draw (e.g. a bound-hitting exponent): left out of the interval
    intervals = (
        [_interval(per_budget[:, j], level) for j in range(budgets.size)]
        if k
        else [(math.nan, math.nan)] * budgets.size
    )
    t_iv = _interval(at_target, level) if k else (math.nan, math.nan)
    s_iv = _interval(slopes, level) if k else (math.nan, math.nan)
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
    import json

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
