"""`scalelab parity --layouts single,dp2,fsdp2,tp2sp,pp2-1f1b [--json]`: does a layout change the numbers?

Runs the same model, data and seed for N steps under each layout on this machine (gloo processes)
and prints, per layout, the max |Δloss| over the steps and the max |Δparameter| at the end against
the single-device run. Exit 0 when every layout is within --tolerance, 1 when one is not, 2 for a
bad layout (checked before any process starts). Logic: scalelab.parallel.parity.
Expert-parallel (MoE) layouts and the ones the dense harness does not take (ep2, ep2xtp2-sp, dp2xep2,
cp2-ring, ...) run in scalelab.parallel.ep_parity / cp_parity and print a second table.
"""

from __future__ import annotations

import json
import sys

DEFAULT_LAYOUTS = "single,dp2,fsdp2,tp2,tp2sp,pp2-1f1b,fsdp2xtp2,dp2xpp2xtp2"


def add_parser(sub) -> None:
    p = sub.add_parser(
        "parity", help="check that parallel layouts match the single-device run", description=__doc__.splitlines()[0]
    )
    p.add_argument(
        "--layouts",
        default=DEFAULT_LAYOUTS,
        help=f"comma-separated layouts (default {DEFAULT_LAYOUTS}); see scalelab.parallel.parity",
    )
    p.add_argument("--steps", type=int, default=3, help="optimizer steps per layout (default 3)")
    p.add_argument(
        "--optimizer", default="adamw", help="adamw | sgd | adamw,sgd (both, one process group per world size)"
    )
    p.add_argument("--lr", type=float, default=0.0, help="learning rate (default: 1e-4 adamw, 0.1 sgd)")
    p.add_argument("--layers", type=int, default=4, help="layers of the debug model (default 4)")
    p.add_argument("--seed", type=int, default=0)
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
    from scalelab.parallel.moe_cp_parity import (
        check_moe_cp_layouts,
        format_moe_cp_rows,
        is_moe_cp_layout,
        run_moe_cp_parity,
    )
    from scalelab.parallel.parity import ParitySpec, debug_model, format_report, parse_layout, run_parity

    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    if not layouts:
        raise UsageError("--layouts is empty; e.g. --layouts single,dp2,fsdp2")
    # Expert-parallel (MoE) and ring / TP x CP layouts run in their own harness
    # (scalelab.parallel.moe_cp_parity): ep2, fsdp4xep2, cp2-ring, tp2xcp2 ...
    ep_cp = [x for x in layouts if is_moe_cp_layout(x) and not _parses(parse_layout, x)]
    layouts = [x for x in layouts if x not in ep_cp]
    check_moe_cp_layouts(ep_cp)  # bad names fail before any process starts
    optimizers = [x.strip() for x in args.optimizer.split(",") if x.strip()]
    for opt in optimizers:
        if opt not in ("adamw", "sgd"):
            raise UsageError(f"--optimizer {opt!r} unknown; use adamw, sgd or adamw,sgd")
    if args.steps < 1 or args.layers < 1 or args.tolerance <= 0:
        raise UsageError("--steps and --layers must be >= 1 and --tolerance > 0")
    specs = [
        ParitySpec(
            model=debug_model(args.layers),
            steps=args.steps,
            optimizer=opt,
            lr=args.lr,
            seed=args.seed,
            dtype=args.dtype,
            accumulation=args.accumulation,
            z_loss=args.z_loss,
            tolerance=args.tolerance,
        )
        for opt in optimizers
    ]
    if args.dtype == "bf16":
        layouts = [x if "+bf16" in x or x.startswith("single") else x + "+bf16" for x in layouts]
    ok = True
    if layouts:
        report = run_parity(layouts, specs)
        print(report.to_json() if args.json else format_report(report))
        ok = report.ok
    if ep_cp:
        rows = run_moe_cp_parity(ep_cp, seed=args.seed, tolerance=args.tolerance)
        print(json.dumps({"ep_cp_layouts": rows}, indent=2) if args.json else format_moe_cp_rows(rows))
        ok = ok and all(r["ok"] for r in rows)
    sys.stdout.flush()
    return 0 if ok else 1


def _parses(parse_layout, name: str) -> bool:
    from scalelab.errors import UsageError

    try:
        parse_layout(name)
    except UsageError:
        return False
    return True
