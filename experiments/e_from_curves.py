"""Can a wider family of points pin the irreducible loss E? The loss-curve law on every checkpoint.

A final-loss fit of a first round (12 runs) reads the small models' curvature as the floor E. Every
logged checkpoint of those runs is a wider family: `lr_annealing` (scalelab.fitting.loss_curves.curves) fitted on
all of them gives its own E, and resampling whole runs gives that E's spread. If the spread were
narrow, E could enter the final-loss fit as a prior; this prints whether it is, for the store's runs
at or below `--max-flops` (the first round) and for all of them.

    python experiments/e_from_curves.py STORE [--max-flops 2e12] [--boot 24]
"""

from __future__ import annotations

import argparse

import numpy as np

from scalelab.errors import run_script
from scalelab.fitting.estimate.intervals import percentile_interval
from scalelab.fitting.loss_curves.curves import fit_curves
from scalelab.sweeps.tracking.run_curves import store_curves


def curve_e(curves, boot: int, rng: np.random.Generator) -> tuple[float, list[float], int]:
    """(E of the curve law on `curves`, E of each whole-run resample, resamples that failed)."""
    full = fit_curves(curves, law="lr_annealing").params["E"]
    draws, failed = [], 0
    for _ in range(boot):
        pick = rng.integers(0, len(curves), len(curves))
        try:
            draws.append(fit_curves([curves[i] for i in pick], law="lr_annealing").params["E"])
        except Exception:  # noqa: BLE001 - a resample with too few distinct runs: counted, not hidden
            failed += 1
    return full, draws, failed


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store")
    ap.add_argument("--max-flops", type=float, default=2e12)
    ap.add_argument("--boot", type=int, default=24)
    ap.add_argument("--loss", default="final_val_loss")
    args = ap.parse_args(argv)
    runs, curves = store_curves(args.store, loss_col=args.loss)
    flops = dict(zip(runs["run_id"].to_list(), (6 * runs["params"] * runs["tokens"]).to_list()))
    first = [c for c in curves if flops[c.run_id] <= args.max_flops * 1.05]
    rng = np.random.default_rng(0)
    for label, subset in ((f"runs at or below {args.max_flops:.3g} FLOPs", first), ("every run", curves)):
        full, draws, failed = curve_e(subset, args.boot, rng)
        lo, hi = percentile_interval(draws, 0.95)
        print(
            f"{label} ({len(subset)} runs): E = {full:.4f}, 95% over {len(draws)} whole-run resamples "
            f"[{lo:.3f}, {hi:.3f}], log-sd {np.std(np.log(draws)):.2f}" + (f", {failed} failed" if failed else "")
        )


if __name__ == "__main__":
    run_script(main, __file__)
