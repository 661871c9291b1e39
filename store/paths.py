"""Where things are in a sweep store: every path of a sweep, its address, its runs.

    <root>/<sweep>/sweep.yaml             the spec as given (later rounds: rounds/<name>.yaml)
    <root>/<sweep>/sweep.resolved.json    every run of every round: id, config, labels, N, D, C
    <root>/<sweep>/runs/<run_id>/         a run's records and checkpoints (scalelab.store.records)
    <root>/<sweep>/rounds/round_K.yaml    the closed loop's round K spec (`sweep next`)
    <root>/<sweep>/fits/round_K.json      round K's fit, gates, backtests and proposals
    <root>/<sweep>/ledger.json            the closed loop's fits and scored predictions
    <root>/<sweep>/events.jsonl           the trials' event log (events/ on object storage)
    <root>/<sweep>/plans/<name>/          `scalelab plan-run`'s plans of the sweep

    layout = SweepLayout(sweep_dir)       # every one of those paths, named; the only place they are built
    layout.spec, layout.round_fit(3), layout.round_fits()

A sweep directory is a local or shared POSIX path, or an object-storage URL (`s3://bucket/prefix`,
scalelab.store.objects); every function here takes either and returns the same kind.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from scalelab.errors import UsageError
from scalelab.store import files, objects

SPEC = "sweep.yaml"
RESOLVED = "sweep.resolved.json"
LEDGER = "ledger.json"
EVENTS = "events.jsonl"
ROUND = "round_"  # rounds/round_K.yaml, fits/round_K.json
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
    return files.exists(SweepLayout(path).spec)


@dataclass(frozen=True)
class SweepLayout:
    """Every path of one sweep's store: Paths for a local directory, URLs on object storage.

    Callers outside scalelab.store name a sweep's files through this, never by joining names, so the
    layout (module docstring) has one owner.
    """

    root: str | Path

    def file(self, rel: str) -> str | Path:
        """A file named relative to the sweep (a spec of sweep.resolved.json's `specs`: rounds/x.yaml)."""
        return files.join(self.root, rel)

    @property
    def spec(self) -> str | Path:
        """sweep.yaml: the spec the sweep was launched with."""
        return files.join(self.root, SPEC)

    @property
    def resolved(self) -> str | Path:
        return files.join(self.root, RESOLVED)

    @property
    def ledger(self) -> str | Path:
        return files.join(self.root, LEDGER)

    @property
    def events(self) -> str | Path:
        return files.join(self.root, EVENTS)

    @property
    def runs(self) -> str | Path:
        return files.join(self.root, "runs")

    def run(self, run_id: str) -> str | Path:
        return run_path(self.root, run_id)

    @property
    def fits(self) -> str | Path:
        return files.join(self.root, "fits")

    @property
    def rounds(self) -> str | Path:
        return files.join(self.root, "rounds")

    @property
    def plans(self) -> str | Path:
        return files.join(self.root, "plans")

    def plan(self, name: str) -> str | Path:
        return files.join(self.root, "plans", name)

    def round_fit(self, k: int) -> str | Path:
        """fits/round_K.json: round k's fit, gates, backtests and proposals."""
        return files.join(self.root, "fits", f"{ROUND}{k}.json")

    def round_spec(self, k: int) -> str | Path:
        """rounds/round_K.yaml: round k's spec."""
        return files.join(self.root, "rounds", f"{ROUND}{k}.yaml")

    def _round_files(self, folder: str) -> dict[str, int]:
        """{name: K} of every round_K file in `folder` ("fits": .json, "rounds": .yaml)."""
        suffix = {"fits": ".json", "rounds": ".yaml"}[folder]
        names = files.names(files.join(self.root, folder), ROUND, suffix)
        return {n: int(n[len(ROUND) : -len(suffix)]) for n in names if n[len(ROUND) : -len(suffix)].isdigit()}

    def round_numbers(self, folder: str) -> set[int]:
        """The K of every round_K file in `folder` ("fits": .json, "rounds": .yaml)."""
        return set(self._round_files(folder).values())

    def round_fits(self) -> list[str | Path]:
        """Every fits/round_K.json, by round (the last is the latest fit)."""
        found = self._round_files("fits")
        return [files.join(self.root, "fits", n) for n in sorted(found, key=found.__getitem__)]
