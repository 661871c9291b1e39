"""The closed loop from a cold start: rounds of `sweep next` until the law is identified, its
compute-optimal run at 3x, then one run at 10x the largest budget fitted — each predicted before it ran.

Protocol (all on local Ray, into one sweep; every prediction is in the sweep's ledger):
1. Round 0: the demo's IsoFLOP design (3 budgets spanning 10x, 4 sizes each centred on a prior of
   20 tokens per parameter, span 3 each side, the demo recipe).
2. Rounds 1..R: `sweep next` with the final target fixed up front (T = 10 x 3 x the largest initial
   budget). While a gate fails, the round is the runs that would pass it; once every gate passes,
   the round is the compute-optimal run at 3x the largest budget. Each round's fit reports the
   interval of L*(T), so the table shows how it shrank.
3. The final fit (every run so far, the 3x run included) proposes the compute-optimal run at 10x its
   largest budget (= T); that run is trained and scored.

    python bench/closed_loop.py                         # ~45-60 min on 2 idle cores
    python bench/closed_loop.py --out results/bench/loop --budget-scale 0.5

Prints, per round: runs fitted, the gates, alpha/beta/E/a, L*(T) with its interval and width; then
predicted vs measured for every scored prediction (ledger) and the coverage.

Measured 2026-12-03 (--out sharing the demo's store root, so round 0 and the 3x run were reused;
the 10x run took 48 min beside the test suite): gates passed at round 1; 3x run 1.3557 vs
predicted 1.3818 (+1.93%, inside [1.3331, 1.4324]); 10x run (N 414,656, D 24.1M, 6e13 FLOPs)
1.1983 vs 1.2870 (+7.40%, inside [1.0612, 1.5609]). docs/closed-loop.md discusses the miss.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import yaml

from scalelab.store import ledger
from scalelab.sweeps.demo import demo_spec
from scalelab.sweeps.execute import launch
from scalelab.sweeps.proposal_text import format_gates
from scalelab.sweeps.propose import propose_round
from scalelab.sweeps.rounds import LaunchOptions, run_rounds
from scalelab.sweeps.spec import expand_sweep

MAX_ROUNDS = 4


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/bench/closed_loop", help="store root; the sweep is <out>/loop")
    ap.add_argument("--budget-scale", type=float, default=1.0, help="multiply the initial budgets")
    ap.add_argument("--num-cpus", type=int, default=None)
    args = ap.parse_args()
    t0 = time.time()
    sweep_dir = Path(args.out) / "loop"
    spec = demo_spec()
    spec["name"] = "closed-loop-bench"
    spec["isoflop"]["budgets"] = [float(f"{b * args.budget_scale:.3g}") for b in spec["isoflop"]["budgets"]]
    largest = max(spec["isoflop"]["budgets"])
    target = 30.0 * largest  # 10x the budget of the 3x run

    def announce(k, p) -> None:
        print(f"round {k}: {len(p.fit['run_ids'])} runs fitted; " + format_gates(p.gates.to_dict()).splitlines()[0])

    result = run_rounds(
        expand_sweep(spec),
        sweep_dir,
        spec_text=yaml.safe_dump(spec, sort_keys=False),
        spec_name="loop",
        rounds=1 + MAX_ROUNDS,
        target_flops=target,
        budget_flops=3 * largest,
        step=3.0,
        until_passed=True,
        options=LaunchOptions(num_cpus=args.num_cpus),
        before_launch=announce,
    )
    history = [p.to_dict() for p in result.proposals]
    final = propose_round(sweep_dir, target_flops=target, budget_flops=target, step=10.0)
    history.append(final.to_dict())
    print(format_gates(final.gates.to_dict()))
    if final.passed:
        launch(final.sweep, sweep_dir, spec_text=final.spec_path.read_text(), spec_name=final.spec_path.stem,
               num_cpus=args.num_cpus)  # fmt: skip
    ledger.score(sweep_dir)
    print(f"\nclosed loop: {time.time() - t0:.0f} s; target T = {target:.3g} FLOPs")
    print(
        f"{'round':>5} {'runs':>4} {'gates':>6} {'alpha':>7} {'beta':>7} {'E':>7} {'a':>6} "
        f"{'L*(T)':>8} {'interval':>20} {'width':>7}"
    )
    for p in history:
        f, (lo, hi) = p["fit"], p["loss_at_target_interval"]
        prm = f["params"]
        print(
            f"{p['round']:>5} {p['n_points']:>4} {'pass' if p['gates']['passed'] else 'FAIL':>6} {prm['alpha']:>7.3f} "
            f"{prm['beta']:>7.3f} {prm['E']:>7.3f} {f['a']:>6.3f} {p['loss_at_target']:>8.4f} "
            f"[{lo:.4f}, {hi:.4f}] {(hi - lo) / p['loss_at_target']:>7.2%}"
        )
    print()
    print(ledger.format_ledger(ledger.read_ledger(sweep_dir)))


if __name__ == "__main__":
    main()
