"""`scalelab run CONFIG.yaml --out DIR [--set k=v ...] [--resume]`: one pretraining run.

The config is fully validated before anything starts (bad keys exit 2 with one line). With a
`parallel:` section whose layout needs more than one process, the processes are started here on
this machine (torchrun-compatible environment) and rank 0 writes the records.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

from scalelab.errors import UsageError


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="train one run from a YAML config", description=__doc__)
    p.add_argument("config", help="run config YAML (or a config.json saved by an earlier run)")
    p.add_argument("--out", required=True, help="run directory for records and checkpoints")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="dotted override, e.g. --set model.d_model=256 (repeatable)",
    )
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    p.add_argument(
        "--start-over",
        action="store_true",
        help="with --resume: when no checkpoint in --out verifies, train from step 0 (they are kept as "
        "step_<N>.corrupt); without it such a run stops with one line",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from scalelab.store.records import read_status
    from scalelab.train.config import load_run_config

    cfg = load_run_config(args.config, args.overrides)
    if "://" in args.out:
        raise UsageError(
            f"--out {args.out}: a single run writes to a local or shared path; "
            "object storage is for sweeps (scalelab sweep launch --out s3://...)"
        )
    if args.start_over and not args.resume:
        raise UsageError("--start-over: goes with --resume (it decides what a resume does when nothing verifies)")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a directory (new or holding this run)")
    try:
        status = read_status(out)  # an empty file (cut by a power loss) reads as no status
    except (OSError, ValueError):
        raise UsageError(f"--out {out}: status.json is unreadable; choose another --out") from None
    if (status is not None or (out / "config.json").exists()) and not args.resume:
        raise UsageError(
            f"--out {out} already holds a run (status {(status or {}).get('status')}); "
            "pass --resume to continue it or choose another --out"
        )
    if args.resume and (out / "config.json").exists():
        from scalelab.train.identity import NotSameRun, same_run

        try:  # parallel/logging may change on resume: they are not the run's identity
            same_run(json.loads((out / "config.json").read_text()), (status or {}).get("run_id"), today=cfg)
        except NotSameRun as e:
            raise UsageError(
                f"--resume: the config differs from {out}/config.json beyond parallel/logging (at {e.path}); "
                "resume with that file (a new layout may be given with --set parallel.*)"
            ) from None
    with _run_lock(out, resume=args.resume):
        return _train(cfg, out, args)


@contextlib.contextmanager
def _run_lock(out: Path, resume: bool = False) -> Iterator[None]:
    """The run's lock (the one a sweep trial holds, scalelab.store.run_lock), held while it trains.

    A new --out is made as a directory that already holds its lock (made under a temporary name,
    locked, renamed into place: of two `scalelab run` into one new --out, one makes it and the other
    finds it locked); the run is checked again under the lock (another process may have trained it
    between the checks and the lock). A new directory left holding only its lock is removed when
    a later check refuses the run, so bad input writes nothing."""
    from scalelab.store.run_lock import fcntl_lock

    with contextlib.ExitStack() as stack:
        created = not out.is_dir() and _make_locked(out, stack)
        if not created:
            try:
                stack.enter_context(fcntl_lock(out, wait_s=0))
            except RuntimeError:
                raise UsageError(
                    f"--out {out}: another process is training this run (it holds {out / '.lock'}); "
                    "wait for it to end, or stop it"
                ) from None
            if not resume and ((out / "status.json").exists() or (out / "config.json").exists()):
                raise UsageError(f"--out {out}: another process trained a run there meanwhile; choose another --out")
        try:
            yield
        except UsageError:
            if created and [p.name for p in out.iterdir()] == [".lock"]:
                shutil.rmtree(out, ignore_errors=True)
            raise


def _make_locked(out: Path, stack: contextlib.ExitStack) -> bool:
    """Make `out` with its lock held (see _run_lock); False when another process made it first."""
    from scalelab.store.run_lock import fcntl_lock

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    tmp.mkdir()  # the mode a new run directory gets (umask), as before
    stack.enter_context(fcntl_lock(tmp, wait_s=0))  # the lock goes with the directory's inode
    try:
        os.rename(tmp, out)  # fails when out exists and holds anything (another run's .lock)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        return False
    return True


def _train(cfg, out: Path, args) -> int:
    resume = args.resume
    if resume and args.start_over:
        from scalelab.train import checkpoint as ckpt

        chosen, _ = ckpt.select_resume_checkpoint(out / "checkpoints", start_over=True)
        resume = chosen is not None  # nothing verified: the run starts from step 0, as asked
    if cfg.parallel.world_size > 1:
        _check_sources(cfg, out, resume)  # in the ranks they would fail one by one, with tracebacks
        from scalelab.train.launch import launch_local

        return launch_local(cfg, out, resume=resume)
    from scalelab.train.loop import train_run
    from scalelab.train.train_clock import TrainClock

    clock = TrainClock(in_process=True)  # the clocks of a sweep trial's end event: what a CPU plan times
    summary = train_run(cfg, out, resume=resume)
    _print_summary(summary, out)
    print("train {train_s:.1f} s wall, {train_cpu_s:.1f} s CPU".format(**clock.seconds()))
    return 0 if summary.get("status") == "done" else 1


def _check_sources(cfg, out: Path, resume: bool) -> None:
    """The checkpoint a multi-process run starts from, checked once here (CheckpointError, exit 2)."""
    from scalelab.train import checkpoint as ckpt

    if resume and (out / "checkpoints").is_dir():
        ckpt.select_resume_checkpoint(out / "checkpoints")
    elif cfg.train.init_from:
        ckpt.verify(cfg.train.init_from)


def _print_summary(summary: dict, out: Path) -> None:
    status = summary.get("status")
    if status != "done":
        print(f"run {status}: {summary.get('reason', '')}  ({out})")
        return
    print(
        f"done  params={summary['params']:,}  tokens={summary['num_tokens']:,}  "
        f"train_loss={summary['final_train_loss']:.4f}  val_loss={summary['final_val_loss']:.4f}  "
        f"val_bpb={summary['final_val_bpb']:.4f}  -> {out}"
    )
