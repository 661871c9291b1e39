"""Calibration of bootstrap (and delta-method) intervals on synthetic Chinchilla sweeps.

For each of `--datasets` sweeps simulated from known parameters (Besiroglu et al.'s Chinchilla
values, a 16 x 15 grid of N x D = 240 runs, lognormal loss noise), fit Approach 3, bootstrap, and
record whether the nominal 95% percentile interval contains the true alpha, beta and
a_opt = beta / (alpha + beta). Reports the measured coverage with its binomial standard error.
The issue's target: 93-97% over >= 200 datasets.

    python bench/fit_calibration.py --datasets 200 --n-boot 400        # ~7 min on the shared 2-core box
    python bench/fit_calibration.py --datasets 20 --n-boot 200         # quick look

Cost savers, stated in the output: the full-data fit uses every 9th point of Hoffmann's grid
(500 starts; --grid-stride) - the optimum is the same as with 4500 on these designs - and each
replicate is warm-started plus --extra-starts of the fit's other distinct end points.

Measured 2026-12-02 (`--datasets 200 --n-boot 400`, 1% noise, 417 s on the shared box): bootstrap
coverage alpha 95.5%, beta 98.0%, a_opt 98.5% (binomial SE 1.5%); delta method 91.5%, 96.0%, 92.0%.
bootstrap_sd_over_mc_sd (rms bootstrap sd / sd of the estimates over these 200 datasets): alpha
1.01, beta 1.10, a_opt 1.11. With 2% noise (`--n-boot 200 --grid-stride 45 --noise 0.02`):
bootstrap 94.5%, 98.0%, 98.0%.

Why beta and a_opt over-cover (investigated 2026-12-02; no code defect found):
- Replicates are at their own optimum (60 datasets, 200 replicates each): re-running every
  replicate from its end point with ftol = 0, gtol = 1e-12 (4 restarts) lowers no objective by
  more than 3e-8 and leaves every bootstrap sd unchanged to 3 digits; no replicate sits at a
  bound (200 datasets); all converged.
- The 200-dataset Monte-Carlo sd is itself noisy (SE ~5%): over 1000 datasets (seeds 1000-1999)
  sd(alpha) = 0.0128, sd(beta) = 0.0229, sd(a_opt) = 0.0183. Against these the bootstrap sd is
  ~7% wide for ALL three (1.07, 1.07, 1.07), while the delta-method se / MC sd is 0.99 for all three.
  The apparent alpha/beta difference is the seed set: its first 200 datasets spread alpha 6.5%
  more and beta 2.4% less than the 1000. A uniform 7% excess predicts ~96.4% coverage; 95.5% and
  98.0% are within ~1.1 binomial SE of it.
- The 7% comes from the near-LAD objective (Huber delta = 1e-3 on 1% noise), not from the fitter:
  with objective="squared" the same pipeline's bootstrap sd (200 datasets x 200 replicates) /
  1000-dataset MC sd is 1.00, 1.01, 0.99. The pairs bootstrap of a LAD-type estimator is mildly
  conservative at this n; the sample median of n = 240 normals shows the same (rms bootstrap sd /
  MC sd = 1.04, 2000 samples).
The intervals are therefore honest 95% percentile intervals of a slightly over-dispersed
bootstrap; no width or level adjustment is applied.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from scalelab.fitting.bootstrap import bootstrap
from scalelab.fitting.fit import fit_law
from scalelab.fitting.intervals import delta_method_intervals
from scalelab.fitting.laws import get_law
from scalelab.fitting.simulate import CHINCHILLA_EPOCH, simulate

TARGETS = ("alpha", "beta", "a_opt")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", type=int, default=200)
    ap.add_argument("--n-boot", type=int, default=400)
    ap.add_argument("--noise", type=float, default=0.01)
    ap.add_argument("--grid-stride", type=int, default=9)
    ap.add_argument("--extra-starts", type=int, default=2)
    ap.add_argument("--level", type=float, default=0.95)
    ap.add_argument("--seed", type=int, default=1000)
    ap.add_argument("--out", default=None, help="write the JSON summary here")
    args = ap.parse_args()

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
    main()
