"""Bootstrap refits of a store's fit: every replicate in one batched L-BFGS, next to one fit per replicate.

    python bench/refit_replicates_speed.py                 # 3 synthetic stores x 3 laws, 40 replicates
    python bench/refit_replicates_speed.py --replicates 64 --store DIR   # a real store too

What `scalelab fit`, `sweep next` and the stacked law's interval spend most of their time on: each
of B resamples of the runs refitted from the full fit's optimum plus 8 grid starts, then a scipy
polish of the best end point. Measured in the same process on the same resamples (the plan
refit_bootstrap draws):
1. batched: `refit_bootstrap` as shipped (bootstrap.refit_replicates: every replicate's every
   start a row of one batched L-BFGS, then each replicate's polish);
2. the reference: `refit_law` once per replicate (fit_law on the replicate's drawn runs), which is
   how the replicates were refitted before.
Printed per store and law: seconds of each, their ratio, and how the two agree: each replicate's
objective (on its own runs) at the two end points, relative difference (absolute below 1e-10: an
exactly fitted resample); a replicate whose end points differ by more than 1e-6 is counted where
the batched one is lower or higher (different basins or a flat valley's stopping point).
Synthetic stores: the Chinchilla-form truth (analysis/synthetic.py) on 3, 4 and 6 IsoFLOP budgets.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from scalelab.analysis.store_reader import load_store_runs
from scalelab.analysis.synthetic import SyntheticLaw, isoflop_design, write_synthetic_sweep
from scalelab.errors import UsageError
from scalelab.fitting.estimate.fit import fit_law
from scalelab.fitting.estimate.objective import BatchObjective
from scalelab.fitting.forms.laws import get_law
from scalelab.fitting.uncertainty.bootstrap import refit_bootstrap, refit_law

DESIGNS = {
    "3 budgets": [1e13, 1e14, 1e15],
    "4 budgets": [1e13, 3e13, 1e14, 3e14],
    "6 budgets": [1e13, 3e13, 1e14, 3e14, 1e15, 3e15],
}
LAWS = ("chinchilla", "kaplan", "farseer")
# A resample with about as many distinct runs as the law has parameters is fitted exactly: its
# objective is ~1e-14 or ~1e-18 depending on where L-BFGS stopped; those compare in absolute terms.
FLOOR = 1e-10


def _objective(law, data, rep, params) -> float:
    keep = rep.counts > 0
    obj = BatchObjective(law, {k: data[k][keep] for k in law.inputs}, data["loss"][keep], weights=rep.counts[keep])
    return float(obj.value(torch.tensor(law.to_fit(params))[None])[0])


def compare(runs, law_name: str, replicates: int) -> dict:
    law = get_law(law_name)
    data = {k: np.asarray(runs[k], dtype=float) for k in (*law.inputs, "loss")}
    pool = law.init_grid()
    fit = fit_law(law, data, starts=pool, n_polish=1)
    t0 = time.perf_counter()
    boot = refit_bootstrap(law, data, fit, replicates=replicates, rng=np.random.default_rng(0), start_pool=pool)
    t_batched = time.perf_counter() - t0
    t0 = time.perf_counter()
    reference = []
    for rep in boot.plan:
        keep = rep.counts > 0
        sub = {k: v[keep] for k, v in data.items()}
        try:
            reference.append(dict(refit_law(law, sub, rep.starts, rep.counts[keep]).params))
        except UsageError:
            reference.append(None)
    t_ref = time.perf_counter() - t0
    fitted = [p for p in reference if p is not None]
    plans = [rep for rep, p in zip(boot.plan, reference) if p is not None]
    ends = [
        (_objective(law, data, rep, b), _objective(law, data, rep, r)) for rep, b, r in zip(plans, boot.draws, fitted)
    ]
    rel = np.array([(fb - fr) / max(abs(fr), FLOOR) for fb, fr in ends])
    return {
        "batched_s": t_batched,
        "reference_s": t_ref,
        "speedup": t_ref / t_batched,
        "same_count": len(boot.draws) == len(fitted),
        "median_rel": float(np.median(np.abs(rel))),
        "lower": int((rel < -1e-6).sum()),
        "higher": int((rel > 1e-6).sum()),
        "worst_higher": float(rel.max()),
        "n": len(rel),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicates", type=int, default=40)
    ap.add_argument("--store", action="append", default=[], help="a sweep store to add (its runs table)")
    args = ap.parse_args()
    stores = {}
    root = Path(tempfile.mkdtemp())
    for i, (name, budgets) in enumerate(DESIGNS.items()):
        write_synthetic_sweep(root / str(i), isoflop_design(budgets), SyntheticLaw(), noise_seed=i + 1)
        stores[f"synthetic, {name}"] = load_store_runs(root / str(i))
    for path in args.store:
        stores[path] = load_store_runs(path)
    total_b = total_r = 0.0
    print(f"{'store':28s} {'law':11s} {'runs':>4s} {'batched':>8s} {'per-rep':>8s} {'ratio':>6s}  agreement")
    for sname, runs in stores.items():
        for law_name in LAWS:
            r = compare(runs, law_name, args.replicates)
            total_b += r["batched_s"]
            total_r += r["reference_s"]
            print(
                f"{sname:28s} {law_name:11s} {len(runs):4d} {r['batched_s']:7.1f}s {r['reference_s']:7.1f}s "
                f"{r['speedup']:5.1f}x  median |rel f| {r['median_rel']:.0e}; batched lower {r['lower']}, "
                f"higher {r['higher']} of {r['n']} (worst +{max(r['worst_higher'], 0):.1e})"
                + ("" if r["same_count"] else "; replicates fitted differ")
            )
    print(f"total: batched {total_b:.1f} s, one fit per replicate {total_r:.1f} s, {total_r / total_b:.1f}x")


if __name__ == "__main__":
    main()
