"""Benchmark: extrapolation error of scalelab's fitter on public model families (not a test).

Protocol (Choshen, Zhang & Andreas 2025, "A Hitchhiker's Guide to Scaling Law Estimation"; the data
are their release, copied to experiments/data/scaling with its provenance and licence):
  1. per family, drop the largest model; from every other model keep its checkpoints after the
     first 10% of training (by tokens);
  2. fit the law (default: Chinchilla, Approach 3, Huber on log loss) on those points;
  3. predict the largest model's loss on the last 30% of its training (by tokens) and report the
     mean absolute relative error (ARE) |pred - obs| / obs.
The paper reports ~4% as typically the best reachable and up to ~20% as still useful.

Families and how each table becomes (params N, tokens D, loss in nats):
  OPT      opt_trajectories.csv: N from model_size ("125m"), D = 10^num_token, loss = ln(ppl)
  GPT-3    gpt3_extracted_curves.csv: N from the paper's table, D = step * 1e9, loss = val_loss
           (digitised; thinned to the median per log-token bin so dense curves don't dominate)
  LM-1     revisiting_lang.csv, Domain LM: N = Model, D = seen examples (a constant factor per
           example does not change a Chinchilla fit's predictions), loss = Loss
Not scored: OLMo (only one model below the largest: the N-terms are unidentified), T5-Pile (its
loss columns are transformed, negative values), single-model logs (K2, RedPajama).

    python experiments/fit_public.py [--law chinchilla] [--json OUT.json]

Curve laws and law selection (`--curves`, on by default; fitting/loss_curves/curves.py,
fitting/selection/select.py). The same split, with every family's checkpoints as loss curves:
  chinchilla+, kaplan+  the (N, D) laws fitted by the curve fitter: checkpoints grouped per run,
                        random-intercept weights (no run counts for more than its seed noise allows)
  lr_area, lr_annealing the LR-area laws (Tissue et al. 2024 with a size term); they need each
  lr_ann_sized          model's LR schedule, taken from the papers: OPT (Zhang et al. 2022, Table 1
                        and Sec. 2.2): linear warmup over 375M tokens (2000 steps for 175B), linear
                        decay to 10% at 300B tokens, the batch of Table 1 (the logged tokens per
                        step agree); GPT-3 (Brown et al. 2020, Table 2.1 and App. B): warmup over
                        375M tokens, cosine to 10% at 260B tokens, then constant (the batch-size
                        ramp of the first 4-12B tokens is ignored). These are the planned schedules:
                        OPT-175B's real one was lowered by hand mid-run (below), which the data do
                        not record. LM-1's schedule is not in the data: its curve laws are "n/a".
                        lr_ann_sized is lr_annealing_sized (data term B N^gamma / S1^beta).
  average               geometric mean of the scored candidates' predictions (equal weights)
  auto                  the candidate chosen by a nested held-out-largest backtest inside the
                        training models (hold out the largest of them, score the last 30% of its
                        curve; Chinchilla kept unless beaten by 10%), refitted on all training models.
                        `auto*` is the plain lowest-MARE choice, for comparison.
The last lines give where the held-out run's residual against the chosen law shifts level, and
where the nested selection's held-out run's does (fitting/loss_curves/curve_departures.py).
experiments/fit_public_sensitivity.py varies the fit's settings.

Figures it printed, with the date and the machine's load: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import numpy as np
import polars as pl

from scalelab.errors import UsageError, run_script
from scalelab.fitting.entry.fit_options import FitOptions
from scalelab.fitting.entry.fit_runs import fit_runs
from scalelab.fitting.entry.from_report import predict_from_fit
from scalelab.fitting.estimate.io import read_runs
from scalelab.fitting.loss_curves.curve_departures import departures
from scalelab.fitting.loss_curves.curves import CurveFit, RunCurve, fit_curves
from scalelab.fitting.selection.select import select_law

DATA = pathlib.Path(__file__).resolve().parent / "data" / "scaling"  # provenance and licence: its README.md

GPT3_SIZES = {
    "small": 125e6,
    "medium": 350e6,
    "large": 760e6,
    "xl": 1.3e9,
    "2.7b": 2.7e9,
    "6.7b": 6.7e9,
    "13b": 13e9,
    "175b": 175e9,
}


def _size(text: str) -> float:
    text = text.strip().lower()
    scale = {"m": 1e6, "b": 1e9}[text[-1]]
    return float(text[:-1]) * scale


def load_opt() -> pl.DataFrame:
    df = pl.read_csv(DATA / "opt_trajectories.csv")
    return pl.DataFrame(
        {
            "model": df["model_size"],
            "params": [_size(s) for s in df["model_size"]],
            "tokens": 10.0 ** df["num_token"].to_numpy(),
            "loss": np.log(df["ppl"].to_numpy()),
        }
    )


def load_gpt3(bins_per_decade: int = 50) -> pl.DataFrame:
    df = pl.read_csv(DATA / "gpt3_extracted_curves.csv", infer_schema_length=None)
    df = df.with_columns(pl.col("val_loss").cast(pl.Float64, strict=False)).drop_nulls("val_loss")
    df = df.with_columns(
        params=pl.col("model").replace_strict(GPT3_SIZES, return_dtype=pl.Float64),
        tokens=pl.col("step") * 1e9,
    ).filter(pl.col("tokens") > 0)
    # Digitised curves hold hundreds of near-duplicate points; one median per log-token bin.
    df = df.with_columns(bin=(pl.col("tokens").log10() * bins_per_decade).floor())
    df = df.group_by("model", "params", "bin").agg(tokens=pl.col("tokens").median(), loss=pl.col("val_loss").median())
    return df.select("model", "params", "tokens", "loss").sort("params", "tokens")


def load_revisiting_lm() -> pl.DataFrame:
    df = pl.read_csv(DATA / "revisiting_lang.csv").filter(pl.col("Domain") == "LM")
    return pl.DataFrame(
        {
            "model": df["Model"].cast(pl.Utf8),
            "params": df["Model"].cast(pl.Float64),
            "tokens": df["Seen Examples"].cast(pl.Float64),
            "loss": df["Loss"].cast(pl.Float64),
        }
    ).filter(pl.col("tokens") > 0)


# Pile-T5 (EleutherAI): parameter counts and 1e6 tokens per step as ColPret's loader states them.
PILE_T5_SIZES = {"base": 247_586_304, "large": 783_173_632, "xl": 2_849_804_288, "xxl": 11_135_426_560}


def load_pile_t5() -> pl.DataFrame:
    """Pile-T5's validation curves; loss = ln(val_perplexity), as OPT's ln(ppl) above."""
    df = pl.read_csv(DATA / "pile_t5.csv").filter(pl.col("steps") > 0)
    return pl.DataFrame(
        {
            "model": df["model_name"],
            "params": df["model_name"].replace_strict(PILE_T5_SIZES, return_dtype=pl.Float64),
            "tokens": df["steps"].cast(pl.Float64) * 1e6,
            "loss": np.log(df["val_perplexity"].to_numpy()),
        }
    ).sort("params", "tokens")


# RedPajama-INCITE (Together, 2023), digitised curves as the Hitchhiker's release has them: tokens in
# billions and loss, no header; the two models under the names the release gives them (2.4B, 6.7B).
REDPAJAMA_SIZES = {"2.4B": 2.4e9, "6.7B": 6.7e9}


def load_redpajama() -> pl.DataFrame:
    frames = []
    for name, n in REDPAJAMA_SIZES.items():
        a = np.loadtxt(DATA / f"redpajama_{name}.csv", delimiter=",")
        frames.append(pl.DataFrame({"model": [name] * len(a), "params": np.full(len(a), n), "tokens": a[:, 0] * 1e9,
                                    "loss": a[:, 1]}))  # fmt: skip
    return pl.concat(frames).sort("params", "tokens")


EPOCH_DROPPED = 5  # Besiroglu et al. 2024 leave out the five runs of highest loss (their notebook's rule)


def load_epoch(path) -> pl.DataFrame:
    """Epoch AI's extraction of Chinchilla's runs (Besiroglu et al. 2024; not in this repository: see
    docs/frontier.md for how to get it): columns 'Model Size', 'Training FLOP', 'loss'; D = C / 6N;
    the EPOCH_DROPPED highest losses left out, as their analysis does (240 runs remain)."""
    df = pl.read_csv(path).select(params="Model Size", flops="Training FLOP", loss="loss").drop_nulls()
    cut = df["loss"].sort(descending=True)[EPOCH_DROPPED - 1]
    df = df.filter(pl.col("loss") < cut).with_columns(tokens=pl.col("flops") / (6 * pl.col("params")))
    return df.with_columns(model=pl.lit("chinchilla")).select("model", "params", "tokens", "flops", "loss")


FAMILIES = {"OPT": load_opt, "GPT-3": load_gpt3, "LM-1 (Alabdulmohsin)": load_revisiting_lm}
# Scored only after the method was fixed, never used to choose or tune it (experiments/fit_public_auto.py --held-out).
HELD_OUT_FAMILIES = {"Pile-T5": load_pile_t5}


def pick_families(names: str | None, families: dict) -> dict:
    """The `families` that `--families` names (comma-separated first words: OPT, GPT-3, LM-1, Pile-T5);
    all of them when None. A smoke test scores one small family through the same path."""
    if names is None:
        return families
    by_word = {k.split()[0]: k for k in families}
    picked = {}
    for word in (w.strip() for w in names.split(",")):
        if word not in by_word:
            raise UsageError(f"--families: no family {word!r} here; use some of {','.join(by_word)}")
        picked[by_word[word]] = families[by_word[word]]
    return picked


# (tokens per step, peak LR) per model, from the papers' tables (see the module docstring)
OPT_RECIPE = {
    "125m": (0.5e6, 6.0e-4),
    "1.3b": (1e6, 2.0e-4),
    "6.7b": (2e6, 1.2e-4),
    "13b": (4e6, 1.0e-4),
    "30b": (4e6, 1.0e-4),
    "175b": (2e6, 1.2e-4),
}
GPT3_RECIPE = {
    "small": (0.5e6, 6.0e-4),
    "medium": (0.5e6, 3.0e-4),
    "large": (0.5e6, 2.5e-4),
    "xl": (1e6, 2.0e-4),
    "2.7b": (1e6, 1.6e-4),
    "6.7b": (2e6, 1.2e-4),
    "13b": (2e6, 1.0e-4),
    "175b": (3.2e6, 0.6e-4),
}
TOTAL_TOKENS = 300e9  # both OPT and GPT-3 train every size for 300B tokens


def opt_schedule(model: str) -> tuple[np.ndarray, float]:
    """(LR per step, tokens per step): linear warmup, linear decay to 10% at 300B tokens."""
    batch, peak = OPT_RECIPE[model]
    warm = 2000 * batch if model == "175b" else 375e6
    tok = np.arange(int(TOTAL_TOKENS // batch)) * batch
    decay = peak * (1.0 - 0.9 * np.clip((tok - warm) / (TOTAL_TOKENS - warm), 0.0, 1.0))
    return np.where(tok < warm, peak * (tok + batch) / warm, decay), batch


def gpt3_schedule(model: str) -> tuple[np.ndarray, float]:
    """(LR per step, tokens per step): warmup over 375M tokens, cosine to 10% at 260B, then flat."""
    batch, peak = GPT3_RECIPE[model]
    warm, end = 375e6, 260e9
    tok = np.arange(int(TOTAL_TOKENS // batch)) * batch
    p = np.clip((tok - warm) / (end - warm), 0.0, 1.0)
    cosine = 0.1 * peak + 0.45 * peak * (1.0 + np.cos(np.pi * p))
    return np.where(tok < warm, peak * (tok + batch) / warm, cosine), batch


SCHEDULES = {"OPT": opt_schedule, "GPT-3": gpt3_schedule}


def split_protocol(df: pl.DataFrame, *, drop_first: float = 0.1, score_last: float = 0.3):
    """(train, test) frames per the protocol: largest model held out, early checkpoints dropped."""
    # Some tables repeat rows verbatim (the fitter rejects exact duplicates as double-recorded runs).
    df = df.unique(subset=["model", "tokens", "loss"], keep="first", maintain_order=True)
    df = df.with_columns(frac=pl.col("tokens") / pl.col("tokens").max().over("model"))
    largest = df["params"].max()
    train = df.filter((pl.col("params") < largest) & (pl.col("frac") > drop_first))
    test = df.filter((pl.col("params") == largest) & (pl.col("frac") >= 1.0 - score_last))
    return train, test


def score_family(name: str, df: pl.DataFrame, *, law: str) -> dict:
    train, test = split_protocol(df)
    t0 = time.perf_counter()
    table = read_runs(train.select("params", "tokens", "loss"), min_rows=2)
    fit = fit_runs(table, FitOptions(law=law, backtest=False)).to_report()
    n_test, d_test = (np.array(test[c].to_numpy(), dtype=float) for c in ("params", "tokens"))
    pred = predict_from_fit(fit, params=n_test, tokens=d_test)["loss"]
    obs = np.array(test["loss"].to_numpy(), dtype=float)
    are = np.abs(np.asarray(pred) - obs) / obs
    return {
        "family": name,
        "law": law,
        "models_train": int(train["model"].n_unique()),
        "points_train": train.height,
        "largest_params": float(test["params"].max()),
        "points_test": test.height,
        "are_mean": float(are.mean()),
        "are_max": float(are.max()),
        "bias": float(np.mean((np.asarray(pred) - obs) / obs)),
        "params": fit["params"],
        "fit_seconds": round(time.perf_counter() - t0, 2),
        "warnings": fit["warnings"],
    }


def family_curves(name: str, df: pl.DataFrame) -> list[RunCurve]:
    """One RunCurve per model. Families without a published schedule get a constant placeholder LR
    (only the (N, D) laws, which ignore it, are fitted on them)."""
    sched = SCHEDULES.get(name)
    out = []
    for (model,), g in df.sort("tokens").group_by(["model"], maintain_order=True):
        tokens, loss = (np.array(g[c].to_numpy(), dtype=float) for c in ("tokens", "loss"))
        if sched is not None:
            lr, batch = sched(str(model))
        else:  # LM-1: steps of the checkpoints' common token unit
            batch = float(np.gcd.reduce(np.round(tokens).astype(np.int64)))
            lr = np.ones(int(round(tokens.max() / batch)))
        steps = np.clip(np.round(tokens / batch).astype(np.int64), 1, lr.size)
        uniq, inv = np.unique(steps, return_inverse=True)
        mean_loss = np.exp(np.bincount(inv, weights=np.log(loss)) / np.bincount(inv))
        out.append(
            RunCurve(
                run_id=str(model),
                params=float(g["params"][0]),
                lr=lr,
                steps=uniq,
                loss=mean_loss,
                tokens_per_step=batch,
            )
        )
    return sorted(out, key=lambda c: c.params)


CURVE_CANDIDATES = ("chinchilla", "kaplan", "lr_area", "lr_annealing", "lr_annealing_sized")


def _in_tokens(dep, curve: RunCurve) -> dict:
    """A departure (fitting.loss_curves.curve_departures) with its two checkpoints in tokens of `curve`."""
    before, after = curve.tokens(np.array([dep.step_before, dep.step_after]))
    return dep.to_dict() | {"tokens_before": float(before), "tokens_after": float(after)}


def score_curves(name: str, df: pl.DataFrame, *, drop_first: float = 0.1, score_last: float = 0.3) -> dict:
    """Mean ARE on the largest model's last 30% for each curve candidate, their average and auto."""
    df = df.unique(subset=["model", "tokens", "loss"], keep="first", maintain_order=True)
    curves = family_curves(name, df)
    train, test = curves[:-1], curves[-1]
    steps = test.tail_steps(score_last)
    obs = test.loss[np.isin(test.steps, steps)]
    names = [c for c in CURVE_CANDIDATES if name in SCHEDULES or c in ("chinchilla", "kaplan")]
    t0 = time.perf_counter()
    preds, fits = {}, {}
    for law in names:
        fits[law] = fit_curves(train, law, drop_first=drop_first)
        preds[law] = fits[law].predict(test, steps)
    preds["average"] = np.exp(np.mean(np.log(np.stack(list(preds.values()))), axis=0))
    sel = select_law(
        curves=train,
        candidates=[*names, "average"],
        score="tail",
        tail=score_last,
        curve_kwargs={"drop_first": drop_first},
        refit=False,
    )
    preds["auto"] = preds[sel.chosen]
    plain = select_law(
        curves=train,
        candidates=[*names, "average"],
        score="tail",
        tail=score_last,
        curve_kwargs={"drop_first": drop_first},
        refit=False,
        incumbent=None,
    )
    preds["auto*"] = preds[plain.chosen]
    # where the held-out run leaves the chosen law (fitting/loss_curves/curve_departures.py): a level shift of its
    # residual says the run changed mid-way in a way its given schedule does not show
    held = departures(fits[sel.chosen], test) if isinstance(fits.get(sel.chosen), CurveFit) else []
    are = {k: float(np.mean(np.abs(p - obs) / obs)) for k, p in preds.items()}
    bias = {k: float(np.mean((p - obs) / obs)) for k, p in preds.items()}
    return {
        "family": name,
        "are": are,
        "bias": bias,
        "auto_choice": sel.chosen,
        "plain_choice": plain.chosen,
        "selection_backtest": {c.name: (c.backtest.mare if c.backtest else None) for c in sel.candidates.values()},
        "heldout_departures": [_in_tokens(d, test) for d in held],
        "nested_departures": [_in_tokens(d, train[-1]) for d in sel.departures],
        "params": {k: f.params for k, f in fits.items()},
        "decay": {k: f.decay for k, f in fits.items() if k == "lr_annealing"},
        "seconds": round(time.perf_counter() - t0, 1),
    }


def print_curve_table(base: list[dict], rows: list[dict]) -> None:
    cols = ["approach3", *CURVE_CANDIDATES, "average", "auto", "auto*"]
    head = {"approach3": "A3", "chinchilla": "chinchilla+", "kaplan": "kaplan+", "lr_annealing_sized": "lr_ann_sized"}
    print(
        f"{'family':<22}" + "".join(f"{head.get(c, c):>13}" for c in cols) + "  auto picked (auto*)        auto vs A3"
    )
    for b, r in zip(base, rows):
        vals = {"approach3": b["are_mean"], **r["are"]}
        cells = "".join(f"{100 * vals[c]:>12.2f}%" if c in vals else f"{'n/a':>13}" for c in cols)
        change = 100 * (vals["auto"] / vals["approach3"] - 1.0)
        picked = f"{r['auto_choice']} ({r['plain_choice']})"
        print(f"{r['family']:<22}{cells}  {picked:<26}{change:>+7.0f}%")
    print("nested selection backtest (MARE on the largest training model's last 30%):")
    for r in rows:
        bt = ", ".join(f"{k} {100 * v:.2f}%" for k, v in r["selection_backtest"].items() if v is not None)
        print(f"  {r['family']:<22}{bt}")
    print("level shifts of the held-out run's residual against the chosen law (log obs/pred; < 0: run got better),")
    print("and of the nested selection's held-out run (the largest training model) against its fit:")
    for r in rows:
        for key, what in (("heldout_departures", "held-out"), ("nested_departures", "nested")):
            shifts = ", ".join(
                f"{d['tokens_before'] / 1e9:.0f}B -> {d['tokens_after'] / 1e9:.0f}B tokens {100 * d['jump']:+.2f}% "
                f"(z {d['z']:+.1f})"
                for d in r[key]
            )
            print(f"  {r['family']:<22}{what:<10}{shifts or 'none'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--law", default="chinchilla")
    parser.add_argument("--json", type=pathlib.Path, default=None, help="write the results here")
    parser.add_argument("--no-curves", action="store_true", help="skip the curve laws and law selection")
    parser.add_argument("--families", default=None, help="comma-separated: OPT,GPT-3,LM-1 (default: all three)")
    args = parser.parse_args(argv)
    families = pick_families(args.families, FAMILIES)
    rows = [score_family(name, load(), law=args.law) for name, load in families.items()]
    print(f"{'family':<22} {'models':>6} {'train pts':>9} {'test pts':>8} {'ARE':>8} {'max':>8} {'bias':>8}")
    for r in rows:
        print(
            f"{r['family']:<22} {r['models_train']:>6} {r['points_train']:>9} {r['points_test']:>8} "
            f"{100 * r['are_mean']:>7.2f}% {100 * r['are_max']:>7.2f}% {100 * r['bias']:>+7.2f}%"
        )
    curve_rows = []
    if not args.no_curves:
        curve_rows = [score_curves(name, load()) for name, load in families.items()]
        print()
        print(f"mean ARE on the largest model's last 30% (A3 = Approach 3 with --law {args.law}, as above)")
        print_curve_table(rows, curve_rows)
    if args.json:
        args.json.write_text(json.dumps({"approach3": rows, "curves": curve_rows}, indent=2, default=float))
    return 0


if __name__ == "__main__":
    run_script(main, __file__)
