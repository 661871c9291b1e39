"""Error, coverage and width of the stacked law's prediction intervals at 3x, 10x and 30x, on
synthetic designs whose truth is known: a law of the fitted form, and three that are not.

Each trial draws a truth (E in [1.2, 2.0], A and B around 60 and 80 within x1.65, alpha and beta in
[0.25, 0.45]), writes the IsoFLOP design a researcher would start from (3 budgets 2e11..2e12, 4
sizes per budget, span 3 around the true N*(C) off by up to x1.35, run noise 0.6% log-sd), fits the
stacked law exactly as `fit.law: auto` does (`fitting.selection.ensemble.fit_stacked`: Chinchilla and Kaplan,
forward backtests, bootstrap), and predicts the fit's own compute-optimal run at 3x, 10x and 30x the
largest budget; the run's loss is drawn from the truth with the same noise. Truths:

  chinchilla  E + A/N^alpha + B/D^beta (the incumbent's own form)
  curved      chinchilla x (1 + 0.02 ln(N/1e5)^2 / 10): curvature in ln N no fitted form follows
  farseer     E + A/N^alpha + B (N/1e5)^0.1 / D^beta: the data term grows with N
  receding    E (1e5/N)^0.05 + A/N^alpha + B/D^beta: the floor recedes with scale

    python experiments/stacked_coverage.py --trials 16 [--kinds chinchilla,curved] [--bootstrap 8]

Prints per truth and distance the mean |error|, the bias, the interval's coverage (with its binomial
standard error), its mean width and how often the forward evidence moved weight off Chinchilla.
The trials' seeds are fixed: the same command prints the same table.

Design for distance: `--design NAME --targets 2e13,6e13` fits another first round (DESIGNS: its
budgets and sizes per budget; the truths and seeds are the same) and predicts at fixed budgets
instead of multiples of the design's largest, so designs are compared at the same targets, each
with its cost (the sum of its runs' FLOPs) printed. A synthetic truth has no warmup transient: a
design's small budgets are as informative here as their noise allows, which on real runs they are not.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

import numpy as np

from scalelab.errors import run_script
from scalelab.fitting.allocation.allocate import chinchilla_optimum
from scalelab.fitting.selection.ensemble import fit_stacked

MULTIPLES = (3, 10, 30)
NOISE = 0.006  # a run's log-sd: the demo's seed study measures 0.4-0.6%
SPAN = 3.0


def _budgets(lo: float, hi: float, k: int) -> tuple[float, ...]:
    return tuple(float(b) for b in np.logspace(math.log10(lo), math.log10(hi), k))


# name -> (budgets, sizes per budget); "demo" is the closed loop's first round
DESIGNS = {
    "demo": (_budgets(2e11, 2e12, 3), 4),  # 12 runs over one decade
    "five": (_budgets(2e11, 2e12, 5), 3),  # 15 runs, one decade, five groups
    "up4": (_budgets(2e11, 6.3e12, 4), 4),  # 16 runs over 1.5 decades, upward
    "down5": (_budgets(2e10, 2e12, 5), 3),  # 15 runs over two decades, downward
}
BUDGETS, SIZES = DESIGNS["demo"]

Truth = Callable[[np.ndarray, np.ndarray], np.ndarray]


def truth(kind: str, rng: np.random.Generator) -> tuple[Truth, dict[str, float]]:
    """A truth of the given kind and the Chinchilla parameters its design is centred on."""
    p = {
        "E": rng.uniform(1.2, 2.0),
        "A": 60 * math.exp(rng.uniform(-0.5, 0.5)),
        "B": 80 * math.exp(rng.uniform(-0.5, 0.5)),
        "alpha": rng.uniform(0.25, 0.45),
        "beta": rng.uniform(0.25, 0.45),
    }

    def base(n, d):
        return p["E"] + p["A"] / n ** p["alpha"] + p["B"] / d ** p["beta"]

    forms: dict[str, Truth] = {
        "chinchilla": base,
        "curved": lambda n, d: base(n, d) * (1 + 0.02 * np.log(n / 1e5) ** 2 / 10),
        "farseer": lambda n, d: p["E"] + p["A"] / n ** p["alpha"] + p["B"] * (n / 1e5) ** 0.1 / d ** p["beta"],
        "receding": lambda n, d: p["E"] * (1e5 / n) ** 0.05 + p["A"] / n ** p["alpha"] + p["B"] / d ** p["beta"],
    }
    return forms[kind], p


def design(
    p: dict[str, float], rng: np.random.Generator, budgets=BUDGETS, sizes: int = SIZES
) -> tuple[np.ndarray, ...]:
    """`sizes` runs per budget, log-spaced over x SPAN either side of a prior N*(C) that is off the truth's."""
    off = math.exp(rng.uniform(-0.3, 0.3))
    n, c = [], []
    for budget in budgets:
        centre = chinchilla_optimum(p, budget)[0] * off
        for x in centre * np.exp(np.linspace(-math.log(SPAN), math.log(SPAN), sizes)):
            n.append(x)
            c.append(budget)
    n, c = np.array(n), np.array(c)
    return n, c / (6 * n), c


def draw(seed: int, kind: str, name: str = "demo"):
    """Trial `seed`'s truth and first round: (truth, n, d, c, measured losses, the trial's generator,
    which then draws the targets' measurements). One protocol for every bench that scores these trials."""
    budgets, sizes = DESIGNS[name]
    rng = np.random.default_rng(1000 + seed)
    f, p = truth(kind, rng)
    n, d, c = design(p, rng, budgets, sizes)
    return f, n, d, c, f(n, d) * np.exp(NOISE * rng.standard_normal(n.size)), rng


def target_runs(fit, f: Truth, rng: np.random.Generator, budgets, targets: tuple[float, ...] | None = None):
    """Per target (a multiple of the design's largest budget, or an absolute budget from `targets`),
    in order: (target, its budget, the fit's compute-optimal N and D there, the run's loss drawn from
    the truth with the runs' noise). One protocol for every bench that scores these trials."""
    for mult in targets or MULTIPLES:
        budget = mult if targets else mult * max(budgets)
        nn, dd, _ = fit.optimum(budget)
        yield mult, budget, nn, dd, float(f(np.array(nn), np.array(dd))) * math.exp(NOISE * rng.standard_normal())


def trial(
    seed: int, kind: str, bootstrap: int, name: str = "demo", targets: tuple[float, ...] | None = None
) -> dict[float, tuple[float, bool, float, bool]]:
    """Per target (target_runs): (relative error, covered, relative width, weight moved off Chinchilla)."""
    f, n, d, c, y, rng = draw(seed, kind, name)
    fit = fit_stacked(params=n, tokens=d, loss=y, flops=c, groups=c, noise=NOISE, bootstrap=bootstrap)
    out = {}
    for mult, budget, nn, dd, obs in target_runs(fit, f, rng, DESIGNS[name][0], targets):
        pi = fit.predict_interval(nn, dd, budget)
        out[mult] = ((pi.point - obs) / obs, pi.lo <= obs <= pi.hi, (pi.hi - pi.lo) / pi.point, fit.stack.adopted)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--kinds", default="chinchilla,curved,farseer,receding")
    ap.add_argument("--bootstrap", type=int, default=8, help="run-resampling replicates per fit")
    ap.add_argument("--design", choices=sorted(DESIGNS), default="demo", help="the first round's budgets and sizes")
    ap.add_argument("--targets", default=None, help="absolute target budgets, comma-separated (default: 3, 10, 30x)")
    args = ap.parse_args(argv)
    targets = tuple(float(t) for t in args.targets.split(",")) if args.targets else None
    budgets, sizes = DESIGNS[args.design]
    cost = sizes * sum(budgets)
    print(f"design {args.design}: {len(budgets)} budgets {budgets[0]:.2g}..{budgets[-1]:.2g}, {sizes} sizes each, "
          f"{len(budgets) * sizes} runs, {cost:.3g} FLOPs")  # fmt: skip
    print(f"{'truth':<11} {'target':>6} {'|err|':>7} {'bias':>7} {'coverage':>13} {'width':>6} {'adopted':>7}")
    for kind in args.kinds.split(","):
        t0 = time.perf_counter()
        rows = [trial(i, kind, args.bootstrap, args.design, targets) for i in range(args.trials)]
        for mult in targets or MULTIPLES:
            e = np.array([r[mult][0] for r in rows])
            cov = float(np.mean([r[mult][1] for r in rows]))
            se = math.sqrt(cov * (1 - cov) / len(rows))
            width = float(np.mean([r[mult][2] for r in rows]))
            adopted = float(np.mean([r[mult][3] for r in rows]))
            print(
                f"{kind:<11} {f'{mult:.2g}' if targets else f'{mult}x':>6} {100 * np.mean(np.abs(e)):>6.2f}% "
                f"{100 * np.mean(e):>+6.2f}% "
                f"{100 * cov:>6.0f}% ± {100 * se:>2.0f}% {100 * width:>5.1f}% {100 * adopted:>6.0f}%"
            )
        print(f"  ({len(rows)} trials, {time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    run_script(main, __file__)
