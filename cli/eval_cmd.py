"""`scalelab eval CHECKPOINT_OR_RUN_DIR --tasks ...`: evaluate saved checkpoints.

    scalelab eval runs/r1 --tasks bundled:stdlib_nextline bundled:stdlib_completion
    scalelab eval runs/r1/checkpoints/step_400 --tasks my_task.jsonl olmes:arc_easy/rc_0shot --limit 200

A run dir evaluates every completed checkpoint in it; a checkpoint dir evaluates that one. Held-out
loss/bpb per source is recomputed too (skip with --no-val). Results are merged into the run's
evals.parquet (replacing rows with the same step, task and metric) unless --no-write, and printed.
"""

from __future__ import annotations

import math


def add_parser(sub) -> None:
    p = sub.add_parser(
        "eval",
        help="evaluate checkpoints on MC tasks and held-out loss/bpb",
        description=__doc__.splitlines()[0],
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
    p.add_argument("--no-val", action="store_true", help="skip held-out loss/bpb")
    p.add_argument("--no-write", action="store_true", help="print only; leave evals.parquet alone")
    p.add_argument("--batch-sequences", type=int, default=16, help="sequences per forward pass")
    p.set_defaults(func=run)


def run(args) -> int:
    from scalelab.train.eval_tasks import evaluate_checkpoint, find_checkpoints, load_tasks, merge_eval_rows

    run_dir, ckpts = find_checkpoints(args.path)
    tasks = load_tasks(args.tasks, args.limit)
    all_rows = []
    for ckpt in ckpts:
        rows = evaluate_checkpoint(
            ckpt, tasks, with_val=not args.no_val, device=args.device, batch_sequences=args.batch_sequences
        )
        all_rows += rows
        for r in rows:
            se = "" if r["stderr"] is None or math.isnan(r["stderr"]) else f" ± {r['stderr']:.4f}"
            print(f"step {r['step']:>7}  {r['task']:<32} {r['metric']:<9} {r['value']:.4f}{se}")
    if not args.no_write:
        path = merge_eval_rows(run_dir, all_rows)
        print(f"{len(all_rows)} rows -> {path}")
    return 0
