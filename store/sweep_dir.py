"""A sweep directory: its spec, and sweep.resolved.json, the list of every run of every round.

    <root>/<sweep>/sweep.yaml             the spec as given (later rounds: rounds/<name>.yaml)
    <root>/<sweep>/sweep.resolved.json    every run of every round: id, config, labels, N, D, C

    init_sweep(sweep_dir, spec_text, spec_name, runs, name)   # new sweep, or a later round of it
    read_resolved(sweep_dir)["runs"]                          # what `sweep resume` trains

On object storage (`s3://bucket/prefix/sweep`) the same files are objects, each written whole
(a later round's spec under rounds/ as locally); sweep.resolved.json there is extended by
conditional puts, so two drivers never drop each other's runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from scalelab.errors import UsageError
from scalelab.store import objects
from scalelab.store.atomic import atomic_write_bytes, atomic_write_json, replace_if, update_json
from scalelab.store.paths import RESOLVED, SPEC, check_run_id, is_sweep_dir, runs_dir

DRIVER_PREFIX = "driver/"  # a detached driver's spec copy (`sweep launch --detach`), written before the sweep


def init_sweep(sweep_dir: str | Path, spec_text: str, spec_name: str, runs: list[dict], name: str) -> str:
    """Create or extend a sweep directory; returns the spec's file name relative to the sweep.

    A new directory gets sweep.yaml. Launching another spec into an existing sweep (a later round
    from `sweep next`) stores it under rounds/ and appends its runs to sweep.resolved.json.
    """
    if objects.is_url(sweep_dir):
        return _init_object_sweep(sweep_dir, spec_text, spec_name, runs, name)
    sweep_dir = Path(sweep_dir)
    if sweep_dir.exists() and not sweep_dir.is_dir():
        raise UsageError(f"--out {sweep_dir} is a file; give a sweep directory (new, or one to extend)")
    if sweep_dir.exists() and not is_sweep_dir(sweep_dir) and any(sweep_dir.iterdir()):
        raise UsageError(f"--out {sweep_dir} exists and is not a sweep directory; choose an empty or new one")
    runs_dir(sweep_dir).mkdir(parents=True, exist_ok=True)
    if not is_sweep_dir(sweep_dir):
        atomic_write_bytes(sweep_dir / SPEC, spec_text.encode())
        rel = SPEC
    elif (sweep_dir / SPEC).read_text() == spec_text:
        rel = SPEC
    else:
        rel = f"rounds/{spec_name}.yaml"
        existing = sweep_dir / rel
        if existing.exists() and existing.read_text() != spec_text:
            raise UsageError(f"{existing} holds a different spec of the same name; rename the spec file")
        atomic_write_bytes(existing, spec_text.encode())
    resolved = read_resolved(sweep_dir)
    resolved.setdefault("name", name)
    specs = resolved.setdefault("specs", [])
    if rel not in specs:
        specs.append(rel)
    known = {r["run_id"] for r in resolved.setdefault("runs", [])}
    for r in runs:
        if r["run_id"] not in known:
            resolved["runs"].append(dict(r, spec=rel))
            known.add(r["run_id"])
    atomic_write_json(sweep_dir / RESOLVED, resolved)
    return rel


def _init_object_sweep(url: str, spec_text: str, spec_name: str, runs: list[dict], name: str) -> str:
    """init_sweep on object storage: every check before the first object is written (what the runs
    need of the store, e.g. single-process layouts, the caller checks first: scalelab.sweeps.execution.execute).
    sweep.yaml and a round's spec are created with `If-None-Match: *`, and sweep.resolved.json is
    extended by conditional puts (scalelab.store.atomic.update_json), so two drivers extending one
    sweep never drop each other's runs."""
    objects.check_sweep(url, "--out")
    spec = objects.read_bytes(objects.join(url, SPEC))
    if spec is None and [k for k in objects.list_objects(url) if not k.startswith(DRIVER_PREFIX)]:
        raise UsageError(f"--out {url} holds objects but no sweep.yaml; choose an empty or new prefix")
    rel = SPEC if spec is None or spec.decode() == spec_text else f"rounds/{spec_name}.yaml"
    target = objects.join(url, rel)
    if not replace_if(target, spec_text.encode(), None) and objects.read_bytes(target).decode() != spec_text:
        raise UsageError(f"{target} holds a different spec of the same name; rename the spec file")

    def extend(resolved: dict[str, Any]) -> tuple[None, bool]:
        resolved.setdefault("name", name)
        specs = resolved.setdefault("specs", [])
        if rel not in specs:
            specs.append(rel)
        known = {r["run_id"] for r in resolved.setdefault("runs", [])}
        resolved["runs"] += [dict(r, spec=rel) for r in runs if r["run_id"] not in known]
        return None, True

    update_resolved(url, extend)
    return rel


def update_resolved(sweep_dir: str | Path, change) -> Any:
    """Read-modify-write sweep.resolved.json: change(resolved) -> (result, changed). On object
    storage by conditional puts (no lost update between two drivers); locally as before, one
    driver per sweep directory."""
    if objects.is_url(sweep_dir):
        return update_json(objects.join(sweep_dir, RESOLVED), change, default=dict)
    resolved = read_resolved(sweep_dir)
    result, changed = change(resolved)
    if changed:
        write_resolved(sweep_dir, resolved)
    return result


def write_resolved(sweep_dir: str | Path, resolved: dict[str, Any]) -> None:
    target = objects.join(sweep_dir, RESOLVED) if objects.is_url(sweep_dir) else Path(sweep_dir) / RESOLVED
    atomic_write_json(target, resolved)


def read_resolved(sweep_dir: str | Path) -> dict[str, Any]:
    """sweep.resolved.json ({} when there is none); every run id in it checked before any is used
    in a path (UsageError naming it)."""
    where = objects.join(sweep_dir, RESOLVED) if objects.is_url(sweep_dir) else str(Path(sweep_dir) / RESOLVED)
    if objects.is_url(sweep_dir):
        data = objects.read_bytes(where)
        resolved = {} if data is None else json.loads(data)
    else:
        path = Path(where)
        resolved = json.loads(path.read_text()) if path.exists() else {}
    for r in resolved.get("runs") or []:
        check_run_id(r.get("run_id"), f"{where}: run")
        if r.get("depends_on") is not None:
            check_run_id(r["depends_on"], f"{where}: depends_on")
    return resolved
