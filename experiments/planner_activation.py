"""Benchmark: the planner's activation-memory formula vs the bytes autograd saves for backward (CPU).

Sizes (debug, tiny-1m, tiny-3m, an MoE debug model) × seq_len × micro-batch × activation
checkpointing, a pipeline first stage, and, in one 2-process gloo group, tp2, tp2+SP (with and
without AC), cp2 all-gather and cp2 ring. Measured with torch.autograd.graph.saved_tensors_hooks
(distinct storages, parameters and buffers excluded); see experiments.planner_validate.

    python experiments/planner_activation.py [--json OUT.json] [--no-spawn]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from experiments.planner_validate import format_rows, local_rows, spawned_rows
from scalelab.errors import run_script


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="also write the rows here")
    ap.add_argument("--no-spawn", action="store_true", help="skip the tp/cp rows (2 processes)")
    ap.add_argument("--quick", action="store_true", help="two sizes of the single-process rows (the smoke test)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    t0 = time.perf_counter()
    rows = local_rows(quick=args.quick)
    if not args.no_spawn:
        rows += spawned_rows()
    print(format_rows(rows))
    print(f"wall time {time.perf_counter() - t0:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0 if all(abs(r["rel_error"]) <= 0.10 for r in rows) else 1


if __name__ == "__main__":
    run_script(main, __file__)
