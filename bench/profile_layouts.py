"""Profiles of one ~10M model under single, dp2, fsdp2, tp2 and pp2 on CPU/gloo, beside the planner's estimates.

    python bench/profile_layouts.py --out /tmp/profiles [--steps 2] [--warmup 3] [--reuse]

Each layout is one `scalelab profile examples/profile-10m.yaml --layout L` (a fresh process group;
one thread per rank). The planner's side uses one set of constants for all five, this machine's:
`peak_flops` = the one-thread matmul rate the single run measured, link bandwidth = the median gloo
all-reduce bus bandwidth the two-rank runs measured, `mfu` refitted on the single run's unprofiled
step time (`calibrate`; so the single row agrees by construction and the others are predictions).
A second planner column uses the rates each run's own ranks measured (the slowest rank's matmul rate,
that run's bandwidth): on a shared machine two ranks rarely get two full cores.
Prints a summary table (mean over ranks; memory: the fullest rank) and each layout's per-rank tables.
Timings on a shared machine are noisy: rerun when it is quiet before trusting a few percent.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from scalelab.parallel.planner import Hardware
from scalelab.train.profile_report import (
    GLOO_STEP_LATENCY_S,
    build_report,
    cpu_constants,
    cpu_hardware,
    format_report,
    load_rank_summaries,
)
from scalelab.train.trace_analysis import CATEGORIES

LAYOUTS = ("single", "dp2", "fsdp2", "tp2", "pp2")
CONFIG = Path(__file__).resolve().parent.parent / "examples" / "profile-10m.yaml"


def _profile(layout: str, out: Path, steps: int, warmup: int) -> None:
    cmd = [sys.executable, "-m", "scalelab.cli", "profile", str(CONFIG), "--layout", layout]
    cmd += ["--steps", str(steps), "--warmup", str(warmup), "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=os.environ | {"WANDB_MODE": "disabled"})
    if res.returncode != 0:
        raise SystemExit(f"{layout}: scalelab profile failed\n{res.stderr[-2000:]}")


def shared_hardware(dirs: dict[str, Path]) -> Hardware:
    """This machine for all five layouts: the single run's matmul rate, the two-rank runs' median gloo
    bandwidth and per-step latency (GLOO_STEP_LATENCY_S where a run did not record it)."""
    single = load_rank_summaries(dirs["single"])[0]["hardware"]
    pairs = [s["hardware"] for k, d in dirs.items() if k != "single" for s in load_rank_summaries(d)]
    bw = statistics.median(h["bus_bytes_per_s"] for h in pairs)
    alpha = statistics.median(h.get("step_latency_s", GLOO_STEP_LATENCY_S) for h in pairs)
    return replace(cpu_hardware(load_rank_summaries(dirs["dp2"])), peak_flops=single["matmul_flops"],
                   intra_node_bytes_per_s=bw, inter_node_bytes_per_s=bw,
                   intra_node_step_latency_s=alpha, inter_node_step_latency_s=alpha)  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="a directory for the five profiled runs")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reuse", action="store_true", help="keep runs already in --out (report them again)")
    args = p.parse_args()
    out = Path(args.out)
    dirs = {lay: out / lay for lay in LAYOUTS}
    for lay, d in dirs.items():
        if not (args.reuse and list(d.glob("profile/rank*/summary.json"))):
            _profile(lay, d, args.steps, args.warmup)
    hw = shared_hardware(dirs)
    consts = cpu_constants(hw, [dirs["single"]])
    print(f"hardware: matmul {hw.peak_flops / 1e9:.1f} GFLOP/s (1 thread), gloo all-reduce bus bandwidth "
          f"{hw.intra_node_bytes_per_s / 1e9:.2f} GB/s, {hw.intra_node_step_latency_s * 1e6:.0f} us per ring step; "
          f"calibrated mfu {consts.mfu:.3f} (on single)")  # fmt: skip
    reports = {lay: build_report(d, hw, consts) for lay, d in dirs.items()}
    head = ["layout", "step (unprofiled)", "step (profiled)", *CATEGORIES, "comm total"]
    head += ["planner step", "planner compute", "planner comm exposed", "planner bubble", "planner step (run's rates)"]
    head += ["peak MiB", "planner MiB"]
    print("\ntime in ms per step (mean over ranks); memory in MiB (fullest rank; planner: total with buffers)\n")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for lay, r in reports.items():
        mean = lambda f, ranks=r.ranks: statistics.mean(f(row) for row in ranks)  # noqa: E731
        comm_total = mean(lambda row: sum(row["comm_by_collective"].values()))
        peak = max(row["memory"]["peak"] or 0 for row in r.ranks)
        pl = r.planner
        cells = [lay, r.unprofiled_step_s * 1e3, mean(lambda row: row["step_s"]) * 1e3]
        cells += [mean(lambda row, c=c: row["times"][c]) * 1e3 for c in CATEGORIES] + [comm_total * 1e3]
        cells += [pl["step_s"] * 1e3, pl["times"]["compute"] * 1e3, pl["times"]["comm_exposed"] * 1e3]
        own = build_report(dirs[lay], cpu_hardware(load_rank_summaries(dirs[lay])), consts).planner["step_s"]
        cells += [pl["times"]["idle"] * 1e3, own * 1e3, peak / 2**20, pl["memory"]["total"] / 2**20]
        print("| " + " | ".join(c if isinstance(c, str) else f"{c:.1f}" for c in cells) + " |")
    for lay, r in reports.items():
        print(f"\n### {lay}\n")
        print(format_report(r))
    (out / "summary.json").write_text(json.dumps({k: v.as_dict() for k, v in reports.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
