"""Where a far run lands between the two forms a first round fits, and whether the first round can tell.

A first round's Chinchilla fit (levels off at E) and Kaplan fit (no floor) part ways beyond the
fitted budgets. For every run past the first round this prints each form's error, their log
departure D = ln L_kaplan - ln L_chinchilla, and the run's position between them,
p = (ln L_measured - ln L_chinchilla) / D: 0 on Chinchilla's prediction, 1 on Kaplan's. Beside it,
each form's in-sample residual RMS on the first round: what the first round itself says about which
form to believe.

If p were predictable from the first round (from the in-sample fits, or because it is about the same
on every store), an interval could sit where p says and be narrow. If far runs land anywhere in
[0, 1] across stores whose first rounds look alike, any rule that predicts from the first round
alone errs by up to max |p - p_hat| * |D| on some store, and an honest interval must span most of D.

    python experiments/forms_position.py STORE [STORE ...] [--max-flops 2e12] [--far CSV] [--rule 30:A,B]
        [--synthetic 8]

STORE: a store with a first round at or below --max-flops and later runs (experiments/closed_loop.py's
DIR/loop, or a demo store with its 3x run). `--far CSV` (columns seed, params, tokens, loss) adds
far runs measured elsewhere to the store whose first round was trained at that seed:
experiments/data/closed_loop_far_runs.csv holds the far runs of the cold stores at seeds 1, 11 and 21,
whose first rounds can be trained again (the training is deterministic on one machine type).
`--rule 30:A,B` (repeatable; B = 0 for a constant position): a rule p_hat = A + B * (Kaplan's in-sample RMS /
Chinchilla's), scored against each far run's p at that distance. `--synthetic K`: the same table for
K trials of each of experiments/stacked_coverage.py's truths (the demo's design; the far "runs" are the noise-free truth
at Chinchilla's compute-optimal (N, D) at 3x, 10x and 30x the largest budget).
"""

from __future__ import annotations

import argparse

import numpy as np
import polars as pl

from experiments.interval_calibration import in_first_round
from experiments.stacked_coverage import MULTIPLES, draw
from scalelab.errors import run_script
from scalelab.fitting.allocation.allocate import chinchilla_optimum
from scalelab.fitting.estimate.fit import fit_law
from scalelab.fitting.forms.laws import get_law
from scalelab.store.runs_table import load_runs

FORMS = ("chinchilla", "kaplan")
KINDS = ("chinchilla", "curved", "farseer", "receding")


def fit_forms(n, d, y) -> dict[str, dict[str, float]]:
    """Each form's parameters on the first round (the same robust fit as `fit.law: auto`'s components)."""
    return {k: fit_law(k, {"params": n, "tokens": d, "loss": y}, diagnose=False, n_polish=1).params for k in FORMS}


def log_pred(params: dict[str, dict[str, float]], n, d) -> dict[str, np.ndarray]:
    return {
        k: np.log(get_law(k).predict(params[k], params=np.asarray(n, float), tokens=np.asarray(d, float)))
        for k in FORMS
    }


def in_sample_rms(params, n, d, y) -> dict[str, float]:
    pred = log_pred(params, n, d)
    return {k: float(np.sqrt(np.mean((np.log(y) - pred[k]) ** 2))) for k in FORMS}


def positions(params, n, d, y) -> list[tuple[float, float, float, float]]:
    """Per far run: (Chinchilla's relative error, Kaplan's, the departure D, the position p)."""
    pred = log_pred(params, n, d)
    ly = np.log(y)
    dep = pred["kaplan"] - pred["chinchilla"]
    return [
        (float(np.exp(c - t) - 1), float(np.exp(k - t) - 1), float(e), float((t - c) / e))
        for c, k, e, t in zip(pred["chinchilla"], pred["kaplan"], dep, ly)
    ]


def store_rows(
    path: str, max_flops: float, far: pl.DataFrame | None
) -> tuple[dict[str, float], list[tuple[float, tuple]]]:
    """The store's first round's in-sample RMS per form, and (distance, positions row) per far run: the
    store's own runs past the first round, and `far`'s rows of the first round's training seed."""
    runs = load_runs(path)
    n, d, y = (runs[k].to_numpy().astype(float) for k in ("params", "tokens", "loss"))
    c = 6.0 * n * d
    first = in_first_round(c, max_flops)
    params = fit_forms(n[first], d[first], y[first])
    fn, fd, fy = n[~first], d[~first], y[~first]
    if far is not None:
        mine = far.filter(pl.col("seed") == int(runs["seed"].filter(pl.Series(first)).min()))
        fn, fd, fy = (
            np.concatenate([a, mine[k].to_numpy().astype(float)])
            for a, k in ((fn, "params"), (fd, "tokens"), (fy, "loss"))
        )
    order = np.argsort(fn * fd)
    rows = positions(params, fn[order], fd[order], fy[order])
    return in_sample_rms(params, n[first], d[first], y[first]), list(zip(6.0 * (fn * fd)[order] / c[first].max(), rows))


def synthetic_rows(seed: int, kind: str) -> tuple[dict[str, float], list[tuple[float, tuple]]]:
    f, n, d, c, y, _ = draw(seed, kind)
    params = fit_forms(n, d, y)
    targets = [chinchilla_optimum(params["chinchilla"], m * c.max())[:2] for m in MULTIPLES]
    nn, dd = (np.array([t[i] for t in targets]) for i in (0, 1))
    rows = positions(params, nn, dd, f(nn, dd))
    return in_sample_rms(params, n, d, y), list(zip(MULTIPLES, rows))


def show(label: str, rms: dict[str, float], rows, rules: dict[int, list[tuple[float, float]]]) -> None:
    ratio = rms["kaplan"] / rms["chinchilla"]
    rc, rk = 100 * rms["chinchilla"], 100 * rms["kaplan"]
    print(f"{label}: in-sample RMS chinchilla {rc:.2f}%, kaplan {rk:.2f}% (x{ratio:.2f})")
    for mult, (ec, ek, dep, p) in rows:
        line = f"  {mult:5.1f}x  chinchilla {100 * ec:+6.2f}%  kaplan {100 * ek:+6.2f}%  D {dep:+.3f}  p {p:+.2f}"
        for a, b in rules.get(round(mult), ()):
            p_hat = a + b * ratio
            # the rule's point, exp((1 - p_hat) ln L_chinchilla + p_hat ln L_kaplan), against the run
            err = 100 * (np.exp((p_hat - p) * dep) - 1)
            line += f"  p_hat {p_hat:+.2f} (|p - p_hat| {abs(p - p_hat):.2f}, error {err:+.2f}%)"
        print(line)


def summary(label: str, found: list[tuple[float, list]], rules: dict[int, list[tuple[float, float]]]) -> None:
    """Per distance: p's range over the stores or trials, its correlation with the RMS ratio, and each
    rule's score: the mean over stores of a store's mean |p - p_hat| (a store of five runs at a
    distance counts as much as one of two)."""
    for mult in MULTIPLES:
        pts = [(ratio, p, dep) for ratio, rows in found for m, (_, _, dep, p) in rows if round(m) == mult]
        if not pts:
            continue
        ratio, p, dep = (np.array(v) for v in zip(*pts))
        r = float(np.corrcoef(ratio, p)[0, 1]) if len(pts) > 2 and np.std(ratio) > 0 and np.std(p) > 0 else float("nan")
        print(
            f"  {label} {mult}x: {len(pts)} runs, p {p.min():+.2f}..{p.max():+.2f} (mean {p.mean():+.2f}), "
            f"|D| {100 * np.abs(dep).min():.1f}..{100 * np.abs(dep).max():.1f}%, corr(RMS ratio, p) {r:+.2f}"
        )
        for a, b in rules.get(mult, ()):
            per_store = [
                np.mean([abs(p - a - b * ratio) for m, (_, _, _, p) in rows if round(m) == mult])
                for ratio, rows in found
                if any(round(m) == mult for m, _ in rows)
            ]
            print(f"    rule p_hat = {a:+.2f} {b:+.2f} x ratio: score {np.mean(per_store):.2f} over {len(per_store)}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stores", nargs="*")
    ap.add_argument("--max-flops", type=float, default=2e12, help="the first round's largest budget")
    ap.add_argument("--synthetic", type=int, default=0, help="trials per synthetic truth")
    ap.add_argument("--far", default=None, help="CSV of far runs measured elsewhere (seed, params, tokens, loss)")
    ap.add_argument("--rule", action="append", default=[], metavar="DISTANCE:A,B",
                    help="p_hat = A + B * RMS ratio at a distance (3, 10 or 30); repeatable")  # fmt: skip
    args = ap.parse_args(argv)
    rules: dict[int, list[tuple[float, float]]] = {}
    for text in args.rule:
        dist, _, coef = text.partition(":")
        try:
            a, b = (float(v) for v in coef.split(","))
            rules.setdefault(int(dist), []).append((a, b))
        except ValueError:
            ap.error(f"--rule {text!r}: write DISTANCE:A,B, e.g. 30:-0.40,0.53")
    far = pl.read_csv(args.far) if args.far else None
    found = []
    for path in args.stores:
        rms, rows = store_rows(path, args.max_flops, far)
        show(path, rms, rows, rules)
        found.append((rms["kaplan"] / rms["chinchilla"], rows))
    if found:
        summary("stores", found, rules)
    for kind in KINDS if args.synthetic else ():
        found = []
        for seed in range(args.synthetic):
            rms, rows = synthetic_rows(seed, kind)
            show(f"{kind} {seed}", rms, rows, rules)
            found.append((rms["kaplan"] / rms["chinchilla"], rows))
        summary(kind, found, rules)


if __name__ == "__main__":
    run_script(main, __file__)
