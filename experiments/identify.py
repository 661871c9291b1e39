"""Which parameters of a law a design's runs pin down: profile likelihood and fold stability (research).

    python experiments/identify.py RUNS.csv [--law farseer] [--names gamma,beta]

The folds are the table's `group` column, or its FLOP budgets (runs within 5% of each other's C).

A law can fit a design's runs well and still leave a parameter free: an IsoFLOP design ties D to N
within each budget, so Chinchilla's E trades against the exponents, and a size-dependent data term
(Farseer's gamma) trades against alpha and beta unless the budgets span a wide range. Two checks:

- Profile: fix the parameter at values around its estimate, refit the others, and record the rise
  of the squared log-residual sum. With the residual variance s^2 = SSE_min / (n - p), the profile
  95% interval is where (SSE(theta_i) - SSE_min) / s^2 <= 3.84 (chi^2 with 1 dof). A profile that stays
  under the threshold up to a fit bound is "unbounded" on that side.
- Folds: the parameter refitted on each forward fold's training runs (scalelab.fitting.uncertainty.forward's
  expanding windows), printed beside the profile: a parameter that moves steadily as budgets are
  added is pinned in sample to a value that depends on the range fitted. The verdict is the
  profile's; fewer runs make each fold's estimate looser, so the folds inform rather than decide.

    rows = identify("farseer", n, d, loss, groups=budgets)      # in Python
    rows["gamma"].verdict          # "identified" | "not identified: ..."

What it found on this machine's designs: docs/extrapolation.md ("Other forms and identifiability").
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from scalelab.errors import UsageError, run_script
from scalelab.fitting.estimate.approaches import group_budgets
from scalelab.fitting.estimate.fit import fit_law
from scalelab.fitting.estimate.io import read_runs
from scalelab.fitting.forms.laws import get_law
from scalelab.fitting.uncertainty.forward import group_order

CHI2_95 = 3.841


@dataclass(kw_only=True)
class Identification:
    name: str
    estimate: float
    profile_interval: tuple[float | None, float | None]  # None: unbounded up to the fit bound on that side
    fold_values: list[float] = field(default_factory=list)  # the estimate on each forward fold
    verdict: str = ""

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "estimate": self.estimate,
            "profile_interval": list(self.profile_interval),
            "fold_values": list(self.fold_values),
            "verdict": self.verdict,
        }


def _fit(law, n, d, y, starts=None):
    return fit_law(
        law, {"params": n, "tokens": d, "loss": y}, objective="squared", starts=starts, diagnose=False, n_polish=1
    )


def _sse(law, fit, n, d, y) -> float:
    return float(np.sum((np.log(law.predict(fit.params, params=n, tokens=d)) - np.log(y)) ** 2))


def _profile_sse(law, i: int, theta: np.ndarray, v: float, n, d, y) -> float:
    """SSE with fit parameter i pinned at v (the others refitted from the optimum and a few grid rows)."""
    bounds = list(law.fit_bounds)
    bounds[i] = (float(v), float(v))
    pinned = replace(law, fit_bounds=tuple(bounds))
    start = theta.copy()
    start[i] = v
    rows = law.init_grid()[::300].copy()
    rows[:, i] = v
    return _sse(law, _fit(pinned, n, d, y, np.vstack([start, rows])), n, d, y)


def _crossing(law, i: int, theta: np.ndarray, sign: int, sse_min: float, s2: float, n, d, y) -> float | None:
    """Where the profile's rise reaches the chi^2 threshold on one side (None: not before the fit bound).

    Steps double from 1% of the estimate's scale until the rise passes the threshold, then bisection
    (the profile of a well-pinned parameter is narrow, of a free one wide: no fixed grid fits both)."""
    bound = law.fit_bounds[i][1 if sign > 0 else 0]
    rise = lambda v: (_profile_sse(law, i, theta, v, n, d, y) - sse_min) / s2  # noqa: E731
    inner, step = theta[i], 0.01 * max(abs(theta[i]), 0.1)
    while True:
        outer = theta[i] + sign * step
        if sign * (outer - bound) >= 0:
            return None if rise(bound) <= CHI2_95 else _bisect(rise, inner, bound)
        if rise(outer) > CHI2_95:
            return _bisect(rise, inner, outer)
        inner, step = outer, 2 * step


def _bisect(rise, inside: float, outside: float, iters: int = 6) -> float:
    for _ in range(iters):
        mid = 0.5 * (inside + outside)
        inside, outside = (mid, outside) if rise(mid) <= CHI2_95 else (inside, mid)
    return 0.5 * (inside + outside)


def identify(
    law_name: str,
    params,
    tokens,
    loss,
    *,
    groups=None,
    names: Sequence[str] | None = None,
    min_train_runs: int | None = None,
) -> dict[str, Identification]:
    """Profile interval and fold values of each parameter (module docstring), in fit space.

    Fit-space values (e = ln E, a = ln A, ...) are reported for the logged parameters: their
    profiles are symmetric there. `names` limits the parameters profiled (default: all).
    """
    law = get_law(law_name)
    n, d, y = (np.asarray(a, dtype=float) for a in (params, tokens, loss))
    if y.size <= law.n_params + 1:
        raise UsageError(f"{y.size} runs cannot identify {law.n_params} parameters of {law.name}")
    best = _fit(law, n, d, y)
    theta = np.asarray(best.theta, dtype=float)
    sse_min = _sse(law, best, n, d, y)
    s2 = max(sse_min / (y.size - law.n_params), 1e-12)
    fold_thetas: list[np.ndarray] = []
    if groups is not None:
        groups = np.asarray(groups)
        order = group_order(6.0 * n * d, groups)
        need = min_train_runs or law.n_params + 3
        for k in range(2, len(order)):
            m = np.isin(groups, order[:k])
            if m.sum() >= need:
                fold_thetas.append(np.asarray(_fit(law, n[m], d[m], y[m]).theta, dtype=float))
    out: dict[str, Identification] = {}
    for i, name in enumerate(law.fit_names):
        if names is not None and name not in names and law.param_names[i] not in names:
            continue
        lo = _crossing(law, i, theta, -1, sse_min, s2, n, d, y)
        hi = _crossing(law, i, theta, +1, sse_min, s2, n, d, y)
        folds = [float(t[i]) for t in fold_thetas]
        verdict = "identified"
        if lo is None or hi is None:
            verdict = "not identified: the profile stays within the 95% threshold up to the fit bound " + (
                f"{law.fit_bounds[i][0 if lo is None else 1]:g}"
            )
        out[name] = Identification(
            name=name, estimate=float(theta[i]), profile_interval=(lo, hi), fold_values=folds, verdict=verdict
        )
    return out


def format_identification(rows: dict[str, Identification]) -> str:
    lines = [f"{'param':>7} {'estimate':>9} {'profile 95%':>22} {'forward folds':>24}  verdict"]
    for r in rows.values():
        lo, hi = (f"{v:.3g}" if v is not None else "open" for v in r.profile_interval)
        folds = ", ".join(f"{v:.3g}" for v in r.fold_values) or "-"
        lines.append(f"{r.name:>7} {r.estimate:>9.3g} {'[' + lo + ', ' + hi + ']':>22} {folds:>24}  {r.verdict}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("table", help="CSV or Parquet run table (params, tokens or flops, loss)")
    ap.add_argument("--law", default="chinchilla", help="a law of N and D (default chinchilla)")
    ap.add_argument("--names", default=None, help="the parameters to profile, comma-separated (default: all)")
    args = ap.parse_args(argv)
    table = read_runs(args.table, min_rows=2)
    names = [w.strip() for w in args.names.split(",")] if args.names else None
    groups = table.group if table.group is not None else group_budgets(table.flops)
    rows = identify(args.law, table.params, table.tokens, table.loss, groups=groups, names=names)
    print(f"{args.law} on {len(table)} runs in {len(set(groups.tolist()))} groups (fit-space parameters)")
    print(format_identification(rows))
    return 0


if __name__ == "__main__":
    run_script(main, __file__)
