"""Every accounting x law x selection variant on the same stores: its error at 3x, 10x and 30x and its width.

Each variant is fitted by the one fit entry (scalelab.fitting.entry.fit_runs, bootstrap 16) on a store's
round-0 IsoFLOP runs (the first design), and again with every run up to 3x and up to 10x (the
loop's later rounds, gate-fixing runs included); it then predicts every later compute-optimal run the
store holds, and the runs of a gate-fixing IsoFLOP slice past the first design (FitOptions
sets the accounting and the law; the runs' N follows the accounting). Variants:

  accounting  total N | non-embedding N | exact-FLOP N (N = C_exact / 6D)
  law         chinchilla | kaplan | farseer (N-dependent data term) | select (one law by the
              held-out-largest backtest) | auto (the stacked law) | auto-level (the stacked law
              with the level evidence rule) | auto@flops (stacked, with a compute-weighted
              Chinchilla as a third form)

    python experiments/extrapolation_variants.py results/bench/closed_loop/loop [--extra N,D,LOSS,C ...]
        [--accounting total,nonembed] [--laws chinchilla,auto]

`--extra` adds a scored point the store does not hold (e.g. a run of an earlier session), with its N
in the three accountings.
Prints one row per variant and fit stage: the signed error and whether the 95% interval covered,
per scored run, and the mean |error| and width per distance.
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np
import polars as pl

from scalelab.errors import UsageError, run_script
from scalelab.fitting.entry.fit_options import FitOptions
from scalelab.fitting.entry.fit_runs import fit_runs
from scalelab.fitting.estimate.io import read_runs
from scalelab.store import load_runs
from scalelab.sweeps.closed_loop.far_runs import far_runs

ACCOUNTING = ("total", "nonembed", "exact")
LAWS = {
    "chinchilla": dict(law="chinchilla"),
    "kaplan": dict(law="kaplan"),
    "farseer": dict(law="farseer"),
    "select": dict(law="select", candidates=("chinchilla", "kaplan")),
    "auto": dict(law="auto"),
    "auto-level": dict(law="auto", evidence="level"),
    "auto@flops": dict(law="auto", candidates=("chinchilla", "kaplan", "chinchilla@flops")),
}


def _n(frame: pl.DataFrame, accounting: str) -> np.ndarray:
    if accounting == "total":
        return frame["params"].to_numpy().astype(float)
    if accounting == "nonembed":
        return frame["params_nonembed"].to_numpy().astype(float)
    return (frame["flops_exact"].to_numpy() / (6.0 * frame["tokens"].to_numpy())).astype(float)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep_dir")
    ap.add_argument(
        "--extra", nargs="*", default=[], help="N,D,LOSS,C,N_NONEMBED,N_EXACT of a scored point not in the store"
    )
    ap.add_argument("--bootstrap", type=int, default=16)
    ap.add_argument(
        "--accounting", default=",".join(ACCOUNTING), help="comma-separated subset of " + ", ".join(ACCOUNTING)
    )
    ap.add_argument("--laws", default=",".join(LAWS), help="comma-separated subset of " + ", ".join(LAWS))
    args = ap.parse_args(argv)
    accountings = [a for a in args.accounting.split(",") if a]
    if unknown := set(args.laws.split(",")) - set(LAWS) - {""}:
        raise SystemExit(f"--laws: {', '.join(sorted(unknown))} unknown; use {', '.join(LAWS)}")
    laws = {k: LAWS[k] for k in args.laws.split(",") if k}
    if unknown := set(accountings) - set(ACCOUNTING):
        raise SystemExit(f"--accounting: {', '.join(sorted(unknown))} unknown; use {', '.join(ACCOUNTING)}")
    runs = load_runs(args.sweep_dir).filter(pl.col("status") == "done")
    runs = runs.with_columns(round=pl.col("round").fill_null(0) if "round" in runs.columns else pl.lit(0))
    base = runs.filter(pl.col("round") == 0)
    largest = float(base["flops_budget"].max())
    scored = far_runs(runs, largest).sort("flops_budget", "params")
    points = [
        dict(
            label=f"{r['flops_budget'] / largest:.0f}x "
            + (f"s{r.get('seed', 0)}" if r["proposal"] == "compute_optimal" else f"{r['params'] / 1e3:.0f}k"),
            mult=r["flops_budget"] / largest,
            budget=r["flops_budget"],
            loss=r["final_val_loss"],
            n={"total": r["params"], "nonembed": r["params_nonembed"], "exact": r["flops_exact"] / (6 * r["tokens"])},
            d=r["tokens"],
            run_id=r["run_id"],
        )
        for r in scored.iter_rows(named=True)
    ]
    for text in args.extra:
        n, d, loss, c, n_ne, n_ex = (float(x) for x in text.split(","))
        points.append(dict(label=f"{c / largest:.0f}x extra", mult=c / largest, budget=c, loss=loss,
                           n={"total": n, "nonembed": n_ne, "exact": n_ex}, d=d, run_id=None))  # fmt: skip
    stages = {"round 0": base}
    for mult in sorted({round(p["mult"]) for p in points if p["run_id"]})[:-1]:
        # every run the loop held once that distance was trained (a gate-fixing round's runs too)
        stages[f"+{mult}x"] = runs.filter(pl.col("flops_budget") <= mult * largest * 1.01)
    print("scored runs: " + ", ".join(f"{p['label']} ({p['loss']:.4f})" for p in points))
    head = f"{'accounting':<10} {'law':<11} {'fitted on':<9}"
    print(head + "".join(f"{p['label']:>16}" for p in points) + "   mean|err| by distance; mean width")
    for accounting, (name, law_kw), (stage, frame) in itertools.product(accountings, laws.items(), stages.items()):
        table = read_runs(
            {"params": _n(frame, accounting), "tokens": frame["tokens"].to_numpy().astype(float),
             "loss": frame["final_val_loss"].to_numpy(), "flops": frame["flops_budget"].to_numpy()}
        )  # fmt: skip
        try:
            fit = fit_runs(table, FitOptions(bootstrap=args.bootstrap, noise_floor=0.0056, **law_kw))
        except UsageError as e:
            print(f"{accounting:<10} {name:<11} {stage:<9} skipped: {e}")
            continue
        cells, by_mult = [], {}
        fitted_max = float(frame["flops_budget"].max())
        for p in points:
            if p["budget"] <= fitted_max * 1.01:
                cells.append(f"{'(fitted)':>16}")
                continue
            pi = fit.predict_interval(p["n"][accounting], p["d"], p["budget"])
            err = pi.point / p["loss"] - 1
            inside = pi.lo <= p["loss"] <= pi.hi
            by_mult.setdefault(round(p["mult"]), []).append((abs(err), (pi.hi - pi.lo) / pi.point))
            cells.append(f"{100 * err:+7.2f}% {'in ' if inside else 'OUT'} w{100 * (pi.hi - pi.lo) / pi.point:3.0f}")
        summary = "; ".join(
            f"{m}x {100 * np.mean([e for e, _ in v]):.2f}% w{100 * np.mean([w for _, w in v]):.0f}%"
            for m, v in sorted(by_mult.items())
        )
        print(f"{accounting:<10} {name:<11} {stage:<9}" + "".join(cells) + "   " + summary, flush=True)
    return 0


if __name__ == "__main__":
    run_script(main, __file__)
