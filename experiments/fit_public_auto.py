"""`scalelab fit TABLE --law auto` against `--law chinchilla` on the public families, as a user would run it.

For each family of experiments/fit_public.py (OPT, GPT-3, LM-1; data in experiments/data/scaling):
  1. write a table of (params, tokens, loss): every checkpoint after the first 10% of training of
     every model but the largest (the largest model's rows are never written);
  2. `scalelab fit TABLE --law chinchilla --out A3.json` and `scalelab fit TABLE --law auto --out AUTO.json`
     (the stacked law: Chinchilla unless the forward backtests over the models move weight to Kaplan);
  3. `scalelab predict FIT.json --params N --tokens D` at the largest model's last 30% of checkpoints,
     and the mean absolute relative error there (the Hitchhiker's-guide protocol).
The fits never see the held-out rows; the rule was fixed before this bench was run on them.

    python experiments/fit_public_auto.py [--json OUT.json]
    python experiments/fit_public_auto.py --families OPT --bootstrap 2 --starts 4   # a smoke run: fewer
                                                   # replicates and starts than `scalelab fit`'s defaults
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import pathlib
import tempfile
import time
from collections.abc import Iterator

import numpy as np
import polars as pl

from experiments.fit_public import FAMILIES, HELD_OUT_FAMILIES, pick_families
from scalelab.cli.main import main as cli
from scalelab.errors import run_script
from scalelab.fitting.selection.ensemble import StackedFit


def run_cli(*argv: str) -> str:
    """`scalelab ARGV` as a user runs it, in this process: its standard output (SystemExit on a nonzero exit)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli(list(argv))
    if rc:
        raise SystemExit(f"scalelab {' '.join(argv)} exited {rc}")
    return out.getvalue()


def split(df: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(training rows: every model but the largest after 10% of its training; the held-out rows:
    the largest model's last 30%), the Hitchhiker's-guide protocol."""
    df = df.unique(subset=["model", "tokens", "loss"], keep="first", maintain_order=True)
    df = df.with_columns(frac=pl.col("tokens") / pl.col("tokens").max().over("model"))
    largest = df["params"].max()
    train = df.filter((pl.col("params") < largest) & (pl.col("frac") > 0.1)).select("params", "tokens", "loss")
    return train, df.filter((pl.col("params") == largest) & (pl.col("frac") >= 0.7))


def stacked_fits() -> Iterator[tuple[str, StackedFit, pl.DataFrame]]:
    """Per public family (held and held out): its name, the stacked law `scalelab fit TABLE --law auto`
    saves for its training rows (split), and its held-out rows."""
    with tempfile.TemporaryDirectory() as tmp:
        for name, load in {**FAMILIES, **HELD_OUT_FAMILIES}.items():
            train, test = split(load())
            table = pathlib.Path(tmp) / f"{name.split()[0]}.csv"
            train.write_csv(table)
            out = table.with_suffix(".json")
            run_cli("fit", str(table), "--law", "auto", "--out", str(out))
            yield name, StackedFit.from_dict(json.loads(out.read_text())["stacked"]), test


def fit_flags(bootstrap: int | None, starts: int | None) -> list[str]:
    """`scalelab fit`'s --bootstrap and --starts where a run asks for them (none: the command's defaults)."""
    return [*(["--bootstrap", str(bootstrap)] if bootstrap is not None else []),
            *(["--starts", str(starts)] if starts is not None else [])]  # fmt: skip


def score(name: str, df: pl.DataFrame, work: pathlib.Path, flags: list[str] = ()) -> dict:
    train, test = split(df)
    table = work / f"{name.split()[0]}.csv"
    train.write_csv(table)
    n, d, obs = (np.asarray(test[c].to_numpy(), dtype=float) for c in ("params", "tokens", "loss"))
    row: dict = {"family": name, "train_rows": train.height, "test_rows": test.height}
    for law in ("chinchilla", "auto"):
        fit_path = work / f"{table.stem}_{law}.json"
        t0 = time.perf_counter()
        text = run_cli("fit", str(table), "--law", law, *flags, "--out", str(fit_path))
        row[f"{law}_seconds"] = round(time.perf_counter() - t0, 1)
        pred = json.loads(
            run_cli("predict", str(fit_path), "--params", *map(str, n), "--tokens", *map(str, d), "--json")
        )
        p = np.asarray(pred["loss"], dtype=float)
        row[law] = {"are": float(np.mean(np.abs(p - obs) / obs)), "bias": float(np.mean((p - obs) / obs))}
        pis = pred.get("loss_prediction_interval")
        if pis:
            lo, hi = np.array(pis).T
            row[law]["covered"] = float(np.mean((lo <= obs) & (obs <= hi)))
            row[law]["width"] = float(np.mean((hi - lo) / p))
        if law == "auto":
            saved = json.loads(fit_path.read_text())
            row["weights"] = saved["stacked"]["weights"]
            row["rule"] = saved["stacked"]["stack"]["reason"]
            row["fit_text"] = text
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=pathlib.Path, default=None)
    ap.add_argument("--held-out", action="store_true", help="score the families kept out of the method's development")
    ap.add_argument("--families", default=None, help="comma-separated first words (default: every family of the set)")
    ap.add_argument("--bootstrap", type=int, default=None, help="`scalelab fit --bootstrap B` (default: its own)")
    ap.add_argument("--starts", type=int, default=None, help="`scalelab fit --starts K` (default: the whole grid)")
    args = ap.parse_args(argv)
    families = pick_families(args.families, HELD_OUT_FAMILIES if args.held_out else FAMILIES)
    flags = fit_flags(args.bootstrap, args.starts)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [score(name, load(), pathlib.Path(tmp), flags) for name, load in families.items()]
    print(f"{'family':<22} {'A3 (chinchilla)':>16} {'auto':>10} {'change':>8}  weights (chinchilla, kaplan)")
    for r in rows:
        a3, auto = r["chinchilla"]["are"], r["auto"]["are"]
        w = ", ".join(f"{v:.2f}" for v in r["weights"].values())
        print(f"{r['family']:<22} {100 * a3:>15.2f}% {100 * auto:>9.2f}% {100 * (auto / a3 - 1):>+7.0f}%  {w}")
    for r in rows:
        cov = r["auto"].get("covered")
        extra = f"; auto's 95% intervals cover {100 * cov:.0f}% of the rows, mean width {100 * r['auto']['width']:.1f}%"
        print(f"  {r['family']}: {r['rule']}" + (extra if cov is not None else ""))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    run_script(main, __file__)
