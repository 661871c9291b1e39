"""Speed of the Approach-3 fitter: the 4500-start grid and 1000 bootstrap refits, next to plain scipy.

    python bench/fit_speed.py                     # defaults: 240 runs, reference on every 30th start
    python bench/fit_speed.py --ref-stride 1      # the reference over all 4500 starts (slow)

Measured in the same process, on the same simulated Chinchilla sweep (16 x 15 grid of N x D,
2% lognormal noise):
1. fit_law: batched L-BFGS over all 4500 Hoffmann starts + scipy polish of the best 3;
2. bootstrap: 1000 replicates, warm-started (+2 extra starts each), batched;
3. the reference: one scipy L-BFGS-B call per start with a plain numpy Huber objective and its
   analytic gradient (no torch), scipy's default tolerances, on every `--ref-stride`-th start;
   its time is extrapolated to 4500 starts. Its best end point is compared with the batched one;
4. a reference bootstrap: scipy from the warm start with the bootstrap's tight tolerances, on
   `--ref-boot` replicates, extrapolated to 1000.
Wall and CPU seconds are printed with the load average (the development machines are shared).
Goals from the issue: full grid <= 5 s, 1000 bootstrap refits <= 30 s on 2 cores.

Figures it printed, with the date and the machine's load: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
from scipy import optimize

from scalelab.fitting.estimate import fit as fit_mod
from scalelab.fitting.estimate.fit import fit_law
from scalelab.fitting.forms.laws import get_law
from scalelab.fitting.selection.simulate import simulate
from scalelab.fitting.uncertainty.bootstrap import bootstrap, resample_counts


def huber_objective_numpy(theta, log_n, log_d, log_y, weights, delta=1e-3):
    """Plain numpy: sum_i w_i huber(LSE(a - alpha log N, b - beta log D, e) - log y), and its gradient."""
    e, a, b, alpha, beta = theta
    t_a, t_b = a - alpha * log_n, b - beta * log_d
    m = np.maximum(np.maximum(t_a, t_b), e)
    p_a, p_b, p_e = np.exp(t_a - m), np.exp(t_b - m), np.exp(e - m)
    s = p_a + p_b + p_e
    r = m + np.log(s) - log_y
    psi = np.clip(r, -delta, delta)
    f = float(np.sum(weights * psi * (r - 0.5 * psi)))
    ws = weights * psi / s
    grad = np.array([ws @ p_e, ws @ p_a, ws @ p_b, -(ws * p_a) @ log_n, -(ws * p_b) @ log_d])
    return f, grad


class Timer:
    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref-stride", type=int, default=30)
    ap.add_argument("--ref-boot", type=int, default=20)
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--noise", type=float, default=0.02)
    args = ap.parse_args()

    law = get_law("chinchilla")
    data = simulate(law, noise_sigma=args.noise, seed=0)
    n = data["loss"].size
    out = {"runs": n, "torch_threads": fit_mod.MAX_THREADS, "loadavg_before": os.getloadavg()}

    with Timer() as t_fit:
        fit = fit_law(law, data)
    out["fit"] = {
        "wall_s": t_fit.wall,
        "cpu_s": t_fit.cpu,
        "starts": fit.n_starts,
        "objective": fit.objective,
        "params": fit.params,
        "warnings": fit.warnings,
    }

    with Timer() as t_boot:
        boot = bootstrap(law, data, fit, n_boot=args.n_boot, seed=0)
    out["bootstrap"] = {
        "wall_s": t_boot.wall,
        "cpu_s": t_boot.cpu,
        "n_boot": args.n_boot,
        "converged_fraction": float(boot.converged.mean()),
        "alpha_95": boot.interval("alpha"),
        "beta_95": boot.interval("beta"),
    }

    log_n, log_d, log_y = np.log(data["params"]), np.log(data["tokens"]), np.log(data["loss"])
    ones = np.ones(n)
    bounds = list(law.fit_bounds)
    starts = law.init_grid()[:: args.ref_stride]
    best = None
    with Timer() as t_ref:
        for x0 in starts:
            r = optimize.minimize(
                huber_objective_numpy, x0, args=(log_n, log_d, log_y, ones), jac=True, method="L-BFGS-B", bounds=bounds
            )
            if np.isfinite(r.fun) and (best is None or r.fun < best.fun):
                best = r
    scale = law.init_grid().shape[0] / starts.shape[0]
    ref_params = law.to_natural(best.x)
    out["reference_scipy"] = {
        "starts_run": int(starts.shape[0]),
        "wall_s": t_ref.wall,
        "cpu_s": t_ref.cpu,
        "wall_s_extrapolated_4500": t_ref.wall * scale,
        "cpu_s_extrapolated_4500": t_ref.cpu * scale,
        "objective": float(best.fun),
        "params": ref_params,
        "objective_gap_batched_minus_ref": fit.objective - float(best.fun),
        "max_abs_exponent_diff": max(abs(fit.params[k] - ref_params[k]) for k in ("alpha", "beta")),
    }

    counts = resample_counts(n, args.ref_boot, np.random.default_rng(0))
    with Timer() as t_rb:
        for w in counts:
            optimize.minimize(
                huber_objective_numpy,
                np.asarray(fit.theta),
                args=(log_n, log_d, log_y, w),
                jac=True,
                method="L-BFGS-B",
                bounds=bounds,
                options={"gtol": 1e-9, "ftol": 1e-14, "maxiter": 2000},
            )
    out["reference_bootstrap_scipy"] = {
        "replicates_run": args.ref_boot,
        "wall_s": t_rb.wall,
        "cpu_s": t_rb.cpu,
        "wall_s_extrapolated": t_rb.wall * args.n_boot / args.ref_boot,
        "cpu_s_extrapolated": t_rb.cpu * args.n_boot / args.ref_boot,
        "note": "warm start only (the batched bootstrap also runs 2 extra starts per replicate)",
    }
    out["loadavg_after"] = os.getloadavg()
    print(json.dumps(out, indent=2, default=float))


if __name__ == "__main__":
    main()
