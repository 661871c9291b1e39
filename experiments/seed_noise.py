"""Run-to-run noise of the demo's recipe: the same runs under different seeds (init and data order).

The loop's prediction intervals need the noise a single new run carries. A fit of 12 runs with 5
parameters sits closer to its runs than that (and runs of one sweep share their data order), so its
residuals understate it; this measures it directly and is where the demo spec's `fit.noise_floor`
comes from. Two runs of the demo design (47k parameters at 6.3e11 FLOPs, 86k at 2e12), each under
`--seeds` seeds, on local Ray into a store; prints each run's losses, the sd of log loss per run and
pooled.

    python experiments/seed_noise.py                 # 8 runs, ~8 min on 2 idle cores
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import polars as pl
import yaml

from scalelab import store
from scalelab.errors import run_script
from scalelab.sweeps.closed_loop.demo import demo_spec
from scalelab.sweeps.execution.execute import launch
from scalelab.sweeps.specs.spec import expand_sweep

POINTS = [(47_264, 6.3e11), (86_256, 2e12)]  # (N of a demo shape, its budget)


def spec(seeds: int) -> dict:
    base = demo_spec()
    design = {r.params: r for r in expand_sweep(base).runs}
    points = []
    for n, budget in POINTS:
        m = design[n].config["model"]
        keys = ("num_layers", "d_model", "num_heads", "num_kv_heads", "d_ff", "max_seq_len")
        points.append({**{f"model.{k}": m[k] for k in keys}, "train.num_tokens": design[n].num_tokens,
                       "labels": {"flops_budget": budget}})  # fmt: skip
    return {"name": "seed-noise", "base": base["base"], "recipe": base["recipe"], "points": points,
            "seeds": seeds, "execution": base["execution"], "fit": base["fit"]}  # fmt: skip


def main(argv: list[str] | None = None, trainer=launch) -> None:
    """The protocol (module docstring); `trainer` stands in for Ray's launcher (a test's simulator,
    scalelab.analysis.synthetic.synthetic_trainer)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/bench/seed_noise")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--num-cpus", type=int, default=None)
    args = ap.parse_args(argv)
    raw = spec(args.seeds)
    trainer(expand_sweep(raw), args.out, spec_text=yaml.safe_dump(raw, sort_keys=False), spec_name="seed_noise",
           num_cpus=args.num_cpus)  # fmt: skip
    df = store.load_runs(args.out).filter(pl.col("status") == "done")
    pooled = []
    print(f"\nrun-to-run noise ({args.seeds} seeds each; final val loss)")
    for n, _ in POINTS:
        loss = df.filter(pl.col("params") == n)["final_val_loss"].to_numpy()
        sd = float(np.std(np.log(loss), ddof=1))
        pooled.append(sd**2)
        print(f"  N={n:>7,}: " + " ".join(f"{v:.4f}" for v in loss) + f"   sd(log loss) = {sd:.2%}")
    print(f"  pooled sd(log loss) = {math.sqrt(np.mean(pooled)):.2%}")


if __name__ == "__main__":
    run_script(main, __file__)
