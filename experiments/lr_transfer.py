"""Learning-rate transfer across width and depth under sp, mup and completep, measured on CPU.

Runs (on local Ray, into a store, so a rerun trains nothing twice; the machinery of
experiments/lr_sweep.py: a points spec, `launch`, `load_runs`) an LR grid x2 apart at three sizes of the
shape rule (scalelab.models.shapes.shape_for_width): the base (2 layers x 16), 4x wider (2 x 64) and
2x deeper (4 x 16), each at the same 1 token per parameter, batch 4 x 32 tokens, cosine schedule
with 5% warmup, for each parametrization. mup/completep are relative to the base (base_d_model 16,
base_num_layers 2, base_head_dim and base_d_ff of the base's shape). The base and the deeper size
sweep 7 LRs (1e-3..6.4e-2), the 4x wider size (~10x the cost of a base run) 4-5 LRs (WIDE_LRS);
every point with 3 seeds, the base with 6 (init and data order: one seed's curve is too noisy at 1
token per parameter to place its minimum within a grid step, and the base's curve is the flattest
and its runs the cheapest). Runs
go in the order base, wider, deeper. Per size the best LR is the vertex of a parabola of the final
validation loss in log2 LR around the grid minimum, fitted to every seed's point, with a 90%
residual-bootstrap interval (scalelab.fitting.hp_laws.hyperparams.best_lr, the estimator the transfer gate
uses too); "moved" is the distance of that vertex from the base's, in grid steps (fractional), with
the conservative interval (size's interval minus the base's). Goal (issue 13): under mup/completep
the best LR moves by at most one grid step, under sp by more.

completep at 2 layers is the mup model exactly (every depth multiplier is 1 at the base depth),
so its 2-layer rows are the mup runs; only its 4-layer size is trained separately.

    python experiments/lr_transfer.py --out DIR        # trains what DIR lacks, prints the table
    python experiments/lr_transfer.py --out DIR --report   # the table only

Figures it printed, with the date and the machine's load: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import math
import time

import polars as pl
import yaml

from scalelab import store
from scalelab.errors import run_script
from scalelab.fitting.hp_laws.hyperparams import best_lr, grid_position
from scalelab.models.shapes import base_shape, shape_for_width
from scalelab.sweeps.execution.execute import launch
from scalelab.sweeps.specs.spec import expand_sweep

LRS = [5e-4, 1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2, 6.4e-2]
SIZES = [(2, 16), (2, 64), (4, 16)]  # (num_layers, d_model): base, 4x wider, 2x deeper
BASE_LAYERS, BASE_WIDTH = SIZES[0]
TOKENS_PER_PARAM = 1.0
SEQ_LEN, BATCH_SEQUENCES = 32, 4
RUNS = {"sp": SIZES, "mup": SIZES, "completep": [(4, 16)]}  # completep at 2 layers = mup (docstring)
# The 4x wider size costs ~10x a base run, so it sweeps 4-5 of the grid's LRs: sp's
# optimum lies low (1e-3 or below in the first measurement), mup's around the base's.
WIDE_LRS = {"sp": LRS[:4], "mup": LRS[2:7]}
BASE_SEEDS, OTHER_SEEDS = [0, 1, 2, 3, 4, 5], [0, 1, 2]  # the base: a flat curve, cheap runs


def lrs_for(p: str, layers: int, width: int) -> list[float]:
    return WIDE_LRS[p] if width > BASE_WIDTH else LRS[1:]


def seeds_for(layers: int, width: int) -> list[int]:
    return BASE_SEEDS if (layers, width) == SIZES[0] else OTHER_SEEDS


def spec() -> dict:
    from scalelab.models.accounting import num_params

    points = []
    keys = ("num_layers", "d_model", "num_heads", "num_kv_heads", "d_ff", "max_seq_len")
    # in order of SIZES (base, wider, deeper): a run stopped by the clock leaves the base complete
    todo = sorted(((p, size) for p, sizes in RUNS.items() for size in sizes), key=lambda t: SIZES.index(t[1]))
    for p, (layers, width) in todo:
        shape = shape_for_width(layers, width, 320, max_seq_len=SEQ_LEN)
        step = SEQ_LEN * BATCH_SEQUENCES
        tokens = int(round(TOKENS_PER_PARAM * num_params(shape) / step)) * step
        for seed in seeds_for(layers, width):
            for lr in lrs_for(p, layers, width):
                point = {f"model.{k}": getattr(shape, k) for k in keys}
                point |= {
                    "model.parametrization": p,
                    **{f"model.{k}": v for k, v in base_shape(BASE_WIDTH, BASE_LAYERS).items()},
                    "train.num_tokens": tokens,
                    "train.seed": seed,
                    "optim.lr": lr,
                    "labels": {"parametrization": p, "lr": lr, "seed": seed},
                }
                points.append(point)
    base = {
        "model": {"kernels": "torch", "vocab_size": 320},
        "data": {"seq_len": SEQ_LEN, "val_sequences": 128},
        "train": {"global_batch_tokens": SEQ_LEN * BATCH_SEQUENCES},
        "schedule": {"name": "cosine", "warmup_fraction": 0.05},
        "eval": {"interval_steps": 0},
        "checkpoint": {"interval_steps": 0},
        "logging": {"wandb": "disabled", "interval_steps": 10},
    }
    return {"name": "lr-transfer", "base": base, "points": points, "execution": {"max_concurrent": 3}}


def _runs(df: pl.DataFrame, p: str, layers: int, width: int) -> tuple[list[float], list[float], list[str]]:
    """(lr, final val loss, missing) of every run of one size; diverged runs as inf."""
    sub = df.filter((pl.col("parametrization") == p) & (pl.col("num_layers") == layers) & (pl.col("d_model") == width))
    lrs, losses, missing = [], [], []
    for seed in seeds_for(layers, width):
        for lr in lrs_for(p, layers, width):
            hit = sub.filter(((pl.col("lr") - lr).abs() <= 1e-9) & (pl.col("seed") == seed))
            status = hit["status"][0] if hit.height else "missing"
            v = hit["final_val_loss"][0] if status == "done" else None
            if status not in ("done", "diverged"):
                missing.append(f"{p} {layers}x{width} lr {lr:g} seed {seed} ({status})")
                continue
            lrs.append(lr)
            losses.append(float(v) if v is not None and math.isfinite(v) else math.inf)
    return lrs, losses, missing


def table(df: pl.DataFrame) -> tuple[str, dict[str, float]]:
    """Mean loss per LR (over seeds) per parametrization and size; the best LR (fitting.hp_laws.hyperparams
    .best_lr: parabola vertex in log2 LR, 90% bootstrap interval) and its move from the base's in
    grid steps, with the move's interval (size's interval minus the base's, the conservative way).
    * = the grid minimum; "-": diverged; blank: not swept at that size."""
    lines = [
        f"{'param':<10} {'size':<8} {'N':>7} {'seeds':>5} "
        + " ".join(f"{lr:>7.3g}" for lr in LRS)
        + f" {'best LR':>8} {'90% interval':>17} {'moved':>6} {'moved interval':>15}"
    ]
    worst, missing = {}, []
    for p in RUNS:
        source = "mup" if p == "completep" else p
        base = None
        for layers, width in SIZES:
            who = p if (layers, width) in RUNS[p] else source
            lrs, losses, miss = _runs(df, who, layers, width)
            missing += miss
            if not lrs or not any(math.isfinite(v) for v in losses):
                lines.append(f"{p:<10} {layers}x{width}: no finished runs")
                continue
            opt = best_lr(lrs, losses)
            pos = grid_position(opt.lr, LRS)
            span = (grid_position(opt.interval[0], LRS), grid_position(opt.interval[1], LRS))
            if base is None:
                base = (pos, span)
            moved = pos - base[0]
            moved_span = (span[0] - base[1][1], span[1] - base[1][0])
            if opt.interior:
                worst[p] = max(worst.get(p, 0.0), abs(moved))
            else:
                worst[p] = math.inf
            mean = {lr: sum(v for x, v in zip(lrs, losses) if x == lr) / lrs.count(lr) for lr in set(lrs)}
            cells = " ".join(
                ("" if lr not in mean else f"{mean[lr]:.4f}" if math.isfinite(mean[lr]) else "-").rjust(7)
                + ("*" if lr == opt.grid_lr else " ")
                for lr in LRS
            )
            sub = df.filter((pl.col("parametrization") == who) & (pl.col("d_model") == width)
                            & (pl.col("num_layers") == layers))  # fmt: skip
            n = int(sub["params"][0]) if sub.height else 0
            tag = f"{layers}x{width}" + ("" if who == p else "=mup")
            interval = f"[{opt.interval[0]:.3g}, {opt.interval[1]:.3g}]"
            flag = "" if opt.interior else "  (no bracketed minimum: best at the edge of its LRs)"
            lines.append(
                f"{p:<10} {tag:<8} {n:>7,} {len(seeds_for(layers, width)):>5} {cells}{opt.lr:>8.3g} {interval:>17} "
                f"{moved:>+6.2f} {f'[{moved_span[0]:+.2f}, {moved_span[1]:+.2f}]':>15}{flag}"
            )
    lines += [f"not finished: {m}" for m in dict.fromkeys(missing)]
    return "\n".join(lines), worst


def main(argv: list[str] | None = None, trainer=None) -> None:
    """The grid and its table (module docstring); `trainer` stands in for Ray's launcher (a test's
    simulator, scalelab.analysis.synthetic.synthetic_trainer with a truth that depends on the LR)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/bench/lr_transfer", help="sweep directory (store root = its parent)")
    ap.add_argument("--num-cpus", type=int, default=3)
    ap.add_argument("--report", action="store_true", help="print the table of the runs in --out; train nothing")
    args = ap.parse_args(argv)
    t0 = time.time()
    raw = spec()
    if not args.report:
        sweep = expand_sweep(raw, default_name="lr_transfer")
        (trainer or launch)(sweep, args.out, spec_text=yaml.safe_dump(raw, sort_keys=False), spec_name="lr_transfer",
                            num_cpus=args.num_cpus)  # fmt: skip
    df = store.load_runs(args.out)
    text, worst = table(df)
    print(f"\nLR transfer ({df.height} runs, {time.time() - t0:.0f} s; final val loss; * = best LR per size;")
    print(f"sizes: base {BASE_LAYERS}x{BASE_WIDTH}, 4x wider, 2x deeper; {TOKENS_PER_PARAM:g} tokens/param;")
    print(
        "mean over seeds; best LR = parabola vertex in log2 LR (fitting.hp_laws.hyperparams.best_lr); "
        "moved in grid steps)"
    )
    print(text)
    for p, w in worst.items():
        goal = "<= 1 (goal)" if p != "sp" else "(sp: expected > 1)"
        print(f"{p}: best LR moves by at most {w:.2f} grid step(s) across the sizes {goal}")


if __name__ == "__main__":
    run_script(main, __file__)
