"""Benchmark: does the curve laws' prefix prediction improve when every size trains at its best LR?

experiments/curve_sweeps.py's IsoFLOP sweep runs every size (34k-210k parameters) at one sp LR (3e-3),
and docs/curves.md traces its 30%-prefix misses to that design (the larger models gain less per
token at that LR; one short run departs from its law). This bench trains the same IsoFLOP design
(same budgets, sizes, batch, cosine schedule, evaluation and corpus) under CompleteP relative to the
smallest model (width 32, 1 layer: mup across width, 1/L branches across depth), at the LR tuned on
that base model alone, which is the transfer docs/hp-transfer.md measures; then prints table 1 of
experiments/curve_sweeps.py for it (each run's final loss from its first 30% of steps).

    nice -n 10 python experiments/curve_sweeps_mup.py --out results/curves_mup    # ~8 min on 2 idle cores

Step 1, the base LR: LRS x SEEDS runs of the smallest model at the smallest budget's token count,
best LR = fitting.hp_laws.hyperparams.best_lr (parabola vertex in log LR over every seed). Step 2: the
IsoFLOP sweep at that LR (3 significant digits). The base is tuned at the shortest run length;
longer runs may prefer a lower LR (not corrected here: the same holds for any one-LR sweep).

Figures it printed, with the date and the machine's load: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import copy
import pathlib
import time

import yaml

from experiments.curve_sweeps import LAWS, QUICK_LAWS, designs, prefix_table, run_sweep
from scalelab import store
from scalelab.errors import run_script
from scalelab.fitting.hp_laws.hyperparams import best_lr
from scalelab.models.shapes import base_shape
from scalelab.sweeps.execution.execute import launch
from scalelab.sweeps.specs.spec import expand_sweep

LRS = [1.5e-3, 3e-3, 6e-3, 1.2e-2, 2.4e-2, 4.8e-2]
SEEDS = [0, 1]


def base_model(iso: dict) -> tuple[dict, int]:
    """The smallest IsoFLOP model's shape keys and its token count at the smallest budget."""
    runs = expand_sweep(iso).runs
    small = min(runs, key=lambda r: (r.params, r.num_tokens))
    keys = ("num_layers", "d_model", "num_heads", "num_kv_heads", "d_ff")
    return {f"model.{k}": small.config["model"][k] for k in keys}, small.num_tokens


def parametrized(base: dict) -> dict:
    return {"parametrization": "completep", **base_shape(base["model.d_model"], base["model.num_layers"])}


def lr_spec(base: dict, tokens: int, iso: dict) -> dict:
    spec = copy.deepcopy(iso)
    spec.pop("isoflop")
    spec["name"] = "base_lr"
    spec["base"]["model"] = parametrized(base)
    spec["points"] = [
        {**base, "train.num_tokens": tokens, "optim.lr": lr, "train.seed": s} for lr in LRS for s in SEEDS
    ]
    return spec


def main(argv: list[str] | None = None, trainer=None) -> int:
    """The base LR sweep, then the IsoFLOP sweep at its best LR (trained by `trainer` when given, else
    Ray's launcher), then table 1."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("results/curves_mup"))
    parser.add_argument("--quick", action="store_true", help="curve_sweeps' smoke-test IsoFLOP design and laws")
    args = parser.parse_args(argv)
    iso = designs(args.quick)["iso"]
    base, tokens = base_model(iso)
    spec = lr_spec(base, tokens, iso)
    lr_dir = args.out / "base_lr" / "base_lr"
    t0 = time.time()
    (trainer or launch)(expand_sweep(spec), lr_dir, spec_text=yaml.safe_dump(spec), log=lambda m: None)
    df = store.load_runs(lr_dir).sort("lr")
    opt = best_lr(df["lr"].to_list(), df["final_val_loss"].to_list())
    print(f"# base LR sweep ({df.height} runs, {time.time() - t0:.0f} s): {base}, {tokens} tokens")
    for lr in LRS:
        vals = df.filter((df["lr"] - lr).abs() < 1e-12)["final_val_loss"].to_list()
        print(f"  lr {lr:<8.3g} final val loss {' '.join(f'{v:.4f}' for v in vals)}")
    lo, hi = opt.interval
    print(f"  best LR {opt.lr:.3g} [{lo:.3g}, {hi:.3g}] (bracketed: {opt.interior})")
    iso["name"] = "iso_completep"
    iso["base"]["model"] = parametrized(base)
    iso["base"]["optim"] = {"lr": float(f"{opt.lr:.3g}")}
    run_sweep(iso, args.out / "full" / "iso_completep", trainer)
    prefix_table(args.out / "full" / "iso_completep", laws=QUICK_LAWS if args.quick else LAWS)
    return 0


if __name__ == "__main__":
    run_script(main, __file__)
