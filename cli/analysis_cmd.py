"""Analysis commands over a sweep store: noise, predict-task, compare, plot, report.

scalelab noise DIR [--last-n 5]                         SNR / seed & checkpoint noise / decisions
scalelab predict-task DIR|TABLE --task T --params N --tokens D  compute -> task bpb -> accuracy
scalelab compare DIR_A DIR_B [--law chinchilla]         compute-efficiency multiplier of B over A
scalelab compare DIR --by TAG                           ... between the values of a tag in one store
scalelab plot DIR --kind isoflop -o FILE.png            one figure (kinds: see --help)
scalelab report DIR -o report.html                      one self-contained HTML file
"""

from __future__ import annotations

import json
from pathlib import Path

from scalelab.errors import UsageError

# analysis.plots.KINDS + "comparison", spelled out so that building the parser (every `scalelab`
# command) does not import matplotlib; tests/test_report.py checks they agree
PLOT_KINDS = (
    "curves",
    "isoflop",
    "frontier",
    "allocation",
    "residuals",
    "backtest",
    "sensitivity",
    "noise",
    "comparison",
)


def add_parser(sub) -> None:
    """One piece: the analysis commands' parsers, one add_argument per flag in help order."""
    p = sub.add_parser(
        "noise",
        help="evaluation noise: SNR, seed/checkpoint noise, decision accuracy",
        description="Per (task, metric): seed and checkpoint-to-checkpoint noise, signal, SNR, "
        "monotonicity and decision accuracy; recommends bpb over accuracy where the SNR says so.",
    )
    p.add_argument("store", help="a sweep directory (or a store root)")
    p.add_argument("--last-n", type=int, default=5, help="checkpoints averaged per run (default 5)")
    p.add_argument(
        "--no-detrend",
        action="store_true",
        help="checkpoint noise as the plain std of the last n values (default: about a line in step)",
    )
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.set_defaults(func=run_noise)

    p = sub.add_parser(
        "predict-task",
        help="two-step downstream prediction: (N, D) -> task bpb -> accuracy",
        description="Fit task bpb vs (N, D), then the bpb-to-accuracy sigmoid, with intervals. The data is a "
        "sweep store, or a CSV/Parquet table from elsewhere with columns params, tokens, <task>/bpb, "
        "<task>/acc (optional run_id, step, <task>/<metric>_stderr; see scalelab.analysis.tables).",
    )
    p.add_argument("store", help="a sweep directory or store root, or a CSV/Parquet table")
    p.add_argument("--task", required=True, help="task name as in evals.parquet, e.g. bundled/stdlib_nextline")
    p.add_argument("--params", type=float, required=True, help="model parameters N")
    p.add_argument("--tokens", type=float, required=True, help="training tokens D")
    p.add_argument("--law", default="chinchilla", help="step one's law of task bpb in (N, D)")
    p.add_argument("--acc-metric", default="acc", help="acc or acc_norm")
    p.add_argument("--last-n", type=int, default=3, help="checkpoints averaged per run")
    p.add_argument("--bootstrap", type=int, default=200, help="bootstrap refits for the intervals")
    p.add_argument("--unweighted", action="store_true", help="do not weight runs by their noise")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run_predict_task)

    p = sub.add_parser(
        "compare",
        help="compute-efficiency multiplier of B over A, with intervals",
        description="Fit each sweep (or each value of --by TAG in one store) and report how much "
        "compute A needs to reach B's loss, per budget and at a target.",
    )
    p.add_argument("stores", nargs="+", help="DIR_A DIR_B, or one DIR with --by")
    p.add_argument("--by", help="tag whose values split one store into the sides (first value = A)")
    p.add_argument("--law", default="chinchilla", help="chinchilla (default), kaplan, power_law (frontier runs)")
    p.add_argument("--target-flops", type=float, default=None, help="target budget (default 10x the largest)")
    p.add_argument("--bootstrap", type=int, default=200, help="bootstrap refits per side for the intervals")
    p.add_argument("--level", type=float, default=0.95, help="interval level")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run_compare)

    p = sub.add_parser(
        "plot",
        help="one figure of a store",
        description="Draw one figure of a sweep store (the report's figures, one at a time): curves (loss curves), "
        "isoflop, frontier (L*(C) with its band), allocation (N*, D*), residuals, backtest, sensitivity (loss "
        "against a hyperparameter), noise (evaluation SNR), comparison (two stores or two tag values).",
    )
    p.add_argument("store", help="a sweep directory (or a store root)")
    p.add_argument("--kind", required=True, choices=PLOT_KINDS, help="which figure")
    p.add_argument("-o", "--out", required=True, help="output image (.png, .pdf, .svg)")
    p.add_argument("--law", default=None, help="the fitted kinds' law (default: the spec's fit.law, else chinchilla)")
    p.add_argument("--bootstrap", type=int, default=None, help="bootstrap replicates (default: the spec's fit)")
    p.add_argument("--x", default="tokens", choices=("tokens", "flops"), help="x axis of --kind curves")
    p.add_argument("--param", default="lr", help="hyperparameter of --kind sensitivity")
    p.add_argument("--by", help="tag splitting the store for --kind comparison")
    p.add_argument("--with", dest="other", help="second store for --kind comparison")
    p.set_defaults(func=run_plot)

    p = sub.add_parser(
        "report",
        help="self-contained HTML report of a store",
        description="Write one HTML file (plots embedded as PNGs, CSS inline: it opens offline): the sweep's "
        "summary, the law fit (the one `sweep next` made, named by its law) with intervals, backtests, "
        "warnings, gates, the proposed round, the ledger of predictions against measured runs, evaluation "
        "noise, comparisons, the runs planned by `plan-run` under DIR/plans/, and the plots. A study gets its "
        "own sections (docs/studies.md).\n\nexample:\n  scalelab report results/iso -o results/iso/report.html",
    )
    p.add_argument("store", help="a sweep directory (or a store root; s3:// is read from a local copy)")
    p.add_argument(
        "-o",
        "--out",
        required=True,
        metavar="REPORT.html",
        help="the file to write (mode 0666 less the umask: 0644 under the usual 022, as any file you write)",
    )
    p.add_argument("--law", default=None, help="the fit's law (default: the spec's fit.law, else chinchilla)")
    p.add_argument("--bootstrap", type=int, default=None, help="bootstrap replicates (default: the spec's fit)")
    p.add_argument("--compare-by", help="a tag whose values to compare within the store (default: no comparison)")
    p.add_argument("--compare-with", action="append", default=[], help="another store to compare against (repeatable)")
    p.add_argument(
        "--target-flops",
        type=float,
        default=None,
        help="the comparisons' target budget C, where their multiplier is extrapolated (default: 10x the "
        "largest budget)",
    )
    p.set_defaults(func=run_report)


def _check_positive(name: str, value: int | None) -> None:
    if value is not None and value < 0:
        raise UsageError(f"--{name} must be >= 0, got {value}")


def run_noise(args) -> int:
    from scalelab.analysis.noise import NoiseOptions, format_table, noise_table, recommendations
    from scalelab.analysis.store_reader import load_store_runs

    if args.last_n < 1:
        raise UsageError(f"--last-n must be >= 1, got {args.last_n}")
    table = noise_table(
        load_store_runs(args.store), options=NoiseOptions(last_n=args.last_n, detrend=not args.no_detrend)
    )
    if args.json:
        print(json.dumps(table.to_dicts(), indent=2))
        return 0
    print(format_table(table))
    notes = recommendations(table)
    if notes:
        print()
        print("\n".join(f"* {n}" for n in notes))
    return 0


def run_predict_task(args) -> int:
    from scalelab.analysis.downstream import format_prediction, predict_task
    from scalelab.analysis.store_reader import load_evals, load_store_runs

    _check_positive("bootstrap", args.bootstrap)
    if Path(args.store).is_file():
        from scalelab.analysis.tables import task_frames

        runs, evals = task_frames(args.store, task=args.task)
    else:
        runs = load_store_runs(args.store)
        evals = load_evals(runs)
    pred = predict_task(
        runs,
        evals,
        task=args.task,
        params=args.params,
        tokens=args.tokens,
        law=args.law,
        acc_metric=args.acc_metric,
        last_n=args.last_n,
        n_boot=args.bootstrap,
        weighted=not args.unweighted,
    )
    print(json.dumps(pred.to_dict(), indent=2) if args.json else format_prediction(pred))
    return 0


def _sides(stores: list[str], by: str | None):
    from scalelab.analysis.compare import split_by_tag
    from scalelab.analysis.store_reader import load_store_runs

    if by:
        if len(stores) != 1:
            raise UsageError("with --by give exactly one store")
        groups = split_by_tag(load_store_runs(stores[0]), by)
        names = list(groups)
        if len(names) > 2:
            print(f"note: tag '{by}' has {len(names)} values; comparing {names[1]} over {names[0]}")
        return (names[0], groups[names[0]]), (names[1], groups[names[1]])
    if len(stores) != 2:
        raise UsageError("give two stores DIR_A DIR_B, or one store with --by TAG")
    return tuple((Path(s).name or s, load_store_runs(s)) for s in stores)


def run_compare(args) -> int:
    from scalelab.analysis.compare import compare_sweeps, format_comparison

    _check_positive("bootstrap", args.bootstrap)
    if not 0 < args.level < 1:
        raise UsageError(f"--level must be in (0, 1), got {args.level}")
    (name_a, a), (name_b, b) = _sides(args.stores, args.by)
    cmp = compare_sweeps(
        a,
        b,
        names=(name_a, name_b),
        law=args.law,
        target_flops=args.target_flops,
        n_boot=args.bootstrap,
        level=args.level,
        seed=args.seed,
    )
    print(json.dumps(cmp.to_dict(), indent=2) if args.json else format_comparison(cmp))
    return 0


def run_plot(args) -> int:
    from scalelab.analysis import plots
    from scalelab.analysis.store_reader import load_evals, load_metrics, load_store_runs

    kind = args.kind
    if kind == "comparison":
        from scalelab.analysis.compare import compare_sweeps

        stores = [args.store] + ([args.other] if args.other else [])
        (name_a, a), (name_b, b) = _sides(stores, args.by)
        law, n_boot = args.law or "chinchilla", 100 if args.bootstrap is None else args.bootstrap
        fig = plots.plot_comparison(compare_sweeps(a, b, names=(name_a, name_b), law=law, n_boot=n_boot))
    else:
        runs = load_store_runs(args.store)
        if kind == "curves":
            fig = plots.plot_loss_curves(runs, load_metrics(runs), x=args.x)
        elif kind == "sensitivity":
            fig = plots.plot_sensitivity(runs, args.param)
        elif kind == "noise":
            from scalelab.analysis.noise import noise_table

            fig = plots.plot_noise(noise_table(runs, load_evals(runs)))
        else:
            from scalelab.analysis.lawfit import store_fit_from_record
            from scalelab.fitting.entry.fit_options import fit_options
            from scalelab.sweeps.closed_loop.store_fit import fit_store, store_fit_spec

            _check_positive("bootstrap", args.bootstrap)
            options = fit_options(store_fit_spec(args.store), law=args.law, bootstrap=args.bootstrap)
            fit = store_fit_from_record(fit_store(args.store, options, runs=runs)[0].to_record())
            fig = {
                "isoflop": lambda: plots.plot_isoflop(runs, fit),
                "frontier": lambda: plots.plot_frontier(runs, fit),
                "allocation": lambda: plots.plot_allocation(fit),
                "residuals": lambda: plots.plot_residuals(fit),
                "backtest": lambda: plots.plot_backtest(fit),
            }[kind]()
    plots.save(fig, args.out)
    print(f"wrote {args.out}")
    return 0


def run_report(args) -> int:
    from scalelab.analysis.report import write_report

    _check_positive("bootstrap", args.bootstrap)
    path = write_report(
        args.store,
        args.out,
        law=args.law,
        n_boot=args.bootstrap,
        compare_by=args.compare_by,
        compare_with=args.compare_with,
        target_flops=args.target_flops,
    )
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")
    return 0
