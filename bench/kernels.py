"""Benchmark of scalelab's Triton kernels against torch: forward+backward time and peak memory.

For each kernel at LLM-sized shapes (bf16) it compares
  triton    the kernel from scalelab.kernels (what `kernels: triton|auto` runs on CUDA)
  torch     the plain-torch reference (scalelab.kernels.reference)
  compile   torch.compile of the reference
  sdpa      (attention only) F.scaled_dot_product_attention forced to the flash backend
and prints fwd+bwd milliseconds (median, triton.testing.do_bench), peak extra CUDA memory (MiB above
the inputs) and the ratios. Before timing it checks every kernel against the reference computed in
fp32 from the same bf16 inputs and prints max abs errors next to torch's own bf16 error; a kernel
whose error exceeds 2x torch's error + 1% of the largest reference value is flagged MISMATCH (exit code 1).

  python bench/kernels.py                 # all kernels, one H100/H200-class GPU, < 5 minutes
  python bench/kernels.py --only attention fused_ce --no-compile
  TRITON_INTERPRET=1 python bench/kernels.py --cpu-smoke --no-compile  # tiny, CPU: checks the script only

Goals (H200): attention fwd+bwd >= 0.8x the speed of SDPA flash; fused CE peak memory <= 1/4 of
the naive reference at vocab 128k. Without CUDA (and without --cpu-smoke) it prints that it needs CUDA.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass(kw_only=True, slots=True)
class Case:
    """One kernel at one shape: leaf tensors (requiring grad) and the implementations to compare."""

    name: str
    shape: str
    leaves: list[torch.Tensor]
    impls: dict[str, Callable[..., torch.Tensor | tuple[torch.Tensor, ...]]]
    floor: float = 1e-2  # slack on top of 2x torch's own bf16 error, relative to max |fp32 reference|
    flops: float = 0.0  # fwd+bwd FLOPs, for TFLOP/s (attention only)
    results: dict[str, tuple[float, float]] = field(default_factory=dict)  # impl -> (ms, MiB)


def _outputs(x) -> tuple[torch.Tensor, ...]:
    return x if isinstance(x, tuple) else (x,)


def _fwd_bwd(fn, leaves, cots):
    torch.autograd.backward(_outputs(fn(*leaves)), cots)


def _cotangents(case: Case) -> list[torch.Tensor]:
    with torch.no_grad():
        outs = _outputs(case.impls["torch"](*case.leaves))
    g = torch.Generator(device=outs[0].device).manual_seed(0)
    return [torch.randn(o.shape, generator=g, device=o.device, dtype=o.dtype) for o in outs]


def _run_collect(fn, leaves, cots, dtype=None):
    xs = [t.detach().to(dtype or t.dtype).requires_grad_() for t in leaves]
    outs = _outputs(fn(*xs))
    torch.autograd.backward(outs, [c.to(o.dtype) for c, o in zip(cots, outs)])
    return [o.detach().float() for o in outs] + [x.grad.float() for x in xs]


def verify(case: Case, cots) -> bool:
    """Max abs errors of triton and of torch-in-bf16 against the fp32 reference; True when within bounds."""
    truth = _run_collect(case.impls["torch"], case.leaves, cots, torch.float32)
    ref_lowp = _run_collect(case.impls["torch"], case.leaves, cots)
    got = _run_collect(case.impls["triton"], case.leaves, cots)
    ok = True
    parts = []
    for i, (a, t, r) in enumerate(zip(got, truth, ref_lowp)):
        err, ref_err = (a - t).abs().max().item(), (r - t).abs().max().item()
        good = err <= 2 * ref_err + case.floor * t.abs().max().item()
        ok &= good
        label = f"out{i}" if i < len(got) - len(case.leaves) else f"d{i - (len(got) - len(case.leaves))}"
        parts.append(f"{label} {err:.2e} (torch {ref_err:.2e}){'' if good else ' MISMATCH'}")
    del truth, ref_lowp, got
    print(f"  check {case.name:<10} max|triton - fp32 ref|: " + ", ".join(parts))
    return ok


def measure(fn, leaves, cots, on_cuda: bool) -> tuple[float, float]:
    """(median ms of fwd+bwd, peak MiB allocated above the inputs during one fwd+bwd)."""
    step = lambda: _fwd_bwd(fn, leaves, cots)
    for t in leaves:
        t.grad = None
    step()  # warm-up: compilation, autotuning, cuBLAS handles
    for t in leaves:
        t.grad = None
    if not on_cuda:  # --cpu-smoke: wall time of one step, no memory figure
        t0 = time.perf_counter()
        step()
        return (time.perf_counter() - t0) * 1e3, float("nan")
    import triton.testing

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    peak_mib = (torch.cuda.max_memory_allocated() - base) / 2**20
    for t in leaves:
        t.grad = None
    ms = triton.testing.do_bench(step, warmup=25, rep=100, grad_to_none=leaves, return_mode="median")
    for t in leaves:
        t.grad = None
    return ms, peak_mib


def _sdpa_flash(gqa: bool):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def fn(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            if gqa:
                try:
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                except RuntimeError:  # a torch whose flash kernel lacks GQA: repeat the kv heads
                    rep = q.shape[1] // k.shape[1]
                    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    return fn


def build_cases(args, device: str, dtype: torch.dtype) -> list[Case]:
    from scalelab.kernels import reference as R
    from scalelab.kernels.triton_ops import ops

    K = ops()
    if args.cpu_smoke:  # tiny: the interpreter runs each program in Python
        B, T, H, D, hid, ffn, vocab = 1, 128, 8, 64, 128, 448, 4000
    else:  # Llama-3-8B-like: 32 heads of 128, hidden 4096, FFN 14336, vocab 128256
        B, T, H, D, hid, ffn, vocab = 2, 4096, 32, 128, 4096, 14336, 128256
    g = torch.Generator(device=device).manual_seed(0)
    rnd = lambda *shape, std=1.0: (torch.randn(shape, generator=g, device=device) * std).to(dtype)
    leaf = lambda t: t.requires_grad_()
    want = set(args.only)
    cases: list[Case] = []
    for hk in (H, H // 4):
        name = "attention" if hk == H else "attn_gqa"
        if not want & {"attention", name}:
            continue
        q, k, v = leaf(rnd(B, H, T, D)), leaf(rnd(B, hk, T, D)), leaf(rnd(B, hk, T, D))
        impls = {"triton": lambda q, k, v: K.attention(q, k, v, causal=True), "torch": R.attention}
        if device == "cuda":
            impls["sdpa_flash"] = _sdpa_flash(gqa=hk != H)
        # causal fwd (2 matmuls) + bwd (5 matmuls), half the T x T square: 3.5 * 2 * B*H*T*T*D
        cases.append(
            Case(
                name=name,
                shape=f"B={B} T={T} Hq={H} Hk={hk} D={D}",
                leaves=[q, k, v],
                impls=impls,
                flops=3.5 * 2 * B * H * T * T * D,
            )
        )
    n = B * T
    if "rms_norm" in want:
        x, w = leaf(rnd(n, hid)), leaf(1 + rnd(hid, std=0.1))
        impls = {"triton": lambda x, w: K.rms_norm(x, w, 1e-5), "torch": lambda x, w: R.rms_norm(x, w, 1e-5)}
        cases.append(Case(name="rms_norm", shape=f"N={n} D={hid}", leaves=[x, w], impls=impls))
        x, w, r = leaf(rnd(n, hid)), leaf(1 + rnd(hid, std=0.1)), leaf(rnd(n, hid))
        impls = {
            "triton": lambda x, w, r: K.rms_norm(x, w, 1e-5, residual=r),
            "torch": lambda x, w, r: R.rms_norm(x, w, 1e-5, residual=r),
        }
        cases.append(Case(name="rms_add", shape=f"N={n} D={hid} +residual", leaves=[x, w, r], impls=impls))
    if "swiglu" in want:
        impls = {"triton": K.swiglu, "torch": R.swiglu}
        cases.append(
            Case(
                name="swiglu",
                shape=f"N={n} F={ffn}",
                leaves=[leaf(rnd(n, ffn)), leaf(rnd(n, ffn))],
                impls=impls,
            )
        )
    if "rope" in want:
        cos, sin = R.rope_cos_sin(T, D, device=device)
        q, k = leaf(rnd(B, T, H, D)), leaf(rnd(B, T, max(1, H // 4), D))
        impls = {
            "triton": lambda q, k: K.apply_rope(q, k, cos, sin),
            "torch": lambda q, k: R.apply_rope(q, k, cos, sin),
        }
        cases.append(Case(name="rope", shape=f"B={B} T={T} Hq={H} Hk={H // 4} D={D}", leaves=[q, k], impls=impls))
    if "fused_ce" in want:
        h, w = leaf(rnd(n, hid)), leaf(rnd(vocab, hid, std=0.02))
        tgt = torch.randint(0, vocab, (n,), generator=g, device=device)
        impls = {
            "triton": lambda h, w: K.fused_linear_cross_entropy(h, w, tgt, z_loss=1e-4),
            "torch": lambda h, w: R.fused_linear_cross_entropy(h, w, tgt, z_loss=1e-4),
        }
        cases.append(
            Case(
                name="fused_ce",
                shape=f"N={n} D={hid} V={vocab} z=1e-4",
                leaves=[h, w],
                impls=impls,
            )
        )
    if not args.no_compile:
        for c in cases:
            c.impls["compile"] = torch.compile(c.impls["torch"], dynamic=False)
    return cases


def _timed(case: Case, impl: str, fn, cots, on_cuda: bool) -> None:
    try:
        case.results[impl] = measure(fn, case.leaves, cots, on_cuda)
    except Exception as e:  # e.g. a backend that refuses the shape: report, keep going
        print(f"  {case.name}/{impl} failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    kernels = ["attention", "attn_gqa", "rms_norm", "swiglu", "rope", "fused_ce"]
    p.add_argument("--only", nargs="+", choices=kernels, default=kernels, help="kernels to run")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile column")
    p.add_argument(
        "--budget-s",
        type=float,
        default=210.0,
        help="start no torch.compile measurement after this many seconds (keeps the run < 5 min)",
    )
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on CPU (needs TRITON_INTERPRET=1)")
    args = p.parse_args()
    on_cuda = torch.cuda.is_available() and not args.cpu_smoke
    if not on_cuda and not args.cpu_smoke:
        print(
            "bench/kernels.py needs CUDA (a GPU): nothing measured. "
            "Use TRITON_INTERPRET=1 ... --cpu-smoke to check the script on CPU."
        )
        return 0
    if args.cpu_smoke:
        if os.environ.get("TRITON_INTERPRET") != "1":
            print("--cpu-smoke needs TRITON_INTERPRET=1 in the environment (set before Triton is imported)")
            return 2
        device, dtype = "cpu", torch.float32
    else:
        device, dtype = "cuda", torch.bfloat16
    t_start = time.perf_counter()
    dev_name = torch.cuda.get_device_name() if on_cuda else "CPU (interpreter smoke run, timings meaningless)"
    print(f"device: {dev_name}; torch {torch.__version__}; dtype {dtype}")
    cases = build_cases(args, device, dtype)
    all_ok = True
    print("correctness (before timing):")
    cots = {}
    for case in cases:
        t_case = time.perf_counter()
        cots[case.name] = _cotangents(case)
        all_ok &= verify(case, cots[case.name])
        case.results = {}
        for impl, fn in case.impls.items():
            if impl != "compile":  # compiled references are timed last, within the time budget
                _timed(case, impl, fn, cots[case.name], on_cuda)
        print(f"  ({case.name}: checked and timed in {time.perf_counter() - t_case:.0f}s)")
        if on_cuda:
            torch.cuda.empty_cache()
    for case in cases:
        if "compile" not in case.impls:
            continue
        if time.perf_counter() - t_start > args.budget_s:
            print(f"  {case.name}/compile skipped: past the {args.budget_s:.0f}s budget (--budget-s)")
            continue
        t_case = time.perf_counter()
        _timed(case, "compile", case.impls["compile"], cots[case.name], on_cuda)
        print(f"  ({case.name}: torch.compile'd reference compiled and timed in {time.perf_counter() - t_case:.0f}s)")
        if on_cuda:
            torch.cuda.empty_cache()
    del cots
    print()
    print(
        f"{'kernel':<10} {'shape':<34} {'impl':<11} {'fwd+bwd ms':>11} {'peak MiB':>10} "
        f"{'triton speedup':>15} {'mem vs triton':>14}"
    )
    for case in cases:
        tri_ms, tri_mib = case.results.get("triton", (float("nan"), float("nan")))
        for impl, (ms, mib) in case.results.items():
            extra = f"  {case.flops / ms / 1e9:.0f} TFLOP/s" if case.flops and on_cuda else ""
            print(
                f"{case.name:<10} {case.shape:<34} {impl:<11} {ms:>11.3f} {mib:>10.1f} "
                f"{ms / tri_ms:>14.2f}x {mib / tri_mib if tri_mib else float('nan'):>13.2f}x{extra}"
            )
    print("triton speedup = impl ms / triton ms (>1: triton faster); mem vs triton = impl peak / triton peak")
    goals = []
    for case in cases:
        r = case.results
        if case.name == "attention" and "sdpa_flash" in r and "triton" in r:
            goals.append(
                f"attention fwd+bwd speed vs SDPA flash: {r['sdpa_flash'][0] / r['triton'][0]:.2f}x (goal >= 0.8x)"
            )
        if case.name == "fused_ce" and "torch" in r and "triton" in r and on_cuda:
            goals.append(f"fused CE peak memory / naive reference: {r['triton'][1] / r['torch'][1]:.3f} (goal <= 0.25)")
    for line in goals:
        print("GOAL " + line)
    print(
        f"correctness: {'all kernels within bounds' if all_ok else 'MISMATCH (see above)'}; "
        f"total {time.perf_counter() - t_start:.0f}s"
    )
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
