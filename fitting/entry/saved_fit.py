"""A fitted law read back from where it was saved: one loader, one typed object, both on-disk forms.

    fit = load_saved_fit("fit.json")                    # `scalelab fit DATA --out fit.json`
    fit = load_saved_fit(SweepLayout(d).round_fit(3))   # a sweep's fits/round_3.json (`sweep next`)
    fit = load_saved_fit(url, text=files.read_text(url))  # a file read from object storage
    fit = load_saved_fit(scaling_fit.to_record())       # a fit's JSON already in memory
    fit.law, fit.approach, fit.params, fit.draws, fit.stacked, fit.frontier, fit.level
    fit.record        # the fit's own JSON, as saved (the report, or the round's "fit")
    fit.round         # a round file's other fields (proposals, gates, target): None for the others

Every reader of a saved fit (`predict`, `allocate`, `plan-run`, the report, the IsoFLOP generator's
`center: {fit: ...}`, `sweep next`'s round, the W&B fit runs) goes through `load_saved_fit`, so
what a saved fit holds and how a bad one is refused is said once, here. (A study fits its arms
again each round, scalelab.sweeps.studies.study_fit: it reads no saved fit.)

Forms it reads (each file written by the one code that writes it; old files keep loading):
  - "report": `scalelab fit --out FIT.json` (scalelab.fitting.entry.scaling_fit.ScalingFit.to_report with
    its `samples`): law, approach (1, 2, 3), params; `samples` {name: [draw, ...]} give the draws;
  - "round": a sweep's fits/round_K.json (scalelab.sweeps.closed_loop.proposal.Proposal.to_dict): the round's
    target, gates and proposals, with the fit it proposed from under "fit" (ScalingFit.to_record:
    law, params, `draws` [{name: value}], `points`, extrapolation error);
  - "record": a fit record alone (ScalingFit.to_record, or a law with its params such as a recipe
    audit's frontier): an Approach 3 law of (N, D).
A study's round file (fits/round_K.json of a spec with `study:` arms) holds one fit per arm and
their comparison, not one law: it is refused with a line that says so. The two files stay two
forms on purpose: a round file is a round (what was proposed and why) that holds a fit, while
FIT.json is the fit `scalelab fit --json` prints; both hold the same fit fields.

A file that is not one of these (not JSON, not an object, a key missing or of the wrong type) is
refused with one line naming the file and the key (UsageError: exit code 2). Nothing is
unpickled or evaluated: the file is JSON. This module imports no numerical package, so a bad file
is refused before the fitting stack (torch) loads, and plan-run's start-up does not grow.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scalelab.errors import UsageError
from scalelab.fitting.entry.fit_options import LEVEL

FORMS = ("report", "round", "record")
WHAT = "a FIT.json from `scalelab fit DATA --out FIT.json` or a sweep's fits/round_K.json"


@dataclass(frozen=True, kw_only=True)
class SavedFit:
    """A saved fit of a scaling law: what predicts, allocates and plans from it."""

    source: str  # the file it was read from (or the name given to a fit already in memory)
    form: str  # report | round | record (module docstring)
    law: str
    approach: int  # 3: a law of (N, D) or of C; 1/2: N*(C) = n_coef C^n_exponent only
    params: dict[str, float]
    level: float  # the intervals' level the fit was saved with
    draws: list[dict[str, float]]  # parameter draws (bootstrap or delta-method samples); [] when none
    residual_scale: float | None  # the fit's run-to-run noise in log loss
    stacked: dict[str, Any] | None  # law "auto": scalelab.fitting.selection.ensemble.StackedFit.to_dict()
    frontier: dict[str, Any] | None  # scalelab.fitting.allocation.frontier.FrontierFit.to_dict()
    degeneracy: list[dict[str, Any]]  # scalelab.fitting.entry.degeneracy findings
    points: dict[str, list[float]] | None  # the runs fitted (params, tokens, loss, budgets): records only
    run_ids: list[str]
    warnings: list[str]
    backtest: dict[str, Any]
    record: dict[str, Any] = field(repr=False)  # the fit's own JSON as saved
    round: dict[str, Any] | None = field(default=None, repr=False)  # a round file's whole JSON


def load_saved_fit(
    source: SavedFit | Mapping[str, Any] | str | Path, *, text: str | None = None, name: str | None = None
) -> SavedFit:
    """The saved fit in `source`: a file (its `text` when already read, e.g. from object storage),
    a fit's JSON already parsed (`name` says where it came from), or a SavedFit (returned as is).
    UsageError, one line naming the file and the key, for anything that is not a saved fit."""
    if isinstance(source, SavedFit):
        return source
    if isinstance(source, Mapping):
        return _parse(source, name or "the fit")
    where = str(source)
    if text is None:
        path = Path(source)
        if not path.is_file():
            raise UsageError(f"{where} does not exist or is not a file: give {WHAT}")
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"{where}: not readable ({e})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{where} is not JSON ({e.msg} at line {e.lineno}): give {WHAT}") from None
    return _parse(data, where)


def _bad(where: str, key: str, why: str) -> UsageError:
    return UsageError(f"{where}: not a saved fit: key {key!r} {why} ({WHAT})")


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _params(record: Mapping[str, Any], where: str, key: str) -> dict[str, float]:
    params = record.get("params")
    if not isinstance(params, Mapping) or not params:
        raise _bad(where, key, "is missing or not an object of parameter values")
    for k, v in params.items():
        if not _number(v) or not math.isfinite(v):
            raise _bad(where, f"{key}.{k}", f"is {v!r}, not a finite number")
    return dict(params)


def _draws(record: Mapping[str, Any], where: str, prefix: str) -> list[dict[str, float]]:
    """A report's `samples` {name: [values]} or a record's `draws` [{name: value}], as rows."""
    samples, draws = record.get("samples"), record.get("draws")
    if samples:
        if not isinstance(samples, Mapping) or not all(isinstance(v, list) for v in samples.values()):
            raise _bad(where, f"{prefix}samples", "is not an object of value lists")
        if len({len(v) for v in samples.values()}) > 1:
            raise _bad(where, f"{prefix}samples", "has lists of different lengths")
        names = list(samples)
        return _finite([dict(zip(names, vals)) for vals in zip(*(samples[n] for n in names))])
    if draws:
        if not isinstance(draws, list) or not all(isinstance(d, Mapping) for d in draws):
            raise _bad(where, f"{prefix}draws", "is not a list of parameter objects")
        return _finite([dict(d) for d in draws])
    return []


def _finite(rows: list[dict]) -> list[dict[str, float]]:
    """The draws whose every value is a finite number: a replicate whose fit failed is saved with
    nulls (JSON has no NaN) and predicts nothing."""
    return [r for r in rows if all(_number(v) and math.isfinite(v) for v in r.values())]


def _optional(record: Mapping[str, Any], key: str, kind: type, where: str, prefix: str):
    value = record.get(key)
    if value is not None and not isinstance(value, kind):
        raise _bad(where, f"{prefix}{key}", f"is a {type(value).__name__}, not a {kind.__name__}")
    return value


def _parse(data: Any, where: str) -> SavedFit:
    """The form of `data` (module docstring), checked key by key."""
    if not isinstance(data, Mapping):
        raise UsageError(f"{where}: not a saved fit: a JSON object with law and params ({WHAT})")
    round_ = None
    record, prefix = data, ""
    if data.get("study"):
        raise UsageError(
            f"{where}: a study's round (one fit per arm, scalelab.sweeps.studies.study_fit), not one law's saved fit; "
            "`scalelab sweep study` reads it"
        )
    if "fit" in data:
        if not isinstance(data["fit"], Mapping):
            raise _bad(where, "fit", "is not an object (a round file holds its fit record there)")
        round_, record, prefix = dict(data), data["fit"], "fit."
        form = "round"
    else:
        form = "report" if "approach" in data else "record"
    law = record.get("law")
    if not isinstance(law, str) or not law:
        raise _bad(where, f"{prefix}law", "is missing or not a law's name")
    approach = record.get("approach", 3)
    if approach not in (1, 2, 3) or isinstance(approach, bool):
        raise _bad(where, f"{prefix}approach", f"is {approach!r}, not 1, 2 or 3")
    level = record.get("level", LEVEL)
    if not _number(level) or not 0.0 < level < 1.0:
        raise _bad(where, f"{prefix}level", f"is {level!r}, not a level in (0, 1)")
    sigma = record.get("residual_scale")
    if sigma is not None and not _number(sigma):
        raise _bad(where, f"{prefix}residual_scale", f"is {sigma!r}, not a number")
    return SavedFit(
        source=where,
        form=form,
        law=law,
        approach=approach,
        params=_params(record, where, f"{prefix}params"),
        level=level,
        draws=_draws(record, where, prefix),
        residual_scale=sigma,
        stacked=_optional(record, "stacked", Mapping, where, prefix),
        frontier=_optional(record, "frontier", Mapping, where, prefix),
        degeneracy=list(_optional(record, "degeneracy", list, where, prefix) or []),
        points=_optional(record, "points", Mapping, where, prefix),
        run_ids=list(_optional(record, "run_ids", list, where, prefix) or []),
        warnings=list(_optional(record, "warnings", list, where, prefix) or []),
        backtest=dict(_optional(record, "backtest", Mapping, where, prefix) or {}),
        record=dict(record),
        round=round_,
    )
