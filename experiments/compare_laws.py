"""Law forms compared on one run table: held-out error first, AIC/BIC beside it (research, not the product).

The product chooses a law by its own rules (`scalelab fit --law select`: the held-out-largest backtest,
curve laws included, fitting/selection/select.py; `--law auto`: the stacked law, fitting/uncertainty/stacking.py); this
experiment puts the classical criteria beside the held-out error for any table, to read why a form
wins or loses:

    python experiments/compare_laws.py RUNS.csv [--laws chinchilla,kaplan,power_law] [--max-starts 300]

For each law: fit on every run (in-sample log-residual RMSE), a holdout backtest on the
largest-compute runs (MARE, bias), and information criteria from a Gaussian likelihood of the
log-loss residuals r_i = ln pred_i - ln obs_i at the fitted parameters:

    AIC = n ln(RSS / n) + 2k,   BIC = n ln(RSS / n) + k ln n,   RSS = sum r_i^2,   k = #params

AIC/BIC are reported only where defined: the law's inputs are all in the table and n > k + 1.
They are approximations when the fit minimised a Huber loss rather than the Gaussian likelihood,
so the held-out error is the primary ranking; laws that cannot be fitted are listed with the reason.

    rows = compare_laws("runs.csv", laws=("chinchilla", "kaplan", "power_law"))   # in Python
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from scalelab.errors import UsageError, run_script
from scalelab.fitting.entry.fit_runs import one_torch_thread
from scalelab.fitting.estimate.fit import fit_law, subsample_starts
from scalelab.fitting.estimate.io import ColumnMap, RunTable, read_runs
from scalelab.fitting.forms.laws import get_law
from scalelab.fitting.uncertainty.backtest import holdout_backtest, law_fitter

BACKTEST_STARTS = 100  # evenly spaced grid starts per backtest refit (plus the full-data optimum)


@dataclass(kw_only=True, slots=True)
class LawComparison:
    """One law's row in a comparison table (None where a number is not defined)."""

    law: str
    n_params: int
    n_points: int
    params: dict[str, float] | None = None
    rmse_log: float | None = None  # in-sample RMSE of ln loss
    aic: float | None = None
    bic: float | None = None
    holdout_mare: float | None = None
    holdout_bias: float | None = None
    error: str | None = None  # why the law could not be fitted or backtested

    def to_dict(self) -> dict:
        return asdict(self)


def information_criteria(log_residuals: np.ndarray, k: int) -> tuple[float | None, float | None]:
    """(AIC, BIC) of a Gaussian model on log residuals; (None, None) when n <= k + 1 or RSS = 0."""
    r = np.asarray(log_residuals, dtype=float)
    n = r.size
    rss = float(np.sum(r * r))
    if n <= k + 1 or rss <= 0:
        return None, None
    base = n * np.log(rss / n)
    return float(base + 2 * k), float(base + k * np.log(n))


def compare_laws(
    data,
    laws: Sequence[str] = ("chinchilla", "kaplan", "power_law", "power_law_no_e"),
    *,
    columns: ColumnMap | None = None,
    holdout_frac: float | None = None,
    objective: str = "huber",
    delta: float = 1e-3,
    max_starts: int | None = None,
) -> list[LawComparison]:
    """Fit each law and rank them by held-out MARE (laws without one sort last).

    Args:
        data: path / frame / dict accepted by read_runs.
        laws: registry names.
        holdout_frac: backtest hold-out (None: the largest FLOP budget).
        objective, delta: passed to fit_law.
        max_starts: thin each law's start grid (None: all); backtest refits use at most
            BACKTEST_STARTS plus the full-data optimum.
    Returns:
        One LawComparison per law, best held-out error first.
    """
    with one_torch_thread():
        return _compare(data, laws, columns, holdout_frac, objective, delta, max_starts)


def _compare(data, laws, columns, holdout_frac, objective, delta, max_starts) -> list[LawComparison]:
    table = data if isinstance(data, RunTable) else read_runs(data, columns=columns, min_rows=2)
    inputs = table.law_inputs()
    rows = []
    for name in laws:
        law = get_law(name)
        row = LawComparison(law=law.name, n_params=law.n_params, n_points=len(table))
        missing = [k for k in law.inputs if k not in inputs]
        if missing:
            row.error = f"table lacks {missing}"
            rows.append(row)
            continue
        x = {k: inputs[k] for k in law.inputs}
        try:
            starts = subsample_starts(law, max_starts)
            fit = fit_law(law, {**x, "loss": table.loss}, objective=objective, delta=delta, starts=starts)
        except UsageError as e:
            row.error = str(e)
            rows.append(row)
            continue
        row.params = {k: float(v) for k, v in fit.params.items()}
        r = np.log(np.asarray(fit.predict(**x))) - np.log(table.loss)
        row.rmse_log = float(np.sqrt(np.mean(r * r)))
        row.aic, row.bic = information_criteria(r, law.n_params)

        bt_cap = min(max_starts or BACKTEST_STARTS, BACKTEST_STARTS)
        fitter = law_fitter(law, subsample_starts(law, bt_cap, np.asarray(fit.theta)), objective=objective, delta=delta)

        try:
            bt = holdout_backtest(table, fitter, holdout_frac=holdout_frac, min_train=law.n_params + 1)
            row.holdout_mare, row.holdout_bias = bt.mare, bt.bias
        except UsageError as e:
            row.error = f"backtest: {e}"
        rows.append(row)
    return sorted(rows, key=lambda r: (r.holdout_mare is None, r.holdout_mare or 0.0))


def format_comparison(rows: list[LawComparison]) -> str:
    """One line per law, best held-out error first (a number that is not defined prints as -)."""

    def cell(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    lines = [f"{'law':<16} {'k':>2} {'n':>4} {'holdout MARE':>12} {'bias':>8} {'RMSE ln L':>9} {'AIC':>9} {'BIC':>9}"]
    for r in rows:
        mare = cell(None if r.holdout_mare is None else 100 * r.holdout_mare, ".2f") + "%"
        bias = cell(None if r.holdout_bias is None else 100 * r.holdout_bias, "+.2f") + "%"
        line = f"{r.law:<16} {r.n_params:>2} {r.n_points:>4} {mare:>12} {bias:>8} {cell(r.rmse_log, '.4f'):>9}"
        line += f" {cell(r.aic, '.1f'):>9} {cell(r.bic, '.1f'):>9}"
        lines.append(line + (f"  ({r.error})" if r.error else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("table", help="CSV or Parquet run table (params, tokens or flops, loss)")
    ap.add_argument("--laws", default="chinchilla,kaplan,power_law,power_law_no_e", help="comma-separated")
    ap.add_argument("--max-starts", type=int, default=None, help="thin each law's start grid (default: all)")
    ap.add_argument("--json", default=None, help="also write the rows here")
    args = ap.parse_args(argv)
    rows = compare_laws(args.table, laws=[w.strip() for w in args.laws.split(",")], max_starts=args.max_starts)
    print(format_comparison(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.to_dict() for r in rows], f, indent=2)
    return 0


if __name__ == "__main__":
    run_script(main, __file__)
