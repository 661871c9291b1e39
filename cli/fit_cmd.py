"""`scalelab fit`, `scalelab predict`, `scalelab allocate`: scaling-law fits from a run table.

    scalelab fit runs.csv --law chinchilla --approach 3 --bootstrap 200 --json --out fit.json
    scalelab fit results/iso                         # a sweep store: the fit `sweep next` makes of it
    scalelab fit results/iso --law auto              # ... with the law picked by backtest
    scalelab fit metrics.csv --law lr_annealing      # a table of logged steps (run_id, step, lr, params, loss)
    scalelab predict fit.json --params 7e9 --tokens 1.4e12
    scalelab predict fit.json --flops 1e23          # compute-optimal loss and allocation
    scalelab allocate fit.json --flops 1e23 1e24

DATA is CSV or Parquet with columns params, tokens, loss (optional flops, run_id, group, weight);
other names map with --params-col etc. tokens may be derived as flops / (6 params). DATA may also
be a table of logged steps (columns run_id, step, lr, params, loss[, tokens]: an export of another
framework's metrics), or a sweep directory / store root: its runs table's done runs (plus, with
--stopped include, the runs stopped early at their predicted loss and weight) and their loss
curves for the curve laws, fitted with the options of the spec's `fit:` section (law, loss,
bootstrap, noise floor; 200 starts, seed 0: scalelab.sweeps.closed_loop.store_fit) unless an option here
says otherwise - so `scalelab fit DIR`, `sweep next DIR` and `scalelab report DIR` agree.
--law auto fits every candidate law and picks one by the held-out-largest backtest
(scalelab.fitting.selection.select). The fit is scalelab.fitting.entry.fit_runs.fit_runs; this module parses
arguments and prints.

Imports sit in the functions that use them: building this parser is part of every `scalelab` command's
start-up, which must not load the fitting stack, polars or torch.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib

from scalelab.errors import UsageError
from scalelab.fitting.entry.saved_fit import load_saved_fit


def add_parser(sub) -> None:
    _add_fit(sub)
    _add_predict(sub)
    _add_allocate(sub)


FIT_DESCRIPTION = """\
Fit a scaling law to a run table or a sweep store; print the law, its parameters with intervals
(each named with what it is), the backtests and warnings. Nothing is written unless --out.

DATA is a CSV or Parquet table with columns params, tokens, loss (optional flops, run_id, group,
weight; other names with --params-col etc.; tokens may be derived as flops / (6 params)); a table
of logged steps (run_id, step, lr, params, loss) for the curve laws; or a sweep directory / store
root: its done runs, fitted with the options of its spec's `fit:` section unless an option here
says otherwise, so that `scalelab fit DIR`, `sweep next DIR` and `scalelab report DIR` agree.

examples:
  scalelab fit runs.csv --law chinchilla --bootstrap 200 --out fit.json
  scalelab fit results/iso                 # a sweep store: the fit `sweep next` makes of it
  scalelab fit results/iso --law auto      # the stacked law (Chinchilla and Kaplan by forward backtests)
"""


def _add_fit(sub) -> None:
    """The `fit` subcommand's arguments. One piece: one add_argument per flag, in help order."""
    p = sub.add_parser(
        "fit", help="fit a scaling law to a run table (CSV/Parquet) or a sweep store", description=FIT_DESCRIPTION
    )
    p.add_argument("data", help="CSV or Parquet file, one row per run/checkpoint; or a sweep directory / store root")
    p.add_argument(
        "--law",
        default=None,
        help="law form for approach 3 (default chinchilla; a sweep store: its spec's fit.law); auto: the stacked "
        "law (Chinchilla, and Kaplan when forward backtests say Chinchilla drifts; --candidates); select: one law "
        "chosen by the held-out-largest backtest, curve laws included; lr_annealing, lr_area, lr_annealing_sized: "
        "curve laws (need curves: a sweep directory or a table of logged steps)",
    )
    p.add_argument(
        "--candidates",
        default=None,
        help="--law auto: the stacked forms, incumbent first, comma-separated (default chinchilla,kaplan; a form "
        "may weight runs by compute: chinchilla@flops)",
    )
    p.add_argument(
        "--evidence",
        choices=("growth", "level"),
        default=None,
        help="--law auto: what moves weight off the incumbent: its forward error growing with distance (growth, "
        "default) or nonzero per decade (level); docs/extrapolation.md",
    )
    p.add_argument(
        "--stack-point",
        choices=("bagged", "rule"),
        default=None,
        help="--law auto: the weights that predict: the mean of the rule's bootstrap draws that can test the "
        "evidence (bagged, default) or the rule's own all-or-nothing decision (rule); docs/extrapolation.md",
    )
    p.add_argument(
        "--params",
        choices=("total", "nonembed"),
        default=None,
        help="sweep stores: fit on total parameters (default) or without the embedding table",
    )
    p.add_argument(
        "--stopped",
        choices=("include", "exclude"),
        default=None,
        help="sweep stores: runs stopped early enter at their predicted loss, weighted by its precision (include) "
        "or not at all (exclude, the default, as `sweep next`)",
    )
    p.add_argument(
        "--curve-source", choices=("auto", "val", "train"), default="auto", help="sweep stores: which loss curves"
    )
    p.add_argument("--approach", type=int, choices=(1, 2, 3), default=3, help="Chinchilla approach (default 3)")
    p.add_argument(
        "--isoflop-shape",
        choices=("parabola", "power"),
        default=None,
        help="--approach 2: each IsoFLOP slice fitted with a parabola in ln N (Chinchilla's, default) or with the "
        "curve's own asymmetric shape, exponents shared across slices (no grid bias; docs/extrapolation.md)",
    )
    p.add_argument(
        "--bootstrap",
        type=int,
        default=None,
        metavar="B",
        help="bootstrap resamples (0: delta method; default 0, a sweep store: its spec's fit.bootstrap)",
    )
    p.add_argument(
        "--holdout-frac",
        type=float,
        default=None,
        metavar="F",
        help="hold out the top F of runs by FLOPs in the backtest (default: the whole largest budget)",
    )
    p.add_argument("--no-backtest", action="store_true", help="skip the backtests (on by default)")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap, the drawn starts and the backtests")
    p.add_argument(
        "--starts",
        type=int,
        default=None,
        metavar="K",
        help="K evenly spaced starts of the law's start grid (default: all; a sweep store: 200 drawn at random)",
    )
    p.add_argument("--level", type=float, default=0.95, help="interval level (default 0.95)")
    p.add_argument("--objective", choices=("huber", "squared"), default="huber", help="loss on the log-loss residuals")
    p.add_argument("--delta", type=float, default=1e-3, help="Huber threshold on log-loss residuals")
    for role in ("params", "tokens", "flops", "run-id", "group", "unique-tokens", "weight"):
        col = role.replace("-", "_")
        p.add_argument(f"--{role}-col", default=col, metavar="NAME", help=f"the table's {col} column")
    p.add_argument(
        "--loss-col", default=None, metavar="NAME", help="the loss column (default loss; a sweep store: fit.loss)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--out",
        type=pathlib.Path,
        default=None,
        metavar="FIT.json",
        help="save the fit with its parameter samples (what predict, allocate and plan-run read); default: "
        "nothing is written",
    )
    p.set_defaults(func=run_fit)


def _add_predict(sub) -> None:
    q = sub.add_parser(
        "predict",
        help="predict loss from a saved fit",
        description="Predict the loss at (N, D) from a saved fit, with the interval of the law's parameters (CI) "
        "and of a new run (PI: plus the run-to-run noise); with --flops, the compute-optimal N*, D* and loss "
        "at each budget instead.\n\nexamples:\n  scalelab predict fit.json --params 7e9 --tokens 1.4e12\n"
        "  scalelab predict fit.json --flops 1e23 1e24",
    )
    q.add_argument(
        "fit", type=pathlib.Path, help="FIT.json written by `scalelab fit --out` (or a sweep's fits/round_K.json)"
    )
    q.add_argument("--params", type=float, nargs="+", default=None, metavar="N", help="model sizes N (parameters)")
    q.add_argument(
        "--tokens", type=float, nargs="+", default=None, metavar="D", help="training tokens D, one per --params"
    )
    q.add_argument(
        "--unique-tokens",
        type=float,
        nargs="+",
        default=None,
        metavar="U",
        help="unique tokens (data-constrained laws only; repeated epochs beyond them)",
    )
    q.add_argument(
        "--flops", type=float, nargs="+", default=None, metavar="C", help="FLOP budgets: the compute-optimal allocation"
    )
    q.add_argument("--level", type=float, default=None, help="interval level (default: the fit's, usually 0.95)")
    q.add_argument("--json", action="store_true", help="print one JSON object")
    q.set_defaults(func=run_predict)


def _add_allocate(sub) -> None:
    a = sub.add_parser(
        "allocate",
        help="compute-optimal N*, D* at FLOP budgets from a saved fit",
        description="The compute-optimal model size N*, tokens D* and loss L* at FLOP budgets (or the size for "
        "which a data budget is optimal), each with its interval from the saved fit's parameter samples.\n\n"
        "example:\n  scalelab allocate fit.json --flops 1e23 1e24",
    )
    a.add_argument(
        "fit", type=pathlib.Path, help="FIT.json written by `scalelab fit --out` (or a sweep's fits/round_K.json)"
    )
    what = a.add_mutually_exclusive_group(required=True)
    what.add_argument("--flops", type=float, nargs="+", metavar="C", help="FLOP budget(s)")
    what.add_argument(
        "--tokens", type=float, nargs="+", metavar="D", help="data budget(s): the size for which D is optimal"
    )
    a.add_argument("--level", type=float, default=None, help="interval level (default: the fit's, usually 0.95)")
    a.add_argument("--json", action="store_true", help="print one JSON object")
    a.set_defaults(func=run_allocate)


def _columns(args):
    from scalelab.fitting.estimate.io import ColumnMap

    return ColumnMap(
        params=args.params_col,
        tokens=args.tokens_col,
        loss=args.loss_col or "loss",
        flops=args.flops_col,
        run_id=args.run_id_col,
        group=args.group_col,
        unique_tokens=args.unique_tokens_col,
        weight=args.weight_col,
    )


def _clean(obj):
    """JSON-safe copy: non-finite floats become null (json.dumps would write invalid NaN)."""
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _fmt(x) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.4g}"


def _iv(iv) -> str:
    return f"[{_fmt(iv[0])}, {_fmt(iv[1])}]" if iv else "-"


def _options(args: argparse.Namespace, store: pathlib.Path | None):
    """FitOptions from the arguments; for a sweep store, the spec's where an argument is not given
    (scalelab.fitting.entry.fit_options.fit_options: one builder, one set of checks, errors naming the flag)."""
    from scalelab.fitting.entry.fit_options import fit_options

    given = dict(
        law=args.law,
        candidates=tuple(c.strip() for c in args.candidates.split(",") if c.strip()) if args.candidates else None,
        params=args.params,
        evidence=args.evidence,
        stack_point=args.stack_point,
        approach=args.approach,
        isoflop_shape=args.isoflop_shape,
        loss=args.loss_col,
        stopped=args.stopped,
        starts=args.starts,
        bootstrap=args.bootstrap,
        seed=args.seed,
        level=args.level,
        objective=args.objective,
        delta=args.delta,
        backtest=not args.no_backtest,
        holdout_frac=args.holdout_frac,
    )
    flags = {k: "--" + k.replace("_", "-") for k in given} | {"loss": "--loss-col", "backtest": "--no-backtest"}
    if store is None:
        return fit_options(None, flags=flags, **given)
    from scalelab.sweeps.closed_loop.store_fit import store_fit_spec

    return fit_options(store_fit_spec(store), flags=flags, **given)


def _fit(args: argparse.Namespace):
    """The ScalingFit of DATA: a sweep store (its runs table), a table of logged steps, or a run table."""
    from scalelab.fitting.entry.fit_runs import fit_runs
    from scalelab.fitting.estimate.io import read_runs
    from scalelab.fitting.forms.laws import CURVE_LAWS
    from scalelab.store import objects

    wants_curves = args.law == "select" or args.law in CURVE_LAWS
    path = objects.local_view(args.data, "DATA") if objects.is_url(args.data) else pathlib.Path(args.data)
    if path.is_dir():
        from scalelab.sweeps.closed_loop.store_fit import fit_store
        from scalelab.sweeps.tracking.run_curves import store_curves

        options = _options(args, path)
        curves = None
        if wants_curves:
            statuses = ("done", "stopped_early") if options.stopped == "include" else ("done",)
            curves = store_curves(path, source=args.curve_source, statuses=statuses, loss_col=options.loss)[1]
        return fit_store(path, options, curves=curves)[0]
    options = _options(args, None)
    if wants_curves and path.is_file():
        from scalelab.analysis.tables import read_table
        from scalelab.fitting.loss_curves.curves import curves_from_table, is_curve_table

        frame = read_table(path)
        if is_curve_table(frame):
            table, curves = curves_from_table(frame)
            return fit_runs(read_runs(table, columns=_columns(args), min_rows=2), options, curves=curves)
    return fit_runs(read_runs(str(path), columns=_columns(args), min_rows=2), options)


def run_fit(args: argparse.Namespace) -> int:
    if not 0.0 < args.level < 1.0:
        raise UsageError(f"--level must be in (0, 1), got {args.level}")
    fit = _fit(args)
    report = fit.to_report(keep_samples=args.out is not None)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(_clean(report), indent=1))
    if args.json:
        shown = {k: v for k, v in report.items() if k != "samples"}
        print(json.dumps(_clean(shown)))
        return 0
    _print_parameters(report)
    for member, fit in report.get("members", {}).items():  # curve laws and the average
        params = ", ".join(f"{k}={_fmt(v)}" for k, v in fit["params"].items())
        extra = f"  decay {fit['decay']}" if "decay" in fit and member == "lr_annealing" else ""
        cal = report.get("calibration", {}).get(member)
        print(f"  {member}: {params}{extra}" + (f"  (x{cal:.4f} to the table's loss)" if cal else ""))
    for proto, bt in report["backtest"].items():
        if "mare" not in bt:
            print(f"backtest {proto}: skipped ({bt.get('skipped', '')})")
            continue
        print(
            f"backtest {proto}: MARE {100 * bt['mare']:.2f}%  bias {100 * bt['bias']:+.2f}%  "
            f"(train {bt['n_train']}, test {bt['n_test']})"
        )
    if "gates" in report:
        from scalelab.sweeps.closed_loop.proposal_text import format_gates

        print(format_gates(report["gates"]))
    _print_frontier(fit)
    if "stacked" in report:
        _print_stacked(report["stacked"])
    elif "selection" in report:
        _print_selection(report["selection"])
    for w in report["warnings"]:
        print(f"warning: {w}")
    if args.out is not None:
        print(f"saved {args.out}")
    return 0


def _print_parameters(report: dict) -> None:
    """The law that made the numbers, its formula, and each parameter with its interval and what it is."""
    from scalelab.fitting.forms.fit_terms import law_formula, law_heading, meaning, stacked_note

    lvl = int(round(100 * report["level"]))
    print(
        f"law {law_heading(report)}  approach {report['approach']}  points {report['n_points']}  "
        f"objective {_fmt(report['objective'])}  ({report['code_version']})"
    )
    if stacked_note(report):
        print(stacked_note(report))
    if law_formula(report["law"]):
        print(f"{report['law']}: {law_formula(report['law'])}")
    interval = f"{lvl}% interval ({report['interval_method']})"
    width = max(len(interval), 24) + 3
    print(f"{'parameter':<16}{'value':>12}   {interval:<{width}}what it is")
    for name, val in {**report["params"], **report["derived"]}.items():
        shown = _iv(report["intervals"].get(name))
        print(f"{name:<16}{_fmt(val):>12}   {shown:<{width}}{meaning(report['law'], name)}")


def _print_frontier(fit) -> None:
    """How the runs were grouped, the law's degeneracy findings (one line each) and the frontier with
    its compute-optimal prediction at 10x the largest budget beside the surface's."""
    from scalelab.fitting.allocation.frontier import format_frontier
    from scalelab.fitting.entry.degeneracy import DEGENERATE

    if fit.groups:
        print(f"groups: {fit.groups}")
    for f in fit.degeneracy:
        if f.name in DEGENERATE:
            print(f"degenerate law: {f.line}")
    far = 10.0 * float(fit.budgets.max())
    if fit.frontier is not None:
        print("\n".join(format_frontier(fit.frontier)))
        print("  " + fit.compute_optimal(far).line())
        if not fit.surface_holds:
            print("  the law is degenerate: compute-optimal predictions come from the frontier, and (N, D) predictions "
                  "take its level (scalelab predict)")  # fmt: skip
    if fit.brackets(far):
        n, d, _ = fit.optimum(far)
        pi = fit.run_interval(n, d, far, optimal=True)
        law = fit.surface_interval(n, d, far).point
        power = pi.ends[0] * pi.ends[1] / law  # the other side
        print(f"no calibrated frontier: the loop predicts runs past the budgets by the bracket (the geometric mean "
              f"of the law and the best-loss power law); at 10x the largest budget ({far:.3g}, N* {n:.3g}): "
              f"{pi.point:.4f} [{pi.lo:.4f}, {pi.hi:.4f}], the law {law:.4f}, the power law {power:.4f}")  # fmt: skip


def _print_stacked(st: dict) -> None:
    from scalelab.fitting.selection.ensemble import format_stacked

    print("\n".join(format_stacked(st)))


def _print_selection(sel: dict) -> None:
    print(f"law selection: {sel['protocol']}; {sel['rule']}; held out {len(sel['holdout'])} run(s)")
    print(f"  {'candidate':<18}{'MARE':>9}{'bias':>9}  note")
    for c in sel["candidates"]:
        if "mare" in c:
            mark = "chosen" if c["name"] == sel["chosen"] else ""
            print(f"  {c['name']:<18}{100 * c['mare']:>8.2f}%{100 * c['bias']:>+8.2f}%  {mark}")
        else:
            print(f"  {c['name']:<18}{'-':>9}{'-':>9}  {c.get('skipped', '')}")
    if sel.get("departures"):
        from scalelab.fitting.selection.select import departure_line

        for d in sel["departures"]:
            print(departure_line(d))


def _check_level(level):
    if level is not None and not 0.0 < level < 1.0:
        raise UsageError(f"--level must be in (0, 1), got {level}")


def run_predict(args: argparse.Namespace) -> int:
    _check_level(args.level)  # bad input exits before the fitting stack (torch) loads
    if args.flops is None and (args.params is None or args.tokens is None):
        raise UsageError("pass --params N --tokens D, or --flops C")
    fit = load_saved_fit(args.fit)
    from scalelab.fitting.entry.from_report import predict_from_fit

    out = predict_from_fit(
        fit,
        params=args.params,
        tokens=args.tokens,
        flops=args.flops,
        unique_tokens=args.unique_tokens,
        level=args.level,
    )
    out = _by_the_bracket(fit, out)
    if args.json:
        print(json.dumps(_clean(out)))
    elif "allocations" in out:
        _print_allocations(out)
    else:
        lvl = int(round(100 * out["level"]))
        keys = [k for k in ("params", "tokens", "unique_tokens", "flops") if k in out]
        head = f"{'loss':>10}   {lvl}% CI (parameters)   {lvl}% PI (new run)"
        print("".join(f"{k:>14}" for k in keys) + head)
        ivs = out["loss_interval"] or [None] * len(out["loss"])
        pis = out["loss_prediction_interval"] or [None] * len(out["loss"])
        for i, loss in enumerate(out["loss"]):
            row = f"{_fmt(loss):>10}   {_iv(ivs[i]):<22}{_iv(pis[i])}"
            print("".join(f"{_fmt(out[k][i]):>14}" for k in keys) + row)
        for i, ends in enumerate(out.get("loss_ends") or []):
            if ends is not None:
                print(f"row {i + 1}: beyond the fitted budgets, the bracket of the law and the best-loss power law "
                      f"(as `sweep next` predicts it); its two sides {_fmt(ends[0])} and {_fmt(ends[1])}")  # fmt: skip
        if out.get("note"):
            print(out["note"])
        elif out["loss_interval"] is None:
            print("no intervals: the saved fit holds no parameter samples (refit with --out FIT.json)")
    return 0


def _by_the_bracket(fit, out: dict) -> dict:
    """Runs beyond a first round's fitted budgets as the loop predicts them (`sweep next`: the bracket,
    ScalingFit.run_interval), from the saved fit as plan-run reads it
    (scalelab.planning.loss_model.BracketLossModel). A (params, tokens) row past the budgets: its loss
    and prediction interval are the bracket's, its two sides in `loss_ends` (None for rows the law
    predicts itself), its parameter interval (the law's own) left out. An allocation past them: its
    L* and interval are the bracket's at its (N*, D*), the sides in `loss_opt_ends`. At a --level other
    than the fit's the bracket's log-sd parts give the interval at that level. Other fits (and one
    plan-run cannot read: no backtest or samples) are returned as they are."""
    if out.get("approach", 3) != 3 or ("allocations" not in out and ("params" not in out or "tokens" not in out)):
        return out
    from scalelab.fitting.uncertainty.predictive import interval_from_parts
    from scalelab.planning.loss_model import BracketLossModel, load_loss_model

    try:
        model = load_loss_model(fit)
    except UsageError:  # a fit plan-run cannot read (no backtest, no samples): the law predicts, as saved
        return out
    if not isinstance(model, BracketLossModel):
        return out

    def bracket(n: float, d: float, flops: float):
        pi = model.predict(n, d, flops)
        ends = list(pi.ends)
        if not math.isclose(pi.level, out["level"]):
            pi = interval_from_parts(pi.point, pi.parts, out["level"])
        return pi, ends

    if "allocations" in out:
        rows = []
        for r in out["allocations"]:
            if model.brackets(r["flops"]) and "loss_opt" in r:
                pi, ends = bracket(r["n_opt"], r["d_opt"], r["flops"])
                r = {**r, "loss_opt": pi.point, "loss_opt_interval": [pi.lo, pi.hi], "loss_opt_ends": ends}
            rows.append(r)
        return {**out, "allocations": rows}
    rows = len(out["loss"])
    ends: list[list[float] | None] = [None] * rows
    pis = list(out["loss_prediction_interval"] or [None] * rows)
    cis = list(out["loss_interval"] or [None] * rows)
    loss = list(out["loss"])
    for i, (n, d) in enumerate(zip(out["params"], out["tokens"])):
        flops = 6.0 * float(n) * float(d)
        if model.brackets(flops):
            pi, ends[i] = bracket(float(n), float(d), flops)
            loss[i], pis[i], cis[i] = pi.point, [pi.lo, pi.hi], None
    if all(e is None for e in ends):
        return out
    return {**out, "loss": loss, "loss_interval": cis, "loss_prediction_interval": pis, "loss_ends": ends}


def _print_allocations(out: dict) -> None:
    lvl = int(round(100 * out["level"]))
    source = out["allocations"][0].get("source", "surface") if out["allocations"] else "surface"
    print(f"compute-optimal allocation ({out['law']}, approach {out['approach']}, from the {source}; {lvl}% intervals)")
    for r in out["allocations"]:
        print(
            f"C={_fmt(r['flops'])}: N*={_fmt(r['n_opt'])} {_iv(r['n_opt_interval'])}  "
            f"D*={_fmt(r['d_opt'])} {_iv(r['d_opt_interval'])}  "
            f"D/N={_fmt(r['tokens_per_param'])} {_iv(r['tokens_per_param_interval'])}"
            + (f"  L*={_fmt(r['loss_opt'])} {_iv(r['loss_opt_interval'])}" if "loss_opt" in r else "")
            + ("  (optimum at the search bound)" if r["at_bound"] else "")
        )
        if "line" in r:
            print(f"  {r['line']}")
        if r.get("loss_opt_ends"):
            low, high = r["loss_opt_ends"]
            print(f"  L* beyond the fitted budgets by the bracket of the law and the best-loss power law "
                  f"(as `sweep next` predicts it): its two sides {_fmt(low)} and {_fmt(high)}")  # fmt: skip


def run_allocate(args: argparse.Namespace) -> int:
    _check_level(args.level)  # bad input exits before the fitting stack (torch) loads
    fit = load_saved_fit(args.fit)
    from scalelab.fitting.entry.from_report import allocate_from_fit

    out = _by_the_bracket(fit, allocate_from_fit(fit, flops=args.flops, tokens=args.tokens, level=args.level))
    if args.json:
        print(json.dumps(_clean(out)))
    else:
        _print_allocations(out)
    return 0
