"""The default's compute-optimal predictions on synthetic truths: recovery, coverage and sharpness.

Protocol (the design of issue 47's public IsoFLOP set, at a smaller scale): six budgets over two
decades (1e18..1e20), seven sizes each over +-0.6 decades around the truth's N*, 1% lognormal run
noise; `scalelab fit`'s defaults (fit_runs(table, FitOptions())); each truth's L*(C) one and 1.5
decades past the runs (1e21, 3e21), predicted by the default (ScalingFit.compute_optimal: the
frontier) and by Approach 3 (the surface's own optimum). Truths:

  chinchilla  Epoch's fit of Chinchilla's runs (Besiroglu et al. 2024): the surface's own form
  kaplan      Kaplan et al.'s published law: no floor (a Chinchilla fit of it settles near the floor)
  transient   chinchilla x (1 + 0.3 (1e7 / N)^0.5): small models pay extra, as runs still in warmup do
  curved      chinchilla x (1 + 0.002 ln(N / 1e7)^2): curvature in ln N no fitted form follows

Per truth and target: mean |error| of each, the default's coverage of the truth by its 95% interval
and its median half-width (ln(hi / point), as %).

    python experiments/frontier_synthetic.py [--trials 12] [--kinds chinchilla,kaplan]
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from scalelab.errors import run_script
from scalelab.fitting.allocation.allocate import numeric_optimum
from scalelab.fitting.entry.fit_options import FitOptions
from scalelab.fitting.entry.fit_runs import fit_runs
from scalelab.fitting.estimate.io import read_runs
from scalelab.fitting.forms.laws import get_law
from scalelab.fitting.selection.simulate import CHINCHILLA_EPOCH, KAPLAN_2020, design_points

BUDGETS = np.logspace(18, 20, 6)
TARGETS = (1e21, 3e21)
NOISE = 0.01


def _chin(n, d):
    p = CHINCHILLA_EPOCH
    return p["E"] + p["A"] / n ** p["alpha"] + p["B"] / d ** p["beta"]


TRUTHS = {
    "chinchilla": _chin,
    "kaplan": lambda n, d: get_law("kaplan").predict(KAPLAN_2020, params=n, tokens=d),
    "transient": lambda n, d: _chin(n, d) * (1 + 0.3 * (1e7 / n) ** 0.5),
    "curved": lambda n, d: _chin(n, d) * (1 + 0.002 * np.log(n / 1e7) ** 2),
}


def trial(kind: str, seed: int) -> list[dict]:
    x = design_points("chinchilla", CHINCHILLA_EPOCH, design="isoflop", budgets=BUDGETS, points_per_budget=7,
                      isoflop_width=0.6)  # fmt: skip
    truth = TRUTHS[kind]
    loss = truth(x["params"], x["tokens"]) * np.exp(
        NOISE * np.random.default_rng(seed).standard_normal(x["params"].size)
    )
    fit = fit_runs(read_runs({**x, "loss": loss}), FitOptions())
    rows = []
    for c in TARGETS:
        true = numeric_optimum(truth, c)[2]
        co = fit.compute_optimal(c)
        lo, hi = co.loss.lo, co.loss.hi
        rows.append({"kind": kind, "target": c, "default": co.loss.point / true - 1, "covered": lo <= true <= hi,
                     "half": math.log(hi / co.loss.point), "approach3": co.surface_loss / true - 1})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--kinds", default=",".join(TRUTHS))
    args = ap.parse_args(argv)
    print("truth       target  default |error|  approach 3 |error|  default coverage  median half-width")
    for kind in args.kinds.split(","):
        rows = [r for seed in range(args.trials) for r in trial(kind, seed)]
        for c in TARGETS:
            mine = [r for r in rows if r["target"] == c]
            d, a = (np.mean([abs(r[k]) for r in mine]) for k in ("default", "approach3"))
            cover = np.mean([r["covered"] for r in mine])
            half = math.expm1(float(np.median([r["half"] for r in mine])))
            print(f"{kind:<11} {c:.0e}  {100 * d:14.2f}%  {100 * a:17.2f}%  {100 * cover:15.0f}%  {100 * half:16.1f}%",
                  flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    run_script(main, __file__)
