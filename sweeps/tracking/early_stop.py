"""Early stopping of sweep runs whose final loss is already known within the noise.

    early_stop: {tolerance: 0.01, min_fraction: 0.3}        # in a sweep spec (top level)

At each checkpoint past `min_fraction` of its steps (and at most every `check_every` of the run), a
run fits the curve law (`law`, fitting/loss_curves/curves.py) on the curves of the sweep's finished runs plus
its own prefix and predicts its final loss. Its interval adds two log-space sds
(fitting/predictive.interval_from_parts): the spread of refits on resampled runs (parameter
uncertainty) and the law's misspecification, measured by backtesting the same prediction on the
finished runs: each finished run's final loss predicted from its own prefix at the same fraction,
with the other finished runs complete (leave-one-out). Their RMS log error, scaled by Student's t
with one degree of freedom per backtested run (fitting/predictive.t_over_z), is the term a run
bootstrap cannot see (it also holds some parameter noise, so the sum errs wide): on the CPU
IsoFLOP sweep the bootstrap intervals alone covered the real final loss in 65-81% of the checks.
When the interval's half-width is at most `tolerance` of the prediction (the noise floor: a
full run would not measure its loss more precisely than seed-to-seed noise) and at least `min_runs`
finished runs inform the fit, the run stops there: status.json says `stopped_early`, with the
predicted final loss and its interval, the step, and the FLOPs not spent. The decision happens at a
checkpoint event, after the records are flushed and the checkpoint written, so a stopped run can be
resumed to its end if wanted. Single-process runs only (the callback runs on rank 0). On object
storage the run's own prefix is its node-local copy (scalelab.store.lease) and the finished runs
come from a local copy of the sweep's records taken at each check.

Predicted losses are on the scale of the store's `loss` column (the final validation loss): the
curve law's final prediction times a calibration factor measured on the finished runs (their
`loss` over the law's prediction for them), so a curve of training losses still predicts the loss
the sweep's fits use.

Fits over a store with stopped runs (scalelab.sweeps.closed_loop.store_fit, FitOptions.stopped): "include" gives
each stopped run its predicted loss and the weight sigma^2 / (sigma^2 + s^2) (`stopped_run_weight`),
s the sd of its prediction (from the interval) and sigma the noise floor (tolerance / z): a run
predicted as precisely as a run is measured counts fully; "exclude" (the default) drops them.
"""

from __future__ import annotations

import io
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from scalelab import store
from scalelab.config_tree import from_dict, safe_yaml
from scalelab.errors import ConfigError, UsageError
from scalelab.fitting.estimate.intervals import percentile_interval
from scalelab.fitting.forms.laws import CURVE_LAWS
from scalelab.fitting.loss_curves.curves import RunCurve, fit_curves
from scalelab.fitting.uncertainty.predictive import interval_from_parts, replicate_sd, t_over_z
from scalelab.store import files, objects
from scalelab.sweeps.tracking.run_curves import SOURCES, resolve_source, run_curve, store_curves
from scalelab.train.config import build_run_config
from scalelab.train.stop_run import StopRun

STATUS = "stopped_early"


@dataclass(kw_only=True, slots=True)
class EarlyStopConfig:
    tolerance: float = 0.01  # stop when the interval's half-width <= this fraction of the prediction
    min_fraction: float = 0.3  # never stop before this fraction of the run's steps
    check_every: float = 0.1  # at most one decision per this fraction of the run
    min_runs: int = 3  # finished runs of the sweep the fit needs besides this one
    law: str = "lr_annealing"  # a curve law (fitting.forms.laws.CURVE_LAWS)
    source: str = "auto"  # curve source: auto | val | train (sweeps/tracking/run_curves.py)
    level: float = 0.95  # interval level
    n_boot: int = 32  # run-resampling refits for the interval
    backtest_runs: int = 8  # finished runs backtested for the misspecification term (the last in store order); 0: none

    @property
    def noise_sd(self) -> float:
        """The noise floor as an sd of log loss: tolerance / z."""
        return self.tolerance / float(stats.norm.ppf(0.5 + self.level / 2.0))


def parse_early_stop(section: Any) -> EarlyStopConfig | None:
    """The spec's `early_stop:` mapping -> EarlyStopConfig (None when absent or `false`).

    Raises:
        ConfigError: an unknown key or a value out of range, naming the key.
    """
    if section is None or section is False:
        return None
    if section is True:
        section = {}
    if not isinstance(section, dict):
        raise ConfigError("early_stop", f"expected a mapping, got {section!r}", "e.g. {tolerance: 0.01}")
    known = EarlyStopConfig.__slots__
    for key in section:
        if key not in known:
            raise ConfigError(f"early_stop.{key}", "unknown key", f"known keys: {', '.join(known)}")
    cfg = from_dict(EarlyStopConfig, section, prefix="early_stop")
    checks = {
        "tolerance": 0 < cfg.tolerance < 1,
        "min_fraction": 0 < cfg.min_fraction < 1,
        "check_every": 0 < cfg.check_every <= 1,
        "min_runs": cfg.min_runs >= 1,
        "level": 0 < cfg.level < 1,
        "n_boot": cfg.n_boot >= 8,
        "backtest_runs": cfg.backtest_runs >= 0,
        "law": cfg.law in CURVE_LAWS,
        "source": cfg.source in SOURCES,
    }
    ranges = {
        "law": f"one of {CURVE_LAWS}",
        "source": f"one of {SOURCES}",
        "min_runs": ">= 1",
        "n_boot": ">= 8",
        "backtest_runs": ">= 0",
    }
    for key, ok in checks.items():
        if not ok:
            fix = ranges.get(key, "a value in (0, 1)")
            raise ConfigError(f"early_stop.{key}", f"{getattr(cfg, key)!r} is out of range", f"use {fix}")
    return cfg


def settings_for(sweep_dir: str | Path, run_id: str) -> EarlyStopConfig | None:
    """The early_stop section of the spec that generated `run_id` (sweep.yaml or a round's spec)."""
    resolved = store.read_resolved(sweep_dir)
    entry = next((r for r in resolved.get("runs", []) if r.get("run_id") == run_id), None)
    layout = store.SweepLayout(sweep_dir)
    spec = layout.file(entry["spec"]) if (entry or {}).get("spec") else layout.spec
    text = files.read_text(spec)
    if text is None:
        return None
    return parse_early_stop((safe_yaml(io.StringIO(text), str(spec)) or {}).get("early_stop"))


@dataclass(kw_only=True, slots=True)
class Decision:
    """One early-stopping check of a run."""

    stop: bool
    step: int
    fraction: float
    predicted_loss: float = math.nan
    interval: tuple[float, float] = (math.nan, math.nan)  # bootstrap and misspecification together
    interval_bootstrap: tuple[float, float] = (math.nan, math.nan)  # the run bootstrap alone
    half_width: float = math.nan  # relative to the prediction
    misspecification: float = math.nan  # RMS log error of the backtested prefix predictions
    n_backtest: int = 0  # finished runs backtested
    n_runs: int = 0  # finished runs in the fit
    reason: str = ""
    seconds: float = 0.0

    def record(self, flops_6n: float | None, cfg: EarlyStopConfig, law: str) -> dict[str, Any]:
        """status.json fields of a stopped run."""
        return {
            "predicted_loss": self.predicted_loss,
            "predicted_loss_interval": list(self.interval),
            "stopped_step": self.step,
            "stopped_fraction": self.fraction,
            "saved_flops": None if flops_6n is None else flops_6n * (1.0 - self.fraction),
            "early_stop": {
                "law": law,
                "tolerance": cfg.tolerance,
                "level": cfg.level,
                "half_width": self.half_width,
                "misspecification": self.misspecification,
                "n_backtest": self.n_backtest,
                "n_runs": self.n_runs,
                "seconds": self.seconds,
            },
        }


def predict_from_prefix(prefix: RunCurve, finished: list[RunCurve], finished_loss: np.ndarray, law: str):
    """(predicted final loss, the fit, calibration factor): `law` fitted on the finished curves plus
    `prefix`, its final prediction for `prefix` times the factor that maps the law's predictions of
    the finished runs onto their recorded `loss` (geometric mean of the ratios)."""
    cf = fit_curves([*finished, prefix], law)
    own = np.array([cf.predict_final(c) for c in finished])
    factor = float(np.exp(np.mean(np.log(np.asarray(finished_loss) / own)))) if finished else 1.0
    return factor * cf.predict_final(prefix), cf, factor


BACKTEST_STEP = 0.2  # backtests run at min_fraction + k * this, the largest at or below the check


def prefix_backtest(
    finished: list[RunCurve], finished_loss: np.ndarray, fraction: float, law: str, cache: dict | None = None
) -> np.ndarray:
    """Log errors of predict_from_prefix on each finished run, seen through its own first `fraction`
    with the other finished runs complete (leave-one-out). Needs >= 2 finished runs.

    `cache` (a dict the caller keeps) reuses the errors for the same runs and fraction.
    """
    key = (tuple(sorted(c.run_id for c in finished)), round(fraction, 6), law)
    if cache is not None and key in cache:
        return cache[key]
    errs = []
    for j, c in enumerate(finished):
        others = [o for i, o in enumerate(finished) if i != j]
        others_loss = np.delete(np.asarray(finished_loss), j)
        try:
            pred, _, _ = predict_from_prefix(c.prefix(fraction), others, others_loss, law)
        except UsageError:
            continue
        errs.append(math.log(pred / finished_loss[j]))
    out = np.array(errs)
    if cache is not None:
        cache[key] = out
    return out


def decide(
    prefix: RunCurve,
    finished: list[RunCurve],
    finished_loss: np.ndarray,
    step: int,
    cfg: EarlyStopConfig,
    cache: dict | None = None,
) -> Decision:
    """Fit the curve law on the finished runs plus this run's prefix; stop if the interval is narrow.

    The interval is the module docstring's: bootstrap and backtested misspecification. `cache`
    (optional, kept by the caller across checks) holds the backtests.
    """
    t0 = time.perf_counter()
    frac = step / prefix.num_steps
    out = Decision(stop=False, step=step, fraction=frac, n_runs=len(finished))
    if len(finished) < cfg.min_runs:
        out.reason = f"{len(finished)} finished run(s) < min_runs={cfg.min_runs}"
        return out
    try:
        pred, cf, factor = predict_from_prefix(prefix, finished, finished_loss, cfg.law)
        draws = factor * cf.final_draws(prefix, n_boot=cfg.n_boot, seed=0)
    except UsageError as e:
        out.reason = f"no fit: {e}"
        return out
    lo_b, hi_b = percentile_interval(draws, cfg.level)
    parts = {"bootstrap": replicate_sd(draws, cfg.level)}
    recent = finished[-cfg.backtest_runs :] if cfg.backtest_runs else []
    if len(recent) >= 2:
        # the backtest at the largest grid fraction at or below this check's: at most as informed
        at = cfg.min_fraction + BACKTEST_STEP * math.floor((frac - cfg.min_fraction) / BACKTEST_STEP + 1e-9)
        errs = prefix_backtest(recent, finished_loss[-len(recent) :], max(at, cfg.min_fraction), cfg.law, cache)
        if errs.size:
            out.misspecification, out.n_backtest = float(np.sqrt(np.mean(errs**2))), int(errs.size)
            parts["misspecification"] = t_over_z(errs.size, cfg.level) * out.misspecification
    iv = interval_from_parts(pred, parts, cfg.level)
    out.predicted_loss, out.interval, out.interval_bootstrap = float(pred), (iv.lo, iv.hi), (lo_b, hi_b)
    out.half_width = float((iv.hi - iv.lo) / 2.0 / pred)
    out.stop = bool(np.isfinite(out.half_width) and out.half_width <= cfg.tolerance)
    out.reason = f"half-width {out.half_width:.2%} {'<=' if out.stop else '>'} tolerance {cfg.tolerance:.2%}"
    if out.n_backtest:
        out.reason += f" (misspecification {out.misspecification:.2%} over {out.n_backtest} backtested runs)"
    out.seconds = time.perf_counter() - t0
    return out


def finished_curves(sweep_dir: str | Path, source: str, exclude: str) -> tuple[list[RunCurve], np.ndarray]:
    """Curves and final losses of the sweep's done runs (other than `exclude`); an s3:// sweep's
    from a local copy of its records, taken for this check and removed after it."""
    view = objects.local_view(sweep_dir, "sweep_dir") if objects.is_url(sweep_dir) else None
    try:
        runs, curves = store_curves(view or sweep_dir, source=source)
    except UsageError:
        return [], np.empty(0)
    finally:
        if view is not None:
            shutil.rmtree(view.parent, ignore_errors=True)
    keep = [i for i, c in enumerate(curves) if c.run_id != exclude and c.final_loss is not None]
    return [curves[i] for i in keep], np.array([curves[i].final_loss for i in keep], dtype=float)


def callback(sweep_dir: str | Path, run_id: str, config: dict[str, Any], run_dir: Path | None = None):
    """The train-loop callback that stops `run_id` early, or None when its spec has no early_stop.

    run_dir: the directory the run trains in (on object storage its node-local copy; default the
    sweep's runs/<run_id>)."""
    cfg = settings_for(sweep_dir, run_id)
    if cfg is None:
        return None
    run_dir = run_dir if run_dir is not None else store.run_path(sweep_dir, run_id)
    num_steps = build_run_config(config).num_steps
    source = resolve_source(cfg.source, [config])  # the sweep's runs share their eval settings
    train_rows: list[tuple[int, float]] = []
    last_check = [-math.inf]
    backtests: dict = {}  # the misspecification backtests, reused while the finished runs are the same

    def cb(kind: str, record: dict[str, Any]) -> None:
        if kind == "step":
            train_rows.append((int(record["step"]), float(record["loss"])))
            return
        step = int(record["step"]) if kind == "checkpoint" else 0
        frac = step / num_steps
        if kind != "checkpoint" or frac < cfg.min_fraction or frac >= 1.0:
            return
        if frac - last_check[0] < cfg.check_every - 1e-9:
            return
        last_check[0] = frac
        extra = (np.array([s for s, _ in train_rows]), np.array([v for _, v in train_rows]))
        finished, losses = finished_curves(sweep_dir, source, run_id)
        try:
            prefix = run_curve(run_dir, source=source, config=config, extra_points=extra).prefix(max_step=step)
        except UsageError:
            return
        d = decide(prefix, finished, losses, step, cfg, backtests)
        store.append_event(sweep_dir, "early_stop_check", run_id, **_event(d))
        if d.stop:
            status = store.read_status(run_dir) or {}
            per_token, tokens = status.get("flops_per_token_6n"), status.get("num_tokens")
            raise StopRun(STATUS, d.record(per_token * tokens if per_token and tokens else None, cfg, cfg.law))

    return cb


def _event(d: Decision) -> dict[str, Any]:
    return {
        "step": d.step,
        "fraction": d.fraction,
        "stop": d.stop,
        "predicted_loss": d.predicted_loss,
        "interval": list(d.interval),
        "interval_bootstrap": list(d.interval_bootstrap),
        "misspecification": d.misspecification,
        "n_backtest": d.n_backtest,
        "reason": d.reason,
        "seconds": d.seconds,
    }


# ---------------------------------------------------------------------------------------------
# Fitting a store that holds stopped runs
# ---------------------------------------------------------------------------------------------


def stopped_run_weight(status: dict[str, Any], tolerance: float | None = None) -> tuple[float | None, float]:
    """(predicted final loss, fit weight) of a stopped run from its status.json (module docstring):
    weight sigma^2 / (sigma^2 + s^2), s the sd of the prediction (from its interval) and sigma the
    noise floor, from the run's own early_stop tolerance unless `tolerance` is given."""
    lo, hi = status.get("predicted_loss_interval") or (math.nan, math.nan)
    es = status.get("early_stop") or {}
    z = float(stats.norm.ppf(0.5 + es.get("level", 0.95) / 2.0))
    sigma = (tolerance if tolerance is not None else es.get("tolerance", 0.01)) / z
    s = (math.log(hi) - math.log(lo)) / (2.0 * z) if lo and hi and lo > 0 else math.inf
    return status.get("predicted_loss"), sigma**2 / (sigma**2 + s**2)
