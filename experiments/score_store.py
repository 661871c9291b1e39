"""A closed-loop store's first round, fitted by the shipped default, against the runs past it.

The cold-store goals of issue 47 are about what a first round predicts far out: its 30x error within
+-4%, its intervals no wider than 15% at 10x and 20% at 30x and still covering, the demo's 3x within
1.5%. This script scores them on a store trained by `python experiments/closed_loop.py --out DIR --seed S`
(or the demo's, results/demo/isoflop):

1. the first round: the store's round-0 runs (its IsoFLOP design), fitted as the loop fits them
   (scalelab.sweeps.closed_loop.store_fit: the spec's `fit:` options, the whole start grid, seed 0);
2. the scored runs: every later compute-optimal run and a gate-fixing slice past the first design
   (scalelab.sweeps.closed_loop.far_runs), and any `--far` rows of the store's seed
   (experiments/data/closed_loop_far_runs.csv's columns: seed, params, tokens, loss, distance);
3. each predicted as the loop predicts a compute-optimal run of that budget (ScalingFit.run_interval:
   the compute frontier's level with its calibrated 95% interval, or, past a first round with no
   calibrated frontier, the bracket since docs/first-round.md's protocol 2), with the surface's own
   prediction beside it;
4. per distance (a multiple of the first round's largest budget): mean |error|, coverage, mean
   width ((hi - lo) / point, the issue's width), against the goals;
5. the "bracket" column (registered in docs/first-round.md, step 3b, before stores s1100-s1400's far
   runs trained; ScalingFit.bracket_interval, scalelab.fitting.allocation.bracket): the geometric
   mean of the surface's prediction and a power law through each budget's best measured loss, its
   95% interval, and its "ends" (the two sides themselves: the claim that the truth lies between).

    python experiments/score_store.py DIR/loop [--far experiments/data/closed_loop_far_runs.csv --seed S] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import pathlib

import numpy as np
import polars as pl

from scalelab.errors import run_script
from scalelab.store import load_runs
from scalelab.sweeps.closed_loop.far_runs import far_runs
from scalelab.sweeps.closed_loop.store_fit import fit_options, fit_store, store_fit_spec

GOALS = {3: (0.015, None), 10: (None, 0.15), 30: (0.04, 0.20)}  # distance: (|error| at most, width at most)


def far_points(path: pathlib.Path, far: pathlib.Path | None, seed: int | None) -> tuple[list[dict], float]:
    """(every scored run of the store and of --far, the first round's largest budget)."""
    runs = load_runs(path).filter(pl.col("status") == "done")
    runs = runs.with_columns(round=pl.col("round").fill_null(0) if "round" in runs.columns else pl.lit(0))
    largest = float(runs.filter(pl.col("round") == 0)["flops_budget"].max())
    points = [
        {"params": r["params"], "tokens": r["tokens"], "loss": r["final_val_loss"], "budget": r["flops_budget"],
         "source": f"round {r['round']} {r['proposal']}", "run_id": r["run_id"]}
        for r in far_runs(runs, largest).iter_rows(named=True)
    ]  # fmt: skip
    if far is not None:
        rows = pl.read_csv(far)
        if seed is not None:
            rows = rows.filter(pl.col("seed") == seed)
        points += [
            {"params": r["params"], "tokens": r["tokens"], "loss": r["loss"], "budget": r["distance"] * largest,
             "source": f"--far seed {r['seed']}", "run_id": None}
            for r in rows.iter_rows(named=True)
        ]  # fmt: skip
    return sorted(points, key=lambda p: (p["budget"], p["params"])), largest


def score(path: pathlib.Path, points: list[dict], largest: float) -> list[dict]:
    """Each point predicted by the first round's fit (module docstring, 1 and 3)."""
    runs = load_runs(path)
    runs = runs.with_columns(round=pl.col("round").fill_null(0) if "round" in runs.columns else pl.lit(0))
    fit = fit_store(path, fit_options(store_fit_spec(path)), runs=runs.filter(pl.col("round") == 0))[0]
    print(f"first round: {fit.loss.size} runs, {fit.law}; degenerate: {[f.name for f in fit.degeneracy] or 'no'}")
    if fit.frontier is not None:
        weights = ", ".join(f"{k} {v:.2f}" for k, v in fit.frontier.calibration.weights.items())
        print(f"frontier: {len(fit.frontier.used)} points, weights {weights}")
    out = []
    for p in points:
        pi = fit.run_interval(p["params"], p["tokens"], p["budget"], optimal=True)
        surface = fit.surface_interval(p["params"], p["tokens"], p["budget"])
        b = fit.bracket_interval(p["params"], p["tokens"], p["budget"])
        out.append(
            p
            | {
                "distance": p["budget"] / largest,
                "predicted": [pi.point, pi.lo, pi.hi],
                "error": pi.point / p["loss"] - 1,
                "width": (pi.hi - pi.lo) / pi.point,
                "covered": bool(pi.lo <= p["loss"] <= pi.hi),
                "surface": [surface.point, surface.lo, surface.hi],
                "surface_error": surface.point / p["loss"] - 1,
                "bracket": [b.point, b.lo, b.hi, b.low_end, b.high_end],
                "bracket_error": b.point / p["loss"] - 1,
                "bracket_width": (b.hi - b.lo) / b.point,
                "bracket_covered": bool(b.lo <= p["loss"] <= b.hi),
                "ends_width": (b.high_end - b.low_end) / b.point,
                "ends_covered": bool(b.low_end <= p["loss"] <= b.high_end),
            }
        )
    return out


def report(rows: list[dict]) -> None:
    print(f"{'run':<28} {'N':>10} {'D':>11} {'x':>4} {'measured':>9} {'predicted [95%]':>26} {'error':>7} "
          f"{'width':>6}  surface            bracket [95%]")  # fmt: skip
    for r in rows:
        lo, hi = r["predicted"][1:]
        out = "" if r["covered"] else " OUT"
        print(f"{r['source']:<28} {r['params']:>10.0f} {r['tokens']:>11.4g} {r['distance']:>4.0f} {r['loss']:>9.4f} "
              f"{r['predicted'][0]:>8.4f} [{lo:.4f}, {hi:.4f}] {100 * r['error']:>+6.2f}% {100 * r['width']:>5.1f}%"
              f"{out}  {r['surface'][0]:.4f} ({100 * r['surface_error']:+.2f}%)  {r['bracket'][0]:.4f} "
              f"[{r['bracket'][1]:.4f}, {r['bracket'][2]:.4f}] ({100 * r['bracket_error']:+.2f}%)")  # fmt: skip
    by_distance = {
        x: [r for r in rows if round(r["distance"]) == x] for x in sorted({round(r["distance"]) for r in rows})
    }
    print("by distance: mean |error|, coverage, mean width; the goal")
    for x, mine in by_distance.items():
        err = float(np.mean([abs(r["error"]) for r in mine]))
        width = float(np.mean([r["width"] for r in mine]))
        cover = np.mean([r["covered"] for r in mine])
        goal = GOALS.get(x)
        text = (
            ""
            if goal is None
            else "; goal "
            + ", ".join(
                s
                for s in (goal[0] and f"|error| <= {100 * goal[0]:g}%", goal[1] and f"width <= {100 * goal[1]:g}%")
                if s
            )
        )
        print(f"  {x:>3}x  {len(mine)} run(s)  {100 * err:.2f}%  {100 * cover:.0f}%  {100 * width:.1f}%{text}")
    print(
        "the bracket column (docs/first-round.md, step 3b): mean signed error, coverage and mean width of the 95%"
        " interval, and of the ends"
    )
    for x, mine in by_distance.items():
        err = float(np.mean([r["bracket_error"] for r in mine]))
        cover = np.mean([r["bracket_covered"] for r in mine])
        width = float(np.mean([r["bracket_width"] for r in mine]))
        ends = np.mean([r["ends_covered"] for r in mine]), float(np.mean([r["ends_width"] for r in mine]))
        print(
            f"  {x:>3}x  {len(mine)} run(s)  {100 * err:+.2f}%  {100 * cover:.0f}%  {100 * width:.1f}%  "
            f"ends {100 * ends[0]:.0f}%  {100 * ends[1]:.1f}%"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store", type=pathlib.Path, help="the sweep directory (experiments/closed_loop.py's DIR/loop)")
    ap.add_argument("--far", type=pathlib.Path, default=None, help="far runs not in the store (seed, params, ...)")
    ap.add_argument("--seed", type=int, default=None, help="--far: the store's training seed")
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)
    points, largest = far_points(args.store, args.far, args.seed)
    rows = score(args.store, points, largest)
    report(rows)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    run_script(main, __file__)
