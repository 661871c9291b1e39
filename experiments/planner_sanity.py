"""Benchmark: the planner's choice vs layouts published by torchtitan's authors (facts, no GPU).

torchtitan's Llama 3 train configs (torchtitan/models/llama3/train_configs, "a preset for 64 A100
GPUs"; we plan for 80 GiB GPUs with the planner's default H100 constants):
  70B: seq_len 8192, local_batch_size 8, data_parallel_shard_degree -1 (= 8 on 64 GPUs),
       tensor_parallel_degree 8, pp 1, cp 1, activation checkpointing full
       -> 64 GPUs, global batch 8 x 8 = 64 sequences (524,288 tokens)
  8B:  seq_len 8192, batch_size 1, data_parallel_shard_degree -1 (= 8 on 8 GPUs), tp 1,
       activation checkpointing selective (op)  -> 8 GPUs, 8 sequences (65,536 tokens)
For each, prints the planner's top layouts, then its estimate for the published layout and where
that layout ranks among those that fit.

    python experiments/planner_sanity.py [--top 5]
"""

from __future__ import annotations

import argparse

from scalelab.errors import run_script

GIB = 2**30

CASES = [
    # (preset, GPUs, seq_len, sequences per step, published layout, sequences per micro-batch)
    ("70b", 64, 8192, 64, "fsdp8xtp8+ac", 8),
    ("8b", 8, 8192, 8, "fsdp8+sac", 1),
]


def _line(p) -> str:
    m = p.memory
    return (
        f"{p.name:<26} step {p.step_time_s:7.2f} s  mfu {p.mfu:.2f}  mem {m['total'] / GIB:5.1f} GiB "
        f"(params {m['params'] / GIB:.1f}, grads {m['grads'] / GIB:.1f}, optim {m['optimizer'] / GIB:.1f}, "
        f"acts {m['activations'] / GIB:.1f}, bufs {m['buffers'] / GIB:.1f})  fits={p.fits}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=5)
    args = ap.parse_args(argv)
    from scalelab.models.presets import get_preset
    from scalelab.parallel.layouts import parse_layout
    from scalelab.parallel.planner import CostConstants, Hardware, estimate, plan_layouts

    hw, consts = Hardware(gpu_memory_bytes=80 * GIB), CostConstants()
    for preset, gpus, seq_len, sequences, published, mbs in CASES:
        cfg = get_preset(preset)
        plans = plan_layouts(cfg, num_gpus=gpus, seq_len=seq_len, global_batch_tokens=sequences * seq_len, hw=hw)
        print(f"== {preset} on {gpus} x 80 GiB, seq_len {seq_len}, {sequences} sequences/step: {len(plans)} fit")
        for p in plans[: args.top]:
            print("  " + _line(p))
        lay = parse_layout(published)
        pub = estimate(
            cfg, lay, micro_batch_sequences=mbs, seq_len=seq_len, global_batch_sequences=sequences, hw=hw, consts=consts
        )
        rank = 1 + sum(p.step_time_s < pub.step_time_s for p in plans)
        print(f"  published: {_line(pub)}")
        print(f"  published layout ranks {rank} of {len(plans)}; planner's best is "
              f"{pub.step_time_s / plans[0].step_time_s - 1:+.1%} faster than it (by the same model)")  # fmt: skip
    return 0


if __name__ == "__main__":
    run_script(main, __file__)
