"""The live predicted final loss of a sweep run while it trains, for its W&B record.

    predict = LivePrediction(sweep_dir=..., run_id=..., config=..., settings=PredictConfig())
    train_run(cfg, run_dir, wandb=WandbRun(..., predict=predict))   # the loop calls predict(kind, record)

At every `every` of the run's steps from `min_fraction` on, the run's curve so far (the training
loss of its logged steps, or its validation losses when the run evaluates during training: the
sweep's curve source, sweeps/tracking/run_curves.py) is fitted with the curves of the sweep's finished runs
by the curve law, and its final loss predicted with an interval: the same prediction and interval
early stopping decides on (sweeps/early_stop.decide: the run bootstrap plus the law's
misspecification measured by backtesting prefixes of finished runs; calibrated to the store's
`loss` column, the final validation loss). Nothing is predicted until `min_runs` finished runs have
curves. What it returns is logged at the event's step:

    predict/final_loss, predict/final_loss_lo, predict/final_loss_hi   the prediction and interval
    predict/fraction, predict/n_runs, predict/seconds                  where, from how many runs, cost

The fits run in the training process between two steps (rank 0): each costs what one early-stopping
check costs, so `every` and `n_boot` set the overhead; `sweep status` and the store never see it.
The object is plain data (paths and the config), so it travels to a Ray Train worker group whole.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scalelab import store
from scalelab.config_tree import from_dict
from scalelab.errors import ConfigError, UsageError
from scalelab.fitting.forms.laws import CURVE_LAWS
from scalelab.fitting.loss_curves.curves import RunCurve
from scalelab.sweeps.specs.spec_checks import check_keys
from scalelab.sweeps.tracking.early_stop import EarlyStopConfig, decide, finished_curves
from scalelab.sweeps.tracking.run_curves import SOURCES, planned_lr, resolve_source, run_curve
from scalelab.train.config import build_run_config
from scalelab.train.run_summary import run_summary_fields


@dataclass(kw_only=True, slots=True)
class PredictConfig:
    """`wandb.predict` in a sweep spec."""

    every: float = 0.1  # fraction of the run between two predictions
    min_fraction: float = 0.1  # the first prediction (the curve law needs the run past its warmup)
    min_runs: int = 3  # finished runs with curves the fit needs besides this one
    law: str = "lr_annealing"  # a curve law (fitting.forms.laws.CURVE_LAWS)
    source: str = "auto"  # auto | val | train (sweeps/tracking/run_curves.py)
    level: float = 0.95
    n_boot: int = 16  # run-resampling refits for the interval
    backtest_runs: int = 4  # finished runs backtested for the misspecification term; 0: none


def parse_predict(section: Any) -> PredictConfig | None:
    """`wandb.predict`: true (the defaults), false (none) or a mapping of PredictConfig's keys.

    Raises:
        ConfigError: an unknown key or a value out of range, naming the key.
    """
    if section is False or section is None:
        return None
    if section is True:
        return PredictConfig()
    check_keys(section, list(PredictConfig.__slots__), "wandb.predict")
    cfg = from_dict(PredictConfig, section, prefix="wandb.predict")
    checks = {
        "every": (0 < cfg.every <= 1, "a fraction in (0, 1], e.g. 0.1"),
        "min_fraction": (0 < cfg.min_fraction < 1, "a fraction in (0, 1), e.g. 0.1"),
        "min_runs": (cfg.min_runs >= 1, ">= 1"),
        "law": (cfg.law in CURVE_LAWS, f"one of {CURVE_LAWS}"),
        "source": (cfg.source in SOURCES, f"one of {SOURCES}"),
        "level": (0 < cfg.level < 1, "a value in (0, 1)"),
        "n_boot": (cfg.n_boot >= 8, ">= 8"),
        "backtest_runs": (cfg.backtest_runs >= 0, ">= 0"),
    }
    for key, (ok, fix) in checks.items():
        if not ok:
            raise ConfigError(f"wandb.predict.{key}", f"{getattr(cfg, key)!r} is out of range", f"use {fix}")
    return cfg


@dataclass(kw_only=True)
class LivePrediction:
    """The `predict` callable of a sweep run's WandbRun (module docstring)."""

    sweep_dir: str
    run_id: str
    config: dict[str, Any]
    settings: PredictConfig

    def __post_init__(self) -> None:
        cfg = build_run_config(self.config)
        self.num_steps = cfg.num_steps
        self.source = resolve_source(self.settings.source, [self.config])
        self.next_fraction = self.settings.min_fraction
        self.points: dict[int, float] = {}  # step -> loss of this session (the source's)
        self.backtests: dict = {}  # early_stop's backtest cache, reused while the finished runs are the same
        self._curve_parts: tuple | None = None  # (lr per step, tokens per step, params), built once

    def __call__(self, kind: str, record: dict[str, Any]) -> dict[str, float] | None:
        if kind == "step" and self.source == "train":
            self.points[int(record["step"])] = float(record["loss"])
        elif kind == "eval" and self.source == "val":
            vals = [r["value"] for r in record["rows"] if r.get("task") == "val" and r.get("metric") == "loss"]
            if vals:
                self.points[int(record["step"])] = float(vals[0])
        else:
            return None
        step = int(record["step"])
        fraction = step / self.num_steps
        if fraction + 1e-9 < self.next_fraction or fraction >= 1.0:
            return None
        while self.next_fraction <= fraction + 1e-9:
            self.next_fraction += self.settings.every
        return self.predict_at(step)

    def _prefix(self, step: int) -> RunCurve:
        """This run's curve through `step`: what an earlier session recorded, then this session's points."""
        if self._curve_parts is None:
            lr, tps = planned_lr(self.config)
            params = float(run_summary_fields(build_run_config(self.config))["params"])
            self._curve_parts = (lr, tps, params)
        lr, tps, params = self._curve_parts
        steps, loss = [], []
        first = min(self.points) if self.points else step + 1
        try:  # a resumed run: its earlier sessions' points are on disk
            disk = run_curve(store.run_path(self.sweep_dir, self.run_id), source=self.source, config=self.config)
            keep = disk.steps < first
            steps, loss = list(disk.steps[keep]), list(disk.loss[keep])
        except UsageError:
            pass
        mine = sorted(s for s in self.points if s <= step)
        steps += mine
        loss += [self.points[s] for s in mine]
        return RunCurve(
            run_id=self.run_id,
            params=params,
            lr=lr,
            steps=np.asarray(steps, dtype=np.int64),
            loss=np.asarray(loss, dtype=float),
            tokens_per_step=float(tps),
        )

    def predict_at(self, step: int) -> dict[str, float] | None:
        """The prediction from this run's curve through `step` (None: too few finished runs, no fit)."""
        t0 = time.perf_counter()
        s = self.settings
        finished, losses = finished_curves(Path(self.sweep_dir), self.source, self.run_id)
        if len(finished) < s.min_runs:
            return None
        cfg = EarlyStopConfig(
            tolerance=1e-6,  # never "stop": only the prediction and its interval are wanted
            min_fraction=s.min_fraction,
            min_runs=s.min_runs,
            law=s.law,
            source=self.source,
            level=s.level,
            n_boot=s.n_boot,
            backtest_runs=s.backtest_runs,
        )
        d = decide(self._prefix(step), finished, losses, step, cfg, self.backtests)
        if not math.isfinite(d.predicted_loss):
            return None
        return {
            "predict/final_loss": d.predicted_loss,
            "predict/final_loss_lo": d.interval[0],
            "predict/final_loss_hi": d.interval[1],
            "predict/fraction": d.fraction,
            "predict/n_runs": float(d.n_runs),
            "predict/seconds": time.perf_counter() - t0,
        }
