"""`scalelab demo`: the whole loop on a laptop CPU in under 10 minutes.

An IsoFLOP sweep of tiny models at 3 budgets on the default corpus (local Ray), the Chinchilla fit,
a proposed next round of one compute-optimal run at ~3x the largest budget, that run, and a printed
comparison of predicted vs measured loss with its interval, plus a PNG of the IsoFLOP curves.

    scalelab demo [--out results/demo] [--quick]
"""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser(
        "demo",
        help="IsoFLOP sweep -> fit -> proposed run -> predicted vs measured (CPU, <10 min)",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("--out", default="results/demo", help="store root for the demo sweep (default results/demo)")
    p.add_argument("--quick", action="store_true", help="a smaller demo (~2 minutes) for smoke tests")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray (default: all)")
    p.add_argument("--address", default=None, help="run on an existing Ray cluster instead")
    p.set_defaults(func=run)


def run(args) -> int:
    from scalelab.analysis.plots import plot_demo
    from scalelab.sweeps.demo import run_demo

    result = run_demo(args.out, quick=args.quick, num_cpus=args.num_cpus, address=args.address, plot=plot_demo)
    return 0 if result.get("ok") else 1
