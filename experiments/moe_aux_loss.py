"""Benchmark: does the load-balancing loss reduce router imbalance? (CPU, seconds)

Trains the MoE debug model (8 experts, top-2, no shared expert) on random tokens with AdamW for
`--steps` steps at several aux-loss weights, dropless and with capacity factor 1.0, and reports the
imbalance (max/mean routed copies per expert, mean over layers) at the first step and over the last
10 steps, the aux loss and the fraction of dropped copies. See experiments.moe_balance.

    python experiments/moe_aux_loss.py [--steps 80]
"""

from __future__ import annotations

import argparse

import torch

from scalelab.errors import run_script


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=80)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from experiments.moe_balance import aux_balance_run

    head = f"{'aux weight':>10} {'capacity':>8} {'imb. step 1':>11} {'imb. last 10':>12}"
    print(f"{head} {'aux last 10':>11} {'dropped':>8}")
    for cf in (0.0, 1.0):
        for w in (0.0, 0.01, 0.1):
            r = aux_balance_run(w, steps=args.steps, capacity_factor=cf)
            print(
                f"{w:>10} {cf or 'dropless':>8} {r['imbalance_first']:>11.3f} {r['imbalance_last10']:>12.3f} "
                f"{r['aux_loss_last10']:>11.4f} {r['dropped_frac_last10']:>8.2%}"
            )
    return 0


if __name__ == "__main__":
    run_script(main, __file__)
