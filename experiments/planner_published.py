"""The step-time model against published cluster results, and a what-if at 10k GPUs.

    python experiments/planner_published.py              # both tables (~1-3 min: the best-layout searches)
    python experiments/planner_published.py --no-search  # published rows only, seconds

Rows, sources and constants: scalelab.parallel.planner_published and scalelab.parallel.hardware;
the write-up with the figures is docs/planner-at-scale.md. Each row: the planner's figure for the
published layout (one set of constants per GPU type), the published figure, the error, the step's
breakdown, and the planner's own best layout for the same job (GPUs, sequence length, batch).
"""

from __future__ import annotations

import argparse

from scalelab.errors import run_script
from scalelab.parallel.planner_published import (
    evaluate_published,
    format_published,
    format_what_if,
    time_breakdown,
    what_if_10k,
)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-search", action="store_true", help="skip the planner's own best-layout search")
    ap.add_argument("--no-what-if", action="store_true", help="skip the 10k-GPU what-if table")
    args = ap.parse_args(argv)
    results = evaluate_published(search_best=not args.no_search)
    print("## Published vs predicted\n")
    print(format_published(results))
    goal = [r for r in results if r.row.in_goal]
    within = [r for r in goal if abs(r.error) <= 0.15]
    worst = 100 * max(abs(r.error) for r in goal)
    print(f"\nwithin 15%: {len(within)} of {len(goal)} goal rows; max |error| {worst:.1f}%")
    print("\n## Predicted step of each published layout\n")
    for r in results:
        print(f"- {r.row.label}: {time_breakdown(r.plan)}; memory {r.plan.memory['total'] / 2**30:.0f} GiB/GPU")
    if not args.no_what_if:
        print("\n## What-if at 10,240 H100s (8K context, 16M-token batches)\n")
        whatif = what_if_10k()
        print(format_what_if(whatif))
        for r in whatif:
            print(f"- {r['model']}: {r.get('breakdown', '')}")


if __name__ == "__main__":
    run_script(main, __file__)
