"""A candidate interval for far targets, measured against the uncalibrated one on synthetic truths.

The uncalibrated interval (before scalelab.fitting.selection.ensemble scaled this term and added a forms
part, experiments/extrapolation_scale.py) adds an extrapolation term t/z k d_t: k is the forward folds'
miss per decade, measured half a decade out where a fold's miss is mostly its own parameter and run
noise, and d_t is the target's distance. The candidate keeps the parts the
bootstrap and the noise model already carry and widens them only by what the folds show beyond
them: the fold that holds out the largest budget is refitted with its own bootstrap, each held-out
run's miss is standardised by that fold's predictive sd (bootstrap, weights, noise),

    z_i = ln(obs_i / pred_i) / sd_fold(i),     lambda = max(1, sqrt(mean z_i^2)),

and the target's interval is point * exp(+-z lambda sqrt(s_boot^2 + s_weights^2 + sigma^2)).
Under the fitted form z is about N(0, 1) and lambda about 1; under a misspecified truth the fold's
misses exceed its own spread and lambda scales the interval, whose bootstrap part already grows
with distance.

Trials, truths and designs are experiments/stacked_coverage.py's (same seeds), so the uncalibrated columns
reproduce its uncalibrated table in docs/extrapolation.md.

    python experiments/interval_calibration.py --trials 16 --kinds chinchilla,farseer [--bootstrap 8]

On this machine's runs: `--store DIR --max-flops 2e12 --score N,D,LOSS ...` fits the store's runs at
or below max-flops as `scalelab fit DIR` does (its spec's `fit:`), the fold on the runs below the
largest of those budgets, and prints both intervals at each scored (params, tokens, measured loss).
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from experiments.stacked_coverage import DESIGNS, MULTIPLES, NOISE, draw, target_runs
from scalelab.errors import run_script
from scalelab.fitting.selection.ensemble import fit_stacked
from scalelab.fitting.uncertainty.predictive import interval_from_parts
from scalelab.store.runs_table import load_runs
from scalelab.sweeps.closed_loop.store_fit import fit_options, fit_store, store_fit_spec


def _sd(parts: dict) -> float:
    return math.sqrt(parts["bootstrap"] ** 2 + parts["weights"] ** 2 + parts["noise"] ** 2)


def trial(seed: int, kind: str, bootstrap: int) -> dict:
    budgets = DESIGNS["demo"][0]
    f, n, d, c, y, rng = draw(seed, kind)
    kw = dict(noise=NOISE, bootstrap=bootstrap)
    fit = fit_stacked(params=n, tokens=d, loss=y, flops=c, groups=c, **kw)
    held = c >= max(budgets) * 0.99
    fold = fit_stacked(params=n[~held], tokens=d[~held], loss=y[~held], flops=c[~held], groups=c[~held], **kw)
    lam = fold_lambda(fold, n[held], d[held], c[held], y[held])
    out = {"lambda": lam}
    for mult, budget, nn, dd, obs in target_runs(fit, f, rng, budgets):
        pi = fit.predict_interval(nn, dd, budget, extrapolation_scale=1.0, forms=False)
        cand = interval_from_parts(pi.point, {"scaled": lam * _sd(pi.parts)}, pi.level)
        out[mult] = (
            (pi.point - obs) / obs,
            pi.lo <= obs <= pi.hi,
            (pi.hi - pi.lo) / pi.point,
            cand.lo <= obs <= cand.hi,
            (cand.hi - cand.lo) / cand.point,
        )
    return out


def fold_lambda(fold, n, d, c, y) -> float:
    """lambda (module docstring) of a fold's fit scored on the held-out runs (n, d, c, y)."""
    z = []
    for nn, dd, cc, obs in zip(n, d, c, y):
        pi = fold.predict_interval(nn, dd, cc, extrapolation_scale=1.0, forms=False)
        z.append(math.log(obs / pi.point) / _sd(pi.parts))
    return max(1.0, math.sqrt(float(np.mean(np.square(z)))))


def in_first_round(flops, max_flops: float):
    """Whether runs of these FLOPs (a number, array or Series) are in the first round: at or below
    `max_flops`, within 5% (a budget's runs sit near it, not on it)."""
    return flops <= max_flops * 1.05


def first_round_runs(path: str, max_flops: float):
    """The store's runs in the first round (in_first_round)."""
    runs = load_runs(path)
    return runs.filter(in_first_round(6.0 * runs["params"] * runs["tokens"], max_flops))


def score_store(path: str, max_flops: float, scored: list[tuple[float, float, float]]) -> None:
    first = first_round_runs(path, max_flops)
    budgets = 6.0 * first["params"] * first["tokens"]
    fold_runs = first.filter(budgets < float(budgets.max()) / 1.5)
    options = fit_options(store_fit_spec(path))
    fit = fit_store(path, options, runs=first)[0]
    fold = fit_store(path, options, runs=fold_runs)[0]
    held = fit.table.flops >= float(fit.table.flops.max()) / 1.5
    t = fit.table
    lam = fold_lambda(fold.stacked, t.params[held], t.tokens[held], t.flops[held], t.loss[held])
    print(f"{path}: {len(first)} runs, the fold {len(fold_runs)}; lambda {lam:.2f}")
    for n, d, obs in scored:
        pi = fit.stacked.predict_interval(n, d, 6 * n * d, extrapolation_scale=1.0, forms=False)
        cand = interval_from_parts(pi.point, {"scaled": lam * _sd(pi.parts)}, pi.level)
        print(
            f"  N {n:.0f} D {d:.3g} ({6 * n * d / max_flops:.0f}x): predicted {pi.point:.4f}, measured {obs:.4f} "
            f"({pi.point / obs - 1:+.2%}); uncalibrated [{pi.lo:.4f}, {pi.hi:.4f}] ({(pi.hi - pi.lo) / pi.point:.1%}); "
            f"candidate [{cand.lo:.4f}, {cand.hi:.4f}] ({(cand.hi - cand.lo) / cand.point:.1%})"
        )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--kinds", default="chinchilla,farseer")
    ap.add_argument("--bootstrap", type=int, default=8)
    ap.add_argument("--store", default=None)
    ap.add_argument("--max-flops", type=float, default=2e12)
    ap.add_argument("--score", nargs="*", default=[], help="PARAMS,TOKENS,LOSS of a run the fit has not seen")
    args = ap.parse_args(argv)
    if args.store:
        score_store(args.store, args.max_flops, [tuple(float(v) for v in s.split(",")) for s in args.score])
        return
    head = f"{'truth':<11} {'target':>6} {'|err|':>7} {'uncalibrated: cover':>15} {'width':>6}"
    print(head + f" {'candidate: cover':>17} {'width':>6}")
    for kind in args.kinds.split(","):
        t0 = time.perf_counter()
        rows = [trial(i, kind, args.bootstrap) for i in range(args.trials)]
        for mult in MULTIPLES:
            e, cov, width, ccov, cwidth = (np.array([r[mult][k] for r in rows], dtype=float) for k in range(5))
            print(
                f"{kind:<11} {f'{mult}x':>6} {100 * np.mean(np.abs(e)):>6.2f}% {100 * cov.mean():>14.0f}% "
                f"{100 * width.mean():>5.1f}% {100 * ccov.mean():>16.0f}% {100 * cwidth.mean():>5.1f}%"
            )
        lams = np.array([r["lambda"] for r in rows])
        print(
            f"  ({len(rows)} trials, {time.perf_counter() - t0:.0f} s; lambda median {np.median(lams):.2f}, "
            f"max {lams.max():.2f}, > 1 in {np.mean(lams > 1):.0%})",
            flush=True,
        )


if __name__ == "__main__":
    run_script(main, __file__)
