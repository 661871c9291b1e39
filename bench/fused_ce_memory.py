"""CPU memory claim for the chunked linear + cross-entropy: peak memory vs the naive full-logits path.

Runs `scalelab.kernels.reference.fused_linear_cross_entropy` forward + backward twice per vocab size,
each in a fresh subprocess: once naive (chunk_size=None: the full [N, V] fp32 logits, their
log-softmax and their gradient all live at once) and once chunked (chunk_size=C: logits formed C
tokens at a time under activation checkpointing). Memory is the process's peak resident set
(VmHWM from /proc/self/status) minus its resident set just before the call, with glibc told to
return every allocation above 128 KiB to the OS on free (MALLOC_MMAP_THRESHOLD_), so that the
peak counts live tensors, not allocator caching. Both numbers include the gradients of hidden and
weight (N x D and V x D fp32), which any implementation must hold.

  python bench/fused_ce_memory.py                       # N=1024 tokens, D=128, V in {32768, 131072}
  python bench/fused_ce_memory.py --tokens 2048 --vocab 65536 --chunk 256

Linux only (reads /proc). Takes ~1 minute on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _worker(args: argparse.Namespace) -> None:
    import torch

    from scalelab.kernels.reference import fused_linear_cross_entropy

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(args.tokens, args.hidden, generator=g).requires_grad_()
    weight = (torch.randn(args.vocab, args.hidden, generator=g) * 0.02).requires_grad_()
    targets = torch.randint(0, args.vocab, (args.tokens,), generator=g)
    chunk = None if args.mode == "naive" else args.chunk
    # Warm up on a tiny problem so that one-time allocations (thread pools, autograd) are not counted.
    small = fused_linear_cross_entropy(hidden[:2], weight[:8], targets[:2] % 8, chunk_size=chunk)
    small.backward()
    hidden.grad = weight.grad = None
    before = _rss_kib("VmRSS")
    t0 = time.perf_counter()
    loss = fused_linear_cross_entropy(hidden, weight, targets, z_loss=1e-4, chunk_size=chunk)
    loss.backward()
    seconds = time.perf_counter() - t0
    peak = _rss_kib("VmHWM")
    # Process-wide peak includes the warm-up; the warm-up is tiny next to the [N, V] work measured here.
    out = {
        "mode": args.mode,
        "peak_delta_mib": (peak - before) / 1024,
        "seconds": seconds,
        "loss": loss.item(),
    }
    print(json.dumps(out))


def _measure(mode: str, args: argparse.Namespace, vocab: int) -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", OMP_NUM_THREADS="1")
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        "--mode",
        mode,
        "--tokens",
        str(args.tokens),
        "--hidden",
        str(args.hidden),
        "--vocab",
        str(vocab),
        "--chunk",
        str(args.chunk),
    ]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"worker {mode} V={vocab} failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=1024, help="N, tokens in the batch")
    p.add_argument("--hidden", type=int, default=128, help="D, hidden size")
    p.add_argument("--vocab", type=int, nargs="+", default=[32768, 131072], help="V, one or more vocab sizes")
    p.add_argument("--chunk", type=int, default=128, help="tokens per chunk in the chunked path")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=("naive", "chunked"), default="naive", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        args.vocab = args.vocab[0]
        _worker(args)
        return 0
    if not os.path.exists("/proc/self/status"):
        print("fused_ce_memory needs Linux /proc to read peak RSS")
        return 1
    a = args
    print(f"fused linear + CE, fwd+bwd, fp32 on CPU: N={a.tokens} tokens, D={a.hidden}, chunk={a.chunk}")
    cols = ("vocab", "logits MiB", "naive MiB", "chunked MiB", "ratio", "loss diff")
    widths = (8, 11, 10, 12, 7, 10)
    print(" ".join(f"{c:>{w}}" for c, w in zip(cols, widths)))
    for vocab in args.vocab:
        naive = _measure("naive", args, vocab)
        chunked = _measure("chunked", args, vocab)
        logits_mib = args.tokens * vocab * 4 / 2**20
        ratio = chunked["peak_delta_mib"] / naive["peak_delta_mib"]
        diff = abs(naive["loss"] - chunked["loss"])
        vals = (f"{vocab}", f"{logits_mib:.0f}", f"{naive['peak_delta_mib']:.0f}",
                f"{chunked['peak_delta_mib']:.0f}", f"{ratio:.3f}", f"{diff:.2e}")  # fmt: skip
        print(" ".join(f"{v:>{w}}" for v, w in zip(vals, widths)))
        secs = f"time naive {naive['seconds']:.1f}s, chunked {chunked['seconds']:.1f}s (recomputes logits)"
        print(f"{'':>8} {secs}")
    print("ratio = chunked peak / naive peak: peak RSS above the RSS before the call;")
    print("        both include the gradients of hidden (N x D) and weight (V x D)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
