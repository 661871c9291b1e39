"""Where a run reports besides its records: Weights & Biases (offline by default) and a progress bar.

    logger = open_wandb(cfg, run_dir, runtime, context)   # None unless rank 0 and W&B is on
    bar = open_progress(cfg, runtime, start_step)          # None unless rank 0 and logging.progress allows it

The mode is `logging.wandb` (offline | online | disabled) unless `WANDB_MODE` is set in the
environment, which wins (W&B's own switch: CI sets it to disabled). The API key comes from the
environment of the process (`WANDB_API_KEY`, or the node's `wandb login`), never from a config.

`context` (a WandbRun) is what a launcher adds to the run's W&B record: a sweep passes the run's
group, tags, job type and summary fields, and optionally `predict`, a callable that sees the same
(kind, record) events as the loop's callbacks and returns metrics to log (a sweep's live
predicted final loss, computed on the sweep's side: this package never fits a law).

W&B must never stop a run. Before an online run starts, `unreachable()` asks the server's health
endpoint (PROBE_TIMEOUT_S): a server that does not answer costs seconds, not wandb.init's retries.
An online run that cannot reach its server logs offline instead, with one warning line on stderr
(`wandb sync` uploads it later); wandb.init is bounded by `init_timeout` (INIT_TIMEOUT_S); and any
failure of W&B itself leaves the run logging to its records only. An online run's finish() waits
at most FINISH_TIMEOUT_S for its uploads.

wandb and tqdm are imported when used: wandb costs seconds to import, and neither is needed by a
run that logs only to its records.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalelab.train.config import to_dict
from scalelab.train.identity import config_hash

MODES = ("offline", "online", "disabled")
INIT_TIMEOUT_S = 30.0  # wandb.init's own limit (its default is 90 s); a server that slow is not reached
PROBE_TIMEOUT_S = 5.0  # the health check before an online run
# An online run.finish() waits this long for its uploads (W&B's default: forever). A server that went
# away mid-run then costs minutes, not the trial; the run's local W&B files keep what was not sent
# (`wandb sync` uploads it).
FINISH_TIMEOUT_S = 120.0

Predict = Callable[[str, dict[str, Any]], "dict[str, float] | None"]


def open_progress(cfg, runtime, start_step: int):
    """A tqdm bar on rank 0 (logging.progress: on, or auto when stderr is a terminal), else None."""
    if not runtime.is_rank0:
        return None
    mode = cfg.logging.progress
    if mode == "off" or (mode == "auto" and not sys.stderr.isatty()):
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.num_steps, initial=start_step, unit="step", desc=cfg.name, dynamic_ncols=True)


def step_metrics(row: dict[str, Any]) -> dict[str, float]:
    """A metrics row (metrics.parquet's columns) under its W&B names; the loop and `sweep wandb` agree."""
    return {
        "train/loss": row["loss"],
        "train/lr": row["lr"],
        "train/grad_norm": row["grad_norm"],
        "perf/tokens_per_s": row["tokens_per_s"],
        "tokens": row["tokens"],
    }


def eval_metrics(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Eval rows (evals.parquet's columns) under their W&B names: `<task>/<metric>`."""
    return {f"{r['task']}/{r['metric']}": r["value"] for r in rows}


def wandb_mode(configured: str) -> str:
    """The W&B mode a process uses: WANDB_MODE from the environment when set, else `configured`.

    W&B's own spellings map onto ours: dryrun is offline, run is online."""
    env = os.environ.get("WANDB_MODE", "").strip().lower()
    env = {"dryrun": "offline", "run": "online"}.get(env, env)
    return env if env in MODES else configured


def base_url() -> str:
    """The W&B server this process would use: WANDB_BASE_URL, else the `wandb login --host` settings
    file, else wandb's default (resolved as wandb.setup resolves it)."""
    try:
        from wandb.sdk.wandb_settings import Settings

        settings = Settings()
        config_dir = os.environ.get("WANDB_CONFIG_DIR")
        settings.settings_system = str(Path(config_dir or "~/.config/wandb").expanduser() / "settings")
        settings.update_from_system_settings()
        settings.update_from_env_vars(dict(os.environ))
        return str(settings.base_url).rstrip("/")
    except Exception:  # noqa: BLE001 - wandb's internals moved: the variable alone
        return os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").rstrip("/")


def unreachable(url: str | None = None, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when the W&B server at `url` (default: base_url()) answers HTTP at all, else why not."""
    url = url or base_url()
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=timeout_s):
            return None
    except urllib.error.HTTPError:  # it answered (an error status is still an answer)
        return None
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        return f"{url}: {reason}"


@dataclass(kw_only=True)
class WandbRun:
    """What a launcher adds to a run's W&B record (module docstring). Every field is optional."""

    group: str | None = None  # the sweep
    tags: list[str] = field(default_factory=list)  # its design: budget, size, round, proposal kind, arm
    job_type: str = "train"  # train | cooldown | eval | fit
    name: str | None = None  # display name (default: the config's name)
    summary: dict[str, Any] = field(default_factory=dict)  # N, D, C, a ledger prediction, ...
    config: dict[str, Any] = field(default_factory=dict)  # added to the run's W&B config (design labels)
    mode: str | None = None  # overrides the configured mode (a sweep whose driver could not reach W&B)
    predict: Predict | None = None  # (kind, record) -> metrics to log, or None


def start_wandb(
    *,
    mode: str,
    project: str,
    run_id: str,
    directory: Path,
    name: str | None = None,
    group: str | None = None,
    tags: list[str] | None = None,
    job_type: str | None = None,
    config: dict[str, Any] | None = None,
    resume: str | None = "allow",
    warn: Callable[[str], None] | None = None,
):
    """A W&B run, or None: mode disabled, or W&B failed (one warning line through `warn`, default
    stderr). An online run whose server is unreachable, or does not let wandb.init finish within
    INIT_TIMEOUT_S, logs offline. Tags are cut to W&B's 64 characters."""
    if mode == "disabled":
        return None
    warn = warn or _stderr
    if mode == "online" and (why := unreachable()) is not None:
        warn(f"warning: W&B was not reached ({why}); logging offline to {directory}/wandb (`wandb sync`)")
        mode = "offline"
    try:
        import wandb
    except ImportError:
        warn("warning: wandb is not installed; logging to the records only (pip install wandb)")
        return None
    directory.mkdir(parents=True, exist_ok=True)
    kwargs = dict(
        project=project,
        id=run_id,
        name=name,
        group=group,
        tags=[t[:64] for t in tags or []],
        job_type=job_type,
        config=config,
        resume=resume,
        dir=str(directory),
        reinit="finish_previous",
    )
    for attempt in (mode, "offline") if mode == "online" else (mode,):
        try:
            settings = wandb.Settings(silent=True, console="off", init_timeout=INIT_TIMEOUT_S)
            if attempt == "online":
                settings.finish_timeout = FINISH_TIMEOUT_S
            return wandb.init(mode=attempt, settings=settings, **kwargs)
        except Exception as e:  # noqa: BLE001 - W&B must never stop a run (module docstring)
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
            _teardown(wandb)  # a failed init keeps the run id "in use" in W&B's service
            if attempt == "online":
                warn(f"warning: W&B was not reached ({reason}); logging offline to {directory}/wandb (`wandb sync`)")
            else:
                warn(f"warning: W&B failed ({reason}); logging to the records only")
    return None


def _teardown(wandb) -> None:
    try:
        wandb.teardown()
    except Exception:  # noqa: BLE001 - already broken: the next attempt reports what fails
        pass


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class _Wandb:
    """The calls the loop makes on a W&B run; a failing W&B call is reported once, then skipped."""

    def __init__(self, run, predict: Predict | None = None):
        self.run = run
        self.predict = predict
        self.broken = False

    def _guard(self, fn, *args, **kwargs) -> None:
        if self.broken:
            return
        try:
            fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - W&B must never stop a run
            self.broken = True
            _stderr(f"warning: W&B stopped logging this run ({type(e).__name__}: {e}); the records are complete")

    def log(self, data: dict[str, Any], step: int) -> None:
        self._guard(self.run.log, data, step=step)

    def observe(self, kind: str, record: dict[str, Any]) -> None:
        """A loop event for the live prediction: what `predict` returns is logged at the event's step.
        A failing prediction is reported once and never stops the run."""
        if self.predict is None or self.broken:
            return
        try:
            out = self.predict(kind, record)
        except Exception as e:  # noqa: BLE001 - a prediction is advice, never a reason to stop training
            self.predict = None
            _stderr(f"warning: the live prediction failed ({type(e).__name__}: {e}); no further predictions")
            return
        if out:
            self.log(out, step=int(record["step"]))
            self.summary_update(out)

    def summary_update(self, data: dict[str, Any]) -> None:
        self._guard(self.run.summary.update, {k: v for k, v in data.items() if v is not None})

    def finish(self, exit_code: int = 0) -> None:
        self._guard(self.run.finish, exit_code=exit_code)


def open_wandb(cfg, run_dir: Path, runtime, context: WandbRun | None = None) -> _Wandb | None:
    """The run's W&B logger on rank 0 (module docstring), else None."""
    context = context or WandbRun()
    mode = wandb_mode(context.mode or cfg.logging.wandb)
    if not runtime.is_rank0 or mode == "disabled":
        return None
    config = to_dict(cfg)
    if context.config:
        config["sweep"] = context.config
    run = start_wandb(
        mode=mode,
        project=cfg.logging.wandb_project,
        run_id=config_hash(cfg),
        directory=Path(run_dir),
        name=context.name or cfg.name,
        group=context.group,
        tags=context.tags,
        job_type=context.job_type,
        config=config,
    )
    if run is None:
        return None
    logger = _Wandb(run, context.predict)
    logger.summary_update(context.summary)
    return logger
