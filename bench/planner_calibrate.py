"""Benchmark: calibrate the planner's step-time model from real (CPU, one process) training steps.

Times forward+backward+AdamW steps of CPU presets at several micro-batch sizes and activation
checkpointing modes, fits the planner's constants on half of the runs (`calibrate`; one process has
no communication, so only `mfu` is identifiable) and reports the step-time error of the other half
before (default constants) and after calibration. The CPU "peak" is a measured fp32 matmul rate.

    python bench/planner_calibrate.py [--steps 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from scalelab.train.profiling import matmul_flops


def time_steps(cfg, lay, mbs: int, seq_len: int, sequences: int, steps: int) -> float:
    from scalelab.models.llama import build_model
    from scalelab.models.loss import lm_loss
    from scalelab.parallel.checkpointing import apply_ac

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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from scalelab.models.presets import get_preset
    from scalelab.parallel.config import ParallelConfig
    from scalelab.parallel.planner import CostConstants, Hardware, Measurement, calibrate, candidate_name, estimate

    hw = Hardware(gpu_memory_bytes=2**40, peak_flops=matmul_flops(reps=20), gpus_per_node=1)
    seq_len, sequences = 128, 8
    runs = []
    for name in ("tiny-1m", "tiny-3m", "small-10m"):
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
        name = next(n for n in ("tiny-1m", "tiny-3m", "small-10m") if get_preset(n, kernels="torch") == m.cfg)
        label = candidate_name(m.parallel, m.micro_batch_sequences)
        print(f"{name:<10} {label:<14} {m.step_time_s:>10.3f} {e0:>+8.1%} {e1:>+10.1%}")
    mean_abs = lambda xs: sum(abs(x) for x in xs) / len(xs)  # noqa: E731
    print(f"held-out mean |error|: default mfu={default.mfu:.2f} {mean_abs(errors(default)):.1%}; "
          f"calibrated mfu={fitted.mfu:.3f} {mean_abs(errors(fitted)):.1%}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
