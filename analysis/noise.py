"""Evaluation-noise analysis: is a metric good enough to decide anything with this sweep?

Following AI2's Signal and Noise study (Heineman et al. 2025): a benchmark metric whose
signal-to-noise ratio is low gives wrong small-scale decisions, and switching from accuracy to
bits-per-byte and averaging the last checkpoints fixes much of it. Per (task, metric):

    final_r      mean of run r's last `last_n` checkpoint values (the value decisions use)
    ckpt_std     checkpoint-to-checkpoint noise: mean over runs of the std of the last `last_n`
                 values about a straight line in step (ddof=2; the training trend is not noise;
                 NoiseOptions(detrend=False) gives the plain std, ddof=1, of Signal and Noise)
    seed_std     seed variance: sqrt of the mean over seed groups (runs that differ only by seed)
                 of the variance (ddof=1) of final_r within the group; NaN without such groups
    signal       spread across the sweep: max - min of the seed-averaged finals of the configs
    noise        sqrt(seed_std^2 + ckpt_std^2) (the terms that are known); with neither (one seed,
                 one checkpoint per run) the evaluation's own reported stderr (eval_se, the
                 finite-example noise: a lower bound), as the column noise_source says
    snr          signal / noise
    tau          monotonicity: mean over runs of Kendall's tau between step and the metric,
                 signed so that improving with training is +1
    decision_acc over pairs of candidates (configs that differ in anything but seed, size and
                 token count) present at a smaller scale and at the largest scale they share:
                 the fraction of (pair, smaller scale) whose ordering by the seed-averaged final
                 agrees with the ordering at the largest scale; NaN with one candidate.

    res = noise_table(load_store_runs(DIR))                  # polars frame, one row per (task, metric)
    recommendations(res)                                     # ["use bpb over acc for ...", ...]
    fit_weights(runs, evals, "val", "loss", last_n=3)        # 1 / variance per run, for the fitter
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl
from scipy import stats

from scalelab.analysis.store_reader import load_evals, lower_is_better

SNR_DECIDE = 2.0  # below this the spread of the sweep is within ~2 noise sd: too noisy to rank


@dataclass(kw_only=True, slots=True)
class NoiseOptions:
    last_n: int = 5  # checkpoints averaged for a run's final value and used for checkpoint noise
    snr_decide: float = SNR_DECIDE
    detrend: bool = True  # checkpoint noise about a straight line in step (False: plain std, ddof=1)


def _finals(ev: pl.DataFrame, last_n: int, detrend: bool = True) -> pl.DataFrame:
    """Per run: final (mean of last n), ckpt_std (std of last n), n_ckpt, tau vs step."""
    rows = []
    for (run_id,), grp in ev.sort("step").group_by(["run_id"], maintain_order=True):
        values = grp["value"].to_numpy()
        steps = grp["step"].to_numpy()
        tail = values[-last_n:]
        ckpt_std = float("nan")
        if not detrend and tail.size >= 2:
            ckpt_std = float(tail.std(ddof=1))
        elif tail.size >= 3:
            # residuals about a straight line in step: the training trend over the tail is not noise
            t = steps[-last_n:].astype(float)
            resid = tail - np.polyval(np.polyfit(t, tail, 1), t)
            ckpt_std = float(np.sqrt(np.sum(resid**2) / (tail.size - 2)))
        tau = float("nan")
        if values.size >= 3 and np.ptp(values) > 0:
            tau = float(stats.kendalltau(steps, values).statistic)
        se = grp["stderr"].to_numpy()[-last_n:] if "stderr" in grp.columns else np.array([np.nan])
        se = se[np.isfinite(se.astype(float))] if se.size else se
        rows.append(
            dict(
                run_id=run_id,
                final=float(tail.mean()),
                eval_se=float(np.mean(se)) if se.size else float("nan"),
                ckpt_std=ckpt_std,
                n_ckpt=int(tail.size),
                tau=tau,
            )
        )
    return pl.DataFrame(rows)


def _decision_accuracy(per_run: pl.DataFrame) -> tuple[float, int]:
    """Agreement of candidate orderings at smaller scales with the largest shared scale."""
    cand = per_run.group_by(["candidate", "scale"]).agg(pl.col("final").mean(), pl.col("flops").mean())
    names = sorted(set(cand["candidate"]))
    if len(names) < 2:
        return float("nan"), 0
    table = {(r["candidate"], r["scale"]): (r["final"], r["flops"]) for r in cand.iter_rows(named=True)}
    agree = total = 0
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            shared = [s for (c, s) in table if c == a and (b, s) in table]
            if len(shared) < 2:
                continue
            shared.sort(key=lambda s: table[(a, s)][1])  # by compute
            target = shared[-1]
            want = np.sign(table[(a, target)][0] - table[(b, target)][0])
            for s in shared[:-1]:
                got = np.sign(table[(a, s)][0] - table[(b, s)][0])
                total += 1
                agree += int(got == want)
    if total == 0:
        return float("nan"), 0
    return agree / total, total


def noise_table(
    runs: pl.DataFrame, evals: pl.DataFrame | None = None, options: NoiseOptions | None = None
) -> pl.DataFrame:
    """One row per (task, metric) with the quantities of the module docstring.

    Args:
        runs: `scalelab.analysis.store_reader.load_store_runs(...)` (needs run_id, seed_group, scale,
            candidate, flops).
        evals: per-checkpoint rows (default: read from the runs' evals.parquet).
        options: last_n and the SNR threshold.
    """
    opts = options or NoiseOptions()
    evals = evals if evals is not None else load_evals(runs)
    keys = runs.select("run_id", "seed_group", "scale", "candidate", pl.col("flops").cast(pl.Float64))
    out = []
    for (task, metric), ev in evals.group_by(["task", "metric"], maintain_order=True):
        per_run = _finals(ev, opts.last_n, opts.detrend).join(keys, on="run_id", how="inner")
        if per_run.is_empty():
            continue
        sign = -1.0 if lower_is_better(metric) else 1.0
        groups = per_run.group_by("seed_group").agg(pl.col("final").var(ddof=1).alias("var"), pl.len().alias("n"))
        seeded = groups.filter(pl.col("n") >= 2)
        seed_std = float(math.sqrt(seeded["var"].mean())) if seeded.height else float("nan")
        config_means = per_run.group_by("seed_group").agg(pl.col("final").mean())["final"]
        signal = float(config_means.max() - config_means.min()) if config_means.len() > 1 else float("nan")
        ckpt_std = (
            float(per_run["ckpt_std"].drop_nans().mean()) if per_run["ckpt_std"].drop_nans().len() else float("nan")
        )
        parts = [x for x in (seed_std, ckpt_std) if not math.isnan(x)]
        eval_se = float(per_run["eval_se"].drop_nans().mean()) if per_run["eval_se"].drop_nans().len() else math.nan
        noise_source = "seed+ckpt" if parts else ("eval stderr" if not math.isnan(eval_se) else "none")
        # without seeds or checkpoints the evaluation's own standard error (finite example set) is
        # the only noise estimate: a lower bound on the real noise
        noise = math.sqrt(sum(x * x for x in parts)) if parts else eval_se
        snr = signal / noise if noise and not math.isnan(noise) and noise > 0 else float("nan")
        tau = float((sign * per_run["tau"].drop_nans()).mean()) if per_run["tau"].drop_nans().len() else float("nan")
        dec, n_dec = _decision_accuracy(per_run)
        out.append(
            dict(
                task=task,
                metric=metric,
                n_runs=per_run.height,
                mean=float(per_run["final"].mean()),
                signal=signal,
                seed_std=seed_std,
                ckpt_std=ckpt_std,
                eval_se=eval_se,
                noise=noise,
                noise_source=noise_source,
                snr=snr,
                tau=tau,
                decision_acc=dec,
                decision_pairs=n_dec,
            )
        )
    return pl.DataFrame(out).sort("task", "metric")


def recommendations(table: pl.DataFrame, snr_decide: float = SNR_DECIDE) -> list[str]:
    """Plain-language advice: bpb over accuracy where its SNR is higher; metrics too noisy to decide."""
    notes = []
    rows = {(r["task"], r["metric"]): r for r in table.iter_rows(named=True)}
    for task in sorted({t for t, _ in rows}):
        bpb = rows.get((task, "bpb"))
        for acc_name in ("acc", "acc_norm"):
            acc = rows.get((task, acc_name))
            if bpb is None or acc is None or math.isnan(bpb["snr"]) or math.isnan(acc["snr"]):
                continue
            if bpb["snr"] > acc["snr"]:
                dec = ""
                if not (math.isnan(bpb["decision_acc"]) and math.isnan(acc["decision_acc"])):
                    dec = f", decision accuracy {_pct(bpb['decision_acc'])} vs {_pct(acc['decision_acc'])}"
                src = "" if bpb["noise_source"] == "seed+ckpt" else f"; noise = {bpb['noise_source']} only"
                notes.append(
                    f"{task}: decide with bpb, not {acc_name} (SNR {bpb['snr']:.1f} vs {acc['snr']:.1f}{dec}{src})"
                )
            else:
                notes.append(f"{task}: {acc_name} has the higher SNR here ({acc['snr']:.1f} vs bpb {bpb['snr']:.1f})")
    for (task, metric), r in sorted(rows.items()):
        if not math.isnan(r["snr"]) and r["snr"] < snr_decide:
            notes.append(
                f"{task} {metric}: SNR {r['snr']:.2f} < {snr_decide:g}: the sweep's spread is within "
                "the noise; "
                "do not rank runs on it (average more checkpoints/seeds, or use a continuous metric)"
            )
    return notes


def _pct(x: float) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{100 * x:.0f}%"


def fit_weights(
    runs: pl.DataFrame,
    evals: pl.DataFrame,
    task: str,
    metric: str,
    last_n: int = 5,
    seed_std: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(final value, weight = 1 / variance) per row of `runs`, for weighting a law fit.

    variance = seed_std^2 + ckpt_std_r^2 / n_r: the spread between seeds plus the checkpoint noise of
    the mean of the run's last n values (the eval's own stderr stands in for ckpt_std_r when a run
    has fewer than 3 checkpoints). Weights are normalised to mean 1; when some run has no noise
    estimate at all, every run gets weight 1. Runs without the metric get NaN and weight 0.
    """
    ev = evals.filter((pl.col("task") == task) & (pl.col("metric") == metric))
    per_run = {r["run_id"]: r for r in _finals(ev, last_n).iter_rows(named=True)} if ev.height else {}
    if seed_std is None:
        tab = noise_table(runs, ev, NoiseOptions(last_n=last_n)) if ev.height else None
        seed_std = float(tab["seed_std"][0]) if tab is not None and tab.height else float("nan")
    seed_var = 0.0 if seed_std is None or math.isnan(seed_std) else seed_std**2
    values, var = [], []
    for run_id in runs["run_id"]:
        r = per_run.get(run_id)
        if r is None:
            values.append(float("nan"))
            var.append(float("inf"))
            continue
        # checkpoint noise of the tail mean; else the eval's own stderr; else unknown (0)
        sd = r["ckpt_std"] if not math.isnan(r["ckpt_std"]) else r["eval_se"]
        ck = 0.0 if math.isnan(sd) else sd**2 / r["n_ckpt"]
        values.append(r["final"])
        var.append(seed_var + ck)
    var_arr = np.asarray(var)
    has = np.isfinite(var_arr)
    w = np.zeros_like(var_arr)
    if has.any() and np.all(var_arr[has] > 0):
        w[has] = 1.0 / var_arr[has]
    else:  # some run has no noise estimate at all: equal weights for the runs that have values
        w = has.astype(float)
    if w.sum() > 0:
        w = w / w[w > 0].mean()
    return np.asarray(values), w


def format_table(table: pl.DataFrame) -> str:
    """The table `scalelab noise` prints."""
    head = (
        f"{'task':<28} {'metric':<9} {'runs':>4} {'mean':>8} {'signal':>8} {'seed sd':>8} {'ckpt sd':>8} "
        f"{'eval se':>8} {'SNR':>7} {'tau':>6} {'decision':>9}  noise from"
    )
    lines = [head, "-" * len(head)]
    for r in table.iter_rows(named=True):
        lines.append(
            f"{r['task'][:28]:<28} {r['metric']:<9} {r['n_runs']:>4} {r['mean']:>8.4f} {_num(r['signal'])} "
            f"{_num(r['seed_std'])} {_num(r['ckpt_std'])} {_num(r['eval_se'])} {_num(r['snr'], 7, 2)} "
            f"{_num(r['tau'], 6, 2)} {_pct(r['decision_acc']):>5} ({r['decision_pairs']})  {r['noise_source']}"
        )
    return "\n".join(lines)


def _num(x: float, width: int = 8, digits: int = 4) -> str:
    return f"{'n/a':>{width}}" if x is None or math.isnan(x) else f"{x:>{width}.{digits}f}"
