"""Benchmark: the curve laws and early stopping on this machine's own small sweeps (not a test).

    nice -n 10 python experiments/curve_sweeps.py --out results/curves      # ~2.5 h on 2 shared cores
    nice -n 10 python experiments/curve_sweeps.py --quick --out /tmp/curves # the smoke designs: 4+4+3+6 runs

Trains (or reuses, the store dedupes) four CPU sweeps of tiny models on the default corpus, 64-token
sequences, then prints four tables:

  1. IsoFLOP sweep (3 budgets x 4 sizes, cosine, validation every 25 steps): each run's final
     validation loss predicted from its first 30% of steps, (a) with the other runs complete (what
     early stopping sees) and (b) with every run seen only through its first 30%; next to them the
     same laws fitted on the complete curves (in-sample: how well the law's shape can fit at all).
  2. WSD cooldown branches (sweeps/specs/cooldowns.py) predicted from their stable run alone.
  3. Cosine runs predicted from constant-LR runs of the same sizes: from constant runs only, and
     from constant runs plus WSD runs (a constant run with a 20% cooldown).
  4. Early stopping on the same IsoFLOP sweep (a second store with `early_stop:`): runs stopped,
     compute saved, the stopped runs' predicted vs. actual final loss (the full sweep's), and the
     Chinchilla fit with and without the stopped runs next to the full sweep's, with intervals.
     Then a replay of the same decisions (sweeps/early_stop.decide) on the full sweep's records at
     several tolerances: each run checked at its checkpoints in the order the runs started, with
     the runs that had ended before it started as the finished ones (what the live sweep saw at
     least); compute saved, errors of the stopped runs, and the fits with and without them.

Predictions use fitting/loss_curves/curves.py (lr_annealing: Tissue et al. 2024 with a size term;
lr_annealing_sized: its data term times N^gamma; lr_area: the forward area only; chinchilla on every
checkpoint for reference) on validation-loss curves. Errors
are (predicted - observed) / observed of the final validation loss.

Figures it printed, with the date and the machine's load: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import pathlib
import time

import numpy as np
import polars as pl
import yaml

from scalelab import store
from scalelab.errors import UsageError, run_script
from scalelab.fitting.entry.fit_options import FitOptions
from scalelab.fitting.entry.fit_runs import fit_runs
from scalelab.fitting.estimate.io import read_runs
from scalelab.fitting.loss_curves.curves import fit_curves
from scalelab.sweeps.closed_loop.store_fit import fit_frame
from scalelab.sweeps.execution.execute import launch
from scalelab.sweeps.specs.spec import expand_sweep
from scalelab.sweeps.tracking.early_stop import STATUS, EarlyStopConfig, decide, predict_from_prefix
from scalelab.sweeps.tracking.run_curves import store_curves

COMMON = {
    "data": {"seq_len": 64, "val_sequences": 64},
    "optim": {"lr": 3.0e-3},
    "logging": {"wandb": "disabled"},
}
EXECUTION = {"max_failures": 2, "cpus_per_run": 1, "max_concurrent": 2}
ISO = {
    "name": "iso",
    "base": {
        **COMMON,
        "train": {"global_batch_tokens": 512},
        "schedule": {"name": "cosine"},
        "eval": {"interval_steps": 25},
        "checkpoint": {"interval_steps": 50, "keep_last": 1},
    },
    "isoflop": {"budgets": [1.8e11, 5.4e11, 1.6e12], "num_sizes": 4, "params": [3.5e4, 2.0e5], "flops": "6n"},
    "execution": EXECUTION,
}
EARLY_STOP = {"tolerance": 0.01, "min_fraction": 0.3, "check_every": 0.1, "min_runs": 3, "n_boot": 32}
COOLDOWNS = {
    "name": "wsd",
    "base": {
        **COMMON,
        "train": {"global_batch_tokens": 512},
        "schedule": {"name": "wsd", "decay_fraction": 0.2},
        "eval": {"interval_steps": 25},
    },
    "ladder": {"sizes": [5.0e4, 1.0e5], "tokens_per_param": [40]},
    "cooldowns": {"fractions": [0.25, 0.5]},
    "execution": EXECUTION,
}
SCHEDULES = {
    "name": "schedules",
    "base": {**COMMON, "train": {"global_batch_tokens": 512}, "eval": {"interval_steps": 25}},
    "ladder": {"sizes": [3.5e4, 7.0e4, 1.4e5], "tokens_per_param": [20]},
    "axes": {"schedule.name": ["constant", "wsd", "cosine"]},
    "execution": EXECUTION,
}
LAWS = ("lr_annealing", "lr_annealing_sized", "lr_area", "chinchilla")
SCHEDULE_LAWS = ("lr_annealing", "lr_area")  # tables 2 and 3: one size or a few (the size term is moot)
QUICK_LAWS = ("lr_annealing", "chinchilla")  # table 1 under --quick


def designs(quick: bool = False) -> dict[str, dict]:
    """The four sweeps' specs (iso, iso with early stopping, wsd, schedules). `quick`, the smoke test's:
    the two smallest budgets at two sizes, one WSD size, two schedule sizes, and early stopping with
    the fewest refits its spec allows; every table's code path still runs."""
    iso, wsd, sch, es = copy.deepcopy(ISO), copy.deepcopy(COOLDOWNS), copy.deepcopy(SCHEDULES), dict(EARLY_STOP)
    if quick:
        iso["isoflop"].update(budgets=ISO["isoflop"]["budgets"][:2], num_sizes=2)
        wsd["ladder"]["sizes"] = COOLDOWNS["ladder"]["sizes"][:1]
        sch["ladder"]["sizes"] = SCHEDULES["ladder"]["sizes"][:2]
        es.update(n_boot=8, backtest_runs=0)
    return {"iso": iso, "early_stop": {**iso, "early_stop": es}, "wsd": wsd, "schedules": sch}


def run_sweep(spec: dict, out: pathlib.Path, trainer=None) -> None:
    """Train `spec` into `out` (the store dedupes); `trainer` replaces Ray's launcher (a test's simulator)."""
    t0 = time.time()
    res = (trainer or launch)(expand_sweep(spec), out, spec_text=yaml.safe_dump(spec), log=lambda m: None)
    print(
        f"# sweep {spec['name']}: {len(res['trained'])} run(s) trained, {len(res['skipped'])} reused "
        f"({time.time() - t0:.0f} s) -> {out}"
    )


def pct(x: float) -> str:
    return f"{100 * x:+.2f}%" if math.isfinite(x) else "n/a"


def summary(errors: dict[str, np.ndarray]) -> str:
    return "  ".join(
        f"{k}: mean |err| {100 * np.nanmean(np.abs(v)):.2f}%, max {100 * np.nanmax(np.abs(v)):.2f}%"
        for k, v in errors.items()
    )


# ---------------------------------------------------------------------------------------------
# 1. final loss from the first 30%
# ---------------------------------------------------------------------------------------------


def prefix_table(sweep: pathlib.Path, fraction: float = 0.3, laws: tuple[str, ...] = LAWS) -> None:
    runs, curves = store_curves(sweep, source="val")
    finals = np.array([c.final_loss for c in curves])
    pre = [c.prefix(fraction) for c in curves]
    errs: dict[str, dict[str, np.ndarray]] = {"in-sample": {}, "others complete": {}, "all at 30%": {}}
    for law in laws:
        cf = fit_curves(curves, law)  # every run complete: how well the law's shape can fit at all
        errs["in-sample"][law] = np.array([cf.predict_final(c) for c in curves]) / finals - 1
        others = [[c for j, c in enumerate(curves) if j != i] for i in range(len(curves))]
        loo = [predict_from_prefix(pre[i], others[i], np.delete(finals, i), law)[0] for i in range(len(curves))]
        errs["others complete"][law] = (np.array(loo) - finals) / finals  # as early stopping predicts
        cf = fit_curves([p for p in pre if p.steps.size], law)
        errs["all at 30%"][law] = (np.array([cf.predict_final(c) for c in curves]) - finals) / finals
    print(f"\n## 1. final validation loss from the first {fraction:.0%} of steps ({sweep})")
    shown = ("in-sample", "others complete")
    head = "".join(f"{f'{law[:18]} ({s[:6]})':>28}" for s in shown for law in laws)
    print(f"{'run':<13}{'N':>8}{'steps':>7}{'C':>9}{'final':>8}{head}")
    for i, (row, c) in enumerate(zip(runs.iter_rows(named=True), curves)):
        cells = "".join(f"{pct(errs[s][law][i]):>28}" for s in shown for law in laws)
        print(f"{c.run_id:<13}{c.params:>8.0f}{c.num_steps:>7}{row['flops']:>9.2g}{finals[i]:>8.4f}{cells}")
    for s, e in errs.items():
        print(f"{s:>16}: {summary(e)}")


# ---------------------------------------------------------------------------------------------
# 2. cooldown branches from the stable run; 3. cosine from constant-LR runs
# ---------------------------------------------------------------------------------------------


def cooldown_table(sweep: pathlib.Path) -> None:
    runs, curves = store_curves(sweep, source="val")
    by_id = dict(zip(runs["run_id"], curves))
    print(f"\n## 2. WSD cooldown branches predicted from the stable run alone ({sweep})")
    print(
        f"{'branch':<13}{'N':>8}{'branch@':>8}{'steps':>7}{'observed':>10}"
        + "".join(f"{law:>16}" for law in SCHEDULE_LAWS)
    )
    errs: dict[str, list[float]] = {law: [] for law in SCHEDULE_LAWS}
    for row in runs.filter(pl.col("cooldown") == "stable").iter_rows(named=True):
        stable = by_id[row["run_id"]]
        fits = {law: fit_curves([stable], law) for law in SCHEDULE_LAWS}
        for b in runs.filter(pl.col("branch_of") == row["run_id"]).sort("tokens").iter_rows(named=True):
            c = by_id[b["run_id"]]
            cells = ""
            for law, cf in fits.items():
                e = cf.predict_final(c) / c.final_loss - 1.0
                errs[law].append(e)
                cells += f"{pct(e):>16}"
            print(f"{c.run_id:<13}{c.params:>8.0f}{b['branch_step']:>8}{c.num_steps:>7}{c.final_loss:>10.4f}{cells}")
    print(f"{'':>16}{summary({k: np.array(v) for k, v in errs.items()})}")


def schedule_table(sweep: pathlib.Path) -> None:
    runs, curves = store_curves(sweep, source="val")
    sched = runs["schedule"].to_list()
    pick = lambda names: [c for c, s in zip(curves, sched) if s in names]  # noqa: E731
    cosine = pick(("cosine",))
    print(f"\n## 3. cosine runs predicted from constant-LR runs of the same sizes ({sweep})")
    sources = {"constant only": pick(("constant",)), "constant + wsd": pick(("constant", "wsd"))}
    print(
        f"{'cosine run':<13}{'N':>8}{'steps':>7}{'observed':>10}"
        + "".join(f"{f'{law} ({s})':>30}" for s in sources for law in SCHEDULE_LAWS)
    )
    fits = {(s, law): fit_curves(train, law) for s, train in sources.items() for law in SCHEDULE_LAWS}
    errs = {k: [] for k in fits}
    for c in cosine:
        cells = ""
        for k, cf in fits.items():
            e = cf.predict_final(c) / c.final_loss - 1.0
            errs[k].append(e)
            cells += f"{pct(e):>30}"
        print(f"{c.run_id:<13}{c.params:>8.0f}{c.num_steps:>7}{c.final_loss:>10.4f}{cells}")
    print("".join(f"  {s}/{law}: mean |err| {100 * np.mean(np.abs(v)):.2f}%" for (s, law), v in errs.items()))
    for (s, law), cf in fits.items():
        if law == "lr_annealing":
            print(
                f"  {s}: fitted C = {cf.params['C']:.3g} (annealing bonus), decay {cf.decay}; "
                + ("; ".join(cf.warnings[:1]) or "no warnings")
            )


# ---------------------------------------------------------------------------------------------
# 4. early stopping
# ---------------------------------------------------------------------------------------------


def _fit_row(name: str, frame: pl.DataFrame, bootstrap: int) -> dict:
    try:
        table = read_runs(frame.drop("status"), min_rows=2)
        rep = fit_runs(table, FitOptions(law="chinchilla", bootstrap=bootstrap, backtest=False)).to_report()
    except UsageError as e:  # e.g. too few runs left once the stopped ones are excluded
        return {"name": name, "n": frame.height, "params": {}, "intervals": {}, "error": str(e)}
    return {"name": name, "n": frame.height, "params": rep["params"], "intervals": rep["intervals"]}


def runs_for_fit(path: pathlib.Path, stopped: str = "include") -> pl.DataFrame:
    """The runs a fit of `path` uses, stopped runs at their predicted loss and weight (store_fit.fit_frame)."""
    return fit_frame(store.load_runs(path), FitOptions(stopped=stopped), store_path=path)


def early_stop_table(full: pathlib.Path, es: pathlib.Path, bootstrap: int) -> None:
    runs_full = store.load_runs(full).filter(pl.col("status") == "done")
    runs_es = store.load_runs(es)
    actual = dict(zip(runs_full["run_id"], runs_full["loss"]))
    total = float(runs_es["flops"].sum())
    stopped = runs_es.filter(pl.col("status") == "stopped_early")
    saved = 0.0
    print(f"\n## 4. early stopping on the IsoFLOP sweep ({es}; the full sweep {full} trains every run)")
    print(
        f"{'run':<13}{'N':>8}{'C':>9}{'stopped at':>11}{'predicted':>10}{'95% interval':>20}{'actual':>9}{'error':>9}"
    )
    for row in stopped.sort("flops").iter_rows(named=True):
        st = store.read_status(store.run_path(es, row["run_id"]))
        lo, hi = st["predicted_loss_interval"]
        saved += st.get("saved_flops") or 0.0
        a = actual.get(row["run_id"], float("nan"))
        print(
            f"{row['run_id']:<13}{row['params']:>8.0f}{row['flops']:>9.2g}{st['stopped_fraction']:>10.0%} "
            f"{st['predicted_loss']:>10.4f}  [{lo:.4f}, {hi:.4f}]{a:>9.4f}{pct(st['predicted_loss'] / a - 1):>9}"
        )
    print(
        f"runs stopped: {stopped.height} of {runs_es.height}; training FLOPs (6ND) saved: {saved:.3g} of "
        f"{total:.3g} ({saved / total:.1%})"
    )
    checks = [e for e in store.read_events(es) if e["event"] == "early_stop_check" and np.isfinite(e["predicted_loss"])]
    if checks:
        print(f"early-stop checks with a fit: {len(checks)}, fitting time {sum(e['seconds'] for e in checks):.0f} s")
        err = np.array([e["predicted_loss"] / actual[e["run_id"]] - 1 for e in checks])
        cover = np.array([e["interval"][0] <= actual[e["run_id"]] <= e["interval"][1] for e in checks])
        boot = [e.get("interval_bootstrap", e["interval"]) for e in checks]
        cover_b = np.array([lo <= actual[e["run_id"]] <= hi for e, (lo, hi) in zip(checks, boot)])
        half = np.array([(e["interval"][1] - e["interval"][0]) / 2 / e["predicted_loss"] for e in checks])
        frac = np.array([e["fraction"] for e in checks])
        for lo, hi in ((0.3, 0.5), (0.5, 0.7), (0.7, 1.0)):
            m = (frac >= lo) & (frac < hi)
            if m.any():
                print(
                    f"  checks at {lo:.0%}-{hi:.0%} of a run: {int(m.sum()):>3}, |error| of the predicted final loss "
                    f"{100 * np.mean(np.abs(err[m])):.2f}% (max {100 * np.max(np.abs(err[m])):.2f}%), interval "
                    f"half-width {100 * np.mean(half[m]):.2f}%, intervals covering the actual {cover[m].mean():.0%} "
                    f"(bootstrap alone {cover_b[m].mean():.0%})"
                )
    rows = [
        _fit_row("full sweep (no early stopping)", runs_for_fit(full), bootstrap),
        _fit_row("early stopping, stopped runs included", runs_for_fit(es, stopped="include"), bootstrap),
        _fit_row("early stopping, stopped runs excluded", runs_for_fit(es, stopped="exclude"), bootstrap),
    ]
    _print_fits(rows, list(rows[0]["params"]), bootstrap)


def replay_checks(full: pathlib.Path, settings: dict | None = None) -> tuple[pl.DataFrame, dict[str, list]]:
    """Early-stopping checks replayed on a finished sweep:
    (runs, {run_id: [(fraction, pred, lo, hi, lo_bootstrap, hi_bootstrap, misspecification)]}).

    Each run is checked at its checkpoints (>= min_fraction, check_every apart) in the order the
    runs started, with the runs that had ended before it started as the finished ones. The checks
    do not depend on the tolerance, which only decides at which check a run stops.
    """
    cfg = EarlyStopConfig(**{**EARLY_STOP, **(settings or {}), "tolerance": 1e-9})
    runs, curves = store_curves(full, source="val")
    by_id = dict(zip(runs["run_id"], curves))
    events = store.read_events(full)
    start = {e["run_id"]: e["time"] for e in events if e["event"] == "start"}
    end = {e["run_id"]: e["time"] for e in events if e["event"] == "end"}
    ckpt = ISO["base"]["checkpoint"]["interval_steps"]
    checks: dict[str, list] = {}
    backtests: dict = {}
    for rid in sorted(start, key=start.get):
        c = by_id[rid]
        done = [r for r in end if end[r] < start[rid] and r in by_id]
        finished, losses = [by_id[r] for r in done], np.array([by_id[r].final_loss for r in done])
        last, checks[rid] = -math.inf, []
        for step in range(ckpt, c.num_steps, ckpt):
            frac = step / c.num_steps
            if frac < cfg.min_fraction or frac - last < cfg.check_every - 1e-9:
                continue
            last = frac
            d = decide(c.prefix(max_step=step), finished, losses, step, cfg, backtests)
            if math.isfinite(d.predicted_loss):
                checks[rid].append(
                    (d.fraction, d.predicted_loss, *d.interval, *d.interval_bootstrap, d.misspecification)
                )
                print(f"  replay {rid} at {d.fraction:.0%}: {d.reason} ({d.seconds:.0f} s)", flush=True)
    return runs, checks


def coverage_table(runs: pl.DataFrame, checks: dict[str, list]) -> None:
    """How often the replayed checks' 95% intervals cover the run's real final loss: the run
    bootstrap alone, and with the backtested misspecification term (sweeps/early_stop.decide)."""
    actual = dict(zip(runs["run_id"], runs["loss"]))
    rows = [(r[0], r[1] / actual[rid] - 1, actual[rid], *r[1:]) for rid, rs in checks.items() for r in rs]
    if not rows:
        return
    frac, err, act, pred, lo, hi, lo_b, hi_b, mis = (np.array(v, dtype=float) for v in zip(*rows))
    print(
        f"{'checks at':<12}{'n':>4}{'|error|':>9}{'bootstrap: cover':>18}{'half-width':>12}"
        f"{'+ misspec.: cover':>19}{'half-width':>12}{'misspec. sd':>13}"
    )
    for a, b in ((0.3, 0.5), (0.5, 0.7), (0.7, 1.0), (0.3, 1.0)):
        m = (frac >= a) & (frac < b)
        if not m.any():
            continue
        print(
            f"{f'{a:.0%}-{b:.0%}':<12}{int(m.sum()):>4}{100 * np.mean(np.abs(err[m])):>8.2f}%"
            f"{_cover(m, act, lo_b, hi_b):>18.0%}{_half(m, pred, lo_b, hi_b):>11.2f}%"
            f"{_cover(m, act, lo, hi):>19.0%}{_half(m, pred, lo, hi):>11.2f}%"
            f"{100 * np.nanmean(mis[m]) if np.isfinite(mis[m]).any() else math.nan:>12.2f}%"  # nan: no backtests
        )


def _cover(m: np.ndarray, act: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> float:
    return float(np.mean((lo[m] <= act[m]) & (act[m] <= hi[m])))


def _half(m: np.ndarray, pred: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> float:
    return float(100 * np.mean((hi[m] - lo[m]) / 2 / pred[m]))


def replay_stops(runs: pl.DataFrame, checks: dict[str, list], full: pathlib.Path, tolerance: float):
    """(fit frame with the stopped runs at their predicted loss and weight, stops) at `tolerance`."""
    z = 1.959964
    frame, stops = runs_for_fit(full), []
    for rid, rows in checks.items():
        for frac, pred, lo, hi, *_ in rows:
            if (hi - lo) / 2 / pred > tolerance:
                continue
            s = (math.log(hi) - math.log(lo)) / (2 * z)
            w = (tolerance / z) ** 2 / ((tolerance / z) ** 2 + s**2)
            row = runs.filter(pl.col("run_id") == rid)
            stops.append(
                {
                    "run_id": rid,
                    "fraction": frac,
                    "predicted": pred,
                    "actual": float(row["loss"][0]),
                    "flops": float(row["flops"][0]),
                }
            )
            hit = pl.col("run_id") == rid
            frame = frame.with_columns(
                pl.when(hit).then(pl.lit(pred)).otherwise(pl.col("loss")).alias("loss"),
                pl.when(hit).then(pl.lit(w)).otherwise(pl.col("weight")).alias("weight"),
                pl.when(hit).then(pl.lit(STATUS)).otherwise(pl.col("status")).alias("status"),
            )
            break
    return frame, stops


def replay_table(
    full: pathlib.Path, tolerances: list[float], bootstrap: int, cache: pathlib.Path, settings: dict | None = None
) -> None:
    total = float(store.load_runs(full)["flops"].sum())
    if cache.exists():  # the checks take minutes; the tolerances and fits below are cheap
        runs, checks = store_curves(full, source="val")[0], json.loads(cache.read_text())
    else:
        runs, checks = replay_checks(full, settings)
        cache.write_text(json.dumps(checks))
    print(f"\nreplayed on {full} ({sum(map(len, checks.values()))} checks at checkpoints, >= 30% and 10% apart):")
    coverage_table(runs, checks)
    rows = [_fit_row("no early stopping", runs_for_fit(full), bootstrap)]
    summary_rows = []
    for tol in tolerances:
        frame, stops = replay_stops(runs, checks, full, tol)
        saved = sum(s["flops"] * (1 - s["fraction"]) for s in stops)
        errs = np.abs([s["predicted"] / s["actual"] - 1 for s in stops])
        summary_rows.append(
            f"tolerance {tol:.0%}: {len(stops)} of {frame.height} runs stopped, FLOPs saved {saved:.3g} "
            f"({saved / total:.1%})"
            + (f", stopped runs' |error| mean {100 * errs.mean():.2f}%, max {100 * errs.max():.2f}%" if stops else "")
        )
        if stops:
            rows.append(_fit_row(f"tol {tol:.0%}, stopped runs included", frame, bootstrap))
            done = frame.filter(pl.col("status") == "done")
            rows.append(_fit_row(f"tol {tol:.0%}, stopped runs excluded", done, bootstrap))
    print("\n".join(summary_rows))
    _print_fits(rows, list(rows[0]["params"]), bootstrap)


def _print_fits(rows: list[dict], names: list[str], bootstrap: int) -> None:
    print(f"Chinchilla fits of final validation loss (Approach 3, {bootstrap}-replicate bootstrap 95% intervals):")
    print(f"{'':<40}{'runs':>5}" + "".join(f"{n:>26}" for n in names))
    for r in rows:
        if "error" in r:
            print(f"{r['name']:<40}{r['n']:>5}  no fit: {r['error']}")
            continue
        cells = ""
        for n in names:
            lo, hi = r["intervals"].get(n, (None, None))
            iv = f"[{lo:.3g}, {hi:.3g}]" if lo is not None and hi is not None else ""
            cells += f"{r['params'][n]:>9.3g} {iv:>16}"
        print(f"{r['name']:<40}{r['n']:>5}{cells}")


def main(argv: list[str] | None = None, trainer=None) -> int:
    """The four sweeps (trained by `trainer` when given, else Ray's launcher), then the tables asked for."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("results/curves"))
    parser.add_argument("--bootstrap", type=int, default=200)
    parser.add_argument("--skip-training", action="store_true", help="only analyse what the stores hold")
    parser.add_argument("--tolerances", type=float, nargs="+", default=[0.01, 0.02, 0.03, 0.05])
    parser.add_argument("--tables", default="1234", help="which tables to print (digits)")
    parser.add_argument("--replay-boot", type=int, default=EARLY_STOP["n_boot"], help="refits per replayed check")
    parser.add_argument("--replay-backtests", type=int, default=8, help="finished runs backtested per replayed check")
    parser.add_argument("--quick", action="store_true", help="the smoke test's small designs (designs(quick=True))")
    args = parser.parse_args(argv)
    specs = designs(args.quick)
    full, es = args.out / "full" / "iso", args.out / "early_stop" / "iso"
    wsd, sch = args.out / "full" / "wsd", args.out / "full" / "schedules"
    if not args.skip_training:
        run_sweep(specs["iso"], full, trainer)
        run_sweep(specs["early_stop"], es, trainer)  # another store root: nothing is linked from `full`
        run_sweep(specs["wsd"], wsd, trainer)
        run_sweep(specs["schedules"], sch, trainer)
    if "1" in args.tables:
        prefix_table(full, laws=QUICK_LAWS if args.quick else LAWS)
    if "2" in args.tables:
        cooldown_table(wsd)
    if "3" in args.tables:
        schedule_table(sch)
    if "4" in args.tables:
        if es.exists():  # the live early-stopping sweep (skipped when it was not trained)
            early_stop_table(full, es, args.bootstrap)
        replay = {"n_boot": args.replay_boot, "backtest_runs": args.replay_backtests}
        replay_table(full, args.tolerances, args.bootstrap, args.out / "replay_checks.json", replay)
    return 0


if __name__ == "__main__":
    run_script(main, __file__)
