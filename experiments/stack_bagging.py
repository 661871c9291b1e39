"""The stacked law's point weights: the rule's decision against its bagged mean, on the loop's second round.

The growth rule (scalelab.fitting.uncertainty.stacking) decides all or nothing: the incumbent keeps every weight
unless its forward error's slope is 2 se from zero, and then the weights zero the combination's
slope. Its 400 bootstrap draws of the forward groups (the weights' uncertainty, already in the
interval) are a bagged version of the same decision: their mean moves weight in proportion to how
often a resample adopts. On this machine's two cold stores the rule swung 1/0 -> 0/1 -> 1/0 over
three rounds. Scored here, with everything else equal (the same fit, components and (N, D)): "rule",
the rule's own decision; "bagged", the mean of the draws whose resample can test the evidence (the
default, StackRule.point); "all-draws", the mean of every draw (a resample that repeats one of three
groups cannot test a slope and keeps the incumbent: this mean leans to the incumbent even on
overwhelming evidence); and each form alone. Where the rule has something to decide: after the
round-0 design plus its 3x pair, the first fit with three forward groups.

Protocol (synthetic; experiments/stacked_coverage.py's truths and demo design, trial seeds from
`--first-seed`, never used by the calibration's seeds 0-47): per trial, the round-0 runs; the
stacked fit's compute-optimal run at 3x the largest budget, drawn twice from the truth with the runs'
noise (the loop's `--seeds 2` pair); the refit on those 14 runs; its compute-optimal runs at 10x and
30x drawn from the truth. Per target, the log error of every weighting above. `--public`: the same
comparison on experiments/fit_public_auto.py's split of every public family
(`scalelab fit TABLE --law auto` on all but the largest model; its last 30% of checkpoints held out).

    python experiments/stack_bagging.py --trials 24 --workers 2 [--public] [--bootstrap 8]

Prints mean |error| per truth and target for each weighting, and how often the rule adopted; with
`--bootstrap B` the refit carries B replicates and the default's 95% interval (bagged point,
calibrated) is scored too: coverage and mean width per truth and target.
"""

from __future__ import annotations

import argparse
import math
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from experiments.fit_public_auto import stacked_fits
from experiments.stacked_coverage import DESIGNS, NOISE, draw
from scalelab.errors import run_script
from scalelab.fitting.selection.ensemble import StackedFit, fit_stacked
from scalelab.fitting.uncertainty.stacking import StackRule, stack_weights

KINDS = ("chinchilla", "curved", "farseer", "receding")
TARGETS = (10, 30)  # multiples of the round-0 design's largest budget
STEP = 3  # the 3x pair's multiple


def _weightings(fit: StackedFit) -> dict[str, np.ndarray]:
    """rule: the rule's own decision; bagged: the fit's weights (the mean of the draws that can test
    the evidence, the default); all-draws: the mean of every draw; then each form alone."""
    k = len(fit.names)
    st = fit.stack
    rule = stack_weights(st.groups, fit.names, noise=fit.noise, incumbent=st.incumbent, rule=StackRule(point="rule"))
    out = {"rule": rule.weight_vector(), "bagged": st.weight_vector(), "all-draws": st.draws.mean(axis=0)}
    for i, name in enumerate(fit.names):
        out[name] = np.eye(k)[i]
    return out


def _fit(n, d, y, c, bootstrap: int = 0):
    return fit_stacked(params=n, tokens=d, loss=y, flops=c, groups=c, noise=NOISE, bootstrap=bootstrap)


def trial(args: tuple[int, str, int]) -> dict:
    seed, kind, bootstrap = args
    f, n, d, c, y, rng = draw(seed, kind)
    largest = max(DESIGNS["demo"][0])
    first = _fit(n, d, y, c)
    n3, d3, _ = first.optimum(STEP * largest)
    pair = float(f(np.array(n3), np.array(d3))) * np.exp(NOISE * rng.standard_normal(2))
    n2, d2 = np.append(n, [n3, n3]), np.append(d, [d3, d3])
    y2, c2 = np.append(y, pair), np.append(c, [STEP * largest] * 2)
    fit = _fit(n2, d2, y2, c2, bootstrap)
    out = {"seed": seed, "kind": kind, "adopted": fit.stack.adopted, "bagged": fit.stack.weight_vector().tolist()}
    for mult in TARGETS:
        nn, dd, _ = fit.optimum(mult * largest)
        obs = float(f(np.array(nn), np.array(dd))) * math.exp(NOISE * rng.standard_normal())
        out[str(mult)] = {
            name: float(fit.log_predict(nn, dd, weights=w)) - math.log(obs) for name, w in _weightings(fit).items()
        }
        if bootstrap:
            pi = fit.predict_interval(nn, dd, mult * largest)
            out[f"interval {mult}"] = (pi.lo <= obs <= pi.hi, (pi.hi - pi.lo) / pi.point)
    return out


def synthetic(trials: int, first_seed: int, workers: int, bootstrap: int, kinds: tuple[str, ...] = KINDS) -> None:
    jobs = [(s, k, bootstrap) for k in kinds for s in range(first_seed, first_seed + trials)]
    t0 = time.time()
    with ProcessPoolExecutor(workers) as pool:
        rows = list(pool.map(trial, jobs))
    seeds = f"seeds {first_seed}..{first_seed + trials - 1}"
    print(f"synthetic ladder: {len(rows)} trials in {time.time() - t0:.0f} s ({seeds})")
    names = [k for k in rows[0]["10"]]
    print(f"{'truth':<11} {'target':>6} {'adopted':>8} " + " ".join(f"{n:>11}" for n in names))
    for kind in kinds:
        sub = [r for r in rows if r["kind"] == kind]
        adopted = np.mean([r["adopted"] for r in sub])
        for mult in TARGETS:
            errs = [np.mean([abs(math.expm1(r[str(mult)][n])) for r in sub]) for n in names]
            print(f"{kind:<11} {f'{mult}x':>6} {100 * adopted:>7.0f}% " + " ".join(f"{100 * e:>10.2f}%" for e in errs))
    for mult in TARGETS:
        errs = [np.mean([abs(math.expm1(r[str(mult)][n])) for r in rows]) for n in names]
        print(f"{'all':<11} {f'{mult}x':>6} {'':>8} " + " ".join(f"{100 * e:>10.2f}%" for e in errs))
    if bootstrap:
        print(f"the default's 95% interval ({bootstrap} replicates): coverage, mean width")
        for kind in kinds:
            sub = [r for r in rows if r["kind"] == kind]
            cells = [
                f"{mult}x {100 * np.mean([r[f'interval {mult}'][0] for r in sub]):.0f}% "
                f"{100 * np.mean([r[f'interval {mult}'][1] for r in sub]):.1f}%"
                for mult in TARGETS
            ]
            print(f"  {kind:<11} " + "; ".join(cells) + f"  ({len(sub)} trials)")


def public() -> None:
    print("public families (mean |error| on the held-out rows)")
    for name, fit, test in stacked_fits():
        n, d, obs = (test[col].to_numpy().copy() for col in ("params", "tokens", "loss"))
        cells = [
            f"{k} {100 * np.mean(np.abs(np.exp(fit.log_predict(n, d, weights=w)) / obs - 1)):.2f}%"
            for k, w in _weightings(fit).items()
        ]
        bag = ", ".join(f"{v:.2f}" for v in fit.stack.weight_vector())
        print(f"  {name:<22} adopted {fit.stack.adopted!s:<5} bagged weights {bag}: " + "; ".join(cells))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=24, help="trials per truth")
    ap.add_argument("--first-seed", type=int, default=100)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--public", action="store_true")
    ap.add_argument("--bootstrap", type=int, default=0, help="replicates of the refit; > 0 also scores its interval")
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"the truths, comma-separated (default {','.join(KINDS)})")
    args = ap.parse_args(argv)
    if args.public:
        public()
    if args.trials:
        synthetic(args.trials, args.first_seed, args.workers, args.bootstrap, tuple(args.kinds.split(",")))


if __name__ == "__main__":
    run_script(main, __file__)
