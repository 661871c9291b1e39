"""Where a run reports besides its records: wandb (offline by default) and a progress bar.

    logger = open_wandb(cfg, run_dir, runtime)     # None unless rank 0 and logging.wandb != disabled
    bar = open_progress(cfg, runtime, start_step)  # None unless rank 0 and logging.progress allows it

wandb and tqdm are imported when used: wandb costs seconds to import, and neither is needed by a
run that logs only to its records.
"""

from __future__ import annotations

import sys
from pathlib import Path

from scalelab.train.config import to_dict
from scalelab.train.identity import config_hash


def open_progress(cfg, runtime, start_step: int):
    """A tqdm bar on rank 0 (logging.progress: on, or auto when stderr is a terminal), else None."""
    if not runtime.is_rank0:
        return None
    mode = cfg.logging.progress
    if mode == "off" or (mode == "auto" and not sys.stderr.isatty()):
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.num_steps, initial=start_step, unit="step", desc=cfg.name, dynamic_ncols=True)


class _Wandb:
    """The three calls the loop makes on a wandb run."""

    def __init__(self, run):
        self.run = run

    def log(self, data, step):
        self.run.log(data, step=step)

    def summary_update(self, data):
        self.run.summary.update({k: v for k, v in data.items() if v is not None})

    def finish(self):
        self.run.finish()


def open_wandb(cfg, run_dir: Path, runtime):
    """The run's wandb logger on rank 0 (logging.wandb: offline | online), else None."""
    if not runtime.is_rank0 or cfg.logging.wandb == "disabled":
        return None
    import wandb

    run = wandb.init(
        project=cfg.logging.wandb_project,
        name=cfg.name,
        id=config_hash(cfg),
        resume="allow",
        mode=cfg.logging.wandb,
        dir=str(run_dir),
        config=to_dict(cfg),
        reinit="finish_previous",
        settings=wandb.Settings(silent=True, console="off"),
    )
    return _Wandb(run)
