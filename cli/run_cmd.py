"""`scalelab run CONFIG.yaml --out DIR [--set k=v ...] [--resume]`: one pretraining run.

The config is fully validated before anything starts (bad keys exit 2 with one line). With a
`parallel:` section whose layout needs more than one process, the processes are started here on
this machine (torchrun-compatible environment) and rank 0 writes the records.
"""

from __future__ import annotations

import json
from pathlib import Path

from scalelab.errors import UsageError


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="train one run from a YAML config", description=__doc__.splitlines()[0])
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
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; give a directory (new or holding this run)")
    try:
        status = read_status(out)
    except (OSError, ValueError):
        raise UsageError(f"--out {out}: status.json is unreadable; choose another --out") from None
    if status is not None and not args.resume:
        raise UsageError(
            f"--out {out} already holds a run (status {status.get('status')}); "
            "pass --resume to continue it or choose another --out"
        )
    if args.resume and status is not None and (out / "config.json").exists():
        from scalelab.train.identity import NotSameRun, same_run

        try:  # parallel/logging may change on resume: they are not the run's identity
            same_run(json.loads((out / "config.json").read_text()), status.get("run_id"), today=cfg)
        except NotSameRun as e:
            raise UsageError(
                f"--resume: the config differs from {out}/config.json beyond parallel/logging (at {e.path}); "
                "resume with that file (a new layout may be given with --set parallel.*)"
            ) from None
    if cfg.parallel.world_size > 1:
        _check_sources(cfg, out, args.resume)  # in the ranks they would fail one by one, with tracebacks
        from scalelab.train.launch import launch_local

        return launch_local(cfg, out, resume=args.resume)
    from scalelab.train.loop import train_run

    summary = train_run(cfg, out, resume=args.resume)
    _print_summary(summary, out)
    return 0 if summary.get("status") == "done" else 1


def _check_sources(cfg, out: Path, resume: bool) -> None:
    """The checkpoint a multi-process run starts from, checked once here (CheckpointError, exit 2)."""
    from scalelab.train import checkpoint as ckpt

    if resume and ckpt.list_checkpoints(out / "checkpoints"):
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
