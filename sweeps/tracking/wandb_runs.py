"""A sweep in Weights & Biases: one group per sweep, each run tagged by its design, with a job type and
the numbers scalelab knows about it.

    ctx = trial_context(sweep_dir, run_id, config)   # in a trial: the WandbRun that train_run logs with
    prepare(sweep_dir, runs, log)                    # in the driver, before the trials: is W&B reached?
    sw = sweep_wandb(sweep_dir)                      # group, project, mode of the sweep-side runs

What each run carries (run_context):
  group     the sweep (`wandb.group` in the spec, else the spec's name), every round included;
  tags      its design: `budget:2e+11`, `size:2/4` (its rank among the sizes of its budget),
            `round:0` (the initial design) or `round:K`, `proposal:<kind>` (a `sweep next` run),
            `tpp:<D/N>`, `cooldown:stable|branch`, the arm of a study (`arm:<name>`, a `study:` spec's
            label; and the config's `tags:`, e.g. `arch:moe`), an LR-transfer check's `width:`,
            `depth:`, `lr:`, and `wandb.tags`;
  job_type  train; cooldown for a WSD decay branch; eval (`sweep eval`) and fit (sweeps/tracking/wandb_fit.py);
  summary   N, N_nonembed, D, C (6ND), the budget and, for a proposed run, the ledger's prediction
            and interval (`ledger/predicted_loss`, `ledger/predicted_lo`, `ledger/predicted_hi`);
  predict   while it trains, its predicted final loss (sweeps/tracking/wandb_live.py), when the spec allows.

The mode and project are the base config's `logging.wandb` and `logging.wandb_project` (WANDB_MODE
in the environment wins, scalelab.train.loggers); the API key comes from each node's environment
(WANDB_API_KEY, or `wandb login` on the node), never from the spec. When a sweep asks for online
and its driver cannot reach the server, `prepare` says so in one line and writes
`<sweep>/wandb.json` ({"mode": "offline", ...}): the trials then log offline from the start
instead of each waiting on wandb.init, and `wandb sync` uploads their runs later.

The optional spec section:

    wandb:
      group: iso-v2          # default: the spec's name
      tags: [baseline]       # added to every run of the sweep, fit runs included
      predict: {every: 0.1}  # the live prediction (PredictConfig); false: none
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalelab import store
from scalelab.config_tree import from_dict, load_yaml
from scalelab.errors import ConfigError
from scalelab.store import objects
from scalelab.store.atomic import atomic_write_json
from scalelab.sweeps.specs.spec_checks import check_keys
from scalelab.sweeps.tracking.wandb_live import LivePrediction, PredictConfig, parse_predict
from scalelab.train.config import LoggingConfig
from scalelab.train.loggers import WandbRun, base_url, unreachable, wandb_mode

STATE = "wandb.json"  # <sweep>/wandb.json: the driver's verdict on reaching W&B (prepare)


@dataclass(kw_only=True, slots=True)
class WandbSection:
    """The spec's `wandb:` section (module docstring)."""

    group: str = ""
    tags: list[str] = field(default_factory=list)
    predict: PredictConfig | None = field(default_factory=PredictConfig)


def parse_wandb_section(section: Any) -> WandbSection:
    """The spec's `wandb:` mapping -> WandbSection.

    Raises:
        ConfigError: an unknown key or a bad value, naming the key.
    """
    if section is None:
        return WandbSection()
    if not isinstance(section, dict):
        raise ConfigError("wandb", f"expected a mapping, got {section!r}", "e.g. {group: iso-v2, tags: [baseline]}")
    check_keys(section, list(WandbSection.__slots__), "wandb")
    group = section.get("group", "")
    if not isinstance(group, str):
        raise ConfigError("wandb.group", f"{group!r} is not a name", "use a string, e.g. iso-v2")
    tags = section.get("tags") or []
    if not isinstance(tags, list) or not all(isinstance(t, str) and t for t in tags):
        raise ConfigError("wandb.tags", f"{tags!r} is not a list of names", "e.g. [baseline, v2]")
    return WandbSection(group=group, tags=list(tags), predict=parse_predict(section.get("predict", True)))


@dataclass(kw_only=True, slots=True)
class SweepWandb:
    """Where a sweep's runs go in W&B."""

    group: str
    project: str
    mode: str  # offline | online | disabled, after WANDB_MODE and the driver's verdict
    section: WandbSection


def _spec(sweep_dir: Path) -> dict[str, Any]:
    path = store.SweepLayout(sweep_dir).spec
    return load_yaml(str(path)) if path.exists() else {}


def _state(sweep_dir: str | Path) -> dict[str, Any]:
    if objects.is_url(sweep_dir):
        return {}
    path = Path(sweep_dir) / STATE
    try:
        return json.loads(path.read_text()) if path.exists() else {}
    except (OSError, json.JSONDecodeError):
        return {}


def sweep_wandb(sweep_dir: str | Path, mode: str | None = None) -> SweepWandb:
    """The sweep's group, project and mode (module docstring); `mode` overrides the spec's."""
    sweep_dir = Path(sweep_dir)
    spec = _spec(sweep_dir)
    logging = from_dict(LoggingConfig, ((spec.get("base") or {}).get("logging")) or {}, prefix="base.logging")
    section = parse_wandb_section(spec.get("wandb"))
    name = section.group or spec.get("name") or store.read_resolved(sweep_dir).get("name") or sweep_dir.name
    effective = mode or wandb_mode(logging.wandb)
    if effective == "online" and _state(sweep_dir).get("mode") == "offline":
        effective = "offline"
    return SweepWandb(group=str(name), project=logging.wandb_project, mode=effective, section=section)


# The driver's verdict per W&B server, once per process: one warning line however many launches
# and fit runs the process makes (the demo and `--rounds` make several).
_VERDICTS: dict[str, str | None] = {}


def reachable_mode(requested: str, log) -> str:
    """`requested`, or offline when it is online and this process cannot reach the W&B server (said
    once per process through `log`)."""
    if requested != "online":
        return requested
    url = base_url()
    if url not in _VERDICTS:
        _VERDICTS[url] = unreachable(url)
        if _VERDICTS[url] is not None:
            log(
                f"warning: W&B was not reached ({_VERDICTS[url]}): runs log offline (runs/<id>/wandb, "
                "<sweep>/wandb); `wandb sync` them once it is reachable"
            )
    return "offline" if _VERDICTS[url] is not None else "online"


def prepare(sweep_dir: str | Path, runs: list[dict[str, Any]], log) -> None:
    """Before a launch's trials start: when any run logs online, check once that W&B is reached and
    record the verdict in <sweep>/wandb.json for the trials (module docstring)."""
    if objects.is_url(sweep_dir):
        return
    modes = {wandb_mode(((r.get("config") or {}).get("logging") or {}).get("wandb", "offline")) for r in runs}
    path = Path(sweep_dir) / STATE
    if "online" not in modes or reachable_mode("online", log) == "online":
        path.unlink(missing_ok=True)
        return
    url = base_url()
    atomic_write_json(path, {"mode": "offline", "requested": "online", "base_url": url, "reason": _VERDICTS[url]})


def guarded(what: str, log, fn, /, *args, **kwargs):
    """fn(*args, **kwargs), or None after one warning line: W&B never fails a sweep command."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - the store is complete whatever W&B does
        log(f"warning: W&B: {what} failed ({type(e).__name__}: {e}); the store is unaffected")
        return None


# ---------------------------------------------------------------------------------------------
# One run's group, tags, job type and summary
# ---------------------------------------------------------------------------------------------


def _si(x: float) -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{suffix}"
    return f"{x:.3g}"


def _size_rank(entry: dict[str, Any], entries: list[dict[str, Any]]) -> str | None:
    """`k/n`: the entry's rank among the distinct sizes of its budget (branches left out)."""
    budget = (entry.get("labels") or {}).get("flops_budget")
    if budget is None or entry.get("params") is None:
        return None
    sizes = sorted(
        {
            e["params"]
            for e in entries
            if (e.get("labels") or {}).get("flops_budget") == budget
            and (e.get("labels") or {}).get("cooldown") != "branch"
            and e.get("params") is not None
        }
    )
    return f"{sizes.index(entry['params']) + 1}/{len(sizes)}" if entry["params"] in sizes else None


def run_tags(entry: dict[str, Any], entries: list[dict[str, Any]], extra: list[str] = ()) -> list[str]:
    """A run's design as W&B tags (module docstring); `entries` are the sweep's resolved runs."""
    labels = entry.get("labels") or {}
    tags = []
    if labels.get("flops_budget") is not None:
        tags.append(f"budget:{float(labels['flops_budget']):.2g}")
        rank = _size_rank(entry, entries)
        if rank:
            tags.append(f"size:{rank}")
    tags.append(f"round:{labels.get('round', 0)}")
    if labels.get("proposal"):
        tags.append(f"proposal:{labels['proposal']}")
    if labels.get("tokens_per_param") is not None:
        tags.append(f"tpp:{float(labels['tokens_per_param']):.3g}")
    if labels.get("cooldown"):
        tags.append(f"cooldown:{labels['cooldown']}")
    if labels.get("transfer"):  # an arm of the LR-transfer check
        tags += ["transfer", f"width:{labels.get('d_model')}", f"depth:{labels.get('num_layers')}"]
        tags.append(f"lr:{labels.get('lr'):.3g}" if isinstance(labels.get("lr"), float) else f"lr:{labels.get('lr')}")
    for key in ("arm", "mixture", "epochs", "sample"):  # arm: a study's (scalelab.sweeps.studies.study_spec)
        if labels.get(key) is not None:
            tags.append(f"{key}:{labels[key]}")
    for key, value in sorted(((entry.get("config") or {}).get("tags") or {}).items()):  # arms of a study
        tags.append(f"{key}:{value}")
    return [*tags, *extra]


def job_type(entry: dict[str, Any]) -> str:
    return "cooldown" if (entry.get("labels") or {}).get("cooldown") == "branch" else "train"


def run_summary(entry: dict[str, Any]) -> dict[str, Any]:
    """N, D, C and the budget; a proposed run's prediction from its round (the ledger's numbers)."""
    labels = entry.get("labels") or {}
    out: dict[str, Any] = {
        "N": entry.get("params"),
        "N_nonembed": entry.get("params_nonembed"),
        "D": entry.get("num_tokens"),
        "C": entry.get("flops_6n"),
        "C_budget": labels.get("flops_budget"),
    }
    if labels.get("predicted_loss") is not None:
        lo, hi = labels.get("predicted_interval") or (math.nan, math.nan)
        out |= {
            "ledger/round": labels.get("round"),
            "ledger/predicted_loss": labels["predicted_loss"],
            "ledger/predicted_lo": lo,
            "ledger/predicted_hi": hi,
        }
    return {k: v for k, v in out.items() if v is not None}


def run_name(entry: dict[str, Any]) -> str:
    labels = entry.get("labels") or {}
    name = f"N={_si(entry.get('params') or 0)} D={_si(entry.get('num_tokens') or 0)}"
    if labels.get("cooldown") == "branch":
        name += f" branch@{labels.get('branch_step')}"
    if labels.get("proposal"):
        name += f" {labels['proposal']}"
    return name


def run_context(sw: SweepWandb, entry: dict[str, Any], entries: list[dict[str, Any]]) -> WandbRun:
    """The WandbRun of one resolved run of the sweep (no live prediction)."""
    labels = entry.get("labels") or {}
    return WandbRun(
        group=sw.group,
        tags=run_tags(entry, entries, sw.section.tags),
        job_type=job_type(entry),
        name=run_name(entry),
        summary=run_summary(entry),
        config={"sweep": sw.group, "run_id": entry.get("run_id"), "spec": entry.get("spec"), **labels},
        mode=sw.mode,
    )


def trial_context(sweep_dir: str | Path, run_id: str, config: dict[str, Any]) -> WandbRun | None:
    """What a trial's train_run logs to W&B (module docstring); None when W&B is off for the run, or
    its context cannot be read (the run then logs with its config's W&B settings alone)."""
    try:
        return _trial_context(sweep_dir, run_id, config)
    except Exception as e:  # noqa: BLE001 - W&B must never stop a run
        print(f"warning: the run's W&B group and tags could not be read ({type(e).__name__}: {e})", file=sys.stderr)
        return None


def _trial_context(sweep_dir: str | Path, run_id: str, config: dict[str, Any]) -> WandbRun | None:
    if objects.is_url(sweep_dir):  # the config's own W&B settings (no group or tags on object storage)
        return None
    sw = sweep_wandb(sweep_dir, mode=wandb_mode(((config.get("logging") or {}).get("wandb")) or "offline"))
    if sw.mode == "disabled":
        return None
    entries = store.read_resolved(sweep_dir).get("runs", [])
    entry = next((e for e in entries if e.get("run_id") == run_id), {"run_id": run_id, "config": config})
    ctx = run_context(sw, entry, entries)
    if sw.section.predict is not None:
        ctx.predict = LivePrediction(
            sweep_dir=str(sweep_dir), run_id=run_id, config=config, settings=sw.section.predict
        )
    return ctx
