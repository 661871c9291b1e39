"""The paired gap estimator's coverage, width and power on simulated choice studies: no training, no Ray.

Protocol: the demo's design (scalelab.sweeps.closed_loop.demo): budgets 2e11, 6.3e11, 2e12, 4 sizes per budget
from N*/3 to 3 N* (N* at 20 tokens per parameter), one seed; the target 2e13 and its matched decisive
measurement, 3 sizes (N*/2, N*, 2 N*) x 2 seeds. Both arms' losses at every point come straight from
two known Chinchilla laws (the baseline E 0.9, A 106, B 474, alpha = beta = 0.5: 1.95 at 2e11, 1.23 at
2e13) times independent lognormal noise per run of `noise` nats at loss 1.5, the middle budget's
(0.003, 0.006, 0.01: a relative sd of noise / 1.5, as seed noise scales with the loss; no seed luck
shared by the arms, so the pairing cancels nothing but the laws' shared shape). The other arm's law
(TRUTHS): no gap; a constant ratio; a shifted floor E (a constant gap in nats whose ratio drifts
with C); a larger model or data term (a gap that shrinks with C); other exponents (a gap that drifts
and may cross 0). True gaps at the target run from 0 to about 0.1 nats.

Each simulated study is estimated by scalelab.fitting.comparisons.paired_gap twice, on the same pairs and the same
design-point bootstrap (64 replicates): `backtest_t` (the first version) and `noise_corrected` (the
default). The interval is converted to nats at the baseline's true mean loss over the decisive runs
(the baseline fit's own error, the fourth part a study adds, is left out: it scales with the gap and
is small here). Per method it prints:

  coverage      the measured decisive gap (mean over its 6 pairs) inside the 95% interval (goal 90%+,
                nominal 95%), and the true expected gap inside it
  width         the median interval width in nats (issue 49's goal: at most 0.15)
  decided       the share of studies whose interval excludes 0 among those whose true gap exceeds
                twice the per-point scatter (the sd of L_B - L_A at one point at the target:
                sqrt(2) noise / 1.5 L_A)
  wrong         decided studies whose sign is not the true gap's (goal 0); and decided studies
                of a truth with no gap (a calibrated 95% interval decides about 5% of them)

    python experiments/gap_power.py [--trials 40] [--noise 0.003,0.006,0.01] [--first-seed 500] [--json out.json]

The drift part's SE_WEIGHT (scalelab.fitting.comparisons.gap_drift) was set on seeds 0-9 of each cell; figures to
report use --first-seed 500 (trials below 500: seeds no calibration saw).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

from scalelab.errors import run_script
from scalelab.fitting.comparisons.design_bootstrap import resample_design
from scalelab.fitting.comparisons.gap_model import GapPoints
from scalelab.fitting.comparisons.paired_gap import METHODS, Measurement, paired_gap

BUDGETS = (2e11, 6.3e11, 2e12)
TARGET = 2e13
SIZES = np.geomspace(1 / 3, 3, 4)  # x N*
DECISIVE = (0.5, 1.0, 2.0)  # x N* at the target, 2 seeds each
SEEDS = 2
REPLICATES = 64
BASE = (0.9, 106.0, 474.0, 0.5, 0.5)  # E, A, B, alpha, beta
NOISE_AT = 1.5  # the loss at which `noise` is stated in nats


def _n_star(c: float) -> float:
    return math.sqrt(c / 120)  # 20 tokens per parameter


def _loss(p, n, d):
    e, a, b, alpha, beta = p
    return e + a / n**alpha + b / d**beta


def _exponents(alpha: float, beta: float) -> tuple:
    """Other exponents, equal to the baseline at the largest budget's optimum."""
    n = _n_star(2e12)
    d = 2e12 / 6 / n
    e, a, b, al, be = BASE
    return (e, a * n ** (alpha - al), b * d ** (beta - be), alpha, beta)


TRUTHS = {
    "none": BASE,
    "ratio +1%": (BASE[0] * 1.01, BASE[1] * 1.01, BASE[2] * 1.01, *BASE[3:]),
    "ratio +3%": (BASE[0] * 1.03, BASE[1] * 1.03, BASE[2] * 1.03, *BASE[3:]),
    "ratio -6%": (BASE[0] * 0.94, BASE[1] * 0.94, BASE[2] * 0.94, *BASE[3:]),
    "E +0.02": (BASE[0] + 0.02, *BASE[1:]),
    "E -0.05": (BASE[0] - 0.05, *BASE[1:]),
    "E +0.09": (BASE[0] + 0.09, *BASE[1:]),
    "A x1.3": (BASE[0], BASE[1] * 1.3, *BASE[2:]),
    "B x0.8": (BASE[0], BASE[1], BASE[2] * 0.8, *BASE[3:]),
    "exponents 0.47": _exponents(0.47, 0.47),
    "exponents 0.53": _exponents(0.53, 0.53),
    "alpha 0.45": _exponents(0.45, 0.5),
}


def simulate(pb, noise: float, rng) -> tuple[GapPoints, dict]:
    """The design's matched pairs and the decisive measurement (measured and true mean gaps, L_A)."""
    rel = noise / NOISE_AT
    x, size, group, y = [], [], [], []
    for c in BUDGETS:
        for j, m in enumerate(SIZES):
            n = _n_star(c) * m
            d = c / 6 / n
            ea, eb = rng.normal(0, rel, 2)
            la, lb = _loss(BASE, n, d) * math.exp(ea), _loss(pb, n, d) * math.exp(eb)
            x.append(math.log10(c))
            size.append(j)
            group.append(f"{c:g}/{j}")
            y.append(math.log(lb / la))
    ns = np.array([_n_star(TARGET) * m for m in DECISIVE])
    ds = TARGET / 6 / ns
    true_a, true_b = _loss(BASE, ns, ds), _loss(pb, ns, ds)
    la = np.repeat(true_a, SEEDS) * np.exp(rng.normal(0, rel, ns.size * SEEDS))
    lb = np.repeat(true_b, SEEDS) * np.exp(rng.normal(0, rel, ns.size * SEEDS))
    target = {
        "measured": float(np.mean(lb - la)),
        "true": float(np.mean(true_b - true_a)),
        "loss_a": float(np.mean(true_a)),
    }
    return GapPoints(log_budget=x, size=size, group=group, log_ratio=y), target


def study(pb, noise: float, seed: int) -> dict:
    """One simulated study estimated by every method on the same pairs and bootstrap draws."""
    rng = np.random.default_rng(seed)
    points, target = simulate(pb, noise, rng)
    counts = resample_design(points.group, points.log_budget, REPLICATES, seed).row_counts(points.group)
    out = {**target, "noise": noise}
    for method in METHODS:
        est = paired_gap(
            points,
            target_log_budget=math.log10(TARGET),
            counts=counts,
            measurement=Measurement(sizes=len(DECISIVE), pairs=len(DECISIVE) * SEEDS),
            method=method,
        )
        g = est.at_target.in_loss(target["loss_a"])
        out[method] = {"lo": g.lo, "hi": g.hi, "model": est.model, "parts": {k: v for k, v in g.parts.items()}}
    return out


def summarise(rows: list[dict], method: str) -> dict:
    """The four figures of module docstring for one method over `rows`."""
    lo = np.array([r[method]["lo"] for r in rows])
    hi = np.array([r[method]["hi"] for r in rows])
    measured = np.array([r["measured"] for r in rows])
    true = np.array([r["true"] for r in rows])
    scatter = np.array([math.sqrt(2) * r["noise"] / NOISE_AT * r["loss_a"] for r in rows])
    decided = (lo > 0) | (hi < 0)
    big = np.abs(true) > 2 * scatter
    side = np.where(lo > 0, 1.0, -1.0)
    nonzero = true != 0
    return {
        "studies": len(rows),
        "coverage_measured": float(np.mean((lo <= measured) & (measured <= hi))),
        "coverage_true": float(np.mean((lo <= true) & (true <= hi))),
        "median_width": float(np.median(hi - lo)),
        "big_gaps": int(big.sum()),
        "decided_big": float(np.mean(decided[big])) if big.any() else math.nan,
        "wrong": int(np.sum(decided & nonzero & (np.sign(true) != side))),
        "decided_no_gap": int(np.sum(decided & ~nonzero)),
        "no_gap": int(np.sum(~nonzero)),
    }


def run(trials: int, noises: list[float], truths: list[str], first_seed: int = 0) -> list[dict]:
    rows = []
    for t, name in enumerate(truths):
        for k, noise in enumerate(noises):
            for i in range(trials):
                row = study(TRUTHS[name], noise, seed=first_seed + 100_000 * t + 1_000 * k + i)
                rows.append({"truth": name, **row})
    return rows


def _line(label: str, s: dict) -> str:
    return (
        f"{label:<28} {s['studies']:>5} {100 * s['coverage_measured']:8.1f}% {100 * s['coverage_true']:8.1f}% "
        f"{s['median_width']:9.4f} {100 * s['decided_big']:8.1f}% ({s['big_gaps']:>4}) {s['wrong']:>5} "
        f"{s['decided_no_gap']:>4}/{s['no_gap']}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=40, help="simulated studies per truth and noise level")
    ap.add_argument("--noise", default="0.003,0.006,0.01", help="per-run noise sds in nats, comma-separated")
    ap.add_argument("--truths", default=",".join(TRUTHS), help="comma-separated names of TRUTHS")
    ap.add_argument("--first-seed", type=int, default=0, help="the first study's seed (500: draws no calibration saw)")
    ap.add_argument("--json", default=None, help="also write the summaries here")
    args = ap.parse_args(argv)
    truths = args.truths.split(",")
    for name in truths:
        if name not in TRUTHS:
            print(f"--truths: {name!r} is not a truth; use one of {', '.join(TRUTHS)}", file=sys.stderr)
            return 2
    noises = [float(v) for v in args.noise.split(",")]
    start = time.perf_counter()
    rows = run(args.trials, noises, truths, args.first_seed)
    wall = time.perf_counter() - start
    for name in truths:
        gaps = [r["true"] for r in rows if r["truth"] == name]
        print(f"truth {name:<15} true gap at 2e13 {np.mean(gaps):+.4f} nats")
    head = (
        f"{'method / truth':<28} {'n':>5} {'cov meas':>9} {'cov true':>9} {'width':>9} {'decided':>9} {'(big)':>6} "
        f"{'wrong':>5} {'no-gap decided':>14}"
    )
    summary = {
        "trials": args.trials,
        "first_seed": args.first_seed,
        "noise": noises,
        "wall_s": wall,
        "load_average": os.getloadavg(),
        "methods": {},
    }
    for method in METHODS:
        print(f"\n{head}")
        summary["methods"][method] = {"all": summarise(rows, method)}
        print(_line(f"{method} (all)", summary["methods"][method]["all"]))
        for name in truths:
            s = summarise([r for r in rows if r["truth"] == name], method)
            summary["methods"][method][name] = s
            print(_line(f"  {name}", s))
    print(f"\n{len(rows)} studies in {wall:.1f} s; load average {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(summary, fh, indent=1)
    return 0


if __name__ == "__main__":
    run_script(main, __file__)
