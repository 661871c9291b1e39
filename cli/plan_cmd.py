"""`scalelab plan-layout`: rank parallel layouts for a model on N GPUs by estimated step time.

    scalelab plan-layout --model 70b --gpus 64 --gpu-memory 80GiB --seq-len 8192 --global-batch-tokens 16M
    scalelab plan-layout --model run.yaml --gpus 8 --gpu-memory 80GiB --seq-len 4096 --global-batch-tokens 1M
    scalelab plan-layout ... --calibrate runs/a runs/b     # refit the constants from run records first
    scalelab plan-layout ... --json                         # one JSON object per layout
    scalelab plan-layout ... --gpu A100-80GB                # that GPU type's constants (parallel/hardware.py)

--model is a preset name (`scalelab models`) or a YAML/JSON file holding a model config (a run
config's `model:` section is used when present). The table shows, per layout: estimated step time,
tokens/s per GPU, MFU, the per-GPU memory breakdown (params, grads, optimizer, activations, buffers)
and the communication volume per step; see scalelab.parallel.planner for the model behind them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from scalelab.errors import UsageError

_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text: str, what: str, binary: bool = False) -> int:
    """'80GiB', '80GB', '16M', '2**24', '1e6' -> an integer (binary: K/M/G mean 2**10/20/30, as in
    "a 4M-token batch")."""
    t = text.strip().lower().replace("_", "")
    if binary and t[-1:] in "kmgt" and not t[-1:].isdigit():
        t += "ib"
    if "**" in t:
        base, _, exp = t.partition("**")
        if base.isdigit() and exp.isdigit():
            return int(base) ** int(exp)
    m = re.fullmatch(r"([0-9.e+]+)\s*([kmgt]i?b?|)", t)
    if not m:
        raise UsageError(f"{what}: cannot read {text!r}; use e.g. 80GiB, 16M, 1e6")
    unit = m.group(2).rstrip("b") if not m.group(2).endswith("ib") else m.group(2)
    try:
        return int(float(m.group(1)) * _UNITS[unit])
    except (KeyError, ValueError):
        raise UsageError(f"{what}: cannot read {text!r}; use e.g. 80GiB, 16M, 1e6") from None


def load_model(spec: str):
    """A ModelConfig from a preset name or a YAML/JSON file."""
    from scalelab.config_tree import load_yaml
    from scalelab.models.config import ModelConfig
    from scalelab.models.presets import get_preset

    path = Path(spec)
    if not path.exists():
        return get_preset(spec)
    data = load_yaml(str(path))
    data = data.get("model", data)
    if "preset" in data:
        preset = data.pop("preset")
        return get_preset(preset, **data)
    try:
        cfg = ModelConfig(**data)
    except TypeError as err:
        raise UsageError(f"--model {spec}: {err}") from None
    cfg.validate()
    return cfg


def add_parser(sub) -> None:
    p = sub.add_parser(
        "plan-layout", help="rank parallel layouts by estimated step time under a memory limit", description=__doc__
    )
    p.add_argument("--model", required=True, help="preset name or YAML/JSON model config")
    p.add_argument("--gpus", type=int, required=True, help="number of GPUs")
    p.add_argument("--gpu-memory", default="80GiB", help="memory per GPU (e.g. 80GiB)")
    p.add_argument("--seq-len", type=int, required=True, help="tokens per sequence")
    p.add_argument("--global-batch-tokens", required=True, help="tokens per optimizer step (4M = 4*2**20)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (tp stays inside one)")
    p.add_argument(
        "--gpu",
        default=None,
        help="GPU type whose constants to use (A100-80GB | H100-SXM; docs/planner-at-scale.md); "
        "the flags below override single values",
    )
    p.add_argument("--peak-tflops", type=float, default=None, help="bf16 dense peak per GPU (default H100: 989)")
    p.add_argument("--intra-node-gbps", type=float, default=None, help="GB/s per GPU inside a node (default 450)")
    p.add_argument("--inter-node-gbps", type=float, default=None, help="GB/s per GPU across nodes (default 50)")
    p.add_argument("--calibrate", nargs="*", default=[], metavar="RUN_DIR", help="refit constants from run records")
    p.add_argument("--top", type=int, default=10, help="layouts to show")
    p.add_argument("--all", action="store_true", help="also list layouts that do not fit")
    p.add_argument("--json", action="store_true", help="one JSON object per layout")
    p.set_defaults(func=run)


def run(args) -> int:
    from scalelab.parallel.planner import CostConstants, Hardware, calibrate, measurements_from_runs, plan_layouts

    cfg = load_model(args.model)
    if args.gpus < 1 or args.seq_len < 1:
        raise UsageError("--gpus and --seq-len must be positive")
    tokens = parse_size(args.global_batch_tokens, "--global-batch-tokens", binary=True)
    if tokens % args.seq_len:
        raise UsageError(f"--global-batch-tokens {tokens} is not a multiple of --seq-len {args.seq_len}")
    base_hw, consts = Hardware(), CostConstants()
    if args.gpu is not None:
        from scalelab.parallel.hardware import GPU_TYPES

        if args.gpu not in GPU_TYPES:
            raise UsageError(f"--gpu {args.gpu!r} unknown; use one of {', '.join(GPU_TYPES)}")
        base_hw, consts = GPU_TYPES[args.gpu]
    hw = Hardware(
        gpu_memory_bytes=parse_size(args.gpu_memory, "--gpu-memory"),
        peak_flops=args.peak_tflops * 1e12 if args.peak_tflops is not None else base_hw.peak_flops,
        gpus_per_node=args.gpus_per_node,
        intra_node_bytes_per_s=(
            args.intra_node_gbps * 1e9 if args.intra_node_gbps is not None else base_hw.intra_node_bytes_per_s
        ),
        inter_node_bytes_per_s=(
            args.inter_node_gbps * 1e9 if args.inter_node_gbps is not None else base_hw.inter_node_bytes_per_s
        ),
    )
    if args.calibrate:
        consts = calibrate(measurements_from_runs(args.calibrate, hw), consts)
        print(f"calibrated from {len(args.calibrate)} runs: {consts}")
    plans = plan_layouts(
        cfg, num_gpus=args.gpus, seq_len=args.seq_len, global_batch_tokens=tokens, hw=hw, consts=consts,
        include_unfit=args.all,
    )  # fmt: skip
    if not plans:
        print(f"no layout fits {args.gpu_memory} per GPU; try --all to see the closest ones")
        return 1
    shown = plans[: args.top]
    if args.json:
        for p in shown:
            print(json.dumps(p.as_row()))
        return 0
    gib = 2**30
    print(
        f"{'layout':<28} {'fits':>4} {'step s':>8} {'tok/s/gpu':>9} {'mfu':>5} | {'params':>6} {'grads':>6} "
        f"{'optim':>6} {'acts':>6} {'bufs':>5} {'total':>6} GiB | comm GiB/step"
    )
    for p in shown:
        m = p.memory
        comm = " ".join(f"{k}={v / gib:.1f}" for k, v in p.comm_bytes.items()) or "-"
        print(
            f"{p.name:<28} {'yes' if p.fits else 'NO':>4} {p.step_time_s:>8.3f} {p.tokens_per_s_per_gpu:>9.0f} "
            f"{p.mfu:>5.2f} | {m['params'] / gib:>6.1f} {m['grads'] / gib:>6.1f} {m['optimizer'] / gib:>6.1f} "
            f"{m['activations'] / gib:>6.1f} {m['buffers'] / gib:>5.1f} {m['total'] / gib:>6.1f}     | {comm}"
        )
    print(f"{len(plans)} layouts{' (all)' if args.all else ' fit'}; estimates (see scalelab.parallel.planner)")
    return 0
