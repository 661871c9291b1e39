"""`scalelab export CHECKPOINT_OR_RUN_DIR --hf OUT`: a Hugging Face model folder from a checkpoint.

    scalelab export runs/r1 --hf hf/r1                       # the run's newest checkpoint
    scalelab export runs/r1/checkpoints/step_400 --hf hf/r1 --dtype bfloat16 --max-shard-gb 2

The checkpoint may come from any layout (FSDP, TP, PP, EP): it is resharded on read, one output
shard at a time. The folder loads with transformers' AutoModelForCausalLM / AutoTokenizer.
"""

from __future__ import annotations

import math

from scalelab.errors import UsageError


def add_parser(sub) -> None:
    p = sub.add_parser(
        "export",
        help="write a checkpoint as a Hugging Face folder (safetensors, config, tokenizer)",
        description=__doc__,
    )
    p.add_argument("path", help="a checkpoints/step_N dir, or a run dir (its newest checkpoint)")
    p.add_argument("--hf", required=True, metavar="OUT", help="output folder (new or empty)")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: the checkpoint's)")
    p.add_argument("--max-shard-gb", type=float, default=5.0, help="largest safetensors file, GB (default 5)")
    p.set_defaults(func=run)


def run(args) -> int:
    from scalelab.train.eval_checkpoint import find_checkpoints
    from scalelab.train.export_hf import DTYPES, export_hf

    if args.dtype is not None and args.dtype not in DTYPES:
        raise UsageError(f"--dtype {args.dtype!r}: use one of {', '.join(DTYPES)}")
    if not (math.isfinite(args.max_shard_gb) and args.max_shard_gb > 0):
        raise UsageError(f"--max-shard-gb {args.max_shard_gb}: must be > 0 and finite, e.g. 5")
    _, ckpts = find_checkpoints(args.path)
    summary = export_hf(
        ckpts[-1],
        args.hf,
        dtype=DTYPES.get(args.dtype),
        max_shard_bytes=int(args.max_shard_gb * 2**30),
    )
    print(
        f"{ckpts[-1]} (step {summary['step']}) -> {args.hf}: {summary['architecture']}, "
        f"{summary['parameters']:,} parameters in {summary['tensors']} tensors, "
        f"{summary['shards']} shard(s), {summary['dtype']}"
    )
    return 0
