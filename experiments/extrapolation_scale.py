"""The stacked law's calibrated interval: how much of the extrapolation term coverage needs, and
whether the candidate forms' spread should be in it; calibrated on some synthetic truths and seeds,
scored on others, on the public families and on this machine's runs.

Uncalibrated, the interval adds t/z k d_t (k the forward folds' miss per decade) to the bootstrap,
weights and noise parts in log space; on experiments/stacked_coverage.py's truths it covers 100% at 3x, 10x
and 30x with intervals 20-130% wide: k is measured half a decade out, where a fold's miss is mostly
noise, and multiplied by the target's distance. Variants (scalelab.fitting.selection.ensemble):

  uncalibrated  sd^2 = s_boot^2 + s_weights^2 + sigma^2 + (t/z k d_t)^2
  scaled        the last term times c
  forms         the last term dropped, plus (max_j |ln L_j - ln L| / z)^2: every form's prediction inside
  forms+scaled  both (the default, c = EXTRAPOLATION_SCALE)

The calibration rule: on truths `chinchilla` and `curved`, trial seeds 0..T-1 (stacked_coverage.draw),
each variant's c is the smallest on a 0.05 grid whose coverage pooled over 3x, 10x and 30x is >= 95%
and >= 92% at each; the scoring set is all four truths at seeds T..2T-1 (farseer and receding are
forms the calibration never saw). The rule's own pick among variants is the narrowest one on the
calibration set; `--variant` scores another at its calibrated c.

    python experiments/extrapolation_scale.py --trials 16 --workers 2 --out scale.json
    python experiments/extrapolation_scale.py --from scale.json [--variant forms+scaled] [--public] [--more 16]
        [--store DIR --max-flops 2e12 --score N,D,LOSS ...]
    python experiments/extrapolation_scale.py --trials 1 --bootstrap 2 --kinds chinchilla   # a smoke run

Each trial's parts, forms and log error are written to --out, so every variant is scored from one
set of fits. `--public`: experiments/fit_public_auto.py's split of every public family (fit on all models
but the largest, scored on its last 30% of checkpoints). `--store`: the store's runs at or below
--max-flops fitted as `scalelab fit DIR` does, scored at each PARAMS,TOKENS,LOSS (runs it has not seen).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from scipy import stats

from experiments.fit_public_auto import stacked_fits
from experiments.interval_calibration import first_round_runs
from experiments.stacked_coverage import DESIGNS, MULTIPLES, NOISE, draw, target_runs
from scalelab.errors import UsageError, run_script
from scalelab.fitting.selection.ensemble import StackedFit, fit_stacked
from scalelab.sweeps.closed_loop.store_fit import fit_options, fit_store, store_fit_spec

KINDS = ("chinchilla", "curved", "farseer", "receding")
CALIBRATION_KINDS = ("chinchilla", "curved")
GRID = np.round(np.arange(0.05, 1.0001, 0.05), 2)
POOLED, EACH = 0.95, 0.92
Z = float(stats.norm.ppf(0.975))


def uncalibrated(fit: StackedFit, n: float, d: float, flops: float):
    """The uncalibrated interval at (N, D) and each candidate form's log departure from its point:
    what every variant is computed from."""
    pi = fit.predict_interval(n, d, flops, extrapolation_scale=1.0, forms=False)
    return pi, (fit.log_components(n, d) - math.log(pi.point)).tolist()


def trial(args: tuple[int, str, int]) -> dict:
    """One trial: per distance the log error ln(obs/pred), the interval's log-space parts and the forms."""
    seed, kind, bootstrap = args
    f, n, d, c, y, rng = draw(seed, kind)
    fit = fit_stacked(params=n, tokens=d, loss=y, flops=c, groups=c, noise=NOISE, bootstrap=bootstrap)
    out = {"seed": seed, "kind": kind, "targets": {}}
    for mult, budget, nn, dd, obs in target_runs(fit, f, rng, DESIGNS["demo"][0]):
        pi, forms = uncalibrated(fit, nn, dd, budget)
        out["targets"][str(mult)] = {"log_error": math.log(obs / pi.point), "forms": forms, **pi.parts}
    return out


# name -> (the scale's grid, whether every form's prediction is kept inside the interval)
VARIANTS = {
    "uncalibrated": ((1.0,), False),
    "scaled": (GRID, False),
    "forms": ((0.0,), True),
    "forms+scaled": ((0.0, *GRID), True),
}


def variant_sd(parts: dict, scale: float, forms: bool) -> float:
    """sd(c) of the module docstring; with `forms`, plus max_j |ln L_j - ln point| / z: no candidate
    form's own prediction falls outside the interval."""
    sq = sum(parts[k] ** 2 for k in ("bootstrap", "weights", "noise") if math.isfinite(parts.get(k, math.nan)))
    ext = parts.get("extrapolation", math.nan)
    if math.isfinite(ext):
        sq += (scale * ext) ** 2
    if forms:
        sq += (max(abs(v) for v in parts["forms"]) / Z) ** 2
    return math.sqrt(sq)


def score(rows: list[dict], scale: float, mult: int, forms: bool = False) -> tuple[float, float, float, int]:
    """(coverage, mean relative width, mean |relative error|, trials) at one distance."""
    cov, width, err = [], [], []
    for r in rows:
        t = r["targets"][str(mult)]
        sd = variant_sd(t, scale, forms)
        cov.append(abs(t["log_error"]) <= Z * sd)
        width.append(math.exp(Z * sd) - math.exp(-Z * sd))
        err.append(abs(math.exp(-t["log_error"]) - 1))
    return float(np.mean(cov)), float(np.mean(width)), float(np.mean(err)), len(rows)


def calibrate(rows: list[dict]) -> tuple[str, float, dict]:
    """The calibration rule: per variant the smallest scale on its grid that keeps coverage (pooled
    over distances >= POOLED, each >= EACH); of those, the variant with the narrowest mean width."""
    found = {}
    for name, (grid, forms) in VARIANTS.items():
        for c in grid:
            per = [score(rows, c, m, forms) for m in MULTIPLES]
            if float(np.mean([p[0] for p in per])) >= POOLED and min(p[0] for p in per) >= EACH:
                found[name] = (float(c), float(np.mean([p[1] for p in per])))
                break
    best = min(found, key=lambda k: found[k][1])
    return best, found[best][0], found


def table(rows: list[dict], variant: str, scale: float) -> None:
    forms = VARIANTS[variant][1]
    label = f"{variant} c={scale:.2f}: cover"
    print(f"{'truth':<11} {'target':>6} {'|err|':>7} {'uncalibrated: cover':>15} {'width':>6} {label:>26} {'width':>6}")
    for kind in KINDS:
        sub = [r for r in rows if r["kind"] == kind]
        if not sub:
            continue
        for mult in MULTIPLES:
            cov1, w1, err, k = score(sub, 1.0, mult)
            cov, w, _, _ = score(sub, scale, mult, forms)
            print(
                f"{kind:<11} {f'{mult}x':>6} {100 * err:>6.2f}% {100 * cov1:>14.0f}% {100 * w1:>5.1f}% "
                f"{100 * cov:>25.0f}% {100 * w:>5.1f}%   ({k} trials)"
            )


def interval(pi, forms: list[float], variant: str, scale: float) -> tuple[float, float]:
    sd = variant_sd({**pi.parts, "forms": forms}, scale, VARIANTS[variant][1])
    return pi.point * math.exp(-Z * sd), pi.point * math.exp(Z * sd)


def score_store(path: str, max_flops: float, scored: list[tuple[float, ...]], variant: str, scale: float) -> None:
    first = first_round_runs(path, max_flops)
    fit = fit_store(path, fit_options(store_fit_spec(path)), runs=first)[0].stacked
    print(f"{path}: the {len(first)} runs at or below {max_flops:.3g} FLOPs; {variant} at c={scale:.2f}")
    for n, d, obs in scored:
        pi, forms = uncalibrated(fit, n, d, 6 * n * d)
        lo, hi = interval(pi, forms, variant, scale)
        print(
            f"  N {n:.0f} D {d:.3g} ({6 * n * d / max_flops:.0f}x): predicted {pi.point:.4f}, measured {obs:.4f} "
            f"({pi.point / obs - 1:+.2%}); forms {', '.join(f'{100 * v:+.1f}%' for v in forms)}; "
            f"uncalibrated [{pi.lo:.4f}, {pi.hi:.4f}] ({(pi.hi - pi.lo) / pi.point:.1%}) "
            f"{'covers' if pi.lo <= obs <= pi.hi else 'MISSES'}; {variant} [{lo:.4f}, {hi:.4f}] "
            f"({(hi - lo) / pi.point:.1%}) {'covers' if lo <= obs <= hi else 'MISSES'}"
        )


def score_public(variant: str, scale: float) -> None:
    """experiments/fit_public_auto.py's protocol (`scalelab fit TABLE --law auto` on every model but the
    largest; its last 30% of checkpoints held out): coverage and width of both intervals."""
    print(f"public families, {variant} at c={scale:.2f}")
    for name, fit, test in stacked_fits():
        rows = {"uncalibrated": [], variant: []}
        for n, d, obs in test.select("params", "tokens", "loss").iter_rows():
            pi, forms = uncalibrated(fit, n, d, 6 * n * d)
            for key, (lo, hi) in (("uncalibrated", (pi.lo, pi.hi)), (variant, interval(pi, forms, variant, scale))):
                rows[key].append((lo <= obs <= hi, (hi - lo) / pi.point))
        print(
            f"  {name:<22} {test.height:>3} held-out rows: "
            + "; ".join(
                f"{k} covers {100 * np.mean([r[0] for r in v]):.0f}% at {100 * np.mean([r[1] for r in v]):.1f}%"
                for k, v in rows.items()
            )
        )


def pick_kinds(text: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """--kinds: (the truths scored, those of them the calibration uses); at least one calibration truth."""
    kinds = tuple(text.split(","))
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise UsageError(f"--kinds: unknown truth {unknown[0]!r}; choose from {','.join(KINDS)}")
    calibration = tuple(k for k in CALIBRATION_KINDS if k in kinds)
    if not calibration:
        raise UsageError(f"--kinds {text}: name at least one calibration truth ({','.join(CALIBRATION_KINDS)})")
    return kinds, calibration


def fit_trials(jobs: list[tuple[int, str, int]], workers: int) -> list[dict]:
    """Every job's trial, in worker processes (one worker: in this process, nothing to spawn)."""
    if workers == 1:
        return [trial(job) for job in jobs]
    with ProcessPoolExecutor(workers) as pool:
        return list(pool.map(trial, jobs, chunksize=4))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=24, help="trials per truth in each split")
    ap.add_argument("--bootstrap", type=int, default=8)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--out", default=None, help="write every trial's parts here (JSON)")
    ap.add_argument("--from", dest="src", default=None, help="read the trials from this file instead of fitting")
    ap.add_argument("--store", default=None, help="score this store's first round on --score runs")
    ap.add_argument("--max-flops", type=float, default=2e12)
    ap.add_argument("--score", nargs="*", default=[], help="PARAMS,TOKENS,LOSS of a run the fit has not seen")
    ap.add_argument("--public", action="store_true", help="score the public families")
    ap.add_argument("--variant", choices=sorted(VARIANTS), default=None, help="score this variant at its calibrated c")
    ap.add_argument("--more", type=int, default=0, help="then fit and score this many more trials per truth")
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"the truths, comma-separated (default {','.join(KINDS)})")
    args = ap.parse_args(argv)
    kinds, calibration_kinds = pick_kinds(args.kinds)
    if args.src:
        data = json.loads(Path(args.src).read_text())
    else:
        t0 = time.perf_counter()
        jobs = [(s, k, args.bootstrap) for k in calibration_kinds for s in range(args.trials)]
        jobs += [(s, k, args.bootstrap) for k in kinds for s in range(args.trials, 2 * args.trials)]
        results = fit_trials(jobs, args.workers)
        data = {"trials": args.trials, "bootstrap": args.bootstrap, "rows": results}
        print(f"{len(results)} trials in {time.perf_counter() - t0:.0f} s")
        if args.out:
            Path(args.out).write_text(json.dumps(data))
    t = data["trials"]
    cal = [r for r in data["rows"] if r["kind"] in calibration_kinds and r["seed"] < t]
    held = [r for r in data["rows"] if r["kind"] in kinds and r["seed"] >= t]
    variant, scale, found = calibrate(cal)
    print(f"calibrated on {len(cal)} trials ({', '.join(calibration_kinds)}, seeds 0..{t - 1}):")
    for name in VARIANTS:
        if name not in found:
            print(f"  {name:<13} no c on its grid meets the rule")
            continue
        c, width = found[name]
        print(f"  {name:<13} c={c:.2f}: mean width {100 * width:.1f}%{'  <- chosen' if name == variant else ''}")
    if args.variant:
        variant, scale = args.variant, found[args.variant][0]
        print(f"scored below: {variant} at c={scale:.2f} (--variant)")
    table(cal, variant, scale)
    print(f"\nscored on {len(held)} trials (every truth, seeds {t}..{2 * t - 1})")
    table(held, variant, scale)
    if args.more:
        jobs = [(s, k, data["bootstrap"]) for k in kinds for s in range(2 * t, 2 * t + args.more)]
        more = fit_trials(jobs, args.workers)
        print(f"\nscored on {len(more)} more trials (every truth, seeds {2 * t}..{2 * t + args.more - 1})")
        table(more, variant, scale)
    if args.store:
        print()
        scored = [tuple(float(v) for v in s.split(",")) for s in args.score]
        score_store(args.store, args.max_flops, scored, variant, scale)
    if args.public:
        print()
        score_public(variant, scale)


if __name__ == "__main__":
    run_script(main, __file__)
