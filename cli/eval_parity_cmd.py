"""`scalelab eval-parity CKPT --tasks ... --variants ...`: does the evaluation setup move the scores?

    scalelab eval-parity runs/r1 --tasks bundled:stdlib_nextline@200 \\
        --variants "dtype=bf16;batch=1,32;padding=left" [--compare runs/r2] [--store results/iso]

Scores one checkpoint (a run dir's newest, or a checkpoints/step_N dir) under a reference setup and
under each variant (one field changed), pairs the examples, and prints per task and metric the
systematic shift with a paired-bootstrap interval next to the evaluation's noise, flagging shifts
above --fraction of the noise and variants that flip the ranking against --compare. Per-example
scores, the table and a summary go to --out (default RUN/eval_parity/step_N), where the report
finds them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from scalelab.errors import UsageError


def add_parser(sub) -> None:
    p = sub.add_parser(
        "eval-parity",
        help="measure how evaluation setups (dtype, batch, padding, layout) shift a checkpoint's scores",
        description=__doc__,
    )
    p.add_argument("path", help="a run dir (its newest checkpoint) or one checkpoints/step_N dir")
    p.add_argument("--tasks", nargs="+", default=["bundled:stdlib_nextline"], help="task specs, as for eval")
    p.add_argument("--variants", required=True, help='e.g. "dtype=bf16;batch=1,32;padding=left"')
    p.add_argument(
        "--reference", default="", help="the reference setup (default layout=single,dtype=fp32,batch=16,padding=right)"
    )
    p.add_argument("--compare", default=None, help="a second checkpoint: flag variants that flip the ranking")
    p.add_argument("--store", default=None, help="a sweep dir: use its seed + checkpoint noise as the noise")
    p.add_argument("--limit", type=int, default=None, help="examples per task (default: all)")
    p.add_argument("--fraction", type=float, default=0.25, help="flag |shift| above this fraction of the noise")
    p.add_argument("--out", default=None, help="output folder (default RUN/eval_parity/step_N)")
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.set_defaults(func=run)


def _store_noise(store: str) -> dict[tuple[str, str], float]:
    from scalelab.analysis.noise import noise_table
    from scalelab.analysis.store_reader import load_store_runs

    table = noise_table(load_store_runs(store))
    known = table.filter(table["noise_source"] == "seed+ckpt")
    return {(r["task"], r["metric"]): r["noise"] for r in known.iter_rows(named=True)}


def run(args) -> int:
    import polars as pl

    from scalelab.analysis.eval_parity import REFERENCE, format_parity, parity_table
    from scalelab.train.data.tokenizer import load_tokenizer
    from scalelab.train.eval_checkpoint import find_checkpoints, load_on_one_device
    from scalelab.train.eval_setups import parse_setup, parse_variants, score_examples, score_layout
    from scalelab.train.eval_tasks import load_tasks

    reference = parse_setup(args.reference)
    variants = parse_variants(args.variants, reference)
    if args.limit is not None and args.limit < 2:
        raise UsageError(f"--limit {args.limit}: must be >= 2 (examples are paired); omit it for all")
    if not (0 < args.fraction and math.isfinite(args.fraction)):
        raise UsageError(f"--fraction {args.fraction}: must be > 0, e.g. 0.25")
    _, ckpts = find_checkpoints(args.path)
    other = find_checkpoints(args.compare)[1][-1] if args.compare else None
    tasks = load_tasks(args.tasks, args.limit)
    noise = _store_noise(args.store) if args.store else None

    def scores(ckpt: Path) -> pl.DataFrame:
        par, cfg, _ = load_on_one_device(ckpt)  # verified here
        tok = load_tokenizer(cfg.data.tokenizer)
        frames = []
        for label, setup in [(REFERENCE, reference), *[(v.label(reference), v) for v in variants]]:
            if setup.layout == "single":
                frame = score_examples(par, tok, tasks, setup, max_seq_len=cfg.model.max_seq_len)
            else:
                frame = score_layout(ckpt, tasks, setup, verified=True)
            frames.append(frame.with_columns(setup=pl.lit(label)))
        return pl.concat(frames)

    ckpt = ckpts[-1]
    per_example = scores(ckpt)
    compare = scores(other) if other is not None else None
    table = parity_table(per_example, noise=noise, compare=compare, fraction=args.fraction)
    out = Path(args.out) if args.out else ckpt.parent.parent / "eval_parity" / ckpt.name
    out.mkdir(parents=True, exist_ok=True)
    per_example.write_parquet(out / "per_example.parquet")
    if compare is not None:
        compare.write_parquet(out / "per_example_compare.parquet")
    table.write_parquet(out / "parity.parquet")
    summary = {
        "checkpoint": str(ckpt),
        "compare": str(other) if other else None,
        "reference": reference.label(),
        "variants": [v.label(reference) for v in variants],
        "fraction": args.fraction,
        "rows": table.to_dicts(),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(json.dumps(summary["rows"], indent=2, default=str) if args.json else format_parity(table))
    print(f"per-example scores, table and summary -> {out}")
    return 0
