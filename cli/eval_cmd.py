"""`scalelab eval CHECKPOINT_OR_RUN_DIR --tasks ...`: evaluate saved checkpoints.

    scalelab eval runs/r1 --tasks bundled:stdlib_nextline bundled:stdlib_completion
    scalelab eval runs/r1/checkpoints/step_400 --tasks my_task.jsonl olmes:arc_easy/rc_0shot --limit 200
    scalelab eval runs/r1 --layout fsdp2xtp2 --tasks bundled:stdlib_nextline   # loaded sharded, 4 ranks

A run dir evaluates every completed checkpoint in it; a checkpoint dir evaluates that one. Held-out
loss/bpb per source is recomputed too (skip with --no-val). Results are merged into the run's
evals.parquet (replacing rows with the same step, task and metric) unless --no-write, and printed.
"""

from __future__ import annotations

import math

from scalelab.errors import UsageError


def add_parser(sub) -> None:
    p = sub.add_parser(
        "eval",
        help="evaluate checkpoints on MC tasks and held-out loss/bpb",
        description=__doc__,
    )
    p.add_argument("path", help="a run dir (all its checkpoints) or one checkpoints/step_N dir")
    p.add_argument(
        "--tasks",
        nargs="*",
        default=["bundled:stdlib_nextline"],
        help="bundled:NAME[@N] | olmes:TASK/VARIANT | PATH.jsonl (default: bundled:stdlib_nextline)",
    )
    p.add_argument("--limit", type=int, default=None, help="examples per task (default: all)")
    p.add_argument("--device", default="cpu", help="cpu | cuda")
    p.add_argument(
        "--layout",
        default="single",
        help="evaluate under a parallel layout (fsdp2, tp2sp, pp2, ep2xtp2, ...): the checkpoint is loaded sharded",
    )
    p.add_argument("--no-val", action="store_true", help="skip held-out loss/bpb")
    p.add_argument("--no-write", action="store_true", help="print only; leave evals.parquet alone")
    p.add_argument("--batch-sequences", type=int, default=16, help="sequences per forward pass")
    p.set_defaults(func=run)


def run(args) -> int:
    from scalelab.parallel.layouts import parse_layout
    from scalelab.train.checkpoint import verify
    from scalelab.train.eval_checkpoint import evaluate_checkpoint, find_checkpoints, merge_eval_rows
    from scalelab.train.eval_tasks import load_tasks

    _check_args(args)
    layout = None if args.layout == "single" else parse_layout(args.layout)
    run_dir, ckpts = find_checkpoints(args.path)
    for ckpt in ckpts:  # every checkpoint verified (and refused if crafted) before any work
        verify(ckpt)
    tasks = load_tasks(args.tasks, args.limit)
    all_rows = []
    for ckpt in ckpts:  # under a layout the ranks load their shards and score through the layout's step
        rows = evaluate_checkpoint(
            ckpt,
            tasks,
            layout=layout,
            with_val=not args.no_val,
            device=args.device,
            batch_sequences=args.batch_sequences,
            verified=True,
        ).rows
        all_rows += rows
        for r in rows:
            se = "" if r["stderr"] is None or math.isnan(r["stderr"]) else f" ± {r['stderr']:.4f}"
            print(f"step {r['step']:>7}  {r['task']:<32} {r['metric']:<9} {r['value']:.4f}{se}")
    if not args.no_write:
        path = merge_eval_rows(run_dir, all_rows)
        print(f"{len(all_rows)} rows -> {path}")
    return 0


def _check_args(args) -> None:
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit {args.limit}: must be >= 1 (examples per task); omit it for all")
    if args.batch_sequences < 1:
        raise UsageError(f"--batch-sequences {args.batch_sequences}: must be >= 1, e.g. 16")
    if args.device not in ("cpu", "cuda") and not args.device.startswith("cuda:"):
        raise UsageError(f"--device {args.device!r}: use cpu or cuda")
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"--device {args.device}: no GPU is visible to this torch build; use --device cpu")
