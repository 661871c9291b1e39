"""Calibration of bootstrap (and delta-method) intervals on synthetic Chinchilla sweeps.

For each of `--datasets` sweeps simulated from known parameters (Besiroglu et al.'s Chinchilla
values, a 16 x 15 grid of N x D = 240 runs, lognormal loss noise), fit Approach 3, bootstrap, and
record whether the nominal 95% percentile interval contains the true alpha, beta and
a_opt = beta / (alpha + beta). Reports the measured coverage with its binomial standard error.
The issue's target: 93-97% over >= 200 datasets.

    python experiments/fit_calibration.py --datasets 200 --n-boot 400        # ~7 min on the shared 2-core box
    python experiments/fit_calibration.py --datasets 20 --n-boot 200         # quick look

Cost savers, stated in the output: the full-data fit uses every 9th point of Hoffmann's grid
(500 starts; --grid-stride) - the optimum is the same as with 4500 on these designs - and each
replicate is warm-started plus --extra-starts of the fit's other distinct end points.

Figures it printed, with the date and the machine's load: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from scalelab.errors import run_script
from scalelab.fitting.estimate.fit import fit_law
from scalelab.fitting.estimate.intervals import delta_method_intervals
from scalelab.fitting.forms.laws import get_law
from scalelab.fitting.selection.simulate import CHINCHILLA_EPOCH, simulate
from scalelab.fitting.uncertainty.bootstrap import bootstrap

TARGETS = ("alpha", "beta", "a_opt")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", type=int, default=200)
    ap.add_argument("--n-boot", type=int, default=400)
    ap.add_argument("--noise", type=float, default=0.01)
    ap.add_argument("--grid-stride", type=int, default=9)
    ap.add_argument("--extra-starts", type=int, default=2)
    ap.add_argument("--level", type=float, default=0.95)
    ap.add_argument("--seed", type=int, default=1000)
    ap.add_argument("--out", default=None, help="write the JSON summary here")
    args = ap.parse_args(argv)

    law = get_law("chinchilla")
    truth = dict(CHINCHILLA_EPOCH)
    truth["a_opt"] = truth["beta"] / (truth["alpha"] + truth["beta"])
    starts = law.init_grid()[:: args.grid_stride]
    hits_b = {k: [] for k in TARGETS}
    hits_d = {k: [] for k in TARGETS}
    widths_b = {k: [] for k in TARGETS}
    sd_b = {k: [] for k in TARGETS}  # per-dataset bootstrap sd of the estimate
    est = {k: [] for k in TARGETS}  # per-dataset full-data estimate (its spread is the true sd)
    t0 = time.perf_counter()
    for i in range(args.datasets):
        data = simulate(law, CHINCHILLA_EPOCH, noise_sigma=args.noise, seed=args.seed + i)
        fit = fit_law(law, data, starts=starts)
        boot = bootstrap(law, data, fit, n_boot=args.n_boot, seed=i, n_extra_starts=args.extra_starts)
        dm = delta_method_intervals(law, data, fit, level=args.level)
        for k in TARGETS:
            lo, hi = boot.interval(k, args.level)
            hits_b[k].append(lo <= truth[k] <= hi)
            widths_b[k].append(hi - lo)
            sd_b[k].append(float(np.std(boot.samples[k], ddof=1)))
            est[k].append(float(boot.estimates[k]))
            lo, hi = dm.interval(k)
            hits_d[k].append(lo <= truth[k] <= hi)
        if (i + 1) % 10 == 0 or i + 1 == args.datasets:
            cov = {k: round(float(np.mean(v)), 3) for k, v in hits_b.items()}
            print(f"[{i + 1}/{args.datasets}] {time.perf_counter() - t0:.0f}s bootstrap coverage {cov}", flush=True)
    summary = {
        "datasets": args.datasets,
        "n_boot": args.n_boot,
        "noise_sigma": args.noise,
        "runs_per_dataset": int(data["loss"].size),
        "fit_starts": int(starts.shape[0]),
        "extra_starts_per_replicate": args.extra_starts,
        "level": args.level,
        "bootstrap_coverage": {k: float(np.mean(v)) for k, v in hits_b.items()},
        "delta_method_coverage": {k: float(np.mean(v)) for k, v in hits_d.items()},
        "coverage_se": float(np.sqrt(args.level * (1 - args.level) / args.datasets)),
        "mean_bootstrap_width": {k: float(np.mean(v)) for k, v in widths_b.items()},
        # rms bootstrap sd / Monte-Carlo sd of the estimates across datasets: > 1 means the
        # bootstrap spread is wider than the sampling distribution (SE of the ratio ~ 1/sqrt(2 n)).
        "bootstrap_sd_over_mc_sd": {
            k: float(np.sqrt(np.mean(np.square(sd_b[k]))) / np.std(est[k], ddof=1)) for k in TARGETS
        },
        "mc_sd": {k: float(np.std(est[k], ddof=1)) for k in TARGETS},
        "seconds": time.perf_counter() - t0,
    }
    print(json.dumps(summary, indent=2))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(summary, fh, indent=2)


if __name__ == "__main__":
    run_script(main, __file__)
