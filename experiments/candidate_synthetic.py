"""Protocol 2's candidate interval (docs/first-round.md, step 5) on a store from a known law: does
"the bracket's two ends, each widened by a run's noise" cover far runs when the law is right?

The store is the tests' synthetic holdout store (tests/test_holdout_round.py): a first round of
three budgets (3e11, 1e12, 3e12; five sizes each) from scalelab.analysis.synthetic's Chinchilla law
with 0.3% run noise, then `sweep next --holdout` runs at 3x, 10x and 30x the largest budget (two
sizes, two seeds each), all predicted by the first round's fit before they "train", scored by the
ledger. No training: every loss comes from the law. Printed per far run: the loop's prediction (the
bracket) and 95% interval, the bracket's two ends, the measured loss, and whether the loop's
interval and the candidate cover it; the candidate with the noise the fit states (its noise floor,
else its residual scale) and with protocol 2's seed-study floor (0.0056).

On real first rounds the surface is pessimistic far out and the power side optimistic, so the truth
lies between the ends. Where the law is right the surface is unbiased: when it errs low, both ends
lie below the truth and only the surface's own interval reaches it.

    python experiments/candidate_synthetic.py [--seed-noise 0.0056] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from experiments.first_round_scores import ends_interval
from scalelab.analysis.synthetic import SyntheticLaw, launch_synthetic
from scalelab.errors import UsageError, run_script
from scalelab.store import ledger
from scalelab.sweeps.closed_loop.propose import Holdout, propose_round

SPEC = {
    "name": "sim",
    "base": {"data": {"seq_len": 64}, "train": {"global_batch_tokens": 512}},
    "isoflop": {"budgets": [3e11, 1e12, 3e12], "num_sizes": 5, "center": {"tokens_per_param": 5}, "span": 3},
    "fit": {"bootstrap": 8},
}
NOISE = 0.003  # the synthetic runs' log-sd


def synthetic_store(sweep_dir: Path) -> list[dict]:
    """The first round and its holdout round from the known law, scored: the ledger's far entries."""
    law = SyntheticLaw()
    launch_synthetic(SPEC, sweep_dir, law, noise_std=NOISE)
    p = propose_round(sweep_dir, holdout=Holdout(multiples=(3.0, 10.0, 30.0), sizes=2, spread=1.5), seeds=2,
                      replicates=8, log=lambda m: None)  # fmt: skip
    launch_synthetic(p.spec_path, sweep_dir, law, noise_std=NOISE)
    ledger.score(sweep_dir)
    return [e for e in ledger.read_ledger(sweep_dir)["predictions"] if e["kind"] == "holdout"]


def score(seed_noise: float = 0.0056) -> dict:
    """The synthetic store's far runs under the loop's interval and the candidate (module docstring),
    printed as a table; the rows and the counts."""
    with tempfile.TemporaryDirectory() as tmp:
        sweep_dir = Path(tmp) / "sim"
        far = synthetic_store(sweep_dir)
        fit = ledger.read_ledger(sweep_dir)["fits"][-1]
    stated = float(fit["noise_floor"]) or float(fit["residual_scale"])
    rows = []
    print(f"the first round's fit: noise floor {fit['noise_floor']}, residual scale {fit['residual_scale']:.4f}")
    print("flops    predicted [95%]            ends              measured  error   loop  cand  cand@floor")
    for e in far:
        m = e["measured"]
        own, floor = ends_interval(e["ends"], stated), ends_interval(e["ends"], seed_noise)
        row = {"flops": e["flops"], "predicted": e["predicted"], "interval": e["interval"], "ends": e["ends"],
               "measured": m, "rel_error": e["rel_error"], "covered": bool(e["covered"]),
               "candidate": own, "candidate_covered": own[0] <= m <= own[1],
               "candidate_floor": floor, "candidate_floor_covered": floor[0] <= m <= floor[1]}  # fmt: skip
        rows.append(row)
        print(f"{e['flops']:.0e}  {e['predicted']:.4f} [{e['interval'][0]:.4f}, {e['interval'][1]:.4f}]  "
              f"{e['ends'][0]:.4f}, {e['ends'][1]:.4f}  {m:.4f}  {100 * e['rel_error']:+.2f}%  "
              f"{'yes' if row['covered'] else 'no':>4}  {'yes' if row['candidate_covered'] else 'no':>4}  "
              f"{'yes' if row['candidate_floor_covered'] else 'no':>4}")  # fmt: skip
    out = {
        "runs": len(rows),
        "covered": sum(r["covered"] for r in rows),
        "candidate_covered": sum(r["candidate_covered"] for r in rows),
        "candidate_floor_covered": sum(r["candidate_floor_covered"] for r in rows),
        "above_both_ends": sum(r["measured"] > r["ends"][1] for r in rows),
        "rows": rows,
    }
    print(f"covered: the loop's interval {out['covered']}/{out['runs']}, the candidate "
          f"{out['candidate_covered']}/{out['runs']} (s {stated:.4f}), {out['candidate_floor_covered']}/{out['runs']} "
          f"(s {seed_noise}); measured above both ends: {out['above_both_ends']}/{out['runs']}")  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed-noise", type=float, default=0.0056, help="protocol 2's stated run noise (log-sd)")
    ap.add_argument("--json", help="write the rows and counts here")
    args = ap.parse_args(argv)
    if not 0.0 <= args.seed_noise < 0.5:
        raise UsageError(f"--seed-noise {args.seed_noise!r} must be a log-sd in [0, 0.5), e.g. 0.0056")
    out = score(args.seed_noise)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    run_script(main, __file__)
