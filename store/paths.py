"""Where things are in a sweep store: a sweep's address, its runs, the file that lists them.

    <root>/<sweep>/sweep.yaml             the spec as given (later rounds: rounds/<name>.yaml)
    <root>/<sweep>/sweep.resolved.json    every run of every round: id, config, labels, N, D, C
    <root>/<sweep>/runs/<run_id>/         a run's records and checkpoints (scalelab.store.records)

A sweep directory is a local or shared POSIX path, or an object-storage URL (`s3://bucket/prefix`,
scalelab.store.objects); every function here takes either and returns the same kind.
"""

from __future__ import annotations

import re
from pathlib import Path

from scalelab.errors import UsageError
from scalelab.store import objects

RESOLVED = "sweep.resolved.json"
RUN_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")  # config_hash gives 12 hex digits


def location(sweep_dir: str | Path) -> str | Path:
    """A sweep's address: an object-storage URL as given, a local path made absolute."""
    return sweep_dir if objects.is_url(sweep_dir) else Path(sweep_dir).resolve()


def runs_dir(sweep_dir: str | Path) -> Path:
    return objects.join(sweep_dir, "runs") if objects.is_url(sweep_dir) else Path(sweep_dir) / "runs"


def run_path(sweep_dir: str | Path, run_id: str) -> Path:
    """<sweep>/runs/<run_id>; UsageError for a run id that is not one plain name (read from a record)."""
    check_run_id(run_id, f"{sweep_dir}: run id")
    return objects.join(sweep_dir, "runs", run_id) if objects.is_url(sweep_dir) else runs_dir(sweep_dir) / run_id


def check_run_id(run_id: object, where: str) -> str:
    """A run id as the store uses it in paths: one plain name (letters, digits, '.', '_', '-'; no
    leading dot), else UsageError naming it and where it was read."""
    if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
        raise UsageError(f"{where} {run_id!r} is not a run id (letters, digits, '.', '_', '-'); fix the record")
    return run_id


def is_sweep_dir(path: str | Path) -> bool:
    if objects.is_url(path):
        return objects.exists(objects.join(path, "sweep.yaml"))
    return (Path(path) / "sweep.yaml").is_file()
