"""`scalelab sweep status`: a sweep's runs grouped by state, with progress, losses and failures.

    info = sweep_status("results/iso")       # JSON-ready dict (what --json prints)
    print(format_status(info))

A run shows `running` both while a trial trains it and after its driver died mid-run; `age` (seconds
since its status or metrics last changed) tells the two apart. Failures list the last error of
each run (from status.json) and how many trial attempts failed (from events.jsonl).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from scalelab import store
from scalelab.errors import UsageError, printable
from scalelab.store import objects
from scalelab.sweeps.execution.ray_cluster import DRIVER_FILE

ORDER = ("running", "failed", "pending", "diverged", "done")


def sweep_status(sweep_dir: str | Path) -> dict[str, Any]:
    shown = sweep_dir  # an s3:// sweep is read from a local copy of its records (objects.local_view)
    sweep_dir = objects.local_view(sweep_dir, "sweep_dir") if objects.is_url(sweep_dir) else Path(sweep_dir)
    if not store.is_sweep_dir(sweep_dir):
        raise UsageError(f"{sweep_dir} is not a sweep directory (no sweep.yaml)")
    df = store.load_runs(sweep_dir)
    events = store.read_events(sweep_dir)
    fails: dict[str, int] = {}
    retries: dict[str, int] = {}  # the driver's count: a trial lost with its node writes no `fail`
    starts: dict[str, int] = {}
    for e in events:
        if e.get("event") == "fail":
            fails[e["run_id"]] = fails.get(e["run_id"], 0) + 1
        elif e.get("event") == "retry":
            retries[e["run_id"]] = retries.get(e["run_id"], 0) + 1
        elif e.get("event") == "start":
            starts[e["run_id"]] = starts.get(e["run_id"], 0) + 1
    now = time.time()
    runs = []
    for r in df.iter_rows(named=True):
        run_dir = store.run_path(sweep_dir, r["run_id"])
        mtimes = [p.stat().st_mtime for p in (run_dir / "status.json", run_dir / "metrics.parquet") if p.exists()]
        runs.append(
            dict(
                run_id=r["run_id"],
                status=r["status"],
                step=r["step"],
                num_steps=r["num_steps"],
                progress=r["progress"],
                params=r["params"],
                tokens=r["tokens"],
                flops=r["flops"],
                final_train_loss=r["final_train_loss"],
                final_val_loss=r["final_val_loss"],
                attempts=r["attempts"],
                trial_starts=starts.get(r["run_id"], 0),
                trial_failures=max(fails.get(r["run_id"], 0), retries.get(r["run_id"], 0)),
                error=r["error"],
                age_s=(now - max(mtimes)) if mtimes else None,
                linked=run_dir.is_symlink(),
                design=_design(r),
                records_lost=_records_lost(run_dir),
            )
        )
    counts: dict[str, int] = {}
    for r in runs:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    resolved = store.read_resolved(sweep_dir)
    return {
        "sweep": str(shown),
        "name": resolved.get("name"),
        "specs": resolved.get("specs", []),
        "counts": counts,
        "driver": read_json(sweep_dir / DRIVER_FILE),  # a detached driver's Ray Job, if any
        "runs": sorted(runs, key=lambda r: (ORDER.index(r["status"]) if r["status"] in ORDER else 9, r["flops"] or 0)),
    }


def _records_lost(run_dir: Path) -> list[dict[str, Any]]:
    """status.json's `records_lost` (records a resume found unreadable), the well-formed entries."""
    try:
        lost = (store.read_status(run_dir) or {}).get("records_lost") or []
    except (OSError, ValueError, AttributeError):
        return []
    keys = {"file", "before_step", "attempt"}
    return [e for e in lost if isinstance(e, dict) and keys <= set(e)] if isinstance(lost, list) else []


def _design(r: dict[str, Any]) -> str:
    parts = []
    if r.get("flops_budget"):
        parts.append(f"C={r['flops_budget']:.2g}")
    if r.get("tokens_per_param"):
        parts.append(f"D/N={r['tokens_per_param']:g}")
    if r.get("cooldown"):
        parts.append(r["cooldown"])
    if r.get("proposal"):
        parts.append(str(r["proposal"]))
    return " ".join(parts)


def _f(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def format_status(info: dict[str, Any]) -> str:
    counts = ", ".join(
        f"{k} {v}"
        for k, v in sorted(info["counts"].items(), key=lambda kv: ORDER.index(kv[0]) if kv[0] in ORDER else 9)
    )
    lines = [f"sweep {info['name']} ({info['sweep']}): {sum(info['counts'].values())} runs: {counts}"]
    if info.get("driver"):
        d = info["driver"]
        lines.append(f"driver: Ray job {d['job_id']} (ray job status --address {d['address']} {d['job_id']})")
    head = (
        f"{'run_id':12s}  {'status':8s}  {'progress':>13s}  {'N':>9s}  {'D':>10s}  "
        f"{'train':>7s}  {'val':>7s}  {'fails':>5s}  design"
    )
    lines += [head, "-" * len(head)]
    for r in info["runs"]:
        prog = f"{r['step']}/{r['num_steps']}" if r["num_steps"] else "-"
        status = r["status"] + ("*" if r["linked"] else "")
        if r["status"] == "running" and r["age_s"] is not None and r["age_s"] > 120:
            status += "?"
        lines.append(
            f"{r['run_id']:12s}  {status:8s}  {prog:>13s}  {_f(r['params'], ',d'):>9s}  {_f(r['tokens'], ',d'):>10s}  "
            f"{_f(r['final_train_loss'], '.4f'):>7s}  {_f(r['final_val_loss'], '.4f'):>7s}  "
            f"{r['trial_failures']:>5d}  {r['design']}"
        )
    errors = [r for r in info["runs"] if r["error"] and r["status"] != "done"]
    for r in errors:
        lines.append(f"  {r['run_id']}: {r['error']}")
    for r in info["runs"]:
        for lost in r.get("records_lost") or []:
            lines.append(
                f"  {r['run_id']}: its {lost['file']} rows before step {lost['before_step']} are lost (unreadable "
                f"when attempt {lost['attempt']} resumed; kept as {lost['file']}.corrupt)"
            )
    if any(r["linked"] for r in info["runs"]):
        lines.append("* trained in another sweep of the store root (linked, not retrained)")
    if any(r["status"] == "running" and (r["age_s"] or 0) > 120 for r in info["runs"]):
        lines.append("? no update for 2+ minutes: its driver may have died; `scalelab sweep resume` continues it")
    return printable("\n".join(lines))  # names and errors come from the store's records


def read_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None
