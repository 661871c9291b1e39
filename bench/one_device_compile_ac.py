"""One-device training runs with `parallel.compile` and `parallel.activation_checkpoint`, against the same run without.

    python bench/one_device_compile_ac.py [--preset tiny-3m] [--seq-len 256] [--batch 16] [--steps 30]

Each variant (plain, compile: true, activation_checkpoint: full, selective, compile + full) is one
`scalelab.train.loop.train_run` of the same config in a fresh process, so that every peak is its own:
  tokens/s     median of the run's metrics rows after the first `--warmup` steps (torch.compile
               compiles in the first steps, which the median leaves out)
  peak memory  on CUDA torch.cuda.max_memory_allocated; on CPU the growth of the process's peak
               resident set over its resident set just before training (parameters, gradients,
               optimizer state, activations and allocator slack, all in one number)
  final loss   the last logged loss: activation checkpointing recomputes the same numbers, compile
               may reorder floating-point sums
Ratios are against the plain run measured in the same invocation.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

VARIANTS = {
    "plain": [],
    "compile": ["parallel.compile=true"],
    "ac-full": ["parallel.activation_checkpoint=full"],
    "ac-selective": ["parallel.activation_checkpoint=selective"],
    "compile+ac-full": ["parallel.compile=true", "parallel.activation_checkpoint=full"],
}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(args) -> None:
    """Train one variant in this process and print its figures as one JSON line."""
    import polars as pl
    import torch

    from scalelab.train.config import build_run_config
    from scalelab.train.loop import train_run

    base = {
        "name": args.variant,
        "model": {"preset": args.preset},
        "data": {"seq_len": args.seq_len, "val_sequences": 8},
        "train": {
            "num_tokens": args.steps * args.batch * args.seq_len,
            "global_batch_tokens": args.batch * args.seq_len,
            "num_threads": args.threads,
            "device": args.device,
            "seed": 0,
        },
        "eval": {"interval_steps": 0, "val_batch_sequences": 8},
        "checkpoint": {"interval_steps": 0, "final": False},
        "logging": {"wandb": "disabled", "progress": "off"},
    }
    cfg = build_run_config(base, VARIANTS[args.variant])
    cuda = torch.cuda.is_available() and args.device != "cpu"
    with tempfile.TemporaryDirectory(prefix="scalelab-bench-") as tmp:
        before = _rss_bytes()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        train_run(cfg, tmp)
        if cuda:
            peak = torch.cuda.max_memory_allocated()
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
        metrics = pl.read_parquet(Path(tmp) / "metrics.parquet")
    steady = metrics.filter(pl.col("step") > args.warmup)
    print(
        json.dumps(
            {
                "variant": args.variant,
                "tokens_per_s": float(steady["tokens_per_s"].median()),
                "peak_bytes": int(peak),
                "final_loss": float(metrics["loss"][-1]),
                "device": "cuda" if cuda else "cpu",
            }
        )
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny-3m")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16, help="sequences per step (one micro-batch)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5, help="steps left out of the tokens/s median")
    ap.add_argument("--threads", type=int, default=1, help="train.num_threads (0: torch's default)")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, from {','.join(VARIANTS)}")
    ap.add_argument("--variant", help=argparse.SUPPRESS)  # child mode: train this one variant
    args = ap.parse_args()
    if args.variant:
        child(args)
        return 0
    rows = []
    for name in args.variants.split(","):
        cmd = [sys.executable, __file__, "--variant", name]
        for key in ("preset", "seq_len", "batch", "steps", "warmup", "threads", "device"):
            cmd += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(f"{name}: failed\n{done.stderr[-3000:]}", file=sys.stderr)
            return 1
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    ref = rows[0]
    print(
        f"{args.preset}, seq_len {args.seq_len}, {args.batch} sequences/step, {args.steps} steps "
        f"(tokens/s: median after step {args.warmup}), one {rows[0]['device']} device, {args.threads} thread(s)"
    )
    peak_label = "peak alloc" if ref["device"] == "cuda" else "peak RSS growth"
    print(
        f"{'variant':<17} {'tokens/s':>10} {'vs plain':>9} {peak_label + ' MiB':>20} {'vs plain':>9} {'final loss':>11}"
    )
    for r in rows:
        print(
            f"{r['variant']:<17} {r['tokens_per_s']:>10.0f} {r['tokens_per_s'] / ref['tokens_per_s']:>8.2f}x "
            f"{r['peak_bytes'] / 2**20:>20.1f} {r['peak_bytes'] / ref['peak_bytes']:>8.2f}x {r['final_loss']:>11.5f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
