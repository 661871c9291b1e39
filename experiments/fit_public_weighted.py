"""Chinchilla fitted with every row weighted by its compute (6 N D), against equal weights, on the
public families, through `scalelab fit TABLE --weight-col weight` as a user would run it.

The rows and the held-out split are experiments/fit_public_auto.py's (the Hitchhiker's-guide protocol);
weights are each row's FLOPs over the largest training row's. Weighting by compute makes the fit
follow the larger runs, where a small model's early curvature no longer sets the floor; the issue
that asked for it proposed it for the loop once larger runs are in.

    python experiments/fit_public_weighted.py
    python experiments/fit_public_weighted.py --families OPT --starts 4   # a smoke run (fewer starts)
"""

from __future__ import annotations

import argparse
import json
import pathlib
import tempfile

import numpy as np
import polars as pl

from experiments.fit_public import FAMILIES, HELD_OUT_FAMILIES, pick_families
from experiments.fit_public_auto import fit_flags, run_cli, split
from scalelab.errors import run_script


def held_out_error(
    train: pl.DataFrame, test: pl.DataFrame, work: pathlib.Path, weighted: bool, flags: list[str] = ()
) -> float:
    table, fit = work / f"w{int(weighted)}.csv", work / f"w{int(weighted)}.json"
    if weighted:
        flops = pl.col("params") * pl.col("tokens")
        train = train.with_columns(weight=flops / flops.max())
    train.write_csv(table)
    run_cli(
        "fit",
        str(table),
        "--law",
        "chinchilla",
        "--no-backtest",
        *flags,
        "--out",
        str(fit),
        *(["--weight-col", "weight"] if weighted else []),
    )
    n, d, obs = (np.asarray(test[c].to_numpy(), dtype=float) for c in ("params", "tokens", "loss"))
    pred = np.asarray(
        json.loads(run_cli("predict", str(fit), "--params", *map(str, n), "--tokens", *map(str, d), "--json"))["loss"]
    )
    return float(np.mean(np.abs(pred - obs) / obs))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=None, help="comma-separated first words (default: OPT,GPT-3,LM-1,Pile-T5)")
    ap.add_argument("--bootstrap", type=int, default=None, help="`scalelab fit --bootstrap B` (default: its own)")
    ap.add_argument("--starts", type=int, default=None, help="`scalelab fit --starts K` (default: the whole grid)")
    args = ap.parse_args(argv)
    flags = fit_flags(args.bootstrap, args.starts)
    print(f"{'family':<24} {'equal':>8} {'by FLOPs':>9} {'change':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, load in pick_families(args.families, {**FAMILIES, **HELD_OUT_FAMILIES}).items():
            train, test = split(load())
            equal, flops = (held_out_error(train, test, pathlib.Path(tmp), w, flags) for w in (False, True))
            print(
                f"{name:<24} {100 * equal:>7.2f}% {100 * flops:>8.2f}% {100 * (flops / equal - 1):>+6.0f}%", flush=True
            )
    return 0


if __name__ == "__main__":
    run_script(main, __file__)
