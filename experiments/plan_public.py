"""The inputs of a GPU plan from a public model family: its run table and its recipe table (not a test).

    python experiments/plan_public.py --out results/plan_gpt3          # writes the two tables
    scalelab fit results/plan_gpt3/gpt3_runs.csv --bootstrap 100 --out results/plan_gpt3/gpt3_fit.json
    python experiments/plan_public.py --out results/plan_gpt3 --check results/plan_gpt3/gpt3_fit.json
    scalelab plan-run results/plan_gpt3/gpt3_fit.json --flops 3e23 --gpu H100-SXM --gpus 2048 \
        --vocab-size 50304 --seq-len 2048 --hp-table results/plan_gpt3/gpt3_recipe.csv \
        --hp-sweep examples/plan/demo_hp_sweep.csv --html results/plan_gpt3/plan.html

The run table is GPT-3's loss curves (experiments/fit_public.py's loader: Brown et al. 2020, digitised, from
the data released with Choshen et al. 2025) with the largest model (175B) held out, as in the
Hitchhiker's protocol: seven models, 125M to 13B parameters, up to 2.3e22 FLOPs, so a plan at 3e23
extrapolates 1.1 decades, and the held-out 175B run (300B tokens, 3.15e23 FLOPs) is a check of the
fit there (--check prints the fit's prediction of its last 30% beside the measured loss).

--drop-first F leaves out each model's checkpoints before F of its training (the guide drops ~10%).
On this table the Chinchilla fit depends on it (measured with the fitter's defaults): F = 0 gives
E 1.52, alpha 0.25, beta 0.51 (the fit warns that its starts disagree on beta) and N*(3e23) = 71B;
F = 0.05 gives beta 0.30 and N* 30B; F = 0.1 gives E on its lower bound and beta 0.09 (N* 5.8B on
8.7T tokens): the intermediate checkpoints of one fixed 300B-token schedule are what pin beta here.
The default is 0 (every checkpoint). The recipe table is the paper's Table 2.1 per model: tokens per
step and peak LR (experiments/fit_public.py GPT3_RECIPE), with the 375M-token warmup every size used.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import numpy as np
import polars as pl

from experiments import fit_public
from scalelab.errors import run_script
from scalelab.fitting.entry.from_report import predict_from_fit

WARMUP_TOKENS = 375e6  # GPT-3 (Brown et al. 2020, App. B): every size warms up over 375M tokens


def tables(drop_first: float) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(training checkpoints, the held-out 175B run's last 30%, the recipe per model)."""
    train, test = fit_public.split_protocol(fit_public.load_gpt3(), drop_first=drop_first)
    recipe = pl.DataFrame(
        {
            "model": list(fit_public.GPT3_RECIPE),
            "params": [fit_public.GPT3_SIZES[m] for m in fit_public.GPT3_RECIPE],
            "batch_tokens": [b for b, _ in fit_public.GPT3_RECIPE.values()],
            "lr": [lr for _, lr in fit_public.GPT3_RECIPE.values()],
            "warmup_tokens": [WARMUP_TOKENS] * len(fit_public.GPT3_RECIPE),
        }
    )
    return train, test, recipe


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=pathlib.Path, required=True)
    ap.add_argument("--drop-first", type=float, default=0.0, help="leave out each model's first fraction")
    ap.add_argument("--check", type=pathlib.Path, default=None, metavar="FIT.json",
                    help="print this fit's prediction of the held-out 175B run")  # fmt: skip
    args = ap.parse_args(argv)
    train, test, recipe = tables(args.drop_first)
    args.out.mkdir(parents=True, exist_ok=True)
    train.select("model", "params", "tokens", "loss").write_csv(args.out / "gpt3_runs.csv")
    recipe.write_csv(args.out / "gpt3_recipe.csv")
    flops = 6 * train["params"] * train["tokens"]
    print(f"wrote {args.out / 'gpt3_runs.csv'}: {train.height} checkpoints of {train['model'].n_unique()} models "
          f"({train['params'].min():.3g}..{train['params'].max():.3g} parameters, up to {flops.max():.3g} FLOPs; "
          "175B held out)")  # fmt: skip
    print(f"wrote {args.out / 'gpt3_recipe.csv'}: {recipe.height} models (GPT-3 Table 2.1)")
    if args.check is not None:
        fit = json.loads(args.check.read_text())
        n, d = (np.array(test[c].to_numpy(), dtype=float) for c in ("params", "tokens"))
        pred = np.array(predict_from_fit(fit, params=n, tokens=d)["loss"])
        obs = np.array(test["loss"].to_numpy(), dtype=float)
        rel = (pred - obs) / obs
        print(f"held-out 175B, last 30% of its 300B tokens ({test.height} points): predicted {pred[-1]:.4f} vs "
              f"measured {obs[-1]:.4f} at the end; mean |error| {100 * np.mean(np.abs(rel)):.2f}%, "
              f"bias {100 * np.mean(rel):+.2f}%")  # fmt: skip
    return 0


if __name__ == "__main__":
    run_script(main, __file__)
