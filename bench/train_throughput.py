"""Training-step throughput of a ~10M-parameter model on this machine, as MFU against matmul peak.

    python bench/train_throughput.py [--preset small-10m] [--seq-len 256] [--batch 8] [--steps 10]

Prints tokens/s, achieved FLOP/s (exact count and 6N count) and, measured in the same run, the
machine's fp32 matmul FLOP/s on square 1024–2048 matrices — their ratio is the model FLOP
utilisation (MFU) on this CPU.
"""

from __future__ import annotations

import argparse
import time

import torch

from scalelab.models.accounting import flops_per_token, num_params
from scalelab.models.llama import build_model
from scalelab.models.loss import lm_loss
from scalelab.models.presets import get_preset


def matmul_flops_per_s(n: int = 2048, repeats: int = 5) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small-10m")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()

    cfg = get_preset(args.preset, vocab_size=320)
    model = build_model(cfg, device=torch.device("cpu"), seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 257, (args.batch, args.seq_len + 1))
    fpt = flops_per_token(cfg, args.seq_len)

    def step():
        loss, _ = lm_loss(model, tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # warm-up (allocations, optimizer state)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    dt = (time.perf_counter() - t0) / args.steps
    tok_s = args.batch * args.seq_len / dt
    peak = max(matmul_flops_per_s(1024), matmul_flops_per_s(2048))
    exact, approx = tok_s * fpt.exact_causal, tok_s * fpt.six_n  # causal attention: half the T x T scores
    print(
        f"model         {args.preset}: N={num_params(cfg):,}  seq_len={args.seq_len}  batch={args.batch}  "
        f"threads={torch.get_num_threads()}"
    )
    print(f"step time     {dt * 1e3:.1f} ms   tokens/s {tok_s:,.0f}")
    print(f"achieved      {exact / 1e9:.2f} GFLOP/s (exact, causal)   {approx / 1e9:.2f} GFLOP/s (6N)")
    print(f"matmul peak   {peak / 1e9:.2f} GFLOP/s (fp32, measured now)")
    print(f"MFU           {exact / peak:.1%} (exact)   {approx / peak:.1%} (6N)")


if __name__ == "__main__":
    main()
