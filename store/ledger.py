"""The ledger: every fit the closed loop makes, and every prediction it scored against a real run.

    <sweep>/ledger.json = {"fits": [...], "predictions": [...], "studies": [...]}

A fit entry (one per `sweep next`) keeps what a reviewer needs to audit it later: the round, the
run ids it used, the code version, the law and its options, the parameters with their intervals,
the identification gates, and which constants moved outside the previous round's intervals
(`drift`). A prediction entry is one proposed run: its run id (the hash of its resolved config, so
the run that is trained is exactly the one predicted), N, D, C, the predicted loss and interval,
and, once the run is done, the measured loss, the relative error and whether the interval covered it.

A study entry (a study's `sweep next`, scalelab.sweeps.studies.study_propose) is one arm against the
baseline at the target: the runs that decide it (the matched decisive measurement: the baseline's and
the arm's run ids, aligned pair by pair, the same size and seed; an older entry names one run per
arm), the predicted gap L_arm - L_baseline with its interval, its parts and the estimator it comes
from, the other estimators' gaps (`views`), the predicted winner and whether the interval excluded 0,
the multiplier. Once every run is done: the measured gap (the mean over pairs of L_arm - L_baseline)
with its standard error (the pairs' sd over sqrt(pairs)) and the same for ln(L_arm / L_baseline),
whether the measurement itself tells the arms apart (|gap| > t se), the measured winner, whether the
prediction named it, whether the interval covered the gap, and the decision: `right` or `wrong` when
the interval excluded 0, `none` when it did not (each view scored the same way).

Predictions are recorded before their runs can start (`record_round`, `record_study`; the round's
spec is written after it), and scored whenever the ledger is touched after a launch (`score`;
scalelab.sweeps.execution.execute calls it at the end of every launch). A prediction whose run had already
started in this sweep when it was recorded (an identical config proposed again: its id is the hash
of the config, labels aside), or that the fit itself used, is kept with a `flag` and never scored:
it was not a prediction. Every update reads and rewrites the file under one lock
(`<sweep>/.ledger.lock`, fcntl), so a scoring pass never drops a fit recorded meanwhile. On object
storage (`s3://`), where there is no lock, the ledger is one object rewritten with a conditional
put (`If-Match` the ETag it was read with; `If-None-Match: *` for the first entry): a writer that
lost the race reads the other's version and applies its change again (scalelab.store.atomic
.update_json), so there too no update is lost. A run is looked up where it lives (a run linked
from a sibling sweep: that sweep's copy). `scalelab sweep ledger DIR` prints it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from scipy import stats

from scalelab.store import objects
from scalelab.store.atomic import atomic_write_json, update_json
from scalelab.store.claims import CLAIMS, claimed_elsewhere, find_finished_elsewhere, run_location
from scalelab.store.paths import SweepLayout, check_run_id
from scalelab.store.records import read_status


def ledger_path(sweep_dir: str | Path) -> str | Path:
    return SweepLayout(sweep_dir).ledger


def _empty() -> dict[str, list[dict[str, Any]]]:
    return {"fits": [], "predictions": [], "studies": []}


def read_ledger(sweep_dir: str | Path) -> dict[str, list[dict[str, Any]]]:
    """The ledger (empty when there is none); every prediction's run id checked before it names a path."""
    path = ledger_path(sweep_dir)
    if objects.is_url(path):
        raw = objects.read_bytes(path)
        return _checked(json.loads(raw), path) if raw else _empty()
    if not path.exists():
        return _empty()
    return _checked(json.loads(path.read_text()), path)


def _checked(data: dict[str, Any], path: str | Path) -> dict[str, list[dict[str, Any]]]:
    data.setdefault("fits", [])
    data.setdefault("predictions", [])
    data.setdefault("studies", [])
    for p in data["predictions"]:
        check_run_id(p.get("run_id"), f"{path}: prediction for run")
    for e in data["studies"]:
        for ids in (e.get("run_ids") or {}).values():
            for run_id in [ids] if isinstance(ids, str) else ids:
                check_run_id(run_id, f"{path}: study entry's run")
    return data


def _update(sweep_dir: str | Path, change) -> Any:
    """Read, change and rewrite the ledger with no lost update (module docstring): under the fcntl
    lock locally, by conditional puts on object storage. change(ledger) -> (result, changed)."""
    path = ledger_path(sweep_dir)
    if objects.is_url(path):
        return update_json(path, lambda book: change(_checked(book, path)), default=_empty)
    with locked(sweep_dir):
        book = read_ledger(sweep_dir)
        result, changed = change(book)
        if changed:
            atomic_write_json(path, book)
        return result


def _status(sweep_dir: str | Path, run_id: str) -> dict[str, Any] | None:
    """status.json of the sweep's run where it lives (a run of a sibling sweep: that copy)."""
    return read_status(run_location(sweep_dir, check_run_id(run_id, f"{sweep_dir}: run id")))


def _started(sweep_dir: str | Path, run_id: str) -> bool:
    """Whether run_id has started anywhere in the store root: in this sweep, claimed by another sweep,
    or finished in one that has not linked it here yet (it will be linked at launch, and its loss is
    then no prediction)."""
    if _status(sweep_dir, run_id) is not None:
        return True
    if objects.is_url(sweep_dir):
        return objects.exists(objects.join(objects.parent(sweep_dir), CLAIMS, f"{run_id}.json"))
    return claimed_elsewhere(sweep_dir, run_id) is not None or find_finished_elsewhere(sweep_dir, run_id) is not None


@contextlib.contextmanager
def locked(sweep_dir: str | Path) -> Iterator[None]:
    """Hold the sweep's ledger lock (an exclusive fcntl lock; released when the holder dies)."""
    fd = os.open(Path(sweep_dir) / ".ledger.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def drift(previous: dict[str, Any] | None, params: dict[str, float]) -> dict[str, dict[str, float]]:
    """Constants of a refit that fall outside the previous round's intervals, {name: {...}}."""
    if not previous:
        return {}
    out = {}
    for name, value in params.items():
        iv = (previous.get("intervals") or {}).get(name)
        if not iv or iv[0] is None or iv[1] is None:
            continue
        if not iv[0] <= value <= iv[1]:
            out[name] = {"value": float(value), "previous": float(previous["params"][name]), "interval": list(iv)}
    return out


def record_round(sweep_dir: str | Path, fit: dict[str, Any], predictions: list[dict[str, Any]]) -> dict[str, Any]:
    """Append one fit and its predictions (before the predicted runs can start); flags the
    predictions that cannot be ones (module docstring)."""
    used = set(fit.get("run_ids") or [])
    recorded_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def change(ledger):
        previous = ledger["fits"][-1] if ledger["fits"] else None
        entry_fit = dict(fit, drift=drift(previous, fit["params"]), recorded_at=recorded_at)
        ledger["fits"].append(entry_fit)
        known = {(p["round"], p["run_id"]) for p in ledger["predictions"]}
        for p in predictions:
            if (p["round"], p["run_id"]) in known:
                continue
            entry = dict(p, measured=None, rel_error=None, covered=None)
            if p["run_id"] in used:
                entry["flag"] = "run used by the fit"
            elif _started(sweep_dir, p["run_id"]):
                entry["flag"] = "run already started"
            ledger["predictions"].append(entry)
        _score(sweep_dir, ledger, None)
        return entry_fit, True

    return _update(sweep_dir, change)


def record_study(sweep_dir: str | Path, studies: list[dict[str, Any]], predictions: list[dict[str, Any]]) -> None:
    """Append a study round's gap predictions and its runs' loss predictions (before the runs start);
    a loss prediction whose run had already started is flagged, as in record_round."""

    def change(ledger):
        known = {(p["round"], p["run_id"]) for p in ledger["predictions"]}
        for p in predictions:
            if (p["round"], p["run_id"]) in known:
                continue
            entry = dict(p, measured=None, rel_error=None, covered=None)
            if _started(sweep_dir, p["run_id"]):
                entry["flag"] = "run already started"
            ledger["predictions"].append(entry)
        known_studies = {(e["round"], e["arm"]) for e in ledger["studies"]}
        for e in studies:
            if (e["round"], e["arm"]) not in known_studies:
                ledger["studies"].append(
                    dict(e, measured_gap=None, measured_winner=None, winner_right=None, covered=None)
                )
        _score(sweep_dir, ledger, None)
        return None, True

    _update(sweep_dir, change)


def _measured(sweep_dir: str | Path, run_id: str, loss_column: str) -> float | None:
    status = _status(sweep_dir, run_id) or {}
    if status.get("status") != "done":
        return None
    measured = status.get(loss_column)
    return float(measured) if measured is not None and math.isfinite(float(measured)) else None


def scored(sweep_dir: str | Path) -> dict[str, list[dict[str, Any]]]:
    """The ledger with every finished run's measurement filled in, read only (`sweep ledger` on a
    store it cannot or should not write; score() records them)."""
    book = read_ledger(sweep_dir)
    _score(sweep_dir if objects.is_url(sweep_dir) else Path(sweep_dir), book, None)
    return book


def score(sweep_dir: str | Path, loss_column: str | None = None) -> list[dict[str, Any]]:
    """Fill in the measured loss of every prediction whose run is done, and the measured gap of every
    study entry whose two runs are; returns the newly scored predictions."""
    sweep_dir = sweep_dir if objects.is_url(sweep_dir) else Path(sweep_dir)

    def change(ledger):
        scored, studies = _score(sweep_dir, ledger, loss_column)
        return scored, bool(scored or studies)

    return _update(sweep_dir, change)


def _score(sweep_dir: str | Path, ledger: dict[str, Any], loss_column: str | None):
    """Score `ledger` in place: (the predictions scored now, the study entries scored now)."""
    scored = []
    for p in ledger["predictions"]:
        if p.get("measured") is not None or p.get("flag"):
            continue
        measured = _measured(sweep_dir, p["run_id"], loss_column or p.get("loss_column") or "final_val_loss")
        if measured is None:
            continue
        lo, hi = p["interval"]
        p["measured"] = measured
        p["rel_error"] = (p["predicted"] - p["measured"]) / p["measured"]
        p["covered"] = bool(lo <= p["measured"] <= hi)
        scored.append(p)
    return scored, _score_studies(sweep_dir, ledger["studies"])


def _mean_se(values: list[float]) -> tuple[float, float | None]:
    """Mean and its standard error (None from one value)."""
    m = sum(values) / len(values)
    if len(values) < 2:
        return m, None
    var = sum((v - m) ** 2 for v in values) / (len(values) - 1)
    return m, math.sqrt(var / len(values))


def _decision(decided: bool, predicted_negative: bool, measured_gap: float) -> str:
    """right | wrong (an interval that excluded 0, on the measured side or not) | none."""
    if not decided:
        return "none"
    return "right" if predicted_negative == (measured_gap < 0) else "wrong"


def _score_study(sweep_dir: str | Path, e: dict[str, Any]) -> bool:
    """Score one study entry in place once all its runs are done (module docstring)."""
    column = e.get("loss_column") or "final_val_loss"
    ids = [e["run_ids"][e["baseline"]], e["run_ids"][e["arm"]]]
    ids = [[x] if isinstance(x, str) else list(x) for x in ids]
    base = [_measured(sweep_dir, r, column) for r in ids[0]]
    arm = [_measured(sweep_dir, r, column) for r in ids[1]]
    if not base or any(v is None for v in base + arm):
        return False
    gap, se = _mean_se([b - a for a, b in zip(base, arm)])
    log_ratio, log_se = _mean_se([math.log(b / a) for a, b in zip(base, arm)])
    t = float(stats.t.ppf(0.5 + e.get("level", 0.95) / 2, len(base) - 1)) if se else math.nan
    lo, hi = e["interval"]
    e.update(
        measured_gap=gap,
        measured_se=se,
        measured_log_ratio=log_ratio,
        measured_log_ratio_se=log_se,
        n_pairs=len(base),
        measured_decided=bool(se is not None and abs(gap) > t * se),
        measured_winner=e["arm"] if gap < 0 else e["baseline"],
        covered=bool(lo <= gap <= hi),
        decision=_decision(e["decided"], e["predicted_gap"] < 0, gap),
    )
    e["winner_right"] = e["measured_winner"] == e["predicted_winner"]
    for view in (e.get("views") or {}).values():
        v_lo, v_hi = view["interval"]
        view["covered"] = bool(v_lo <= gap <= v_hi)
        view["decision"] = _decision(view["decided"], view["gap"] < 0, gap)
    return True


def _score_studies(sweep_dir: str | Path, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The measured gap of study entries whose runs are all done (module docstring)."""
    return [e for e in entries if e.get("measured_gap") is None and _score_study(sweep_dir, e)]


def coverage(predictions: list[dict[str, Any]]) -> dict[str, Any]:
    """How often the intervals held: {n_scored, n_covered, rate, mare}."""
    done = [p for p in predictions if p.get("measured") is not None]
    covered = sum(bool(p["covered"]) for p in done)
    mare = sum(abs(p["rel_error"]) for p in done) / len(done) if done else None
    return {"n_scored": len(done), "n_covered": covered, "rate": covered / len(done) if done else None, "mare": mare}


def format_ledger(ledger: dict[str, list[dict[str, Any]]]) -> str:
    """The ledger as text tables: fits by round, then predicted vs measured, then coverage."""
    lines = ["fits:"]
    lines.append(f"  {'round':>5} {'runs':>4}  {'law':10} {'gates':24} parameters (95% interval)")
    for f in ledger["fits"]:
        iv = f.get("intervals") or {}
        parts = []
        for name, value in f["params"].items():
            lo, hi = (iv.get(name) or [None, None])[:2]
            band = f" [{lo:.3g}, {hi:.3g}]" if lo is not None and hi is not None else ""
            parts.append(f"{name}={value:.4g}{band}")
        gates = f.get("gates") or {}
        verdict = "pass" if gates.get("passed") else "FAIL: " + ",".join(gates.get("failed", []))
        law = "auto" if f.get("stacked") else f["law"]
        lines.append(f"  {f['round']:>5} {len(f.get('run_ids', [])):>4}  {law:10} {verdict:24} " + ", ".join(parts))
        if f.get("stacked"):
            weights = ", ".join(f"{k} {w:.2f}" for k, w in f["stacked"]["weights"].items())
            lines.append(f"        stacked: {weights}; {(f.get('selection') or {}).get('rule', '')}")
        for name, d in (f.get("drift") or {}).items():
            lines.append(
                f"        drift: {name}={d['value']:.4g} is outside the previous round's interval "
                f"[{d['interval'][0]:.4g}, {d['interval'][1]:.4g}]"
            )
    lines.append("predictions:")
    lines.append(
        f"  {'round':>5} {'run':12} {'kind':16} {'N':>10} {'D':>12} {'C':>9} {'predicted':>9} "
        f"{'interval':>19} {'measured':>9} {'error':>7} covered"
    )
    for p in ledger["predictions"]:
        lo, hi = p["interval"]
        measured = f"{p['measured']:.4f}" if p.get("measured") is not None else "pending"
        measured = "not scored" if p.get("flag") else measured
        err = f"{p['rel_error']:+.2%}" if p.get("rel_error") is not None else ""
        cov = "" if p.get("covered") is None else ("yes" if p["covered"] else "NO")
        cov = f"({p['flag']})" if p.get("flag") else cov
        lines.append(
            f"  {p['round']:>5} {p['run_id']:12} {p['kind']:16} {p['params']:>10,} {p['tokens']:>12,} "
            f"{p['flops']:>9.3g} {p['predicted']:>9.4f} [{lo:.4f}, {hi:.4f}] {measured:>9} {err:>7} {cov}"
        )
    c = coverage(ledger["predictions"])
    if c["n_scored"]:
        lines.append(
            f"coverage: {c['n_covered']} of {c['n_scored']} scored predictions inside their interval "
            f"({c['rate']:.0%}); mean |error| {c['mare']:.2%}"
        )
    else:
        lines.append("coverage: no prediction scored yet")
    if ledger.get("studies"):
        lines.append(format_studies(ledger["studies"]))
    return "\n".join(lines)


def format_studies(entries: list[dict[str, Any]]) -> str:
    """A study's predicted vs measured gaps at the target, one line per (round, arm)."""
    lines = ["studies (gap = L_arm - L_baseline at the target; measured: mean over the matched pairs, +- its se):"]
    lines.append(
        f"  {'round':>5} {'arm':12} {'baseline':12} {'C':>9} {'estimator':9} {'predicted':>9} {'interval':>19} "
        f"{'decided':>7} {'winner':12} {'pairs':>5} {'measured':>17} {'measured winner':15} {'decision':>8} covered"
    )
    for e in entries:
        lo, hi = e["interval"]
        measured = "pending"
        if e.get("measured_gap") is not None:
            se = e.get("measured_se")
            measured = f"{e['measured_gap']:+.4f}" + (f" +- {se:.4f}" if se is not None else "")
        decision = e.get("decision") or ""
        cov = "" if e.get("covered") is None else ("yes" if e["covered"] else "NO")
        pairs = len(e["run_ids"][e["baseline"]]) if not isinstance(e["run_ids"][e["baseline"]], str) else 1
        lines.append(
            f"  {e['round']:>5} {e['arm']:12} {e['baseline']:12} {e['target_flops']:>9.3g} "
            f"{e.get('estimator', 'separate'):9} {e['predicted_gap']:>+9.4f} [{lo:+.4f}, {hi:+.4f}] "
            f"{'yes' if e['decided'] else 'no':>7} {e['predicted_winner']:12} {pairs:>5} {measured:>17} "
            f"{e.get('measured_winner') or '':15} {decision:>8} {cov}"
        )
        for name, v in (e.get("views") or {}).items():
            if name == e.get("estimator"):
                continue
            v_lo, v_hi = v["interval"]
            scored = (
                "" if v.get("covered") is None else f"  {v['decision']}, {'covered' if v['covered'] else 'NOT covered'}"
            )
            lines.append(f"        {name:>16}: {v['gap']:+.4f} [{v_lo:+.4f}, {v_hi:+.4f}]{scored}")
    return "\n".join(lines)
