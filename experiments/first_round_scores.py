"""Scores of the registered first-round protocol (docs/first-round.md): each cold store's first-round
error at 3x, 10x and 30x, beside the old recipe's seven stores, against the goals.

For every store given (the `loop` sweep of experiments/first_round_store.py): the ledger scored
(scalelab.store.ledger), its holdout runs grouped by distance (their budget over the first round's
largest, the nearest of 3, 10, 30), the error of each distance the mean of its runs' relative errors
(predicted / measured - 1, each run predicted by the first round's fit before it trained), with the
runs covered by their 95% intervals and the intervals' mean width. Over the stores: the mean error
and the store-to-store sd at 10x and 30x, against the goals (30x: mean within +-2%, goal +-1%, sd
at most 2%; 10x: mean within +-2%, sd at most 1.5%), beside the same for the old recipe's seven
stores (experiments/data/first_round_errors_old_recipe.csv: their first rounds' errors as
docs/extrapolation.md reports them). Stores scored before (their stores need not be on this machine:
a session's machine can be a new one) come from `--recorded`
(experiments/data/first_round_scored_runs.csv: each scored run's measured loss, the default's
prediction and 95% interval and, from s1100 on, the bracket column's, as docs/first-round.md reports
them; `STORE --record JSON` appends a store: the default from its ledger, the bracket from
`experiments/score_store.py --json`);
with them the summary also applies step 3b's rule to the bracket column. And the cost: CPU seconds
of training per store (the runs' `end` events), the first round's FLOPs and CPU time against those
of its 3x and 10x runs (what the loop's ladder spends on its 3x and 10x steps), and the replication
the design chose (its runs beyond the demo's 12) in the same units.

    python experiments/first_round_scores.py results/first_round/s1000/loop results/first_round/s1100/loop ...
    python experiments/first_round_scores.py ... --json scores.json
    python experiments/first_round_scores.py results/first_round/s1300/loop --recorded
    python experiments/first_round_scores.py results/first_round/s1300/loop --record s1300.json  # appended
    python experiments/first_round_scores.py results/first_round/s1500/loop --record   # protocol 2: the ledger alone

Protocol 2's stores (docs/first-round.md: the ledger predicted by the bracket, its ends kept) are
summarised apart from protocol 1's, with its candidate interval (the ends widened by run noise).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
from pathlib import Path

from scalelab import store
from scalelab.config_tree import load_yaml
from scalelab.errors import UsageError, run_script
from scalelab.store import ledger

DISTANCES = (3, 10, 30)
GOALS = {30: (2.0, 2.0), 10: (2.0, 1.5)}  # distance -> (|mean error| at most, store-to-store sd at most), %
OLD = Path(__file__).resolve().parent / "data" / "first_round_errors_old_recipe.csv"
RECORDED = Path(__file__).resolve().parent / "data" / "first_round_scored_runs.csv"
BRACKET_RULE = 2.0  # step 3b: the bracket's 30x mean within +-2% over its scored stores (s1100 on)
DEMO_RUNS = 12  # the demo's first round, the design the replication is priced against
Z95 = 1.959963984540054


def _holdouts(sweep_dir: Path) -> tuple[list[dict], float]:
    """A store's scored ledger: its holdout predictions, and the first round's largest budget."""
    ledger.score(sweep_dir)
    spec = load_yaml(str(store.SweepLayout(sweep_dir).spec))
    far = [p for p in ledger.read_ledger(sweep_dir)["predictions"] if p.get("kind") == "holdout"]
    return far, max(float(b) for b in spec["isoflop"]["budgets"])


def _distance(flops: float, largest: float) -> int:
    """The nearest of DISTANCES to a run's budget over the first round's largest."""
    return min(DISTANCES, key=lambda d: abs(math.log(flops / largest / d)))


def store_scores(sweep_dir: str | Path) -> dict:
    """One store's errors per distance (%), coverage, widths, and its costs."""
    sweep_dir = Path(sweep_dir)
    far, largest = _holdouts(sweep_dir)
    cpu = {
        e["run_id"]: float(e.get("train_cpu_s") or 0) for e in store.read_events(sweep_dir) if e.get("event") == "end"
    }
    runs = store.load_runs(sweep_dir)
    far_ids = {p["run_id"] for p in far}
    first = runs.filter(~runs["run_id"].is_in(list(far_ids)))
    out = {"store": str(sweep_dir), "first_round_runs": first.height, "first_round_flops": float(first["flops"].sum()),
           "first_round_cpu_s": sum(cpu.get(r, 0.0) for r in first["run_id"]), "distances": {}}  # fmt: skip
    for m in DISTANCES:
        at = [p for p in far if _distance(p["flops"], largest) == m]
        done = [p for p in at if p.get("measured") is not None]
        out["distances"][m] = {
            "runs": len(at),
            "scored": len(done),
            "error": 100 * statistics.fmean(p["rel_error"] for p in done) if done else None,
            "covered": sum(bool(p["covered"]) for p in done),
            "width": 100 * statistics.fmean((p["interval"][1] - p["interval"][0]) / p["predicted"] for p in done)
            if done
            else None,
            "flops": sum(p["flops"] for p in at),
            "cpu_s": sum(cpu.get(p["run_id"], 0.0) for p in at),
        }
        ends = [p for p in done if p.get("ends")]
        if ends:  # protocol 2: the ledger's prediction is the bracket; its ends widened by run noise
            sigma = _noise_floor(sweep_dir, ends[0]["round"])
            iv = [ends_interval(p["ends"], sigma) for p in ends]
            out["distances"][m]["ends"] = {
                "scored": len(ends),
                "covered": sum(lo <= p["measured"] <= hi for (lo, hi), p in zip(iv, ends)),
                "width": 100 * statistics.fmean((hi - lo) / p["predicted"] for (lo, hi), p in zip(iv, ends)),
                "noise": sigma,
            }
    out["cpu_s"] = sum(cpu.values())
    out["protocol"] = 2 if any(p.get("ends") for p in far) else 1
    return out


def _noise_floor(sweep_dir: Path, round_k: int) -> float:
    """The stated run noise (log-sd) of the fit that made a round's predictions."""
    fits = [f for f in ledger.read_ledger(sweep_dir)["fits"] if f.get("round") == round_k]
    return float(fits[-1]["noise_floor"])


def ends_interval(ends: list[float], sigma: float, z: float = Z95) -> tuple[float, float]:
    """Protocol 2's candidate interval: the bracket's two sides, each widened by a run's noise."""
    return ends[0] * math.exp(-z * sigma), ends[1] * math.exp(z * sigma)


def _name(sweep_dir: str) -> str:
    """A store's name: X of experiments/first_round_store.py's X/loop."""
    p = Path(sweep_dir)
    return p.parent.name if p.name == "loop" else p.name


def old_recipe() -> dict[int, list[float]]:
    """distance -> the old recipe's first-round errors (%), one per store."""
    with OLD.open() as f:
        rows = list(csv.DictReader(f))
    return {m: [float(r["error_pct"]) for r in rows if int(r["distance"]) == m] for m in (10, 30)}


def recorded_scores(path: str | Path = RECORDED) -> list[dict]:
    """The recorded stores, each as store_scores gives a store's distances (the default's), with the
    bracket column's beside them (`bracket`); no costs."""
    with Path(path).open() as f:
        rows = list(csv.DictReader(f))
    out = []
    for name in dict.fromkeys(r["store"] for r in rows):
        mine = [r for r in rows if r["store"] == name]
        at = {m: [r for r in mine if int(r["distance"]) == m] for m in DISTANCES}
        protocol = int(mine[0].get("protocol") or 1)
        distances = {m: _column(at[m], "default") for m in DISTANCES}
        if protocol == 2:
            for m in DISTANCES:
                distances[m]["ends"] = _recorded_ends(at[m])
        out.append({"store": name, "recorded": True, "protocol": protocol, "distances": distances,
                    "bracket": {m: _column(at[m], "bracket") for m in DISTANCES}})  # fmt: skip
    return out


def _recorded_ends(rows: list[dict]) -> dict:
    """Protocol 2's candidate interval over a distance's recorded runs (their ends and noise floor)."""
    iv = [ends_interval([float(r["ends_low"]), float(r["ends_high"])], float(r["noise_floor"])) for r in rows]
    return {
        "scored": len(rows),
        "covered": sum(lo <= float(r["measured"]) <= hi for (lo, hi), r in zip(iv, rows)),
        "width": 100 * statistics.fmean((hi - lo) / float(r["default"]) for (lo, hi), r in zip(iv, rows)),
        "noise": float(rows[0]["noise_floor"]),
    }


def _column(rows: list[dict], column: str) -> dict:
    """A distance's recorded runs for one column: mean error (%), coverage, mean width (%)."""
    rows = [r for r in rows if r[column]]
    error = "error_pct" if column == "default" else f"{column}_error_pct"
    if not rows:
        return {"runs": 0, "scored": 0, "error": None, "covered": 0, "width": None}
    point, lo, hi, measured = (
        [float(r[k]) for r in rows] for k in (column, f"{column}_lo", f"{column}_hi", "measured")
    )
    return {
        "runs": len(rows),
        "scored": len(rows),
        "error": statistics.fmean(float(r[error]) for r in rows),
        "covered": sum(a <= y <= b for a, b, y in zip(lo, hi, measured)),
        "width": 100 * statistics.fmean((b - a) / p for a, b, p in zip(lo, hi, point)),
    }


def record(sweep_dir: str | Path, score_json: str | Path | None, name: str, path: str | Path = RECORDED) -> int:
    """Append a scored store's runs to the record: the default's prediction and interval from its
    ledger (what the protocol scores), the bracket's from `experiments/score_store.py --json`
    (matched by run id) or, for a protocol-2 store, from the ledger itself with its ends and noise
    floor; the rows it writes. An existing store's name is refused: the record is appended to,
    never rewritten."""
    path = Path(path)
    with path.open() as f:
        reader = csv.DictReader(f)
        fields, known = reader.fieldnames, {r["store"] for r in reader}
    if name in known:
        raise UsageError(f"--as {name}: {path} already records that store; choose the store's own name")
    far, largest = _holdouts(Path(sweep_dir))
    far = [p for p in far if p.get("measured") is not None]
    if all(p.get("ends") for p in far):  # protocol 2: the ledger's prediction is the bracket itself
        sigma = _noise_floor(Path(sweep_dir), far[0]["round"]) if far else math.nan
        bracket = {p["run_id"]: {"bracket": [p["predicted"], *p["interval"]], "bracket_error": p["rel_error"],
                                 "ends": p["ends"], "noise_floor": sigma} for p in far}  # fmt: skip
        source = "ledger (protocol 2: the bracket is the ledger's prediction)"
    else:
        if score_json is None:
            raise UsageError(f"--record: {sweep_dir}'s ledger predicted before protocol 2; give score_store.py --json")
        bracket = {r["run_id"]: r for r in json.loads(Path(score_json).read_text()) if r.get("run_id")}
        source = f"ledger; bracket: score_store.py --json {Path(score_json).name}"
    missing = [p["run_id"] for p in far if p["run_id"] not in bracket]
    if missing:
        raise UsageError(
            f"--record {score_json}: no row for run(s) {', '.join(missing)}; run score_store.py on {sweep_dir}"
        )
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        for p in far:
            (lo, hi), b = p["interval"], bracket[p["run_id"]]
            row = {"store": name, "distance": _distance(p["flops"], largest), "run_id": p["run_id"],
                   "params": round(p["params"]),
                   "tokens": f"{p['tokens']:.3g}", "measured": f"{p['measured']:.4f}",
                   "default": f"{p['predicted']:.4f}", "default_lo": f"{lo:.4f}", "default_hi": f"{hi:.4f}",
                   "error_pct": f"{100 * p['rel_error']:+.2f}", "bracket": f"{b['bracket'][0]:.4f}",
                   "bracket_lo": f"{b['bracket'][1]:.4f}", "bracket_hi": f"{b['bracket'][2]:.4f}",
                   "bracket_error_pct": f"{100 * b['bracket_error']:+.2f}", "source": source}  # fmt: skip
            if "ends" in b:
                row |= {"protocol": 2, "ends_low": f"{b['ends'][0]:.4f}", "ends_high": f"{b['ends'][1]:.4f}",
                        "noise_floor": f"{b['noise_floor']:.4g}"}  # fmt: skip
            w.writerow(row)
    return len(far)


def _summary(errors: list[float]) -> tuple[float, float]:
    mean = statistics.fmean(errors) if errors else math.nan
    sd = statistics.stdev(errors) if len(errors) > 1 else math.nan
    return mean, sd


def report(scores: list[dict]) -> str:
    lines = [
        "first-round error (%) by store: mean of the far runs' (predicted / measured - 1), each predicted by the "
        "first round's fit (the loop's default: fit.law auto) before it trained; covered/scored at 95%, mean width",
        f"{'store':44} {'runs':>4} " + " ".join(f"{f'{m}x':>22}" for m in DISTANCES) + f" {'CPU-s':>8}",
    ]
    for s in scores:
        cells = []
        for m in DISTANCES:
            d = s["distances"][m]
            cell = "-" if d["error"] is None else f"{d['error']:+.2f} {d['covered']}/{d['scored']} w{d['width']:.1f}"
            cells.append(f"{cell:>22}")
        runs, cpu = ("-", "-") if s.get("recorded") else (s["first_round_runs"], f"{s['cpu_s']:.0f}")
        lines.append(f"{s['store'][-44:]:44} {runs:>4} " + " ".join(cells) + f" {cpu:>8}")
    old = old_recipe()
    first, second = ([s for s in scores if s.get("protocol", 1) == k] for k in (1, 2))
    for label, group in (("audited recipe", first), ("protocol 2, the bracket", second)):
        if not group:
            continue
        lines.append("over the stores: mean error, store-to-store sd (goal) -> met?")
        for m in (10, 30):
            new = [s["distances"][m]["error"] for s in group if s["distances"][m]["error"] is not None]
            mean, sd = _summary(new)
            o_mean, o_sd = _summary(old[m])
            max_mean, max_sd = GOALS[m]
            verdict = "met" if abs(mean) <= max_mean and sd <= max_sd else "MISSED"
            if len(new) < 2:
                verdict = "not scored (the sd needs 2 or more stores)"
            lines.append(
                f"  {m}x: {label} {mean:+.2f}%, sd {sd:.2f}% over {len(new)} store(s) (goal |mean| <= {max_mean}%, "
                f"sd <= {max_sd}%): {verdict}; old recipe {o_mean:+.2f}%, sd {o_sd:.2f}% over {len(old[m])} stores"
            )
    lines += _bracket_rule(first)
    lines += _protocol_2(second)
    lines += _costs([s for s in scores if not s.get("recorded")])
    return "\n".join(lines)


def _bracket_rule(scores: list[dict]) -> list[str]:
    """Step 3b's rule over the recorded stores with a bracket column (s1100 on): its 30x mean within
    +-2% makes the bracket the loop's proposal for first rounds without a calibrated frontier."""
    scored = [s for s in scores if s.get("bracket") and s["bracket"][30]["error"] is not None]
    if not scored:
        return []
    out = ["the bracket column (docs/first-round.md step 3b): mean error by store, covered/scored, mean 95% width"]
    for s in scored:
        cells = " ".join(
            f"{m}x {d['error']:+.2f}% {d['covered']}/{d['scored']} w{d['width']:.1f}"
            for m, d in s["bracket"].items()
            if d["error"] is not None
        )
        out.append(f"  {s['store']}: {cells}")
    mean, sd = _summary([s["bracket"][30]["error"] for s in scored])
    verdict = "holds" if abs(mean) <= BRACKET_RULE else "does not hold"
    if len(scored) < 4:
        verdict += " so far; the rule is applied at 4 stores"
    out.append(f"  30x over {len(scored)} store(s): mean {mean:+.2f}%, sd {sd:.2f}% (rule: |mean| <= {BRACKET_RULE}% "
               f"over s1100-s1400): {verdict}")  # fmt: skip
    return out


def _protocol_2(scores: list[dict]) -> list[str]:
    """docs/first-round.md, protocol 2: stores whose ledger predicted by the bracket (their entries keep
    its ends); the default's goals are those above, and the ends candidate's coverage and width."""
    scored = [s for s in scores if any("ends" in d for d in s["distances"].values())]
    if not scored:
        return []
    out = ["protocol 2 (the bracket as the loop's prediction): the ends widened by run noise, covered/scored, "
           "mean width; issue 47's width goals 15% at 10x, 20% at 30x"]  # fmt: skip
    for s in scored:
        cells = " ".join(
            f"{m}x {d['ends']['covered']}/{d['ends']['scored']} w{d['ends']['width']:.1f}"
            for m, d in s["distances"].items()
            if "ends" in d
        )
        out.append(f"  {s['store'][-44:]}: {cells}")
    for m in DISTANCES:
        cells = [s["distances"][m]["ends"] for s in scored if "ends" in s["distances"][m]]
        if cells:
            covered, n = sum(c["covered"] for c in cells), sum(c["scored"] for c in cells)
            width = statistics.fmean(c["width"] for c in cells)
            out.append(f"  {m}x over {len(cells)} store(s): {covered}/{n} covered, mean width {width:.1f}%")
    return out


def _costs(scores: list[dict]) -> list[str]:
    """The first round's and its replication's cost against the 3x and 10x steps."""
    if not scores:
        return []
    out = ["cost per store: first round vs its 3x and 10x runs (the ladder's steps), FLOPs and CPU-s"]
    for s in scores:
        three, ten = s["distances"][3], s["distances"][10]
        extra = max(s["first_round_runs"] - DEMO_RUNS, 0) / max(s["first_round_runs"], 1)
        out.append(
            f"  {s['store'][-44:]}: first round {s['first_round_flops']:.3g} FLOPs / "
            f"{s['first_round_cpu_s']:.0f} CPU-s "
            f"({s['first_round_runs']} runs, {extra:.0%} of them beyond the demo's {DEMO_RUNS}); "
            f"3x runs {three['flops']:.3g} / {three['cpu_s']:.0f}; 10x runs {ten['flops']:.3g} / {ten['cpu_s']:.0f}; "
            f"replication = {extra * s['first_round_flops'] / max(three['flops'], 1):.2f}x the 3x step, "
            f"{extra * s['first_round_flops'] / max(ten['flops'], 1):.2f}x the 10x step (FLOPs)"
        )
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "stores", nargs="*", help="the stores' loop sweeps (experiments/first_round_store.py --out X: X/loop)"
    )
    ap.add_argument("--json", default=None, metavar="PATH", help="also write the scores as JSON")
    ap.add_argument("--recorded", nargs="?", const=str(RECORDED), default=None, metavar="CSV",
                    help=f"add the stores scored before (default {RECORDED.name}); a store given wins")  # fmt: skip
    ap.add_argument("--record", nargs="?", const="", default=None, metavar="JSON",
                    help="append the one store given: its ledger, the bracket from score_store.py --json (a "
                         "protocol-2 store's ledger holds its bracket: no JSON)")  # fmt: skip
    ap.add_argument("--as", dest="name", default=None, help="--record: the store's name (default: its folder's)")
    args = ap.parse_args(argv)
    if args.record is not None:
        if len(args.stores) != 1:
            raise UsageError("--record: give exactly one store (its loop sweep) to record")
        name = args.name or _name(args.stores[0])
        n = record(args.stores[0], args.record or None, name, args.recorded or RECORDED)
        print(f"recorded {n} run(s) of {name} in {args.recorded or RECORDED}")
        return
    if not args.stores and not args.recorded:
        raise UsageError("no store: give the stores' loop sweeps, or --recorded for the stores scored before")
    scores = [store_scores(s) for s in args.stores]
    names = {_name(s) for s in args.stores}
    if args.recorded:
        scores = [s for s in recorded_scores(args.recorded) if s["store"] not in names] + scores
    print(report(scores))
    if args.json:
        Path(args.json).write_text(json.dumps(scores, indent=1) + "\n")


if __name__ == "__main__":
    run_script(main, __file__)
