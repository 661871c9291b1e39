"""A `sweep next` round in Weights & Biases: one run of job_type `fit` in the sweep's group.

    log_rounds(sweep_dir, images=fit_images)   # after `sweep next`: every round not yet logged
    update_ledger(sweep_dir, scored)           # after a launch scored proposed runs: their rounds' ledger tables

A fit run (id `fit-r<K>-<hash of the group>`, name `fit round K`, tags `round:K`, `gates:pass|fail`,
`law:<name>`) logs from the round's own record, fits/round_K.json:

  tables   fit/parameters (estimate and interval of every constant, a = beta/(alpha+beta), the loss,
           N* and D* at the target), fit/gates (each gate: result, value, threshold), fit/brackets
           (each budget's sizes, best size, Approach 2's vertex and interval), fit/backtest,
           proposals (kind, run, N, D, C, predicted loss and interval), ledger (every round's
           predictions with the measured loss once their runs are done, the error and coverage);
  images   the PNGs `images(sweep_dir, record, out_dir)` draws (the CLI passes scalelab.analysis.
           wandb_images: the IsoFLOP curves, the compute frontier, the ledger) — the sweep side draws nothing;
  summary  the constants (`fit/<name>`, `fit/<name>_lo|_hi`), gates_passed, failed gates, the loss at
           the target with its interval, backtest MAREs, the ledger's coverage.

The ledger table is logged at step = the number of scored predictions, so when a proposed run
finishes `update_ledger` resumes that round's fit run and logs the table again at a later step
(an offline fit run resumed offline is a second folder with the same id: `wandb sync` both).
Offline runs live in <sweep>/wandb/. A round that already has a W&B folder is not logged again.
"""

from __future__ import annotations

import hashlib
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scalelab.errors import UsageError
from scalelab.fitting.entry.saved_fit import load_saved_fit
from scalelab.store import ledger, objects
from scalelab.store.paths import SweepLayout
from scalelab.sweeps.tracking.wandb_runs import SweepWandb, guarded, reachable_mode, sweep_wandb
from scalelab.train.loggers import start_wandb

Images = Callable[[Path, dict[str, Any], Path], dict[str, Path]]  # (sweep_dir, round record, out dir) -> {name: PNG}


def fit_run_id(group: str, k: int) -> str:
    return f"fit-r{k}-{hashlib.sha256(group.encode()).hexdigest()[:10]}"


def logged(directory: Path, wandb_id: str) -> bool:
    """Whether a W&B run of this id already has a folder (offline or online) under `directory`."""
    return any((directory / "wandb").glob(f"*run-*-{wandb_id}"))


def round_records(sweep_dir: Path) -> list[dict[str, Any]]:
    """Every fits/round_K.json of the sweep, by round (a study's rounds, one fit per arm, are not
    fit runs: their arms' runs carry the `arm:` tag)."""
    out = []
    for path in SweepLayout(sweep_dir).round_fits():
        try:
            fit = load_saved_fit(path)
        except UsageError:  # unreadable, or a study's round (a fit per arm): no fit run to log
            continue
        if fit.round is not None:
            out.append(fit.round)
    return out


# ---------------------------------------------------------------------------------------------
# The tables (plain rows: W&B's Table is built at the edge)
# ---------------------------------------------------------------------------------------------


def _f(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def parameter_rows(record: dict[str, Any]) -> list[list[Any]]:
    """[name, estimate, lo, hi] for every constant, a, and the optimum at the target."""
    iv = record.get("intervals") or {}
    rows = [[k, _f(v), *[_f(x) for x in (iv.get(k) or [None, None])[:2]]] for k, v in record["params"].items()]
    fit = record.get("fit") or {}
    if fit.get("a") is not None:
        rows.append(["a = beta/(alpha+beta)", _f(fit["a"]), *[_f(x) for x in (iv.get("a") or [None, None])[:2]]])
    if record.get("loss_at_target") is not None:
        lo, hi = record.get("loss_at_target_interval") or [None, None]
        rows.append([f"L*(C={record['target_flops']:.3g})", _f(record["loss_at_target"]), _f(lo), _f(hi)])
        rows.append([f"N*(C={record['target_flops']:.3g})", _f(record.get("n_opt_at_target")), None, None])
        rows.append([f"D*(C={record['target_flops']:.3g})", _f(record.get("d_opt_at_target")), None, None])
    return rows


def gate_rows(gates: dict[str, Any]) -> list[list[Any]]:
    return [
        [g["name"], "pass" if g["passed"] else "FAIL", str(g.get("value")), str(g.get("threshold"))]
        for g in gates.get("gates", [])
    ]


def bracket_rows(gates: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for b in gates.get("brackets", []):
        lo, hi = b.get("vertex_interval") or [None, None]
        why = b.get("edge") or ("flat" if b.get("flat") else "vertex outside")
        verdict = "yes" if b.get("bracketed") else f"no ({why})"
        sizes = ", ".join(f"{s:,.0f}" for s in b.get("sizes", []))
        rows.append([_f(b["flops"]), sizes, _f(b.get("best_size")), _f(b.get("vertex")), _f(lo), _f(hi), verdict])
    return rows


def backtest_rows(backtest: dict[str, Any]) -> list[list[Any]]:
    return [
        [
            name,
            _f(bt.get("mare")),
            _f(bt.get("bias")),
            bt.get("n_train"),
            bt.get("n_test"),
            _f(bt.get("extrapolation_decades")),
        ]  # fmt: skip
        for name, bt in (backtest or {}).items()
        if "mare" in bt
    ]


def proposal_rows(record: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for p in record.get("proposals", []):
        lo, hi = p.get("predicted_interval") or [None, None]
        rows.append(
            [p["kind"], p["run_id"], _f(p.get("budget")), p["params"], p["tokens"], _f(p["flops"]),
             _f(p["predicted_loss"]), _f(lo), _f(hi), _f(p.get("width_reduction"))]
        )  # fmt: skip
    return rows


def ledger_rows(book: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for p in book.get("predictions", []):
        lo, hi = p["interval"]
        rows.append(
            [p["round"], p["run_id"], p["kind"], p["params"], p["tokens"], _f(p["flops"]), _f(p["predicted"]),
             _f(lo), _f(hi), _f(p.get("measured")), _f(p.get("rel_error")),
             None if p.get("covered") is None else bool(p["covered"])]
        )  # fmt: skip
    return rows


COLUMNS = {
    "fit/parameters": ["parameter", "estimate", "lo", "hi"],
    "fit/gates": ["gate", "result", "value", "passes when"],
    "fit/brackets": ["budget C", "sizes N", "best N", "vertex", "vertex lo", "vertex hi", "bracketed"],
    "fit/backtest": ["protocol", "MARE", "bias", "train runs", "test runs", "extrapolation decades"],
    "proposals": ["kind", "run_id", "budget", "N", "D", "C", "predicted", "lo", "hi", "width reduction"],
    "ledger": ["round", "run_id", "kind", "N", "D", "C", "predicted", "lo", "hi", "measured", "error", "covered"],
}


def fit_tables(record: dict[str, Any], book: dict[str, Any]) -> dict[str, list[list[Any]]]:
    """Every table of a fit run as rows (COLUMNS names their columns)."""
    gates = record.get("gates") or {}
    return {
        "fit/parameters": parameter_rows(record),
        "fit/gates": gate_rows(gates),
        "fit/brackets": bracket_rows(gates),
        "fit/backtest": backtest_rows(record.get("backtest") or {}),
        "proposals": proposal_rows(record),
        "ledger": ledger_rows(book),
    }


def fit_summary(record: dict[str, Any], book: dict[str, Any]) -> dict[str, Any]:
    gates = record.get("gates") or {}
    out: dict[str, Any] = {
        "round": record.get("round"),
        "law": record.get("law"),
        "n_runs": record.get("n_points"),
        "gates_passed": bool(gates.get("passed")),
        "gates_failed": ", ".join(gates.get("failed", [])) or "none",
        "target_flops": record.get("target_flops"),
        "loss_at_target": record.get("loss_at_target"),
    }
    iv = record.get("intervals") or {}
    for name, value in record.get("params", {}).items():
        out[f"fit/{name}"] = value
        lo, hi = (iv.get(name) or [None, None])[:2]
        out[f"fit/{name}_lo"], out[f"fit/{name}_hi"] = lo, hi
    lo, hi = record.get("loss_at_target_interval") or [None, None]
    out["loss_at_target_lo"], out["loss_at_target_hi"] = lo, hi
    for name, bt in (record.get("backtest") or {}).items():
        if "mare" in bt:
            out[f"backtest/{name}_mare"] = bt["mare"]
    out |= _coverage(book)
    return {k: v for k, v in out.items() if v is not None}


def fit_tags(sw: SweepWandb, record: dict[str, Any]) -> list[str]:
    verdict = "gates:pass" if (record.get("gates") or {}).get("passed") else "gates:fail"
    return [f"round:{record['round']}", verdict, f"law:{record.get('law')}", *sw.section.tags]


def fit_config(sw: SweepWandb, record: dict[str, Any]) -> dict[str, Any]:
    keys = ("target_flops", "budget_flops", "next_budget", "loss_column", "flops_convention", "code_version", "run_ids")
    head = {"sweep": sw.group, "round": record["round"], "options": (record.get("fit") or {}).get("options")}
    return head | {k: record.get(k) for k in keys}


def _coverage(book: dict[str, Any]) -> dict[str, Any]:
    c = ledger.coverage(book.get("predictions", []))
    return {"ledger/n_scored": c["n_scored"], "ledger/coverage": c["rate"], "ledger/mare": c["mare"]}


# ---------------------------------------------------------------------------------------------
# Logging
# ---------------------------------------------------------------------------------------------


def _tables(wandb, tables: dict[str, list[list[Any]]]) -> dict[str, Any]:
    return {name: wandb.Table(columns=COLUMNS[name], data=rows) for name, rows in tables.items()}


def _images(wandb, images: Images | None, sweep_dir: Path, record: dict[str, Any], log) -> dict[str, Any]:
    """The round's plots as W&B images (W&B copies the PNGs into the run)."""
    if images is None:
        return {}
    try:
        pngs = images(sweep_dir, record, Path(tempfile.mkdtemp(prefix="scalelab-wandb-")))
    except Exception as e:  # noqa: BLE001 - a plot that cannot be drawn must not lose the tables
        log(f"warning: the round's plots for W&B failed ({type(e).__name__}: {e}); logging the tables only")
        return {}
    return {f"plots/{name}": wandb.Image(str(path)) for name, path in pngs.items()}


def log_round(
    sweep_dir: str | Path,
    record: dict[str, Any],
    *,
    sw: SweepWandb | None = None,
    images: Images | None = None,
    log=print,
) -> str | None:
    """Log one round (its fits/round_K.json record) as a fit run; returns its W&B id (None: W&B off)."""
    sweep_dir = Path(sweep_dir)
    sw = sw or sweep_wandb(sweep_dir)
    mode = reachable_mode(sw.mode, log)
    if mode == "disabled":
        return None
    k = int(record["round"])
    book = ledger.read_ledger(sweep_dir)
    run = start_wandb(
        mode=mode,
        project=sw.project,
        run_id=fit_run_id(sw.group, k),
        directory=sweep_dir,
        name=f"fit round {k}",
        group=sw.group,
        tags=fit_tags(sw, record),
        job_type="fit",
        config=fit_config(sw, record),
        warn=log,
    )
    if run is None:
        return None
    import wandb

    data = _tables(wandb, fit_tables(record, book)) | _images(wandb, images, sweep_dir, record, log)
    run.log(data, step=_coverage(book)["ledger/n_scored"])
    run.summary.update(fit_summary(record, book))
    run.finish()
    return run.id


def log_rounds(
    sweep_dir: str | Path, *, images: Images | None = None, mode: str | None = None, force: bool = False, log=print
) -> list[str]:
    """Log every round of the sweep that has no W&B run yet (all of them with `force`); their ids."""
    if objects.is_url(sweep_dir):
        return []
    sweep_dir = Path(sweep_dir)
    sw = sweep_wandb(sweep_dir, mode=mode)
    if sw.mode == "disabled":
        return []
    out = []
    for record in round_records(sweep_dir):
        if not force and logged(sweep_dir, fit_run_id(sw.group, int(record["round"]))):
            continue
        wandb_id = guarded(f"round {record['round']}", log, log_round, sweep_dir, record, sw=sw, images=images, log=log)
        if wandb_id:
            out.append(wandb_id)
    return out


def update_ledger(sweep_dir: str | Path, scored: list[dict[str, Any]], *, log=print) -> list[str]:
    """After proposed runs finished (`scored`: ledger.score's newly scored predictions): the ledger
    table of each of their rounds' fit runs, logged again at the new number of scored predictions.
    Rounds whose fit run was never logged are left alone. Returns the W&B ids updated."""
    if objects.is_url(sweep_dir) or not scored:
        return []
    sweep_dir = Path(sweep_dir)
    sw = sweep_wandb(sweep_dir)
    mode = reachable_mode(sw.mode, log)
    if mode == "disabled":
        return []
    book = ledger.read_ledger(sweep_dir)
    records = {int(r["round"]): r for r in round_records(sweep_dir)}
    out = []
    for k in sorted({int(p["round"]) for p in scored} & set(records)):
        wandb_id = fit_run_id(sw.group, k)
        if logged(sweep_dir, wandb_id) and guarded(
            f"the ledger of round {k}", log, _log_ledger, sw, mode, sweep_dir, records[k], book, log
        ):
            out.append(wandb_id)
    return out


def _log_ledger(sw: SweepWandb, mode: str, sweep_dir: Path, record: dict[str, Any], book: dict[str, Any], log) -> bool:
    """The round's fit run resumed (its id, tags and config), the ledger table at the next step."""
    k = int(record["round"])
    run = start_wandb(
        mode=mode, project=sw.project, run_id=fit_run_id(sw.group, k), directory=sweep_dir, group=sw.group,
        job_type="fit", name=f"fit round {k}", tags=fit_tags(sw, record), config=fit_config(sw, record), warn=log,
    )  # fmt: skip
    if run is None:
        return False
    import wandb

    coverage = _coverage(book)
    run.log(_tables(wandb, {"ledger": ledger_rows(book)}) | coverage, step=coverage["ledger/n_scored"])
    run.summary.update({name: v for name, v in coverage.items() if v is not None})
    run.finish()
    return True
