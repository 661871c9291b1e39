"""One cold store of the registered first-round protocol (docs/first-round.md): a first round trained
with the audited recipe, centred on the audit's N*(C), every design point with its own seeds; then
the runs its fit predicts at 3x, 10x and 30x its largest budget, all predicted before any trains.

Protocol (package code only: scalelab.sweeps.closed_loop.rounds.run_rounds for the first round, a holdout round of
scalelab.sweeps.closed_loop.propose for the far runs, scalelab.sweeps.execution.execute.launch to train them):
1. The first round: the demo's IsoFLOP budgets (2e11, 6.3e11, 2e12), `--num-sizes` sizes each
   centred on the recipe audit's frontier N*(C) (`isoflop.center: {fit: AUDIT}`) over `--span` on each
   side (the largest of --span and the fallbacks SPANS that the shape rule can build: the byte
   vocabulary's smallest model is 18.5k parameters), the audit's recipe (its recipe.yaml: LR(N, D),
   the weight-decay timescale, beta2 in tokens), training seed `--seed` with every design point its
   own init and data order (`seeds: {count: --seeds-per-point, distinct: true}`), the recipe gate
   (`recipe_gate: {audit: AUDIT}`) before it trains, and the demo's `fit:` (the loop's default fit:
   law auto, 32 bootstrap replicates, noise floor 0.0056).
2. The holdout round (`sweep next --holdout 3,10,30 --holdout-sizes 2`): from the first round's fit,
   whatever its gates say, `--holdout-sizes` runs at each multiple spread around its N* (1.5x apart),
   each predicted into the ledger; then trained. Scored by experiments/first_round_scores.py.

    python experiments/first_round_store.py --out results/first_round/s1000 --seed 1000 --audit AUDIT
                                           # AUDIT: the recipe audit's store, results/bench/recipe_audit
    python experiments/first_round_store.py ... --first-round-only     # stop after step 1
    python experiments/first_round_store.py ... --plan                 # the design and its replication table only
Rerun with the same arguments to resume: trained runs are not trained again, and a holdout round
already proposed is launched as it was proposed (never proposed again).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import yaml

from scalelab import store
from scalelab.errors import ConfigError, run_script
from scalelab.store import files, ledger
from scalelab.sweeps.closed_loop.demo import demo_spec
from scalelab.sweeps.closed_loop.proposal import latest_round, read_round
from scalelab.sweeps.closed_loop.propose import Holdout, propose_round
from scalelab.sweeps.closed_loop.rounds import LaunchOptions, run_rounds
from scalelab.sweeps.execution.execute import launch
from scalelab.sweeps.preview.design_report import design_report, format_design_report
from scalelab.sweeps.recipes.recipe_audit import audited_recipe, load_audit
from scalelab.sweeps.specs.isoflop_grid import read_frontier
from scalelab.sweeps.specs.spec import Sweep, expand_sweep

SPANS = (2.0, 1.8, 1.6)  # the span and its fallbacks, largest first


def first_round_spec(audit: str | Path, *, seed: int, num_sizes: int, span: float, seeds_per_point: int,
                     budgets=None) -> tuple[dict, Sweep]:  # fmt: skip
    """The first round's spec and its expansion at the largest buildable span from `span` down."""
    spec = demo_spec()
    spec["name"] = "first-round"
    spec["base"]["train"]["seed"] = seed
    spec["recipe"] = audited_recipe(load_audit(audit))
    spec["recipe_gate"] = {"audit": str(audit), "max_cost": 0.005}
    spec["seeds"] = {"count": seeds_per_point, "distinct": True}
    if budgets:
        spec["isoflop"]["budgets"] = list(budgets)
    error = None
    for s in [span, *(x for x in SPANS if x < span)]:
        spec["isoflop"] |= {"num_sizes": num_sizes, "center": {"fit": str(audit)}, "span": s}
        try:
            return spec, expand_sweep(spec, default_name="first-round")
        except ConfigError as e:
            error = e
    raise error


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="store root; the sweep is <out>/loop")
    ap.add_argument("--seed", type=int, required=True, help="training seed of the first round (point i: seed + i)")
    ap.add_argument("--audit", required=True, help="the recipe audit's store (audit.json: recipe, frontier, gate)")
    ap.add_argument("--num-sizes", type=int, default=6, help="sizes per budget")
    ap.add_argument("--span", type=float, default=SPANS[0], help="sizes from N*/span to span N* (or a fallback)")
    ap.add_argument("--seeds-per-point", type=int, default=1)
    ap.add_argument("--holdout-sizes", type=int, default=2, help="runs per multiple around the fit's N*")
    ap.add_argument("--budgets", default=None, help="comma-separated first-round budgets (default: the demo's)")
    ap.add_argument("--multiples", default="3,10,30", help="the holdout's multiples of the largest budget")
    ap.add_argument("--first-round-only", action="store_true")
    ap.add_argument(
        "--plan", action="store_true", help="print the design (centring, replication priced) and train nothing"
    )
    ap.add_argument("--num-cpus", type=int, default=None)
    args = ap.parse_args(argv)
    t0 = time.time()
    sweep_dir = Path(args.out) / "loop"
    budgets = [float(b) for b in args.budgets.split(",")] if args.budgets else None
    spec, sweep = first_round_spec(args.audit, seed=args.seed, num_sizes=args.num_sizes, span=args.span,
                                   seeds_per_point=args.seeds_per_point, budgets=budgets)  # fmt: skip
    flops = sum(r.cost_flops for r in sweep.runs)
    print(f"first round: {len(sweep.runs)} runs, span {spec['isoflop']['span']:g}, {flops:.3g} FLOPs")
    if args.plan:  # the replication choice of docs/first-round.md is read from this table
        report = design_report(sweep, reference=read_frontier(args.audit, "--audit"), noise=sweep.fit.noise_floor,
                               replication=True)  # fmt: skip
        print(format_design_report(report))
        return
    result = run_rounds(sweep, sweep_dir, spec_text=yaml.safe_dump(spec, sort_keys=False), spec_name="first-round",
                        rounds=1, options=LaunchOptions(num_cpus=args.num_cpus))  # fmt: skip
    if result.stopped or not result.ok:
        raise SystemExit(f"the first round did not finish: {result.stopped or 'a run failed'}")
    print(f"first round done: {time.time() - t0:.0f} s")
    if args.first_round_only:
        return
    if latest_round(sweep_dir):  # proposed before: launch it as proposed
        proposal = read_round(sweep_dir, latest_round(sweep_dir))
    else:
        multiples = tuple(float(m) for m in args.multiples.split(","))
        holdout = Holdout(multiples=multiples, sizes=args.holdout_sizes, spread=1.5)
        proposal = propose_round(sweep_dir, holdout=holdout)
    print(f"holdout round {proposal.round}: {len(proposal.runs)} runs, gates "
          f"{'pass' if proposal.passed else 'fail: ' + ', '.join(proposal.gates.failed)}")  # fmt: skip
    launch(proposal.sweep, sweep_dir, spec_text=files.read_text(proposal.spec_path),
           spec_name=files.stem(proposal.spec_path), num_cpus=args.num_cpus)  # fmt: skip
    ledger.score(sweep_dir)
    print(ledger.format_ledger(ledger.read_ledger(sweep_dir)))
    cpu = sum(e.get("train_cpu_s") or 0.0 for e in store.read_events(sweep_dir) if e.get("event") == "end")
    print(f"store {sweep_dir}: {time.time() - t0:.0f} s wall, {cpu:.0f} CPU-s of training")


if __name__ == "__main__":
    run_script(main, __file__)
