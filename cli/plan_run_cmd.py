"""`scalelab plan-run`: plan the big run from a sweep's fit (or a saved fit) on a cluster.

    scalelab plan-run results/iso --flops 2e14 --gpu cpu --hp-sweep examples/plan/demo_hp_sweep.csv
    scalelab plan-run fit.json --flops 3e23 --gpu H100-SXM --gpus 2048 --vocab-size 50304 --seq-len 2048 \\
        --hp-table gpt3_recipe.csv --html plan.html
    scalelab plan-run fit.json --gpus 2048 --gpu H100-SXM --days 30 ...     # the budget 30 days afford

FIT_OR_SWEEP is a sweep directory (its latest `sweep next` fit, its base config and recipe) or a
FIT.json of `scalelab fit DATA --out FIT.json` (then --vocab-size and --seq-len say what the model
reads; --base CONFIG.yaml gives the rest of the run config). --gpu cpu is this machine, calibrated on
the sweep's own runs. The plan (scalelab.planning.plan) goes to --out (default: a sweep's
DIR/plans/plan-C<budget>/, a fit file's ./plan-C<budget>/): plan.json, run.yaml (the
resolved run config: `scalelab run run.yaml --out DIR` trains it) and sweep.yaml (a one-point spec:
`scalelab sweep launch sweep.yaml --out SWEEP` trains it into a store); --html writes the planning
page (also a section of `scalelab report` for plans under a sweep's plans/). Bad input exits 2
with one line before anything is written.
"""

from __future__ import annotations

import json
from pathlib import Path

from scalelab.errors import UsageError
from scalelab.fitting.entry.saved_fit import load_saved_fit


def add_parser(sub) -> None:
    p = sub.add_parser(
        "plan-run",
        help="plan the big run: size, tokens, LR, batch, layout, time, each with its interval",
        description=__doc__,
    )
    p.add_argument(
        "fit", metavar="FIT_OR_SWEEP", help="a sweep directory (its latest fit) or a FIT.json from `scalelab fit --out`"
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--flops", type=float, help="the FLOP budget C (6ND)")
    what.add_argument("--days", type=float, help="instead: the wall time; C is what the cluster does in it")
    p.add_argument("--gpu", default="cpu", help="GPU type of the planner's table (H100-SXM, A100-80GB) or cpu "
                   "(this machine, calibrated on the sweep's runs; the default)")  # fmt: skip
    p.add_argument("--gpus", type=int, default=1, help="number of GPUs (default 1)")
    p.add_argument("--gpus-per-node", type=int, default=None, help="GPUs per node (default: the GPU type's, 8)")
    p.add_argument("--gpu-memory", default=None, help="memory per GPU, e.g. 80GiB (default: the GPU type's)")
    p.add_argument("--intra-node-gbps", type=float, default=None, help="GB/s per GPU inside a node (default: the GPU "
                   "type's)")  # fmt: skip
    p.add_argument("--inter-node-gbps", type=float, default=None, help="GB/s per GPU across nodes (default: the GPU "
                   "type's)")  # fmt: skip
    p.add_argument("--hp-sweep", default=None, metavar="TABLE", help="an HP sweep (params, lr, loss[, batch_tokens]): "
                   "the LR's interval and what being off costs (default: none: costs unknown)")  # fmt: skip
    p.add_argument("--hp-table", default=None, metavar="TABLE", help="a family's recipe (params, lr, batch_tokens per "
                   "model): LR and batch as power laws of N (fit files; default: DeepSeek LLM's published laws, no "
                   "interval)")  # fmt: skip
    p.add_argument("--vocab-size", type=int, default=None, help="fit files (required there): the model's vocabulary")
    p.add_argument("--seq-len", type=int, default=None, help="fit files (required there): tokens per sequence")
    p.add_argument("--base", default=None, metavar="CONFIG.yaml", help="fit files: a run config whose other "
                   "sections (data, tokenizer, ...) the plan keeps (default: the run config's defaults)")  # fmt: skip
    p.add_argument("--scale", default=None, help="GPU counts of the what-ifs, e.g. 512,1024,4096; none: skip them "
                   "(default on GPU types: powers of two from GPUS/16 to 8192, GPUS and 10240)")  # fmt: skip
    p.add_argument("--out", type=Path, default=None, help="directory for plan.json, run.yaml, sweep.yaml (default: "
                   "a sweep's DIR/plans/plan-C<budget>/, which `scalelab report DIR` shows; for a FIT.json "
                   "./plan-C<budget>/)")  # fmt: skip
    p.add_argument("--html", type=Path, default=None, metavar="PAGE.html", help="also write the planning page "
                   "here (default: none)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    p.set_defaults(func=run)


def _scale(text: str | None) -> list[int] | None:
    if text is None:
        return None
    if text.strip().lower() == "none":
        return []
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--scale {text!r}: give GPU counts separated by commas, e.g. 512,1024,4096") from None
    if not sizes or min(sizes) < 1:
        raise UsageError(f"--scale {text!r}: GPU counts must be >= 1")
    return sizes


def _cluster(args, fit_path: Path):
    from scalelab.planning.cluster import CPU, cpu_cluster, gpu_cluster

    if args.gpu == CPU:
        if args.gpus != 1:
            raise UsageError(f"--gpu cpu plans one process as the sweep's runs; --gpus {args.gpus} is not 1")
        if not fit_path.is_dir():
            raise UsageError(
                "--gpu cpu calibrates the planner on a sweep's runs: give a sweep directory, or a GPU type"
            )
        return cpu_cluster(fit_path)
    from scalelab.cli.plan_cmd import parse_size

    memory = parse_size(args.gpu_memory, "--gpu-memory") if args.gpu_memory else None
    return gpu_cluster(
        args.gpu,
        args.gpus,
        gpus_per_node=args.gpus_per_node,
        gpu_memory_bytes=memory,
        intra_node_bytes_per_s=args.intra_node_gbps * 1e9 if args.intra_node_gbps else None,
        inter_node_bytes_per_s=args.inter_node_gbps * 1e9 if args.inter_node_gbps else None,
    )


def _design(args, fit_path: Path):
    from scalelab.planning.design import fit_design, sweep_design

    if fit_path.is_dir():
        for flag in ("vocab_size", "seq_len", "base", "hp_table"):
            if getattr(args, flag) is not None:
                raise UsageError(f"--{flag.replace('_', '-')}: a sweep's plan takes it from the sweep; drop it")
        return sweep_design(fit_path)
    if args.vocab_size is None or args.seq_len is None:
        raise UsageError("a fit file's plan needs --vocab-size and --seq-len (what the planned model reads)")
    return fit_design(vocab_size=args.vocab_size, seq_len=args.seq_len, base=args.base, name=fit_path.stem)


def _out_dir(args, fit_path: Path, flops: float) -> Path:
    if args.out is not None:
        return args.out
    from scalelab.store.paths import SweepLayout  # start-up time: the store package loads polars

    name = f"plan-C{flops:.3g}".replace("+", "")
    return SweepLayout(fit_path).plan(name) if fit_path.is_dir() else Path(name)


def run(args) -> int:
    fit_path = Path(args.fit)
    if args.flops is not None and not args.flops > 0:
        raise UsageError(f"--flops {args.flops} must be a positive number")
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        raise UsageError(f"--out {args.out} is a file; give a directory")
    sizes = _scale(args.scale)
    # a saved fit file is read (and a bad one refused) before the planner and torch load
    fit = load_saved_fit(fit_path) if fit_path.is_file() else fit_path
    # start-up time: the planner and the fitting stack (torch, scipy) load once the arguments are good
    from scalelab.planning.hparams import read_hp_sweep, read_hp_table
    from scalelab.planning.loss_model import load_loss_model
    from scalelab.planning.plan import HPChoice, plan_for_days, plan_run
    from scalelab.planning.plan_files import write_plan
    from scalelab.planning.plan_text import format_plan

    model = load_loss_model(fit)
    design = _design(args, fit_path)
    cluster = _cluster(args, fit_path)
    hp = HPChoice(
        table=read_hp_table(args.hp_table) if args.hp_table else None,
        table_source=f"the recipe table {Path(args.hp_table).name}" if args.hp_table else "",
        sweep=read_hp_sweep(args.hp_sweep) if args.hp_sweep else None,
    )
    if args.days is not None:
        plan = plan_for_days(model, design, cluster, days=args.days, hp=hp, what_if_sizes=sizes)
    else:
        plan = plan_run(model, design, cluster, flops=args.flops, hp=hp, what_if_sizes=sizes)
    data = plan.to_dict()
    out = _out_dir(args, fit_path, plan.flops)
    written = write_plan(data, out)
    if args.html is not None:
        from scalelab.analysis.plan_page import write_plan_page

        written.append(write_plan_page(data, args.html))
    if args.json:
        print(json.dumps(data))
        return 0
    print(format_plan(data))
    print("files: " + ", ".join(str(p) for p in written))
    run_yaml, spec_yaml = written[1:3]  # write_plan's paths: plan.json, run.yaml, sweep.yaml
    print(f"train it: scalelab run {run_yaml} --out RUN_DIR   (or: scalelab sweep launch {spec_yaml} "
          "--out SWEEP_DIR)")  # fmt: skip
    return 0
