"""Coverage of the closed loop's prediction intervals on synthetic stores whose truth is known.

Each trial draws a law (alpha, beta in [0.25, 0.45], E, A, B around SyntheticLaw's, run noise sd
in [0.3%, 1.5%]), writes the 3-budget IsoFLOP design a researcher would start from (centred on a
prior N*(C) that is off the true one by up to x1.6 either way, span 3), and runs the loop on it
exactly as on real runs: `sweep next` (bracketing rounds while a gate fails), then the
compute-optimal run at 3x the largest budget, "trained" by drawing its loss from the truth (with the
same noise), then a refit and a run at 10x. Every prediction goes through the ledger, which scores
it. With --misspecify M the truth is not of the fitted form: the loss is multiplied by
(1 + M * ln(N / 1e5)^2 / 10), a curvature in ln N that the Chinchilla form cannot follow, so the
intervals' extrapolation term has something to cover.

    python experiments/loop_coverage.py --trials 24                  # ~20 min on the shared 2-core box
    python experiments/loop_coverage.py --trials 24 --misspecify 0.01

Prints one row per trial and the coverage of the 3x and 10x predictions with binomial standard errors.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import yaml
from scipy import optimize

from scalelab.analysis.synthetic import SyntheticLaw, synthetic_trainer
from scalelab.errors import run_script
from scalelab.fitting.allocation.allocate import chinchilla_optimum
from scalelab.store import ledger
from scalelab.sweeps.closed_loop.rounds import LaunchOptions, run_rounds
from scalelab.sweeps.specs.spec import expand_sweep

GATE_ROUNDS = 3  # rounds at 3x that may fix failed gates


def _law(rng: np.random.Generator, misspecify: float) -> SyntheticLaw:
    law = replace(
        SyntheticLaw(),
        alpha=float(rng.uniform(0.25, 0.45)),
        beta=float(rng.uniform(0.25, 0.45)),
        E=float(rng.uniform(1.2, 2.0)),
    )
    return _CurvedLaw(law, misspecify) if misspecify else law


class _CurvedLaw:
    """A SyntheticLaw whose loss carries a curvature in ln N the Chinchilla form cannot follow."""

    def __init__(self, law: SyntheticLaw, m: float):
        self.law, self.m = law, m

    def loss(self, params, tokens):
        n = np.asarray(params, dtype=float)
        return self.law.loss(params, tokens) * (1 + self.m * np.log(n / 1e5) ** 2 / 10)

    def params_dict(self):
        return self.law.params_dict()


def _budget_for(truth: dict, n_opt: float) -> float:
    """The FLOP budget whose true compute-optimal size is n_opt."""
    return math.exp(optimize.brentq(lambda lc: math.log(chinchilla_optimum(truth, math.exp(lc))[0] / n_opt), 0, 80))


class _Phases:
    """The trial's rounds, as run_rounds' `next_round` and `before_launch`: rounds at 3x the largest
    budget (bracketing while a gate fails, at most GATE_ROUNDS), then, once a fit passes, one round
    at the 30x target with a 10x step, trained only when its own fit passes."""

    def __init__(self, gate_budget: float, target: float):
        self.gate_budget, self.target = gate_budget, target
        self.tries, self.final = 0, False

    def __call__(self, i: int, last) -> dict | None:
        if last is None:
            return {"budget_flops": self.gate_budget}
        if self.final:  # the final round was launched
            return None
        if last.passed:
            self.final = True
            return {"budget_flops": self.target, "step": 10.0}
        self.tries += 1
        return {"budget_flops": self.gate_budget} if self.tries < GATE_ROUNDS else None

    def launches(self, i: int, proposal) -> bool:
        return proposal.passed or not self.final


def trial(i: int, root: Path, misspecify: float) -> list[dict]:
    rng = np.random.default_rng(1000 + i)
    law = _law(rng, misspecify)
    while not 1e11 <= _budget_for(law.params_dict(), 1.5e5) <= 1e15:  # a design this repo's shapes can build
        law = _law(rng, misspecify)
    noise = float(rng.uniform(0.003, 0.015))
    truth = law.params_dict()
    # budgets where the true N* of the smallest is 1.5e5 (so N*/3 is buildable), spanning 10x
    c0 = _budget_for(truth, 1.5e5)
    budgets = [float(f"{c0 * m:.3g}") for m in (1.0, 10**0.5, 10.0)]
    off = math.exp(rng.uniform(-0.47, 0.47))  # the prior's N* is off by up to x1.6
    centers = [chinchilla_optimum(truth, c)[0] * off for c in budgets]
    spec = {
        "name": f"cov{i}",
        "base": {"data": {"seq_len": 64}, "train": {"global_batch_tokens": 64}},
        "isoflop": {"budgets": budgets, "num_sizes": 5, "center": {"params": centers}, "span": 3},
        "fit": {"bootstrap": 16},
    }
    sd = root / f"t{i}"
    target = 30 * budgets[-1]
    plan = _Phases(gate_budget=3 * budgets[-1], target=target)
    run_rounds(expand_sweep(spec), sd, spec_text=yaml.safe_dump(spec, sort_keys=False), spec_name=spec["name"],
               rounds=1 + GATE_ROUNDS + 1, target_flops=target, next_round=plan, before_launch=plan.launches,
               options=LaunchOptions(trainer=synthetic_trainer(law, noise_std=noise, noise_seed=i)),
               log=lambda m: None)  # fmt: skip
    ledger.score(sd)
    preds = [q for q in ledger.read_ledger(sd)["predictions"] if q["kind"] == "compute_optimal"]
    for q in preds:
        q["trial"], q["noise"], q["multiple"] = i, noise, q["flops"] / budgets[-1]
    return preds


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=24)
    ap.add_argument("--misspecify", type=float, default=0.0)
    args = ap.parse_args(argv)
    t0 = time.time()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(args.trials):
            got = trial(i, Path(d), args.misspecify)
            rows += got
            for q in got:
                mult = q["multiple"]
                print(
                    f"trial {i:3d} noise {q['noise']:.2%} C={q['flops']:.3g} ({mult:.0f}x) "
                    f"predicted {q['predicted']:.4f} "
                    f"[{q['interval'][0]:.4f}, {q['interval'][1]:.4f}] measured {q['measured']:.4f} "
                    f"{q['rel_error']:+.2%} {'in' if q['covered'] else 'OUT'}",
                    flush=True,
                )
    print(f"\n{args.trials} trials, misspecification {args.misspecify}, {time.time() - t0:.0f} s")
    for label, lo, hi in (("3x", 2, 4), ("10x", 25, 35)):  # the 10x run: 10x the 3x run's budget
        sel = [q for q in rows if lo <= q["multiple"] <= hi and q["measured"] is not None]
        if not sel:
            continue
        k = sum(q["covered"] for q in sel)
        rate = k / len(sel)
        se = math.sqrt(rate * (1 - rate) / len(sel))
        mare = np.mean([abs(q["rel_error"]) for q in sel])
        width = np.mean([(q["interval"][1] - q["interval"][0]) / q["predicted"] for q in sel])
        print(
            f"{label:>4}: coverage {k}/{len(sel)} = {rate:.0%} (SE {se:.0%}); "
            f"mean |error| {mare:.2%}; mean width {width:.2%}"
        )


if __name__ == "__main__":
    run_script(main, __file__)
