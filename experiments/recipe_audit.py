"""The recipe audit at the demo's scale: how far the demo's recipe (sweeps/closed_loop/demo.py DEMO_RECIPE: an LR of
N only, a fixed weight decay, beta2 0.95) is from the best LR, weight decay and beta2 over the sizes
and token horizons its designs use, and the recipe the audit recommends.

Protocol (the `audit:` generator, scalelab.sweeps.recipes.audit_grid; trained on local Ray into a store, so a
rerun trains only what is missing; analysed by scalelab.sweeps.recipes.recipe_audit, as `scalelab sweep
audit` does):
- LR: the demo's four shapes (18.5k, 47k, 114k, 369k parameters) x token horizons 2.4, 8, 27, 90,
  300 and 460 tokens per parameter, the cells above 2.5e12 FLOPs left out (the design's largest
  budget is 2e12; the far runs' regime, 100+ tokens per parameter, is sampled by the small sizes),
  and the 18.5k model at 2.4 (below min_steps): 13 cells, each at 6 LRs from 0.5x to 2.83x the
  recipe's (sqrt(2) apart, skewed up: the LR sweep of docs/closed-loop.md found the smallest size's
  best above the recipe's). Every run is the recipe's run (batch, whole steps, warmup) but its LR.
- Weight decay: AdamW's timescale 1 / (lr wd) at 0.1, 0.3, 1, 3 and 10 run lengths at three cells (the
  recipe's fixed wd 0.1 gives 0.27 to 1.4 run lengths there).
- beta2: 0.95, 0.99 and 0.999 at two cells with the design's smallest batch (256 tokens).
- Shape: 1 to 6 layers at 47k and 114k parameters, 27 tokens per parameter.
Then the table of `scalelab sweep audit` and the cost of the demo's recipe at each run of the demo's
design (the gate's table), written beside the store (audit.json, audit.txt, recipe.yaml).

    python experiments/recipe_audit.py --out results/bench/recipe_audit           # trains, then the table
    python experiments/recipe_audit.py --out results/bench/recipe_audit --report-only
    python experiments/recipe_audit.py --out DIR --dry-run                        # the runs and FLOPs, nothing trained
"""

from __future__ import annotations

import argparse
import math
import time

import yaml

from scalelab.errors import run_script
from scalelab.sweeps.closed_loop.demo import demo_spec
from scalelab.sweeps.execution.execute import launch
from scalelab.sweeps.recipes.recipe_audit import audit_store, format_audit, save_audit
from scalelab.sweeps.recipes.recipe_gate import GateSpec, check_runs, format_recipe_gate
from scalelab.sweeps.specs.spec import expand_sweep

AUDIT = {
    "sizes": [1.85e4, 4.7e4, 1.14e5, 3.7e5],
    "tokens_per_param": [2.4, 8, 27, 90, 300, 460],
    "max_flops": 2.5e12,
    "lr_multipliers": [0.5, 0.71, 1.0, 1.41, 2.0, 2.83],
    "weight_decay": {"cells": [[4.7e4, 27], [1.14e5, 8], [1.85e4, 300]], "timescales": [0.1, 0.3, 1.0, 3.0, 10.0]},
    "beta2": {"cells": [[1.85e4, 27], [1.14e5, 2.4]], "values": [0.95, 0.99, 0.999]},
    "shape": {"cells": [[4.7e4, 27], [1.14e5, 27]], "layers": [1, 2, 3, 4, 6]},
}
SMOKE = {  # enough cells for both laws and the frontier; tests finish its runs from a known truth
    "sizes": [1.85e4, 4.7e4, 1.14e5],
    "tokens_per_param": [8, 27, 90],
    "max_flops": 2.5e12,
    "lr_multipliers": [0.5, 0.71, 1.0, 1.41, 2.0, 2.83],
    "weight_decay": {"cells": [[1.85e4, 27], [4.7e4, 27]], "timescales": [0.15, 0.5, 1.5]},
}


def audit_spec(smoke: bool = False) -> dict:
    """The audit's spec: the demo's base, recipe and execution, the AUDIT grid (SMOKE: a tiny one)."""
    demo = demo_spec()
    return {
        "name": "recipe-audit",
        "description": "the demo recipe audited: sizes x horizons x LRs, weight decay, beta2, shape",
        "base": demo["base"],
        "recipe": demo["recipe"],
        "audit": SMOKE if smoke else AUDIT,
        "execution": demo["execution"],
        "fit": demo["fit"],
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out", default="results/bench/recipe_audit", help="the audit's sweep dir (store root: its parent)"
    )
    ap.add_argument("--num-cpus", type=int, default=None)
    ap.add_argument("--replicates", type=int, default=400, help="bootstrap replicates of every interval")
    ap.add_argument("--report-only", action="store_true", help="analyse the store as it is; train nothing")
    ap.add_argument("--dry-run", action="store_true", help="print the runs' count and FLOPs; train nothing")
    ap.add_argument("--smoke", action="store_true", help="a tiny grid (tests)")
    args = ap.parse_args(argv)
    t0 = time.time()
    raw = audit_spec(args.smoke)
    sweep = expand_sweep(raw, default_name="recipe_audit")
    kinds = {k: sum(r.labels["audit"] == k for r in sweep.runs) for k in ("lr", "weight_decay", "beta2", "shape")}
    print(f"recipe audit: {len(sweep.runs)} runs {kinds}, {sum(r.cost_flops for r in sweep.runs):.3g} FLOPs (6ND)")
    if args.dry_run:
        return
    if not args.report_only:
        text = yaml.safe_dump(raw, sort_keys=False)
        launch(sweep, args.out, spec_text=text, spec_name="recipe_audit", num_cpus=args.num_cpus)
    result = audit_store(args.out, n_boot=args.replicates)
    text = format_audit(result)
    if result.lr_law is not None:
        demo = expand_sweep(demo_spec(), default_name="demo")
        gate = check_runs(demo.runs, result, max_cost=GateSpec(audit=args.out).max_cost, source=args.out)
        text += "\nthe demo's design: the loss its recipe's LR and weight decay cost at each run\n"
        text += format_recipe_gate(gate)
    save_audit(args.out, result, text)
    print(text)
    print(f"recipe audit: {time.time() - t0:.0f} s; {args.out}/audit.json, audit.txt, recipe.yaml")
    assert all(math.isfinite(c.x_opt) for c in result.lr_cells)


if __name__ == "__main__":
    run_script(main, __file__)
