"""Compute-optimal predictions far out on public model families: the default against Approach 3.

The protocol is registered in docs/frontier.md ("The public benchmark"), committed before any score
of it was seen; this script is that protocol, on the package's public API (read_runs, fit_runs,
ScalingFit). In short:

1. Families and their (N, D, loss) (experiments/fit_public.py's loaders): OPT, GPT-3, LM-1, Pile-T5 and
   RedPajama are loss curves (each model's first 10% of tokens left out); Epoch's extraction of
   Chinchilla's runs (--epoch-csv; not in the repository) are final losses.
2. Rolling origin over compute: at each origin (ORIGINS, fractions of the family's span in log C)
   the runs at or below it are fitted with `scalelab fit`'s defaults (FitOptions()); every later
   0.1-decade compute bin's lowest-loss run is a target, at its distance in decades beyond the
   largest fitted compute.
3. Each target is predicted as the loop predicts a compute-optimal run: the default is
   ScalingFit.optimal_run_interval(N, D, C) (the compute frontier's L*(C) times the surface's
   excess at (N, D), the frontier's calibrated 95% interval); Approach 3 is the surface at (N, D)
   with its own interval (ScalingFit.predict, surface_interval). The frontier's bare L*(C) is kept
   too.
4. Per family and distance bin: mean |relative error|, bias, coverage of the 95% intervals, the
   median half-width (ln(hi/point), as %) and its ratio to the median |log error|.

    python experiments/frontier_public.py --families opt,gpt3,lm1,pile_t5,redpajama --epoch-csv EPOCH.csv --json OUT
    python experiments/frontier_public.py --table runs.csv --name mine      # any table: params, tokens, loss[, flops]
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import time

import numpy as np
import polars as pl

from experiments import fit_public
from scalelab.errors import run_script
from scalelab.fitting.entry.fit_options import FitOptions
from scalelab.fitting.entry.fit_runs import fit_runs
from scalelab.fitting.estimate.io import read_runs
from scalelab.fitting.uncertainty.compute_groups import is_curve_table

ORIGINS = (0.4, 0.5, 0.6, 0.7, 0.8)  # fractions of the family's span in log10 C
BIN_DECADES = 0.1  # target bins in log10 C: each bin's lowest-loss run
DISTANCES = (0.0, 0.25, 0.5, 1.0, 1.5, math.inf)  # decades beyond the fitted compute
DROP_FIRST = 0.1  # a loss curve's first 10% of tokens (warmup transients), as the Hitchhiker's guide
MIN_TRAIN_ROWS = 12
FAMILIES = {
    "opt": ("OPT", fit_public.load_opt),
    "gpt3": ("GPT-3", fit_public.load_gpt3),
    "lm1": ("LM-1", fit_public.load_revisiting_lm),
    "pile_t5": ("Pile-T5", fit_public.load_pile_t5),
    "redpajama": ("RedPajama", fit_public.load_redpajama),
}


def prepare(df: pl.DataFrame) -> pl.DataFrame:
    """(model, params, tokens, flops, loss): duplicates out, flops = 6ND where not given, and a loss
    curve's first DROP_FIRST of tokens out."""
    if "flops" not in df.columns:
        df = df.with_columns(flops=6.0 * pl.col("params") * pl.col("tokens"))
    if "model" not in df.columns:
        df = df.with_columns(model=pl.col("params").cast(pl.Utf8))
    df = df.unique(subset=["model", "tokens", "loss"], keep="first", maintain_order=True)
    if is_curve_table(df["params"].to_numpy().astype(float), df["tokens"].to_numpy().astype(float)):
        df = df.filter(pl.col("tokens") > DROP_FIRST * pl.col("tokens").max().over("model"))
    return df.select("model", "params", "tokens", "flops", "loss").sort("flops")


def targets(test: pl.DataFrame) -> pl.DataFrame:
    """Every BIN_DECADES compute bin's lowest-loss run."""
    test = test.with_columns(bin=(pl.col("flops").log10() / BIN_DECADES).floor())
    return test.sort("loss").group_by("bin", maintain_order=True).first().sort("flops")


def score_origin(family: str, df: pl.DataFrame, frac: float) -> list[dict]:
    """The targets beyond one origin, each predicted by the default and by Approach 3 (module docstring)."""
    lc = np.log10(df["flops"].to_numpy())
    origin = lc.min() + frac * (lc.max() - lc.min())
    train, test = df.filter(pl.col("flops").log10() <= origin), df.filter(pl.col("flops").log10() > origin)
    if train.height < MIN_TRAIN_ROWS or test.is_empty():
        return []
    t0 = time.perf_counter()
    fit = fit_runs(read_runs(train.select("params", "tokens", "flops", "loss")), FitOptions())
    seconds = time.perf_counter() - t0
    c_max = float(train["flops"].max())
    rows = []
    for r in targets(test).iter_rows(named=True):
        n, d, c, y = r["params"], r["tokens"], r["flops"], r["loss"]
        default = fit.optimal_run_interval(n, d, c)
        surface = fit.surface_interval(n, d, c)
        bare = fit.compute_optimal(c).loss
        rows.append(
            {
                "family": family,
                "origin": frac,
                "decades": math.log10(c / c_max),
                "observed": y,
                "default": [default.point, default.lo, default.hi],
                "approach3": [float(fit.predict(n, d)), surface.lo, surface.hi],
                "frontier": [bare.point, bare.lo, bare.hi],
                "has_frontier": fit.frontier is not None,
                "degenerate": [f.name for f in fit.degeneracy],
                "fit_seconds": seconds,
            }
        )
    return rows


def _stats(rows: list[dict], key: str) -> dict:
    obs = np.array([r["observed"] for r in rows])
    pred = np.array([r[key] for r in rows])
    rel = pred[:, 0] / obs - 1
    err = np.abs(np.log(pred[:, 0] / obs))
    half = (np.log(pred[:, 2]) - np.log(pred[:, 1])) / 2
    cover = (pred[:, 1] <= obs) & (obs <= pred[:, 2])
    med_err = float(np.median(err))
    return {
        "n": len(rows),
        "mare": float(np.mean(np.abs(rel))),
        "bias": float(np.mean(rel)),
        "coverage": float(np.mean(cover)),
        "half_width": float(np.expm1(np.median(half))),
        "ratio": float(np.median(half) / med_err) if med_err > 0 else float("inf"),
    }


def distance_bin(decades: float) -> str:
    for lo, hi in zip(DISTANCES[:-1], DISTANCES[1:]):
        if lo < decades <= hi:
            return f"{lo:g}-{hi:g}" if math.isfinite(hi) else f">{lo:g}"
    return "0"


def summarise(rows: list[dict]) -> dict:
    """Per family (all its targets) and per family and distance bin, each method's _stats; per
    distance bin the families' mean of each (every family weighing one)."""
    out: dict = {"family": {}, "family_bin": {}, "bin": {}}
    families = list(dict.fromkeys(r["family"] for r in rows))
    bins = [distance_bin(x) for x in (0.1, 0.4, 0.8, 1.2, 2.0)]
    for f in families:
        mine = [r for r in rows if r["family"] == f]
        out["family"][f] = {k: _stats(mine, k) for k in ("default", "approach3", "frontier")}
        for b in bins:
            sub = [r for r in mine if distance_bin(r["decades"]) == b]
            if sub:
                out["family_bin"][f"{f} | {b}"] = {k: _stats(sub, k) for k in ("default", "approach3")}
    for b in bins:
        cells = [v for k, v in out["family_bin"].items() if k.endswith(f"| {b}")]
        if cells:
            out["bin"][b] = {
                k: {s: float(np.mean([c[k][s] for c in cells])) for s in ("mare", "coverage", "half_width", "ratio")}
                for k in ("default", "approach3")
            } | {"families": len(cells), "n": int(sum(c["default"]["n"] for c in cells))}
    return out


def print_tables(summary: dict) -> None:
    print("family      targets  default MARE  approach 3 MARE  ratio  frontier L* MARE  default coverage / half-width")
    ratios = []
    for f, s in summary["family"].items():
        d, a, fr = s["default"], s["approach3"], s["frontier"]
        ratios.append(d["mare"] / a["mare"])
        print(f"{f:<11} {d['n']:>7}  {100 * d['mare']:>11.2f}%  {100 * a['mare']:>14.2f}%  {ratios[-1]:>5.2f}  "
              f"{100 * fr['mare']:>15.2f}%  {100 * d['coverage']:.0f}% / {100 * d['half_width']:.1f}%")  # fmt: skip
    print(f"mean over families of default / approach 3: {np.mean(ratios):.2f}")
    print("\nfamily | distance (decades): n, MARE default / A3, coverage default / A3, half-width default / A3, "
          "half-width over median |error| (default)")  # fmt: skip
    for k, s in summary["family_bin"].items():
        print(f"  {k:<22} {s['default']['n']:>4}  " + _cells(s["default"], s["approach3"]))
    print("\npooled by distance (each family weighing one): families, targets, MARE default / A3, coverage, "
          "half-width, half-width over median |error|")  # fmt: skip
    for b, s in summary["bin"].items():
        print(
            f"  {b:<8} {s['families']} {s['n']:>4}  "
            + _cells(s["default"], s["approach3"])
            + f" / x{s['approach3']['ratio']:.2f}"
        )


def _cells(d: dict, a: dict) -> str:
    """'MARE default / A3  coverage default / A3  half-width default / A3  x ratio' of a table row."""
    return (f"{100 * d['mare']:6.2f}% / {100 * a['mare']:6.2f}%  {100 * d['coverage']:4.0f}% / "
            f"{100 * a['coverage']:4.0f}%  {100 * d['half_width']:6.1f}% / {100 * a['half_width']:6.1f}%  "
            f"x{d['ratio']:.2f}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=",".join(FAMILIES), help=f"comma-separated, of {', '.join(FAMILIES)}")
    ap.add_argument("--epoch-csv", type=pathlib.Path, default=None, help="Epoch's svg_extracted_data.csv (scores it)")
    ap.add_argument("--table", type=pathlib.Path, default=None, help="score this table instead (params, tokens, loss)")
    ap.add_argument("--name", default="table", help="--table: its family name")
    ap.add_argument("--origins", default=",".join(map(str, ORIGINS)))
    ap.add_argument("--json", type=pathlib.Path, default=None, help="write the rows and the summary here")
    ap.add_argument("--epoch-table", type=pathlib.Path, default=None,
                    help="write Epoch's 240 runs (params, tokens, flops, loss) here and stop")  # fmt: skip
    args = ap.parse_args(argv)
    if args.epoch_table is not None:
        fit_public.load_epoch(args.epoch_csv).select("params", "tokens", "flops", "loss").write_csv(args.epoch_table)
        return 0
    origins = [float(x) for x in args.origins.split(",")]
    if args.table is not None:
        frames = {args.name: pl.read_csv(args.table)}
    else:
        frames = {FAMILIES[k][0]: FAMILIES[k][1]() for k in args.families.split(",") if k}
        if args.epoch_csv is not None:
            frames["Epoch Chinchilla"] = fit_public.load_epoch(args.epoch_csv)
    rows = []
    for name, df in frames.items():
        df = prepare(df)
        for frac in origins:
            got = score_origin(name, df, frac)
            rows += got
            print(f"{name} origin {frac}: {len(got)} targets", file=sys.stderr)
    summary = summarise(rows)
    print_tables(summary)
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    run_script(main, __file__)
