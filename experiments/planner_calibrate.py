"""Benchmark: calibrate the planner's step-time model from real (CPU, one process) training steps.

Times forward+backward+AdamW steps of CPU presets at several micro-batch sizes and activation
checkpointing modes, fits the planner's constants on half of the runs (`calibrate`; one process has
no communication, so only `mfu` is identifiable) and reports the step-time error of the other half
before (default constants) and after calibration. The CPU "peak" is a measured fp32 matmul rate.

    python experiments/planner_calibrate.py [--steps 3]
    python experiments/planner_calibrate.py --gloo      # gloo's alpha-beta between two processes, seconds

`--gloo` times fp32 all-reduces of 1 to 2**20 elements between two gloo processes (one thread each)
and fits time = 2(n-1)·alpha + 2(n-1)/n·bytes / bandwidth by least squares on relative error: alpha is the planner's
latency per ring step on this machine (`Hardware.intra_node_step_latency_s` for CPU runs;
scalelab.train.profile_report.GLOO_STEP_LATENCY_S), bandwidth its bus bandwidth.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from scalelab.errors import run_script
from scalelab.parallel.backend import spawn
from scalelab.train.profiling import all_reduce_seconds, matmul_flops

MODELS = ("tiny-1m", "tiny-3m", "small-10m")
GLOO_SIZES = (1, 2**8, 2**12, 2**14, 2**16, 2**18, 2**20)  # fp32 elements per all-reduce


def time_steps(cfg, lay, mbs: int, seq_len: int, sequences: int, steps: int) -> float:
    from scalelab.models.llama import build_model
    from scalelab.models.loss import lm_loss
    from scalelab.parallel.activation_checkpointing import apply_ac

    model = build_model(cfg, seed=0)
    apply_ac(model, lay.activation_checkpoint)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = torch.randint(0, cfg.vocab_size, (sequences, seq_len + 1))
    times = []
    for _ in range(steps + 1):  # the first step warms up
        t0 = time.perf_counter()
        for chunk in batch.split(mbs):
            loss, _ = lm_loss(model, chunk[:, :-1], chunk[:, 1:])
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def _gloo_worker(out: str) -> None:
    times = [all_reduce_seconds(n, reps=20 if n < 2**16 else 5) for n in GLOO_SIZES]
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(times))


def gloo_alpha_beta(world: int = 2) -> tuple[float, float, list[float]]:
    """(alpha: seconds per ring step, bus bandwidth in bytes/s, the median times) between `world`
    gloo processes on this machine."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "times.json")
        spawn(_gloo_worker, world, (str(out),), backend="gloo")  # one thread per rank, loopback
        times = json.loads(out.read_text())
    steps = 2 * (world - 1)
    wire = np.array([steps / world * n * 4 for n in GLOO_SIZES])  # bytes one rank sends
    t = np.array(times)
    # relative residuals: every size counts alike (absolute ones let the largest decide alpha)
    a = np.stack([np.full(len(wire), float(steps)), wire], axis=1) / t[:, None]
    (alpha, inv_bw), *_ = np.linalg.lstsq(a, np.ones(len(t)), rcond=None)
    return float(alpha), float(1 / inv_bw), times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--gloo", action="store_true", help="fit gloo's alpha-beta between two processes instead")
    ap.add_argument(
        "--models", default=",".join(MODELS), help=f"CPU presets, comma-separated (default {','.join(MODELS)})"
    )
    args = ap.parse_args(argv)
    if args.gloo:
        alpha, bw, times = gloo_alpha_beta()
        print("fp32 all-reduce between 2 gloo processes (median seconds):")
        for n, t in zip(GLOO_SIZES, times):
            print(f"  {n * 4:>9} bytes  {t * 1e6:>9.1f} us")
        print(f"alpha {alpha * 1e6:.1f} us per ring step; bus bandwidth {bw / 1e9:.2f} GB/s")
        return 0
    torch.set_num_threads(1)
    from scalelab.models.presets import get_preset
    from scalelab.parallel.config import ParallelConfig
    from scalelab.parallel.planner import CostConstants, Hardware, Measurement, calibrate, candidate_name, estimate

    hw = Hardware(gpu_memory_bytes=2**40, peak_flops=matmul_flops(reps=20), gpus_per_node=1)
    seq_len, sequences = 128, 8
    runs = []
    models = [m.strip() for m in args.models.split(",")]
    for name in models:
        cfg = get_preset(name, kernels="torch")
        for mbs in (2, 8):
            for ac in ("none", "full"):
                lay = ParallelConfig(activation_checkpoint=ac)
                t = time_steps(cfg, lay, mbs, seq_len, sequences, args.steps)
                runs.append(Measurement(cfg=cfg, parallel=lay, micro_batch_sequences=mbs, seq_len=seq_len,
                                        global_batch_sequences=sequences, step_time_s=t, hw=hw))  # fmt: skip
    # fit on (mbs 2, no AC) and (mbs 8, full AC) of every model; predict the other two
    fit_on = [r for i, r in enumerate(runs) if i % 4 in (0, 3)]
    held_out = [r for i, r in enumerate(runs) if i % 4 in (1, 2)]

    def errors(consts):
        out = []
        for m in held_out:
            p = estimate(m.cfg, m.parallel, micro_batch_sequences=m.micro_batch_sequences, seq_len=seq_len,
                         global_batch_sequences=sequences, hw=hw, consts=consts)  # fmt: skip
            out.append(p.step_time_s / m.step_time_s - 1)
        return out

    default = CostConstants()
    fitted = calibrate(fit_on, default)
    print(f"CPU fp32 matmul peak {hw.peak_flops / 1e9:.1f} GFLOP/s (1 thread)")
    print(f"{'model':<10} {'layout':<14} {'measured s':>10} {'default':>8} {'calibrated':>10}")
    for m, e0, e1 in zip(held_out, errors(default), errors(fitted)):
        name = next(n for n in models if get_preset(n, kernels="torch") == m.cfg)
        label = candidate_name(m.parallel, m.micro_batch_sequences)
        print(f"{name:<10} {label:<14} {m.step_time_s:>10.3f} {e0:>+8.1%} {e1:>+10.1%}")
    mean_abs = lambda xs: sum(abs(x) for x in xs) / len(xs)  # noqa: E731
    print(f"held-out mean |error|: default mfu={default.mfu:.2f} {mean_abs(errors(default)):.1%}; "
          f"calibrated mfu={fitted.mfu:.3f} {mean_abs(errors(fitted)):.1%}")  # fmt: skip
    return 0


if __name__ == "__main__":
    run_script(main, __file__)
