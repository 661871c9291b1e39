"""Gradient compression on gloo: bytes per step and the loss effect against the uncompressed run.

    python bench/grad_compression.py              # dp2 (DDP) 20 steps, dp2xfsdp2 (HSDP) 10 steps; ~2-4 min
    python bench/grad_compression.py --steps 40

The debug model (238k parameters, 4 layers) trains with AdamW (lr 1e-3) from the same init and
batches under each `parallel.grad_compression`; bytes are what this rank hands to the gradient
reductions in one compressed step (experiments.compression_check). Figures in
docs/planner-at-scale.md ("Gradient compression").
"""

from __future__ import annotations

import argparse

from experiments.compression_check import compression_trial, format_rows
from scalelab.parallel.parity import ParitySpec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--hsdp-steps", type=int, default=10)
    args = ap.parse_args()
    spec = ParitySpec(steps=args.steps, lr=1e-3)
    print(f"## dp2 (DDP), {args.steps} steps\n")
    rows = compression_trial("dp2", ["none", "bf16", "powersgd"], spec, powersgd_rank=2)
    rows += compression_trial("dp2", ["none", "powersgd"], spec, powersgd_rank=1)[1:]
    print(format_rows(rows))
    print(f"\n## dp2xfsdp2 (HSDP), {args.hsdp_steps} steps\n")
    hsdp = ParitySpec(steps=args.hsdp_steps, lr=1e-3)
    print(format_rows(compression_trial("dp2xfsdp2", ["none", "bf16", "powersgd"], hsdp, powersgd_rank=2)))


if __name__ == "__main__":
    main()
