"""The LR sweep behind the small-scale recipe: the best peak LR at several sizes, and the recipe's pick.

Runs (on local Ray, into a store, so a rerun trains nothing twice) an LR grid at three sizes of the
demo's shape family, each at roughly its compute-optimal token count, with the demo recipe's batch,
length and warmup rules (sweeps/closed_loop/demo.py DEMO_RECIPE; the grid's `optim.lr` overrides the recipe's
LR). Then, per size, the best LR (the vertex of a parabola of loss in log LR), the power law through
them (scalelab.sweeps.recipes.recipe.lr_law_from_runs), and the LR the recipe picks with its ratio to the
best: the recipe is trusted when every ratio is within x2.

    python experiments/lr_sweep.py                     # ~14 min on 2 idle cores; prints the table

Figures it printed, with the date and the machine's load: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import polars as pl

from scalelab import store
from scalelab.errors import run_script
from scalelab.models.shapes import shape_for_width
from scalelab.sweeps.closed_loop.demo import DEMO_RECIPE, demo_spec
from scalelab.sweeps.execution.execute import launch
from scalelab.sweeps.recipes.recipe import lr_law_from_runs, parse_recipe, peak_lr
from scalelab.sweeps.specs.spec import expand_sweep

# (num_layers, d_model, tokens, LR grid): shapes of the demo's designs (29k, 86k, 197k parameters),
# tokens ~ 20 N (10 N for the largest, to bound the cost), LRs x1.4 apart around the recipe's pick
# (the smallest size's loss still fell at 1e-2, so its grid goes on to 2e-2 to bracket the best)
GRID = [
    (2, 24, 586_000, [3.5e-3, 5e-3, 7e-3, 1e-2, 1.4e-2, 2e-2]),
    (2, 48, 1_725_000, [2.5e-3, 3.5e-3, 5e-3, 7e-3]),
    (6, 48, 1_972_000, [1.8e-3, 2.5e-3, 3.5e-3, 5e-3]),
]


def spec() -> dict:
    base = demo_spec()
    points = []
    for layers, width, tokens, lrs in GRID:
        shape = shape_for_width(layers, width, 320, max_seq_len=128)
        keys = ("num_layers", "d_model", "num_heads", "num_kv_heads", "d_ff", "max_seq_len")
        for lr in lrs:
            point = {f"model.{k}": getattr(shape, k) for k in keys}
            point |= {"train.num_tokens": tokens, "optim.lr": lr, "labels": {"lr_sweep": True}}
            points.append(point)
    return {"name": "lr-sweep", "base": base["base"], "recipe": base["recipe"], "points": points,
            "execution": base["execution"], "fit": base["fit"]}  # fmt: skip


def main(argv: list[str] | None = None, trainer=None) -> None:
    """The sweep and its table (module docstring); `trainer` stands in for Ray's launcher (a test's
    simulator, scalelab.analysis.synthetic.synthetic_trainer with a truth that depends on the LR)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/bench/lr_sweep", help="sweep directory (store root = its parent)")
    ap.add_argument("--num-cpus", type=int, default=None)
    args = ap.parse_args(argv)
    import yaml

    t0 = time.time()
    raw = spec()
    sweep = expand_sweep(raw, default_name="lr_sweep")
    text = yaml.safe_dump(raw, sort_keys=False)
    (trainer or launch)(sweep, args.out, spec_text=text, spec_name="lr_sweep", num_cpus=args.num_cpus)
    df = store.load_runs(args.out).filter(pl.col("status") == "done")
    recipe = parse_recipe(DEMO_RECIPE)
    res = lr_law_from_runs(df["params"].to_numpy(), df["lr"].to_numpy(), df["final_val_loss"].to_numpy())
    print(f"\nLR sweep ({df.height} runs, {time.time() - t0:.0f} s; final val loss, demo recipe's batch/warmup)")
    lrs = sorted(set(df["lr"].to_list()))
    print(
        f"{'N':>9} {'D':>10} {'steps':>6} "
        + " ".join(f"{lr:>8.2g}" for lr in lrs)
        + f" {'best LR':>9} {'recipe':>8} {'ratio':>6}"
    )
    worst, edges = 1.0, 0
    for n, best, interior in zip(res.sizes, res.best_lr, res.interior):
        sub = df.filter(pl.col("params") == round(n))
        losses = {float(lr): float(loss) for lr, loss in zip(sub["lr"], sub["final_val_loss"])}
        pick = peak_lr(recipe, n)
        ratio = pick / best
        worst = max(worst, ratio, 1 / ratio)
        d = int(sub["tokens"][0])
        steps = int(sub["num_steps"][0]) if "num_steps" in sub.columns and sub["num_steps"][0] is not None else 0
        cells = " ".join(f"{losses[lr]:>8.4f}" if lr in losses else f"{'':>8}" for lr in lrs)
        edges += not interior  # the best run at an end of the grid: the true best LR lies beyond it
        flag = "" if interior else "  (best at the grid's edge: not bracketed)"
        print(f"{round(n):>9,} {d:>10,} {steps:>6} {cells} {best:>9.3g} {pick:>8.3g} {ratio:>6.2f}{flag}")
    rule = res.rule
    lo, hi = res.exponent_interval
    print(
        f"fitted law: lr = {rule.ref_lr:.3g} (N / {rule.ref_params:.3g})^{rule.exponent:.3f} "
        f"(exponent 95% interval [{lo:.2f}, {hi:.2f}]); recipe: lr = {recipe.lr.ref_lr:.3g} "
        f"(N / {recipe.lr.ref_params:.3g})^{recipe.lr.exponent:.3f}"
    )
    verdict = "ok" if worst <= 2 and not edges else ("NOT within x2" if worst > 2 else f"{edges} size(s) not bracketed")
    print(f"recipe's LR within x{worst:.2f} of the best at every size ({verdict})")
    assert all(math.isfinite(x) for x in res.best_lr)
    np.set_printoptions(precision=4)


if __name__ == "__main__":
    run_script(main, __file__)
