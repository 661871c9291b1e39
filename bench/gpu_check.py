"""GPU check: one table of what scalelab's GPU paths achieve on one GPU (H100/H200 class), in < 10 minutes.

    python bench/gpu_check.py                      # on a CUDA machine: the table
    python bench/gpu_check.py                      # without CUDA: prints what it would run, exits 0
    TRITON_INTERPRET=1 python bench/gpu_check.py --cpu-smoke   # tiny, CPU: exercises every code path

Sections, each in its own subprocess with a time limit (a crash, an out-of-memory or a hang in one
becomes an error row; the others still run and the table is always printed):
  training-fused    `train_run` of the 1b preset (Llama-3.2-1B shape, vocab 128256): bf16 autocast,
                    torch.compile of every block, Triton kernels (kernels: triton), fused AdamW;
                    seq 2048, 16 sequences per step in micro-batches of 4, 10 steps. Step time
                    (median after the compile steps), tokens/s, MFU (exact causal FLOPs; 6N beside),
                    peak memory, each beside the layout planner's estimate (default constants, H100/H200
                    bf16 peak 989 TFLOP/s); then the profile of its last two steps
                    (scalelab.train.profiling): compute, exposed communication, optimizer, data, idle.
  training-unfused  the same run with the torch reference ops (kernels: torch), still compiled.
  kernels           every Triton kernel (bench/kernels.py's cases and shapes: attention and GQA at
                    B=2 T=4096 H=32 D=128, RMSNorm (+residual), SwiGLU, RoPE, fused linear
                    cross-entropy at vocab 128256) against its torch reference and, for attention,
                    SDPA's FlashAttention backend: forward+backward ms and the max error against the
                    fp32 reference beside torch's own bf16 error; fused cross-entropy's peak memory
                    against the reference's.
Budget: 600 s in all; a section gets what is left of it, capped at its own limit.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

TOTAL_BUDGET_S = 570.0  # leaves the parent's start-up and printing inside 10 minutes
SECTIONS = {  # name -> time limit (s)
    "training-fused": 220.0,
    "training-unfused": 150.0,
    "kernels": 180.0,
}
STEPS = {False: 10, True: 4}  # training steps: GPU, --cpu-smoke
KERNELS = ["attention", "attn_gqa", "rms_norm", "swiglu", "rope", "fused_ce"]


# --- rows ----------------------------------------------------------------------------------------------
class Rows:
    """Rows appended to a JSON-lines file as they are measured (a timed-out section keeps its rows)."""

    def __init__(self, path: str, section: str):
        self.path, self.section = path, section

    def add(self, item: str, measured: str, reference: str = "", note: str = "") -> None:
        row = {"section": self.section, "item": item, "measured": measured, "reference": reference, "note": note}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def guard(self, item: str, fn):
        """Run fn(); an exception becomes this item's row (the section goes on)."""
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - any failure is a row of the table
            msg = f"{type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''}"
            self.add(item, "ERROR", note=msg)
            traceback.print_exc()
            return None


# --- training: MFU, the planner beside it, a profile ---------------------------------------------------
def _training_config(kernels: str, smoke: bool, profile_steps: list[int]) -> dict:
    if smoke:  # the debug preset on CPU: fp32, no compile
        model = {"preset": "debug", "kernels": kernels, "vocab_size": 320}
        seq, seqs, mbs, steps, device, dtype, compile_ = 32, 2, 2, STEPS[True], "cpu", "fp32", False
    else:
        model = {"preset": "1b", "kernels": kernels, "vocab_size": 128256}
        seq, seqs, mbs, steps, device, dtype, compile_ = 2048, 16, 4, STEPS[False], "cuda", "bf16", True
    return {
        "name": f"gpu-check-{kernels}",
        "model": model,
        "data": {"seq_len": seq, "val_sequences": 4},
        "train": {
            "num_tokens": steps * seqs * seq,
            "global_batch_tokens": seqs * seq,
            "micro_batch_sequences": mbs,
            "device": device,
            "dtype": dtype,
            "seed": 0,
        },
        "eval": {"interval_steps": 0, "val_batch_sequences": 2},
        "checkpoint": {"interval_steps": 0, "final": False},
        "logging": {"wandb": "disabled", "progress": "off", "interval_steps": 1},
        "parallel": {"compile": compile_},
        "profile": {"steps": profile_steps, "memory": False},
    }


def _hardware(smoke: bool):
    import torch

    from scalelab.parallel.planner import Hardware

    if smoke or not torch.cuda.is_available():
        return Hardware(gpu_memory_bytes=2**40, peak_flops=50e9, gpus_per_node=1)
    return Hardware(gpu_memory_bytes=torch.cuda.get_device_properties(0).total_memory, gpus_per_node=1)


def section_training(rows: Rows, smoke: bool, fused: bool) -> None:
    import polars as pl
    import torch

    from scalelab.models.accounting import flops_per_token
    from scalelab.parallel.planner import CostConstants
    from scalelab.train.config import build_run_config
    from scalelab.train.loop import train_run
    from scalelab.train.profile_report import build_report, micro_batch_sequences, planner_side

    kernels = "triton" if fused else "torch"
    steps = STEPS[smoke]
    warmup = 1 if smoke else 4  # compile and autotuning happen in the first steps
    profile_steps = [steps - 1, steps] if fused else []
    cfg = build_run_config(_training_config(kernels, smoke, profile_steps))
    label = f"{'debug' if smoke else '1b'} kernels={kernels} {'fp32' if smoke else 'bf16 compile'}"
    run_dir = Path(tempfile.mkdtemp(prefix=f"gpu-check-{kernels}-"))
    cuda = cfg.train.device == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    summary = train_run(cfg, run_dir)
    wall = time.perf_counter() - t0
    if summary.get("status") != "done":
        rows.add(f"{label}: run", "ERROR", note=str(summary)[:150])
        return
    peak_mem = torch.cuda.max_memory_allocated() if cuda else None
    metrics = pl.read_parquet(run_dir / "metrics.parquet")
    timed = metrics.filter((pl.col("step") > warmup) & ~pl.col("step").is_in(profile_steps))
    step_s = cfg.tokens_per_step / float(timed["tokens_per_s"].median())
    hw, consts = _hardware(smoke), CostConstants()
    fpt = flops_per_token(cfg.model, cfg.seq_len)
    mfu = fpt.exact_causal * cfg.tokens_per_step / step_s / hw.peak_flops
    mfu_6n = fpt.six_n * cfg.tokens_per_step / step_s / hw.peak_flops
    plan = planner_side(cfg.model, cfg.parallel, seq_len=cfg.seq_len, global_batch_sequences=cfg.global_batch_sequences,
                        micro_batch_sequences=micro_batch_sequences(cfg), device=cfg.train.device, hw=hw,
                        consts=consts)  # fmt: skip
    plan_mfu = fpt.exact_causal * cfg.tokens_per_step / plan["step_s"] / hw.peak_flops
    shape = f"seq {cfg.seq_len} x {cfg.global_batch_sequences} seqs (micro {cfg.train.micro_batch_sequences})"
    rows.add(f"{label}: step time", f"{step_s * 1e3:.1f} ms", f"planner {plan['step_s'] * 1e3:.1f} ms",
             f"{shape}; median of steps {warmup + 1}..{steps} unprofiled; run {wall:.0f}s incl. compile")  # fmt: skip
    rows.add(f"{label}: MFU", f"{mfu:.1%}", f"planner {plan_mfu:.1%} (mfu const {consts.mfu:.2f})",
             f"exact causal FLOPs / {hw.peak_flops / 1e12:.3g} TFLOP/s; with 6N FLOPs: {mfu_6n:.1%}")  # fmt: skip
    rows.add(f"{label}: tokens/s", f"{cfg.tokens_per_step / step_s:,.0f}")
    if peak_mem is not None:
        rows.add(f"{label}: peak memory", f"{peak_mem / 2**30:.1f} GiB",
                 f"planner {plan['memory']['total'] / 2**30:.1f} GiB",
                 "max_memory_allocated: training steps and final eval; planner with overhead_bytes")  # fmt: skip
    if fused:
        report = build_report(run_dir, hw, consts)
        r0 = report.ranks[0]
        t = r0["times"]
        parts = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in t.items())
        planned = plan["times"]
        rows.add(f"{label}: profile steps {report.profiled_steps} (ms)", parts,
                 f"planner compute {planned['compute'] * 1e3:.1f}, comm {planned['comm_exposed'] * 1e3:.1f}",
                 f"profiled step {r0['step_s'] * 1e3:.1f} ms (profiler on)")  # fmt: skip
        m = r0["memory"]
        gib = lambda v: "—" if v is None else f"{v / 2**30:.2f}"  # noqa: E731
        rows.add(f"{label}: profile memory (GiB)",
                 f"params {gib(m['params'])}, grads {gib(m['grads'])}, optim {gib(m['optimizer'])}, "
                 f"acts {gib(m['activations'])}, peak {gib(m['peak'])}",
                 "planner " + ", ".join(f"{k} {gib(v)}" for k, v in report.planner["memory"].items()),
                 f"trace: {run_dir}/profile/rank0")  # fmt: skip


# --- kernels -------------------------------------------------------------------------------------------
def _bench_kernels():
    """bench/kernels.py as a module (the same cases, shapes and timing as that benchmark)."""
    spec = importlib.util.spec_from_file_location("scalelab_bench_kernels", Path(__file__).with_name("kernels.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def section_kernels(rows: Rows, smoke: bool, only: list[str]) -> None:
    import torch

    bk = _bench_kernels()
    on_cuda = torch.cuda.is_available() and not smoke
    device, dtype = ("cuda", torch.bfloat16) if on_cuda else ("cpu", torch.float32)
    args = SimpleNamespace(only=only, no_compile=True, cpu_smoke=smoke)
    cases = bk.build_cases(args, device, dtype)
    for case in cases:
        rows.guard(case.name, lambda case=case: _kernel_rows(rows, bk, case, on_cuda))
        case.leaves = []
        if on_cuda:
            torch.cuda.empty_cache()


def _kernel_rows(rows: Rows, bk, case, on_cuda: bool) -> None:
    import torch

    cots = bk._cotangents(case)
    truth = bk._run_collect(case.impls["torch"], case.leaves, cots, torch.float32)
    lowp = bk._run_collect(case.impls["torch"], case.leaves, cots)
    got = bk._run_collect(case.impls["triton"], case.leaves, cots)
    scale = max(t.abs().max().item() for t in truth)
    err = max((a - t).abs().max().item() for a, t in zip(got, truth))
    ref_err = max((r - t).abs().max().item() for r, t in zip(lowp, truth))
    ok = err <= 2 * ref_err + case.floor * scale
    del truth, lowp, got
    times = {}
    for impl, fn in case.impls.items():
        try:
            times[impl] = bk.measure(fn, case.leaves, cots, on_cuda)
        except Exception as e:  # noqa: BLE001 - e.g. a backend that refuses the shape
            times[impl] = None
            rows.add(f"{case.name} {impl}", "ERROR", note=f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")
    tri = times.get("triton")
    others = [f"{k} {v[0]:.3f} ms ({v[0] / tri[0]:.2f}x)" for k, v in times.items() if k != "triton" and v and tri]
    rows.add(f"{case.name} {case.shape} fwd+bwd", f"triton {tri[0]:.3f} ms" if tri else "—", ", ".join(others),
             f"max|err| {err:.2e} vs fp32 ref (torch in {case.leaves[0].dtype}: {ref_err:.2e}; |ref| {scale:.1e}) "
             f"{'OK' if ok else 'MISMATCH'}")  # fmt: skip
    if case.name == "fused_ce" and on_cuda and tri and times.get("torch"):
        ratio = tri[1] / times["torch"][1]
        rows.add("fused_ce peak memory", f"{tri[1]:.0f} MiB", f"reference {times['torch'][1]:.0f} MiB",
                 f"ratio {ratio:.3f} (goal <= 0.25); MiB above the inputs in one fwd+bwd")  # fmt: skip


# --- the parent: one subprocess per section, one table -------------------------------------------------
def _child(args) -> int:
    rows = Rows(args.rows, args.child)
    if args.child == "kernels":
        rows.guard("kernels", lambda: section_kernels(rows, args.cpu_smoke, args.kernels))
    else:
        fused = args.child == "training-fused"
        rows.guard(args.child, lambda: section_training(rows, args.cpu_smoke, fused))
    return 0


def _run_sections(args) -> list[dict]:
    t_start = time.perf_counter()
    out: list[dict] = []
    for name in args.sections:
        left = TOTAL_BUDGET_S - (time.perf_counter() - t_start)
        limit = min(SECTIONS[name], left)
        if limit < 20:
            out.append({"section": name, "item": "-", "measured": "SKIPPED", "note": f"{left:.0f}s of the budget left"})
            continue
        with tempfile.NamedTemporaryFile("r", suffix=".jsonl", delete=False) as f:
            path = f.name
        cmd = [sys.executable, __file__, "--child", name, "--rows", path, "--kernels", *args.kernels]
        cmd += ["--cpu-smoke"] if args.cpu_smoke else []
        t0 = time.perf_counter()
        note = ""
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, check=False)
            if res.returncode != 0:
                tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or [""]
                note = f"exit {res.returncode}: {tail[0][:150]}"
        except subprocess.TimeoutExpired:
            note = f"timed out after {limit:.0f}s"
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        os.unlink(path)
        if note:
            rows.append({"section": name, "item": "-", "measured": "INCOMPLETE", "note": note})
        if args.verbose:
            print(f"[{name}: {time.perf_counter() - t0:.0f}s]", file=sys.stderr)
        out += rows
    return out


def _print_table(rows: list[dict], header: str) -> None:
    cols = ("section", "item", "measured", "reference", "note")
    width = {c: max([len(c)] + [len(str(r.get(c, ""))) for r in rows]) for c in cols}
    print(header)
    print(" | ".join(c.ljust(width[c]) for c in cols))
    print("-|-".join("-" * width[c] for c in cols))
    for r in rows:
        print(" | ".join(str(r.get(c, "")).ljust(width[c]) for c in cols))


def _triton_version() -> str:
    try:
        import triton
    except ImportError:
        return "not installed"
    return triton.__version__


def _plan_text(args) -> str:
    what = {
        "training-fused": "1b preset, seq 2048 x 16 seqs (micro 4), 10 steps, bf16, compile, kernels triton: "
        "step time, MFU, peak memory vs the planner; profile of steps 9-10",
        "training-unfused": "the same with kernels torch",
        "kernels": f"{', '.join(args.kernels)} (bench/kernels.py shapes) vs torch and SDPA flash; fused CE memory",
    }
    lines = ["No CUDA device: bench/gpu_check.py measures nothing here. On one H100/H200 it would run:"]
    lines += [f"  {name:<17} (limit {SECTIONS[name]:.0f}s) {what[name]}" for name in args.sections]
    lines.append("TRITON_INTERPRET=1 python bench/gpu_check.py --cpu-smoke   checks the script on CPU (tiny shapes)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sections", nargs="+", choices=list(SECTIONS), default=list(SECTIONS))
    p.add_argument("--kernels", nargs="+", choices=KERNELS, default=KERNELS, help="kernels for the kernels section")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny configs on CPU (kernels need TRITON_INTERPRET=1)")
    p.add_argument("--verbose", action="store_true", help="section times on stderr")
    p.add_argument("--child", choices=list(SECTIONS), help=argparse.SUPPRESS)
    p.add_argument("--rows", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return _child(args)
    import torch

    if not torch.cuda.is_available() and not args.cpu_smoke:
        print(_plan_text(args))
        return 0
    if args.cpu_smoke and "kernels" in args.sections and os.environ.get("TRITON_INTERPRET") != "1":
        print("--cpu-smoke runs the Triton kernels in the interpreter: set TRITON_INTERPRET=1 (or leave out kernels)")
        return 2
    t0 = time.perf_counter()
    if args.cpu_smoke:
        device = "CPU smoke run (tiny configs; figures meaningless)"
    else:
        device = f"{torch.cuda.get_device_name()}, {torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB"
    rows = _run_sections(args)
    header = (f"bench/gpu_check.py on {device}; torch {torch.__version__}, triton {_triton_version()}; "
              f"{time.perf_counter() - t0:.0f}s")  # fmt: skip
    _print_table(rows, header)
    return 0


if __name__ == "__main__":
    sys.exit(main())
