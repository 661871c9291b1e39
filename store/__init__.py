"""The sweep store: where runs, sweeps and their records live, and the rules for writing them.

One directory per sweep (or one prefix on object storage), readable without scalelab running:

    <root>/<sweep>/sweep.yaml             the spec as given (later rounds: rounds/<name>.yaml)
    <root>/<sweep>/sweep.resolved.json    every run of every round: id, config, labels, N, D, C
    <root>/<sweep>/runs/<run_id>/         config.json, status.json, metrics.parquet, evals.parquet,
                                          checkpoints/step_N/ (written by scalelab.train)
    <root>/<sweep>/events.jsonl           one line per trial start / end / failure (append-only)
    <root>/<sweep>/fits/<name>.json       fits made by `sweep next` (one per round)
    <root>/<sweep>/ledger.json            every fit and prediction of the closed loop
    <root>/.claims/<run_id>               the one directory of a run in the store root

The modules, bottom up (this package imports only scalelab.errors, never train/ or sweeps/):

    objects        object storage (`s3://bucket/prefix`): whole objects, listings, local views
    atomic         whole-file writes (temporary name + rename; one object on object storage),
                   and read-modify-writes that lose no update (conditional puts on object storage)
    files          a sweep's own files (specs, rounds, fits) read alike from either kind of store
    paths          every path of a sweep (SweepLayout), its address, its runs
    records        a run's status.json and Parquet records, its state
    checkpoint_files   complete checkpoint directories, their upload and download
    sweep_dir      a sweep's spec and sweep.resolved.json
    claims         one copy of each run per store root; links from sibling sweeps
    lease          the run lease on object storage and the node-local copy it guards
    run_lock       one trainer per run: the fcntl lock or the lease
    events         the append-only event log of trials
    ledger         the closed loop's fits and scored predictions
    runs_table     load_runs: one polars row per run; export_table

The functions most callers need are importable from the package itself:

    from scalelab import store
    df = store.load_runs("results/isoflop")          # a sweep dir, a store root, or s3://...
    store.run_state(store.run_path(sweep_dir, run_id))
"""

from scalelab.store.claims import (
    attach_runs,
    claim_run,
    claimed_elsewhere,
    find_finished_elsewhere,
    renamed_runs,
    run_location,
)
from scalelab.store.events import append_event, read_events
from scalelab.store.paths import RESOLVED, SweepLayout, is_sweep_dir, location, run_path, runs_dir
from scalelab.store.records import STATUSES, TERMINAL, last_step, read_status, run_state, write_status
from scalelab.store.runs_table import export_table, load_runs
from scalelab.store.sweep_dir import init_sweep, read_resolved, write_resolved

__all__ = [
    "RESOLVED",
    "STATUSES",
    "TERMINAL",
    "SweepLayout",
    "append_event",
    "attach_runs",
    "claim_run",
    "claimed_elsewhere",
    "export_table",
    "find_finished_elsewhere",
    "init_sweep",
    "is_sweep_dir",
    "last_step",
    "load_runs",
    "location",
    "read_events",
    "read_resolved",
    "read_status",
    "renamed_runs",
    "run_location",
    "run_path",
    "run_state",
    "runs_dir",
    "write_resolved",
    "write_status",
]
