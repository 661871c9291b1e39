"""`scalelab parity --layouts single,dp2,tp2sp,pp2-1f1b,cp2-ring,ep2xtp2 [--json]`: does a layout change the numbers?

Runs the same model, data and seed for N steps under each layout on this machine (gloo processes)
and prints, per layout, the max |Δloss| over the steps, the max |Δgradient| at the first step and
the max |Δparameter| at the end against the single-device run (and, for MoE models, whether the
router's tokens per expert and aux loss match). Exit 0 when every layout is within --tolerance, 1
when one is not, 2 for a bad layout (checked before any process starts). Layout names:
scalelab.parallel.layouts; logic: scalelab.parallel.parity. Layouts with expert parallel (epN) run
on the moe-debug preset, the others on the debug preset, unless --model names one.
"""

from __future__ import annotations

import sys

DEFAULT_LAYOUTS = "single,dp2,fsdp2,tp2,tp2sp,pp2-1f1b,fsdp2xtp2,dp2xpp2xtp2"
MODELS = ("auto", "debug", "moe-debug")


def add_parser(sub) -> None:
    p = sub.add_parser("parity", help="check that parallel layouts match the single-device run", description=__doc__)
    p.add_argument(
        "--layouts",
        default=DEFAULT_LAYOUTS,
        help=f"comma-separated layouts (default {DEFAULT_LAYOUTS}); see scalelab.parallel.layouts",
    )
    p.add_argument(
        "--model",
        default="auto",
        choices=MODELS,
        help="debug preset, moe-debug preset, or auto: moe-debug for layouts with ep, debug otherwise",
    )
    p.add_argument("--steps", type=int, default=3, help="optimizer steps per layout (default 3)")
    p.add_argument(
        "--optimizer", default="adamw", help="adamw | sgd | adamw,sgd (both, one process group per world size)"
    )
    p.add_argument("--lr", type=float, default=0.0, help="learning rate (default: 1e-4 adamw, 0.1 sgd)")
    p.add_argument("--layers", type=int, default=4, help="layers of the debug model (default 4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model's init and the data")
    p.add_argument(
        "--dtype",
        default="fp32",
        choices=("fp32", "bf16"),
        help="bf16: autocast everywhere and bf16 FSDP params (use a looser --tolerance)",
    )
    p.add_argument("--tolerance", type=float, default=1e-5, help="max |Δ| in loss and parameters (default 1e-5)")
    p.add_argument(
        "--accumulation", type=int, default=1, help="loop micro-batches per rank and step under the layouts (default 1)"
    )
    p.add_argument("--z-loss", type=float, default=0.0, help="z-loss weight (default 0)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from scalelab.errors import UsageError
    from scalelab.parallel.layouts import parse_layout
    from scalelab.parallel.parity import ParitySpec, debug_model, format_report, moe_debug_model, run_parity_jobs

    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    if not layouts:
        raise UsageError("--layouts is empty; e.g. --layouts single,dp2,fsdp2")
    optimizers = [x.strip() for x in args.optimizer.split(",") if x.strip()]
    for opt in optimizers:
        if opt not in ("adamw", "sgd"):
            raise UsageError(f"--optimizer {opt!r} unknown; use adamw, sgd or adamw,sgd")
    if args.steps < 1 or args.layers < 1 or args.tolerance <= 0:
        raise UsageError("--steps and --layers must be >= 1 and --tolerance > 0")
    if args.dtype == "bf16":
        layouts = [x if "+bf16" in x or x.startswith("single") else x + "+bf16" for x in layouts]
    models = {"debug": debug_model(args.layers), "moe-debug": moe_debug_model(num_layers=args.layers)}
    groups: dict[str, list[str]] = {}
    for name in layouts:
        if args.model != "auto":
            model = args.model
        else:
            model = "moe-debug" if not name.startswith("single") and parse_layout(name).ep > 1 else "debug"
        groups.setdefault(model, []).append(name)
    jobs = [
        (
            names,
            ParitySpec(
                model=models[model],
                steps=args.steps,
                optimizer=opt,
                lr=args.lr,
                seed=args.seed,
                dtype=args.dtype,
                accumulation=args.accumulation,
                z_loss=args.z_loss,
                tolerance=args.tolerance,
            ),
        )
        for model, names in groups.items()
        for opt in optimizers
    ]
    report = run_parity_jobs(jobs)  # every name is parsed and validated before any process starts
    print(report.to_json() if args.json else format_report(report))
    sys.stdout.flush()
    return 0 if report.ok else 1
