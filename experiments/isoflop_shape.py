"""Approach 2's parabola against the IsoFLOP curve's own shape (`approach2(shape="power")`).

Two measurements on Chinchilla-form truths, sizes of every budget laid out around a guessed
N*(C) ~ C^guess (a sweep centred on a wrong allocation, as real sweeps are):
  1. noise-free runs: the N*(C) exponent's error and N* at 1e24 FLOPs (the pure grid bias);
  2. runs with log-normal noise: bias and rmse of the exponent and of ln N* at 30x the largest budget,
     over `--trials` draws (the same draws for both estimators).

    python experiments/isoflop_shape.py [--trials 150] [--seed 0]
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np

from scalelab.errors import UsageError, run_script
from scalelab.fitting.estimate.approaches import approach2
from scalelab.fitting.forms.laws import Chinchilla

TRUTHS = {
    "hoffmann": dict(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28),  # Hoffmann et al.'s fitted law
    "demo-like": dict(E=1.216, A=675.7, B=1492.3, alpha=0.765, beta=0.6175),  # this machine's demo fit
}
SHAPES = ("parabola", "power")


def n_opt(truth: dict, flops) -> np.ndarray:
    al, be = truth["alpha"], truth["beta"]
    g = (al * truth["A"] / (be * truth["B"])) ** (1 / (al + be))
    return g * (np.asarray(flops, dtype=float) / 6) ** (be / (al + be))


def design(truth: dict, budgets: np.ndarray, sizes: int, width: float, guess: float, shift: float):
    """(N, D, C): `sizes` sizes per budget, +-`width` in ln N around exp(shift) N*(C0) (C/C0)^guess."""
    n, c = [], []
    for budget in budgets:
        centre = n_opt(truth, budgets[0]) * np.exp(shift) * (budget / budgets[0]) ** guess
        n += list(centre * np.exp(np.linspace(-width, width, sizes)))
        c += [budget] * sizes
    n, c = np.array(n), np.array(c)
    return n, c / (6 * n), c


def noise_free(truth: dict) -> None:
    a_true = truth["beta"] / (truth["alpha"] + truth["beta"])
    budgets = np.geomspace(1e18, 1e21, 4)
    for guess, width, sizes, shift in [
        (0.5, 1.5, 5, 0.0),
        (0.55, 2.5, 7, -0.3),
        (0.45, 2.0, 5, 0.8),
        (a_true, 1.0, 4, 0.0),
    ]:
        n, d, c = design(truth, budgets, sizes, width, guess, shift)
        loss = Chinchilla().predict(truth, params=n, tokens=d)
        cells = []
        for shape in SHAPES:
            r = approach2(params=n, tokens=d, loss=loss, flops=c, shape=shape)
            cells.append(f"{shape} {r.n_opt.exponent - a_true:+.4f} / {r.n_opt(1e24) / n_opt(truth, 1e24) - 1:+.2%}")
        print(f"  grid ~C^{guess:.2f}, shift {shift:+.1f}, +-{width} ln N, {sizes} sizes: " + " | ".join(cells))


def noisy(truth: dict, trials: int, rng: np.random.Generator) -> None:
    a_true = truth["beta"] / (truth["alpha"] + truth["beta"])
    for budgets, sizes, width, guess, shift, sd in [
        (np.array([2e11, 6.3e11, 2e12]), 4, 1.0, 0.5, 0.0, 0.0056),
        (np.array([2e11, 6.3e11, 2e12]), 4, 1.0, 0.5, 0.0, 0.002),
        (np.geomspace(2e11, 6.3e12, 4), 5, 1.2, 0.55, 0.3, 0.0056),
    ]:
        n, d, c = design(truth, budgets, sizes, width, guess, shift)
        clean = Chinchilla().predict(truth, params=n, tokens=d)
        target = 30 * budgets.max()
        errs = {s: [] for s in SHAPES}
        failed = dict.fromkeys(SHAPES, 0)
        for _ in range(trials):
            loss = clean * np.exp(sd * rng.standard_normal(clean.size))
            for shape in SHAPES:
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        r = approach2(params=n, tokens=d, loss=loss, flops=c, shape=shape)
                except UsageError:
                    failed[shape] += 1
                    continue
                errs[shape].append((r.n_opt.exponent - a_true, np.log(r.n_opt(target) / n_opt(truth, target))))
        cells = []
        for shape in SHAPES:
            e = np.array(errs[shape])
            cells.append(
                f"{shape}: exponent bias {e[:, 0].mean():+.3f} rmse {np.sqrt(np.mean(e[:, 0] ** 2)):.3f}, "
                f"ln N*(30x) bias {e[:, 1].mean():+.3f} rmse {np.sqrt(np.mean(e[:, 1] ** 2)):.3f}"
                + (f" ({failed[shape]} failed)" if failed[shape] else "")
            )
        print(
            f"  {len(budgets)} budgets x {sizes} sizes, +-{width} ln N, grid ~C^{guess}, noise {sd}: "
            + " | ".join(cells)
        )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=150)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    for name, truth in TRUTHS.items():
        print(f"{name}: noise-free, exponent error / N*(1e24) error")
        noise_free(truth)
        print(f"{name}: {args.trials} noisy draws")
        noisy(truth, args.trials, rng)


if __name__ == "__main__":
    run_script(main, __file__)
