"""A plan on disk: plan.json (everything), run.yaml (the resolved run config), sweep.yaml (a one-point spec).

    written = write_plan(plan.to_dict(), "results/iso/plans/plan-C2e14")
    scalelab run results/iso/plans/plan-C2e14/run.yaml --out RUN_DIR      # trains it as planned
    scalelab sweep launch results/iso/plans/plan-C2e14/sweep.yaml --out results/iso   # ... into the store

`scalelab report` shows every plan under a sweep's plans/ (scalelab.analysis.plan_page).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from scalelab.store.atomic import atomic_write_bytes
from scalelab.store.paths import SweepLayout
from scalelab.sweeps.specs.spec import dump_spec

PLAN_FILE = "plan.json"


def _clean(obj: Any) -> Any:
    """JSON-safe copy: non-finite floats become null, tuples lists."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def write_plan(plan: dict[str, Any], out: str | Path) -> list[Path]:
    out = Path(out)
    # sweep.yaml where a sweep keeps its spec, so `scalelab sweep launch OUT` trains the planned run
    paths = [out / PLAN_FILE, out / "run.yaml", Path(SweepLayout(out).spec)]
    atomic_write_bytes(paths[0], (json.dumps(_clean(plan), indent=1) + "\n").encode())
    atomic_write_bytes(paths[1], dump_spec(plan["config"]).encode())
    atomic_write_bytes(paths[2], dump_spec(plan["spec"]).encode())
    return paths


def read_plans(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """Every plan saved under a sweep's plans/ (oldest first); unreadable files are skipped."""
    found = []
    for path in sorted(Path(SweepLayout(sweep_dir).plans).glob(f"*/{PLAN_FILE}"), key=lambda p: p.stat().st_mtime):
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    return found
