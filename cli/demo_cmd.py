"""`scalelab demo`: the whole loop on a laptop CPU in under 10 minutes.

An IsoFLOP sweep of tiny models at 3 budgets on the default corpus (local Ray), the Chinchilla fit,
a proposed next round of one compute-optimal run at ~3x the largest budget, that run, and a printed
comparison of predicted vs measured loss with its interval, plus a PNG of the IsoFLOP curves.

    scalelab demo [--out results/demo] [--quick] [--wandb offline|online]
"""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser(
        "demo",
        help="IsoFLOP sweep -> fit -> proposed run -> predicted vs measured (CPU, <10 min)",
        description=__doc__,
    )
    p.add_argument("--out", default="results/demo", help="store root for the demo sweep (default results/demo)")
    p.add_argument("--quick", action="store_true", help="a quarter of the compute (budgets 1e11-4e11)")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray (default: all)")
    p.add_argument("--address", default=None, help="run on an existing Ray cluster instead")
    p.add_argument(
        "--wandb",
        choices=("offline", "online", "disabled"),
        default=None,
        help="log the runs, live predictions and fit runs to W&B (sets WANDB_MODE; default: disabled)",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    import os

    from scalelab.analysis.plots import plot_demo
    from scalelab.analysis.wandb_images import fit_images
    from scalelab.sweeps.closed_loop.demo import run_demo

    if args.wandb:  # before Ray starts: the trials inherit it (and a cluster's, through the forwarded WANDB_*)
        os.environ["WANDB_MODE"] = args.wandb
    result = run_demo(
        args.out, quick=args.quick, num_cpus=args.num_cpus, address=args.address, plot=plot_demo, fit_images=fit_images
    )
    if args.wandb == "offline":
        d = f"{args.out}/isoflop"
        print(f"W&B (offline): upload with `wandb sync {d}/runs/*/wandb/offline-run-* {d}/wandb/offline-run-*`")
    return 0 if result.get("ok") else 1
