"""`scalelab sweep eval DIR --tasks ...`: every checkpoint of every finished run, evaluated on Ray.

    summary = evaluate_sweep("results/iso", ["bundled:stdlib_completion@100"])

One Ray task per checkpoint (one CPU, or `gpus` per task) scores the tasks that checkpoint has not
been scored on yet; the driver merges each task's rows into the run's evals.parquet as they arrive
and records them in the run's evals_index.json. The index keys are (checkpoint hash, task hash):
the checkpoint's manifest digest (sizes and sha256 of every file) and a digest of the task's
resolved examples, so a new task added to a finished sweep evaluates only that task, rerunning
evaluates nothing, a task whose examples changed is scored again, and a driver that dies loses at
most the checkpoints in flight (what was merged is in the index). Only runs in a terminal state
(done, stopped_early) are evaluated: a run still training rewrites its evals.parquet itself.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from scalelab import store
from scalelab.errors import UsageError
from scalelab.store.atomic import atomic_write_json
from scalelab.store.checkpoint_files import list_checkpoints
from scalelab.sweeps.execution.ray_cluster import ray_session
from scalelab.sweeps.tracking import wandb_export
from scalelab.train.checkpoint_verify import MANIFEST, METADATA, TRAIN_STATE
from scalelab.train.eval_checkpoint import evaluate_checkpoint, merge_eval_rows
from scalelab.train.eval_tasks import MCTask, load_tasks
from scalelab.train.local_paths import check_local_paths

INDEX = "evals_index.json"
VAL_KEY = "val"  # the index entry for held-out loss/bpb (recomputed only with with_val)
EVALUABLE = ("done", "stopped_early")


def task_hash(task: MCTask) -> str:
    """Digest of a task's name and resolved examples (what is scored, not how it was named)."""
    payload = [task.name, [[ex.context, list(ex.choices), ex.gold] for ex in task.examples]]
    return hashlib.sha256(json.dumps(payload, ensure_ascii=False).encode()).hexdigest()[:16]


def checkpoint_hash(ckpt: Path) -> str:
    """Digest of a checkpoint's manifest, which lists every file's size and sha256.

    A checkpoint from before manifests is digested from its train state and DCP metadata.
    """
    files = [MANIFEST] if (ckpt / MANIFEST).is_file() else [TRAIN_STATE, METADATA]
    digest = hashlib.sha256()
    for name in files:
        digest.update((ckpt / name).read_bytes())
    return digest.hexdigest()[:16]


def read_index(run_dir: Path) -> dict[str, dict[str, Any]]:
    path = run_dir / INDEX
    return json.loads(path.read_text()) if path.exists() else {}


@dataclass
class Job:
    """One checkpoint and what it still needs."""

    run_dir: Path
    ckpt: Path
    ckpt_hash: str
    specs: list[str] = field(default_factory=list)  # task specs not yet scored on this checkpoint
    hashes: list[str] = field(default_factory=list)  # their task hashes, same order
    with_val: bool = False


def plan_jobs(
    sweep_dir: Path, specs: list[str], tasks: list[MCTask], *, with_val: bool, final_only: bool
) -> tuple[list[Job], dict[str, str], int]:
    """(jobs, runs skipped with their state, evaluations already in the indexes)."""
    jobs, skipped, already = [], {}, 0
    hashes = [task_hash(t) for t in tasks]
    for run_dir in sorted(p for p in store.runs_dir(sweep_dir).iterdir() if p.is_dir()):
        state = store.run_state(run_dir)
        if state not in EVALUABLE:
            skipped[run_dir.name] = state
            continue
        index = read_index(run_dir)
        ckpts = [p for _, p in list_checkpoints(run_dir / "checkpoints")]
        for ckpt in ckpts[-1:] if final_only else ckpts:
            h = checkpoint_hash(ckpt)
            job = Job(run_dir, ckpt, h, with_val=with_val and f"{h}:{VAL_KEY}" not in index)
            for spec, th in zip(specs, hashes):
                if f"{h}:{th}" in index:
                    already += 1
                elif th not in job.hashes:
                    job.specs.append(spec)
                    job.hashes.append(th)
            if job.specs or job.with_val:
                jobs.append(job)
    return jobs, skipped, already


def _evaluate_remote(ckpt: str, specs: list[str], limit: int | None, with_val: bool, batch: int) -> list[dict]:
    """One checkpoint in a Ray task (one CPU): the one evaluation, on one device."""
    torch.set_num_threads(1)
    ev = evaluate_checkpoint(ckpt, load_tasks(specs, limit), with_val=with_val, batch_sequences=batch, device="cpu")
    return ev.rows


def _record(job: Job, rows: list[dict], tasks_by_hash: dict[str, MCTask]) -> None:
    merge_eval_rows(job.run_dir, rows)
    index = read_index(job.run_dir)
    step = rows[0]["step"] if rows else None
    when = time.strftime("%Y-%m-%dT%H:%M:%S")
    for th in job.hashes:
        index[f"{job.ckpt_hash}:{th}"] = dict(task=tasks_by_hash[th].name, step=step, checkpoint=job.ckpt.name, at=when)
    if job.with_val:
        index[f"{job.ckpt_hash}:{VAL_KEY}"] = dict(task=VAL_KEY, step=step, checkpoint=job.ckpt.name, at=when)
    atomic_write_json(job.run_dir / INDEX, index)


def evaluate_sweep(
    sweep_dir: str | Path,
    specs: list[str],
    *,
    limit: int | None = None,
    with_val: bool = False,
    final_only: bool = False,
    batch_sequences: int = 16,
    address: str | None = None,
    num_cpus: int | None = None,
    given: frozenset[str] = frozenset(),
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Score every finished run's checkpoints on `specs`; returns counts and the evaluated checkpoints.

    given: the local paths of the launcher's own spec (`--spec`): a run's config.json, a record of
    the store, may name no other (its tokenizer, its data for --val; scalelab.train.local_paths).

    Raises:
        UsageError: not a sweep directory, no task / an unknown task, a run naming a local path
            not given (before Ray starts).
    """
    sweep_dir = Path(sweep_dir).resolve()
    if not store.is_sweep_dir(sweep_dir):
        raise UsageError(f"{sweep_dir} is not a sweep directory (no sweep.yaml); give a `sweep launch --out` dir")
    if not specs and not with_val:
        raise UsageError("--tasks: give at least one task (or --val), e.g. --tasks bundled:stdlib_completion@100")
    tasks = load_tasks(specs, limit)
    t0 = time.time()
    jobs, skipped, already = plan_jobs(sweep_dir, specs, tasks, with_val=with_val, final_only=final_only)
    for run_dir in sorted({j.run_dir for j in jobs}):
        check_local_paths(json.loads((run_dir / "config.json").read_text()), given, str(run_dir / "config.json"))
    if skipped:
        log(
            f"{len(skipped)} run(s) not finished, not evaluated: " + ", ".join(f"{r} ({s})" for r, s in skipped.items())
        )
    log(f"{already} evaluation(s) already in the store; {len(jobs)} checkpoint(s) to evaluate")
    evaluated, failed = [], {}
    new_rows: dict[Path, list[dict]] = {}  # per run, for its W&B eval run
    if jobs:
        tasks_by_hash = {task_hash(t): t for t in tasks}
        with ray_session(address, num_cpus):
            import ray

            remote = ray.remote(num_cpus=1)(_evaluate_remote)
            pending = {remote.remote(str(j.ckpt), j.specs, limit, j.with_val, batch_sequences): j for j in jobs}
            while pending:
                (ref,), _ = ray.wait(list(pending), num_returns=1)
                job = pending.pop(ref)
                name = f"{job.run_dir.name}/{job.ckpt.name}"
                try:
                    rows = ray.get(ref)
                except Exception as e:  # noqa: BLE001 - one checkpoint's failure must not stop the rest
                    failed[name] = f"{type(e).__name__}: {str(e).splitlines()[-1] if str(e) else ''}"
                    log(f"  failed {name}: {failed[name]}")
                    continue
                _record(job, rows, tasks_by_hash)
                new_rows.setdefault(job.run_dir, []).extend(rows)
                evaluated.append(name)
                log(f"  {name}: {len(job.specs)} task(s){' + val' if job.with_val else ''}, {len(rows)} rows")
    log(f"evaluated {len(evaluated)} checkpoint(s), {len(failed)} failed ({time.time() - t0:.0f} s)")
    wandb_export.log_evals(sweep_dir, new_rows, log=log)  # one W&B eval run per run scored (when W&B is on)
    return {"evaluated": evaluated, "failed": failed, "already": already, "skipped": skipped}
